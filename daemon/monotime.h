/*
 * monotime.h: the monotonic clock, in the units the daemon counts in.
 * Deadlines, grant lifetimes and profile timestamps all use it, so that a
 * change of the wall clock never ends a wait early or makes one endless.
 */
#ifndef MONOTIME_H
#define MONOTIME_H

#include <stdint.h>
#include <time.h>

static inline int64_t
mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t
mono_ms(void)
{
	return mono_ns() / 1000000;
}

#endif
