/*
 * exec.h: running a dispatch on the CPU (exec.c), in plain C.
 * TEST HARNESS ONLY (see README.md).
 */
#ifndef METAL_EMU_EXEC_H
#define METAL_EMU_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "include/metal_emu_abi.h"

#define EMU_MAX_THREADS 1024	/* maxTotalThreadsPerThreadgroup */

struct emu_arg {
	void *ptr;		/* buffer contents + offset, or setBytes data */
	size_t len;		/* bytes from ptr to the end of what is bound */
	int bound;
};

struct emu_dispatch {
	const struct metal_emu_kernel *k;
	int threaded;		/* a fiber per GPU thread */
	struct emu_arg args[METAL_EMU_MAX_PARAMS];
	uint32_t grid[3];	/* threadgroups per grid */
	uint32_t tg[3];		/* threads per threadgroup */
};

/* The fault handlers, once per process. */
void emu_exec_init(void);
/* A thread that will run kernels: give it a stack for the handler. */
void emu_exec_thread_init(void);
/* Run d; 0, or -1 with what went wrong in err. Dispatches of all queues
 * run one at a time. */
int emu_exec(const struct emu_dispatch *d, char *err, size_t errlen);
/* What kernel code calls back into (metal_emu_rt in the library). */
extern const struct metal_emu_rt emu_rt;

#endif
