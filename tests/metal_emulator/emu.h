/*
 * emu.h: internals shared by the files of the Metal emulator.
 *
 * TEST HARNESS ONLY. The emulator implements, on Linux and on the CPU, the
 * Foundation, dispatch and Metal declarations in tests/metal_stub (which
 * are written from Apple's documented signatures) so that daemon/runner.m,
 * unchanged, can run here. It is never part of the product: see README.md
 * for what it proves and what only a real Mac can.
 */
#ifndef METAL_EMU_H
#define METAL_EMU_H

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <dispatch/dispatch.h>

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "library.h"

/* The GNU Objective-C runtime (libobjc, gcc's), declared here because its
 * <objc/objc.h> would collide with the stub's. */
size_t class_getInstanceSize(Class cls);
Class object_setClass(id obj, Class cls);
const char *class_getName(Class cls);
Class objc_getClass(const char *name);
#define Nil ((Class)0)
static inline Class
emu_class(id obj)
{
	return ((struct objc_object *)obj)->isa;
}

/* foundation.m */
void emu_count(Class cls, int delta);
/* "Class n, Class n" of every class with live objects, "" when none. */
void emu_live_objects(char *buf, size_t len);
void emu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
NSString *emu_string(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));	/* autoreleased */
NSError *emu_error(long code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));	/* autoreleased */
/* With userInfo info (retained by the error), or NULL for an empty one. */
NSError *emu_error_info(long code, NSDictionary *info,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A retained dictionary of one entry, found by the key's identity (or
 * none, key nil). */
NSDictionary *emu_dictionary(id key, id value);
id emu_autorelease(id obj);
void emu_dispatch_bytes(dispatch_data_t data, const uint8_t **p, size_t *n);
/* METAL_EMU_MACOS: the macOS version NSProcessInfo reports. */
void emu_macos(int v[3]);

@interface NSObject (Emu)
+ (instancetype)allocPlain;	/* NSObject's own alloc, for class clusters */
- (void)dealloc;
- (id)autorelease;
@end

/* device.m */
#define EMU_ARG_TABLE 31	/* buffer argument table entries */
/* In a child of fork() that has not exec'd (Apple: Metal is unsafe there):
 * logs call, then aborts if stop, else returns 1 (refuse it); 0 elsewhere. */
int emu_forked(const char *call, int stop);

@interface EmuBuffer : NSObject <MTLBuffer> {
@public
	void *map;		/* the whole mapping, guard pages included */
	size_t maplen;
	uint8_t *bytes;		/* the GPU's: ends at the trailing guard page */
	uint8_t *cpu;		/* Managed, METAL_EMU_UNIFIED=0: the CPU's copy
				 * (contents), else NULL: contents is bytes */
	NSUInteger length;
}
@end

@interface EmuPipeline : NSObject <MTLComputePipelineState> {
@public
	id lib;			/* EmuLibrary, retained */
	const struct metal_emu_kernel *k;
	int threaded;
}
@end

id <MTLCommandQueue> emu_queue_new(id <MTLDevice> dev);	/* retained */

#endif
