# The macOS build checked on Linux: CMakeLists.txt's Apple path (the Metal
# backend, METAL_SOURCES; dns_sd; the frameworks) compiled and linked for
# arm64 (macOS 11) or x86_64 (macOS 10.15, the oldest docs/metal.md names) by
# zig cc, from PyPI's ziglang (the test extra), which carries Darwin's libc
# headers and libSystem's link stubs. tests/test_macos_build.py builds both
# with -DCMAKE_COMPILE_WARNING_AS_ERROR=ON; daemon/Makefile's macos-check is
# the same through the Makefile.
#   cmake -S . -B build-macos -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-zig-macos.cmake \
#     -DMACOS_ARCH=arm64 [-DZIG=/path/to/zig] && cmake --build build-macos
#
# The macOS versions in zig's targets below are CMakeLists.txt's deployment
# targets: zig cc ignores -mmacosx-version-min (which CMakeLists.txt passes, as
# a Mac's clang needs) and takes the minimum macOS from its target triple only.
#
# zig has no Apple SDK, so what is not Darwin's libc stands in: the Metal
# backend is compiled against tests/metal_stub (the project's Metal,
# Foundation, objc and dispatch declarations, written from Apple's
# documentation), advertise_dnssd.c against Avahi's dns_sd.h (its copy of
# Apple's dns_sd API; Debian: libavahi-compat-libdnssd-dev), and the
# frameworks are not linked: their symbols are left to dynamic lookup. The
# result proves the sources compile and link for macOS; it is not a binary to
# run or install.
set(CMAKE_SYSTEM_NAME Darwin)
if(NOT MACOS_ARCH)
  set(MACOS_ARCH arm64)
endif()
if(MACOS_ARCH STREQUAL "arm64")
  set(_mr_target aarch64-macos.11.0)
elseif(MACOS_ARCH STREQUAL "x86_64")
  set(_mr_target x86_64-macos.10.15)
else()
  message(FATAL_ERROR "MACOS_ARCH=${MACOS_ARCH}: use arm64 or x86_64")
endif()
set(CMAKE_SYSTEM_PROCESSOR ${MACOS_ARCH})

# zig: -DZIG=..., else the one in the repository's .venv (./setup.sh test),
# else zig on PATH.
if(NOT ZIG)
  execute_process(COMMAND ${CMAKE_CURRENT_LIST_DIR}/../.venv/bin/python -c
      "import ziglang, os; print(os.path.dirname(ziglang.__file__) + '/zig')"
    OUTPUT_VARIABLE ZIG OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(NOT ZIG)
  find_program(ZIG zig)
endif()
if(NOT ZIG)
  message(FATAL_ERROR "no zig: pip install ziglang (./setup.sh test), or pass -DZIG=/path/to/zig")
endif()
set(CMAKE_C_COMPILER ${ZIG} cc)
set(CMAKE_OBJC_COMPILER ${ZIG} cc)
set(CMAKE_C_COMPILER_TARGET ${_mr_target})
set(CMAKE_OBJC_COMPILER_TARGET ${_mr_target})
set(CMAKE_TRY_COMPILE_PLATFORM_VARIABLES MACOS_ARCH ZIG)
# CMake's Darwin platform wants install_name_tool; only an install would run it.
set(CMAKE_INSTALL_NAME_TOOL /bin/false)

execute_process(COMMAND pkg-config --cflags avahi-compat-libdns_sd
  OUTPUT_VARIABLE _mr_dnssd OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _mr_rc)
if(NOT _mr_rc EQUAL 0)
  message(FATAL_ERROR "no dns_sd.h: Avahi's compatibility header is needed (Debian: libavahi-compat-libdnssd-dev)")
endif()
set(CMAKE_C_FLAGS_INIT "${_mr_dnssd}")
set(CMAKE_OBJC_FLAGS_INIT "-I${CMAKE_CURRENT_LIST_DIR}/../tests/metal_stub")
set(METAL_RUNNER_FRAMEWORKS "-Wl,-undefined,dynamic_lookup" CACHE STRING
  "left to dynamic lookup: zig has no Apple frameworks to link")
