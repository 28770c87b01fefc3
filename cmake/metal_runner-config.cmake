# find_package(metal_runner): the installed libmetal_runner.a and its headers
# as the target metal_runner::metal_runner_core (examples/embed/CMakeLists.txt).
include(CMakeFindDependencyMacro)
find_dependency(Threads)
include("${CMAKE_CURRENT_LIST_DIR}/metal_runner-targets.cmake")
