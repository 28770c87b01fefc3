# Cross build for riscv64 Linux with Debian's cross gcc (package gcc-riscv64-linux-gnu):
#   cmake -S . -B build-riscv64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-riscv64-linux-gnu.cmake
#   cmake --build build-riscv64    # libmetal_runner.a and metal_runner for riscv64
# Run the result on an x86-64 host under emulation: qemu-riscv64 -L /usr/riscv64-linux-gnu build-riscv64/metal_runner
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR riscv64)
set(CMAKE_C_COMPILER riscv64-linux-gnu-gcc)
set(CMAKE_AR riscv64-linux-gnu-ar CACHE FILEPATH "")
set(CMAKE_RANLIB riscv64-linux-gnu-ranlib CACHE FILEPATH "")
# Libraries and headers come from the cross sysroot only, never the host's.
set(CMAKE_FIND_ROOT_PATH /usr/riscv64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
