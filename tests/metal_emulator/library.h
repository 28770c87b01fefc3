/*
 * library.h: Metal Shading Language source to a loaded kernel library
 * (library.c), in plain C. TEST HARNESS ONLY (see README.md).
 */
#ifndef METAL_EMU_LIBRARY_H
#define METAL_EMU_LIBRARY_H

#include <stddef.h>

#include "exec.h"

struct emu_lib;

/* MTLMathMode's values (MTLLibrary.h, macOS 15): safe, relaxed (fast math
 * that honours infinities and NaNs), fast. */
enum { EMU_MATH_SAFE = 0, EMU_MATH_RELAXED = 1, EMU_MATH_FAST = 2 };

/* Compile MSL source at language version (200, 300, 310, ..., the value
 * of __METAL_VERSION__), in math mode EMU_MATH_*. NULL with *err set
 * (malloc'd) on failure; for a compile error, *err is the compiler's whole
 * output. */
struct emu_lib *emu_lib_compile(const char *src, size_t len, unsigned version,
    int mathmode, char **err);
/* The kernel named name, or NULL. Valid while l is. */
const struct metal_emu_kernel *emu_lib_kernel(struct emu_lib *l,
    const char *name);
/* Nonzero if the library's kernels synchronize threads (barriers,
 * simdgroup functions) and so need a fiber per GPU thread. */
int emu_lib_threaded(const struct emu_lib *l);
void emu_lib_free(struct emu_lib *l);

#endif
