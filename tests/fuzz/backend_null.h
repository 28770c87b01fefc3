/* backend_null.h: the bookkeeping-only backend the session fuzzer uses. */
#ifndef METAL_RUNNER_BACKEND_NULL_H
#define METAL_RUNNER_BACKEND_NULL_H

#include "backend.h"

#define NULL_MEMORY (64u << 20)		/* device memory it reports */
#define NULL_MAXALLOC (4u << 20)	/* larger allocations fail: ENOMEM */
#define NULL_FAIL_LAUNCH 7777		/* global[2]: the launch fails */
#define NULL_FAIL_SYNC 7778		/* global[2]: the next sync fails */

extern const struct backend be_null;

#endif
