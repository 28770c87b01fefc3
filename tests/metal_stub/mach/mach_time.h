/*
 * mach/mach_time.h stand-in: the host clock that MTLCommandBuffer's
 * GPUStartTime and GPUEndTime are in (CACurrentMediaTime is
 * mach_absolute_time in seconds). Declarations as in the macOS SDK's
 * <mach/mach_time.h>; see Apple's Kernel documentation, "mach_absolute_time"
 * and "mach_timebase_info", and Technical Q&A QA1398, "Mach Absolute Time
 * Units" (ticks * numer / denom = ns).
 */
#ifndef METAL_STUB_MACH_TIME_H
#define METAL_STUB_MACH_TIME_H

#include <stdint.h>

/* <mach/machine/kern_return.h> */
typedef int kern_return_t;

struct mach_timebase_info {
	uint32_t numer;
	uint32_t denom;
};
typedef struct mach_timebase_info *mach_timebase_info_t;
typedef struct mach_timebase_info mach_timebase_info_data_t;

/* kern_return_t mach_timebase_info(mach_timebase_info_t info); */
extern kern_return_t mach_timebase_info(mach_timebase_info_t info);
/* uint64_t mach_absolute_time(void); */
extern uint64_t mach_absolute_time(void);

#endif
