/*
 * device.m: the emulated MTLDevice, its buffers, libraries, functions and
 * pipelines. TEST HARNESS ONLY (see README.md).
 *
 * Buffers are shared-storage memory mapped between two inaccessible guard
 * pages, their contents ending at the second one (16-byte aligned), so a
 * kernel that reads or writes past the end of a buffer faults at once and
 * fails its command buffer (exec.c) instead of touching other memory.
 */
#import "emu.h"

#include <sys/mman.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EMU_MAX_BUFFER (1ULL << 30)		/* maxBufferLength */
#define EMU_WORKING_SET (4ULL << 30)		/* recommendedMaxWorkingSetSize */
#define EMU_NEWEST_LANGUAGE 320			/* MSL 3.2, macOS 15's newest */

NSArray *emu_array(id *objs, NSUInteger n);

/* ---- MTLCompileOptions: a class cluster, the stub declares no ivars ---- */

@interface EmuCompileOptions : MTLCompileOptions {
@public
	BOOL fast;
	MTLLanguageVersion version;
}
@end

@implementation MTLCompileOptions
+ (instancetype)alloc
{
	if (self == objc_getClass("MTLCompileOptions"))
		return (id)[EmuCompileOptions allocPlain];
	return [self allocPlain];
}
- (BOOL)fastMathEnabled
{
	return ((EmuCompileOptions *)self)->fast;
}
- (void)setFastMathEnabled:(BOOL)on
{
	((EmuCompileOptions *)self)->fast = on;
}
- (MTLLanguageVersion)languageVersion
{
	return ((EmuCompileOptions *)self)->version;
}
- (void)setLanguageVersion:(MTLLanguageVersion)v
{
	((EmuCompileOptions *)self)->version = v;
}
@end

@implementation EmuCompileOptions
- (instancetype)init
{
	fast = YES;	/* Metal's default: fast math on */
	version = 0;	/* unset: the newest */
	return self;
}
@end

/* __METAL_VERSION__ for a language version, 0 if unknown. */
static unsigned
metal_version(MTLLanguageVersion v)
{
	unsigned major = (unsigned)(v >> 16), minor = (unsigned)(v & 0xffff);

	if (v == 0)
		return EMU_NEWEST_LANGUAGE;
	if ((major == 2 && minor <= 4) || (major == 3 && minor <= 2) ||
	    (major == 4 && minor == 0))
		return major * 100 + minor * 10;
	return 0;
}

/* ---- libraries, functions, pipelines ---- */

@interface EmuLibrary : NSObject <MTLLibrary> {
@public
	struct emu_lib *lib;
}
@end

@interface EmuFunction : NSObject <MTLFunction> {
@public
	EmuLibrary *lib;	/* retained: the code lives in it */
	const struct metal_emu_kernel *k;
}
@end

@implementation EmuLibrary
- (nullable id <MTLFunction>)newFunctionWithName:(NSString *)name
{
	const struct metal_emu_kernel *k;
	EmuFunction *f;

	if ((k = emu_lib_kernel(lib, [name UTF8String])) == NULL)
		return nil;
	f = (EmuFunction *)[EmuFunction alloc];
	f->lib = [self retain];
	f->k = k;
	return f;
}
- (void)dealloc
{
	emu_lib_free(lib);
	[super dealloc];
}
@end

@implementation EmuFunction
- (void)dealloc
{
	[lib release];
	[super dealloc];
}
@end

@implementation EmuPipeline
- (NSUInteger)maxTotalThreadsPerThreadgroup
{
	return EMU_MAX_THREADS;
}
- (void)dealloc
{
	[lib release];
	[super dealloc];
}
@end

/* ---- buffers ---- */

@implementation EmuBuffer
- (void *)contents
{
	return bytes;
}
- (void)dealloc
{
	munmap(map, maplen);
	[super dealloc];
}
@end

/* ---- the device ---- */

@interface EmuDevice : NSObject <MTLDevice> {
	int family;	/* emulated MTLGPUFamilyAppleN: N */
}
@end

static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;
static EmuDevice *the_device;	/* not retained: cleared in dealloc */

@implementation EmuDevice

- (instancetype)init
{
	const char *f = getenv("METAL_EMU_FAMILY");

	family = 7;	/* Apple7 (M1): simdgroup matrices, tensor cores */
	if (f != NULL && sscanf(f, "Apple%d", &family) != 1)
		family = 7;
	if (family < 1 || family > 9)
		family = 7;
	emu_exec_init();
	emu_log("TEST HARNESS: an emulated Metal device (MTLGPUFamilyApple%d) "
	    "running kernels on the CPU; not a GPU, not Apple's compiler",
	    family);
	return self;
}

- (NSString *)name
{
	return emu_string("Metal emulator (CPU, test harness)");
}

- (BOOL)hasUnifiedMemory
{
	return YES;
}

- (uint64_t)recommendedMaxWorkingSetSize
{
	return EMU_WORKING_SET;
}

- (NSUInteger)maxBufferLength
{
	return EMU_MAX_BUFFER;
}

- (BOOL)supportsFamily:(MTLGPUFamily)f
{
	if (f >= MTLGPUFamilyApple1 && f <= MTLGPUFamilyApple9)
		return f - MTLGPUFamilyApple1 + 1 <= family;
	return f == MTLGPUFamilyMac2;
}

- (nullable id <MTLCommandQueue>)newCommandQueue
{
	return emu_queue_new(self);
}

- (nullable id <MTLBuffer>)newBufferWithLength:(NSUInteger)length
    options:(MTLResourceOptions)options
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), data;
	EmuBuffer *b;
	uint8_t *m;

	if (options != MTLResourceStorageModeShared)
		emu_log("newBufferWithLength: options %lu: only shared storage "
		    "is emulated", (unsigned long)options);
	if (length == 0 || length > EMU_MAX_BUFFER)
		return nil;
	data = (length + page - 1) / page * page;
	m = mmap(NULL, data + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
	    -1, 0);
	if (m == MAP_FAILED)
		return nil;
	if (mprotect(m + page, data, PROT_READ | PROT_WRITE) == -1) {
		munmap(m, data + 2 * page);
		return nil;
	}
	b = (EmuBuffer *)[EmuBuffer alloc];
	b->map = m;
	b->maplen = data + 2 * page;
	b->bytes = m + page + data - ((length + 15) & ~(size_t)15);
	b->length = length;
	return b;
}

- (nullable id <MTLLibrary>)newLibraryWithData:(dispatch_data_t)data
    error:(__autoreleasing NSError * _Nullable * _Nullable)error
{
	(void)data;
	if (error != NULL)
		*error = emu_error(1, "metallib is not supported by the "
		    "Metal emulator: it compiles Metal source only (the client "
		    "sends source when its host has no Metal compiler)");
	return nil;
}

- (nullable id <MTLLibrary>)newLibraryWithSource:(NSString *)source
    options:(nullable MTLCompileOptions *)options
    error:(__autoreleasing NSError * _Nullable * _Nullable)error
{
	MTLLanguageVersion lv = options != nil ? [options languageVersion] : 0;
	unsigned version = metal_version(lv);
	const char *src = [source UTF8String];
	struct emu_lib *l;
	EmuLibrary *lib;
	char *err = NULL;

	if (version == 0) {
		if (error != NULL)
			*error = emu_error(2, "unknown MTLLanguageVersion "
			    "0x%lx", (unsigned long)lv);
		return nil;
	}
	l = emu_lib_compile(src, strlen(src), version,
	    options == nil || ((EmuCompileOptions *)options)->fast, &err);
	if (l == NULL) {
		/* MTLLibraryErrorCompileFailure = 3 */
		if (error != NULL)
			*error = emu_error(3, "%s", err);
		free(err);
		return nil;
	}
	lib = (EmuLibrary *)[EmuLibrary alloc];
	lib->lib = l;
	return lib;
}

- (nullable id <MTLComputePipelineState>)newComputePipelineStateWithFunction:
    (id <MTLFunction>)function
    error:(__autoreleasing NSError * _Nullable * _Nullable)error
{
	EmuFunction *f = (EmuFunction *)function;
	EmuPipeline *p;

	if (f == nil) {
		if (error != NULL)
			*error = emu_error(1, "no function");
		return nil;
	}
	p = (EmuPipeline *)[EmuPipeline alloc];
	p->lib = [f->lib retain];
	p->k = f->k;
	p->threaded = emu_lib_threaded(f->lib->lib);
	return p;
}

- (void)dealloc
{
	pthread_mutex_lock(&device_lock);
	if (the_device == self)
		the_device = nil;
	pthread_mutex_unlock(&device_lock);
	[super dealloc];
}

@end

/* The one device, shared while anyone holds it. */
static EmuDevice *
device_get(void)
{
	EmuDevice *d;

	pthread_mutex_lock(&device_lock);
	if (the_device == nil)
		the_device = (EmuDevice *)[[EmuDevice alloc] init];
	else
		[the_device retain];
	d = the_device;
	pthread_mutex_unlock(&device_lock);
	return d;
}

id <MTLDevice> _Nullable
MTLCreateSystemDefaultDevice(void)
{
	if (getenv("METAL_EMU_NO_DEFAULT_DEVICE") != NULL)
		return nil;	/* as for a tool that does not link CoreGraphics */
	return device_get();
}

NSArray<id <MTLDevice>> *
MTLCopyAllDevices(void)
{
	EmuDevice *d = device_get();
	NSArray *all = emu_array((id *)&d, 1);

	[d release];
	return all;
}
