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

NSArray *emu_array(id *objs, NSUInteger n);

/* A size with an optional K, M or G suffix (METAL_EMU_MEMORY); 0 if bad. */
static uint64_t
emu_size(const char *s)
{
	char *end;
	unsigned long long n = strtoull(s, &end, 10);

	switch (*end) {
	case 'G':
		n <<= 10;
		/* FALLTHROUGH */
	case 'M':
		n <<= 10;
		/* FALLTHROUGH */
	case 'K':
		n <<= 10;
		end++;
	}
	return *end == '\0' ? (uint64_t)n : 0;
}

/* ---- MTLCompileOptions: a class cluster, the stub declares no ivars ---- */

/* MTLMathFloatingPointFunctions (MTLLibrary.h, macOS 15): Fast 0, Precise
 * 1; MTLMathMode's values are library.h's EMU_MATH_*. */
enum { EMU_FPFUNC_FAST = 0, EMU_FPFUNC_PRECISE = 1 };

@interface EmuCompileOptions : MTLCompileOptions {
@public
	NSInteger mathmode;
	NSInteger fpfunctions;
	MTLLanguageVersion version;
	char setters[256];	/* what was set, in order, for METAL_EMU_TRACE */
}
- (void)record:(const char *)fmt, ... __attribute__((format(printf, 1, 2)));
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
	return ((EmuCompileOptions *)self)->mathmode == EMU_MATH_FAST;
}
/* "If fastMathEnabled is YES, the system sets mathMode to
 * MTLMathModeFast and mathFloatingPointFunctions to
 * MTLMathFloatingPointFunctionsFast"; NO sets Safe and Precise.
 * https://developer.apple.com/documentation/metal/mtlcompileoptions/mathmode */
- (void)setFastMathEnabled:(BOOL)on
{
	EmuCompileOptions *o = (EmuCompileOptions *)self;

	o->mathmode = on ? EMU_MATH_FAST : EMU_MATH_SAFE;
	o->fpfunctions = on ? EMU_FPFUNC_FAST : EMU_FPFUNC_PRECISE;
	[o record:"fastMathEnabled=%s", on ? "YES" : "NO"];
}
- (MTLMathMode)mathMode
{
	return (MTLMathMode)((EmuCompileOptions *)self)->mathmode;
}
- (void)setMathMode:(MTLMathMode)mode
{
	static const char *names[] = { "safe", "relaxed", "fast" };

	((EmuCompileOptions *)self)->mathmode = mode;
	[(EmuCompileOptions *)self record:"mathMode=%s", mode >= 0 && mode <= 2 ?
	    names[mode] : "?"];
}
- (MTLMathFloatingPointFunctions)mathFloatingPointFunctions
{
	return (MTLMathFloatingPointFunctions)
	    ((EmuCompileOptions *)self)->fpfunctions;
}
- (void)setMathFloatingPointFunctions:(MTLMathFloatingPointFunctions)f
{
	((EmuCompileOptions *)self)->fpfunctions = f;
	[(EmuCompileOptions *)self record:"mathFloatingPointFunctions=%s",
	    f == EMU_FPFUNC_FAST ? "fast" : f == EMU_FPFUNC_PRECISE ?
	    "precise" : "?"];
}
- (MTLLanguageVersion)languageVersion
{
	return ((EmuCompileOptions *)self)->version;
}
- (void)setLanguageVersion:(MTLLanguageVersion)v
{
	((EmuCompileOptions *)self)->version = v;
	[(EmuCompileOptions *)self record:"languageVersion=%lu.%lu",
	    (unsigned long)(v >> 16), (unsigned long)(v & 0xffff)];
}
@end

@implementation EmuCompileOptions
- (instancetype)init
{
	/* Metal's defaults: fast math (fastMathEnabled YES), the fast FP32
	 * functions, the newest language version. */
	mathmode = EMU_MATH_FAST;
	fpfunctions = EMU_FPFUNC_FAST;
	version = 0;
	return self;
}
- (void)record:(const char *)fmt, ...
{
	size_t n = strlen(setters);
	va_list ap;

	if (n + 2 >= sizeof(setters))
		return;
	if (n > 0) {
		strcpy(setters + n, ", ");
		n += 2;
	}
	va_start(ap, fmt);
	vsnprintf(setters + n, sizeof(setters) - n, fmt, ap);
	va_end(ap);
}
@end

/*
 * The newest language version (as __METAL_VERSION__) the emulated Mac's
 * macOS has (METAL_EMU_MACOS, foundation.m), from Apple's MTLLanguageVersion
 * table: 4.0 macOS 26, 3.2 15, 3.1 14, 3.0 13, 2.4 12, 2.3 11, 2.2 10.15.
 */
static unsigned
newest_language(void)
{
	static const int tab[][2] = {
		{ 26, 400 }, { 15, 320 }, { 14, 310 }, { 13, 300 }, { 12, 240 },
		{ 11, 230 },
	};
	size_t i;
	int v[3];

	emu_macos(v);
	if (v[0] == 16)		/* macOS 26 to a program of an older SDK */
		v[0] = 26;
	for (i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		if (v[0] >= tab[i][0])
			return (unsigned)tab[i][1];
	return 220;
}

/*
 * The emulated GPU's Apple family (METAL_EMU_FAMILY: Apple1 ... Apple10, or
 * Mac2 for a GPU of no Apple family, an Intel Mac's): N, or 0 for Mac2.
 */
static int
emu_family(void)
{
	const char *f = getenv("METAL_EMU_FAMILY");
	int family = 7;	/* Apple7 (M1): simdgroup matrices, tensor cores */

	if (f != NULL && strcmp(f, "Mac2") == 0)
		return 0;
	if (f != NULL && sscanf(f, "Apple%d", &family) != 1)
		family = 7;
	if (family < 1 || family > 10)
		family = 7;
	return family;
}

/*
 * MTLGPUFamilyMetal4 (macOS 26): Apple's Metal 4 needs an Apple GPU of
 * family 7 (M1, A14) or later; no Intel or AMD GPU of a Mac has it. So
 * here: macOS 26 and METAL_EMU_FAMILY Apple7 or later.
 */
static int
emu_metal4(void)
{
	return newest_language() >= 400 && emu_family() >= 7;
}

/*
 * The newest language version this device compiles and loads: MSL 4.0 is
 * Metal 4's language, so a GPU without the Metal 4 family has 3.2 at most
 * (on macOS 26: an Intel Mac). What a Mac says when asked for 4.0 on such
 * a GPU was not seen; the emulator refuses it as a version newer than the
 * system has (the texts below say that they are the emulator's).
 */
static unsigned
device_newest_language(void)
{
	unsigned v = newest_language();

	return v >= 400 && !emu_metal4() ? 320 : v;
}

/* __METAL_VERSION__ for a language version, 0 if unknown. */
static unsigned
metal_version(MTLLanguageVersion v)
{
	unsigned major = (unsigned)(v >> 16), minor = (unsigned)(v & 0xffff);

	if (v == 0)
		return device_newest_language();
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

/* ---- reflection ---- */

/*
 * What a pipeline built with reflection reports, from the kernel's
 * parameters as library.c found them (their [[buffer(n)]] index) and the
 * compiler gave them (pointee or referee size and alignment): a buffer
 * binding for each `device T *` and `constant T &`, a threadgroup memory
 * one for each `threadgroup T * [[threadgroup(n)]]`, none for the built-in
 * ids. Only what runner.m reads: the bindings' type, index, bufferDataSize
 * and bufferAlignment, the bindings (macOS 13) and the arguments (before)
 * alike; without MTLPipelineOptionBindingInfo (the same bit as
 * ArgumentInfo) both are empty. Asking a buffer's properties of another
 * type stops the process, as Apple says it does for an MTLArgument ("If
 * the argument is not a buffer, querying this property is a fatal error";
 * an MTLBinding of another type does not have them at all).
 */
enum { EMU_OPT_BINDING_INFO = 1 << 0 };

static void
emu_not_a_buffer(const char *sel, NSUInteger type, NSUInteger index)
{
	emu_log("-[%s]: the argument at index %lu is of type %lu, not a "
	    "buffer: a fatal error (Apple)", sel, (unsigned long)index,
	    (unsigned long)type);
	abort();
}

@interface EmuBinding : NSObject <MTLBufferBinding> {
@public
	NSUInteger type, index, size, align;
	BOOL used;
}
@end

@implementation EmuBinding
/* @property(readonly, getter=isUsed) BOOL used;  (macOS 13): whether the
 * kernel's body names the parameter (library.c, param_used) */
- (BOOL)isUsed
{
	return used;
}
- (MTLBindingType)type
{
	return (MTLBindingType)type;
}
- (NSUInteger)index
{
	return index;
}
- (NSUInteger)bufferDataSize
{
	if (type != MTLBindingTypeBuffer)
		emu_not_a_buffer("MTLBufferBinding bufferDataSize", type, index);
	return size;
}
- (NSUInteger)bufferAlignment
{
	if (type != MTLBindingTypeBuffer)
		emu_not_a_buffer("MTLBufferBinding bufferAlignment", type, index);
	return align;
}
@end

@interface EmuArgument : MTLArgument {
@public
	NSUInteger type, index, size, align;
	BOOL used;
}
@end

@implementation MTLArgument
/* @property(readonly, getter=isActive) BOOL active;  as MTLBinding's used */
- (BOOL)isActive
{
	return ((EmuArgument *)self)->used;
}
- (MTLArgumentType)type
{
	return (MTLArgumentType)((EmuArgument *)self)->type;
}
- (NSUInteger)index
{
	return ((EmuArgument *)self)->index;
}
- (NSUInteger)bufferDataSize
{
	EmuArgument *a = (EmuArgument *)self;

	if (a->type != MTLArgumentTypeBuffer)
		emu_not_a_buffer("MTLArgument bufferDataSize", a->type,
		    a->index);
	return a->size;
}
- (NSUInteger)bufferAlignment
{
	EmuArgument *a = (EmuArgument *)self;

	if (a->type != MTLArgumentTypeBuffer)
		emu_not_a_buffer("MTLArgument bufferAlignment", a->type,
		    a->index);
	return a->align;
}
@end

@implementation EmuArgument
@end

@interface EmuReflection : MTLComputePipelineReflection {
@public
	NSArray *bindings;	/* retained */
	NSArray *arguments;	/* retained */
}
@end

@implementation MTLComputePipelineReflection
- (NSArray<id <MTLBinding>> *)bindings
{
	return ((EmuReflection *)self)->bindings;
}
- (NSArray<MTLArgument *> *)arguments
{
	return ((EmuReflection *)self)->arguments;
}
@end

@implementation EmuReflection
- (void)dealloc
{
	[bindings release];
	[arguments release];
	[super dealloc];
}
@end

/* An autoreleased reflection of k, as newComputePipelineState... gives it. */
static MTLComputePipelineReflection *
emu_reflection(const struct metal_emu_kernel *k, MTLPipelineOption options)
{
	EmuReflection *r = (EmuReflection *)[EmuReflection allocPlain];
	id bind[METAL_EMU_MAX_PARAMS], arg[METAL_EMU_MAX_PARAMS];
	const struct metal_emu_param *p;
	EmuBinding *b;
	EmuArgument *a;
	NSUInteger n = 0, i;
	unsigned j;

	for (j = 0; (options & EMU_OPT_BINDING_INFO) && j < k->nparams; j++) {
		p = &k->params[j];
		if (p->kind == METAL_EMU_PARAM_BUILTIN)
			continue;
		b = (EmuBinding *)[EmuBinding allocPlain];
		a = (EmuArgument *)[EmuArgument allocPlain];
		b->type = a->type = p->kind == METAL_EMU_PARAM_THREADGROUP ?
		    MTLArgumentTypeThreadgroupMemory : MTLArgumentTypeBuffer;
		b->index = a->index = (NSUInteger)p->index;
		b->size = a->size = p->size;
		b->align = a->align = p->align;
		b->used = a->used = p->used ? YES : NO;
		bind[n] = b;
		arg[n++] = a;
	}
	r->bindings = emu_array(bind, n);
	r->arguments = emu_array(arg, n);
	for (i = 0; i < n; i++) {
		[bind[i] release];
		[arg[i] release];
	}
	return (MTLComputePipelineReflection *)emu_autorelease(r);
}

/* A library of len bytes of source compiled at version (__METAL_VERSION__),
 * or nil with *error set, as newLibraryWithSource: and newLibraryWithData:
 * return it (retained). */
static id <MTLLibrary>
emu_library(const char *src, size_t len, unsigned version, int mathmode,
    NSError **error)
{
	struct emu_lib *l;
	EmuLibrary *lib;
	char *err = NULL;

	if ((l = emu_lib_compile(src, len, version, mathmode, &err)) == NULL) {
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

/* ---- buffers ---- */

/*
 * METAL_EMU_MEMORY=N (bytes, K/M/G suffix): a device with N bytes of memory,
 * which recommendedMaxWorkingSetSize reports. A buffer holds its length of it
 * until it is deallocated, which is after its owner released it *and* the
 * command buffers that use it completed (a command buffer retains what it
 * uses, as Metal's do). newBufferWithLength returns nil when the buffers
 * alive would pass N. That is a model, not what an Apple GPU does at its
 * limit (it may page, or fail a command buffer with
 * MTLCommandBufferErrorOutOfMemory, 8): it makes memory that is still the
 * GPU's but no longer counted by the runner visible to a test.
 */
static uint64_t emu_memory;		/* under device_lock; 0: no limit */
static uint64_t emu_memory_used;	/* under device_lock */

static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * METAL_EMU_UNIFIED=0: a GPU without unified memory (an Intel Mac's AMD
 * GPU): hasUnifiedMemory NO, and a Managed buffer has two copies, as on
 * such a Mac: the CPU's (contents) and the GPU's (what kernels and blits
 * use). Only didModifyRange: (CPU to GPU, at the call) and a blit's
 * synchronizeResource: (GPU to CPU, when the GPU runs it) copy between
 * them, so a runner that leaves either out reads or computes stale bytes.
 */
static int
unified(void)
{
	const char *u = getenv("METAL_EMU_UNIFIED");

	return u == NULL || strcmp(u, "0") != 0;
}

@implementation EmuBuffer
- (void *)contents
{
	return cpu != NULL ? cpu : bytes;
}
/* "Informs the GPU that the CPU has modified a section of the buffer";
 * managed storage only. */
- (void)didModifyRange:(NSRange)range
{
	if (cpu == NULL)
		return;		/* one copy: nothing to move */
	if (range.location > length || range.length > length - range.location) {
		emu_log("didModifyRange: {%lu, %lu} is outside a buffer of %lu "
		    "bytes", (unsigned long)range.location,
		    (unsigned long)range.length, (unsigned long)length);
		abort();	/* Metal asserts */
	}
	/* "Metal may synchronize more than the specified part" (Apple,
	 * Synchronizing a Managed Resource): the whole CPU copy goes, so a
	 * runner that marks a part of a copy the GPU has written since its
	 * last synchronization loses the GPU's writes, as it may on a Mac. */
	memcpy(bytes, cpu, length);
}
- (void)dealloc
{
	free(cpu);
	munmap(map, maplen);
	pthread_mutex_lock(&device_lock);
	emu_memory_used -= length;
	pthread_mutex_unlock(&device_lock);
	[super dealloc];
}
@end

/* ---- Metal in a child of fork() ---- */

/*
 * Apple's fork(2), CAVEATS: "All APIs, including global data symbols, in any
 * framework or library should be assumed to be unsafe after a fork() unless
 * explicitly documented to be safe or async-signal safe. If you need to use
 * these frameworks in the child process, you must exec." A process that
 * forked is marked here (pthread_atfork) until it execs, which replaces this
 * image and the mark with it; posix_spawn runs no fork handlers. In such a
 * child Metal is refused: MTLCreateSystemDefaultDevice and
 * MTLCopyAllDevices find no device (what a Mac does there is not known; a
 * refusal the runner reports is what it can show), newLibraryWithSource:
 * fails with the text reported from a Mac for a forked daemon
 * (btxchain/btx#51: its compiler service lookup fails), and the other
 * calls that make or run something (on an object made before the fork:
 * emu_forked's callers) stop the process, as nothing says what they would
 * do on a Mac.
 */
static pid_t emu_fork_parent;	/* set in a child of fork(), else 0 */

static void
emu_fork_child(void)
{
	emu_fork_parent = getppid();
}

__attribute__((constructor))
static void
emu_fork_watch(void)
{
	pthread_atfork(NULL, NULL, emu_fork_child);
}

int
emu_forked(const char *call, int stop)
{
	if (emu_fork_parent == 0)
		return 0;
	emu_log("%s in process %ld, a child of fork() (from %ld) that has not "
	    "called exec: %s. Apple's fork(2): \"All APIs ... in any framework "
	    "or library should be assumed to be unsafe after a fork() ... If "
	    "you need to use these frameworks in the child process, you must "
	    "exec.\"", call, (long)getpid(), (long)emu_fork_parent, stop ?
	    "stopping the process" : "refused");
	if (stop)
		abort();
	return 1;
}

/* ---- the device ---- */

@interface EmuDevice : NSObject <MTLDevice> {
	int family;	/* emulated MTLGPUFamilyAppleN: N */
	int index;	/* 0; with METAL_EMU_DEVICES=2, 0 is the low-power one */
	BOOL lowpower;
}
- (instancetype)initAt:(int)i of:(int)n;
@end

static EmuDevice *the_devices[2];	/* not retained: cleared in dealloc */

@implementation EmuDevice

- (instancetype)initAt:(int)i of:(int)n
{
	const char *f;
	int v[3];

	family = emu_family();
	index = i;
	lowpower = n == 2 && i == 0;
	if ((f = getenv("METAL_EMU_MEMORY")) != NULL)
		emu_memory = emu_size(f);
	emu_exec_init();
	emu_macos(v);
	emu_log("TEST HARNESS: an emulated Metal device (%s%.0d%s%s%s) on an "
	    "emulated macOS %d.%d.%d, running kernels on the CPU; not a GPU, "
	    "not Apple's compiler (device %d taken in process %ld)", family ?
	    "MTLGPUFamilyApple" : "MTLGPUFamilyMac2 only", family,
	    emu_metal4() ? ", Metal 4" : "", lowpower ? ", low power" : "",
	    unified() ? "" : ", no unified memory", v[0], v[1], v[2], i,
	    (long)getpid());
	return self;
}

- (NSString *)name
{
	return emu_string("Metal emulator (CPU, test harness%s)",
	    lowpower ? ", low power" : "");
}

/* @property(readonly, getter=isLowPower) BOOL lowPower;  (macOS 10.11)
 * https://developer.apple.com/documentation/metal/mtldevice/islowpower */
- (BOOL)isLowPower
{
	return lowpower;
}

- (BOOL)hasUnifiedMemory
{
	return unified();
}

- (uint64_t)recommendedMaxWorkingSetSize
{
	return emu_memory != 0 ? emu_memory : EMU_WORKING_SET;
}

- (NSUInteger)maxBufferLength
{
	return EMU_MAX_BUFFER;
}

- (BOOL)supportsFamily:(MTLGPUFamily)f
{
	/* MTLGPUFamilyApple1 = 1001 ... MTLGPUFamilyApple10 = 1010 (the
	 * macOS 26 SDK's MTLDevice.h) */
	if (f >= MTLGPUFamilyApple1 && f <= MTLGPUFamilyApple1 + 9)
		return f - MTLGPUFamilyApple1 + 1 <= family;
	/* MTLGPUFamilyMetal4 = 5002 (the macOS 26 SDK's MTLDevice.h) */
	if (f == (MTLGPUFamily)5002)
		return emu_metal4();
	return f == MTLGPUFamilyMac2;
}

- (nullable id <MTLCommandQueue>)newCommandQueue
{
	emu_forked("newCommandQueue", 1);
	return emu_queue_new(self);
}

- (nullable id <MTLBuffer>)newBufferWithLength:(NSUInteger)length
    options:(MTLResourceOptions)options
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), data;
	EmuBuffer *b;
	uint8_t *m;

	emu_forked("newBufferWithLength:options:", 1);
	if (options != MTLResourceStorageModeShared &&
	    options != MTLResourceStorageModeManaged)
		emu_log("newBufferWithLength: options %lu: only shared and "
		    "managed storage are emulated", (unsigned long)options);
	if (length == 0 || length > EMU_MAX_BUFFER)
		return nil;
	/* METAL_EMU_MEMORY: the device's memory, taken until dealloc. */
	pthread_mutex_lock(&device_lock);
	if (emu_memory != 0 && (length > emu_memory ||
	    emu_memory_used > emu_memory - length)) {
		emu_log("newBufferWithLength: %lu bytes: the device has %llu of "
		    "its %llu bytes (METAL_EMU_MEMORY) in buffers still alive",
		    (unsigned long)length, (unsigned long long)emu_memory_used,
		    (unsigned long long)emu_memory);
		pthread_mutex_unlock(&device_lock);
		return nil;
	}
	emu_memory_used += length;
	pthread_mutex_unlock(&device_lock);
	data = (length + page - 1) / page * page;
	m = mmap(NULL, data + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
	    -1, 0);
	if (m != MAP_FAILED &&
	    mprotect(m + page, data, PROT_READ | PROT_WRITE) == -1) {
		munmap(m, data + 2 * page);
		m = MAP_FAILED;
	}
	if (m == MAP_FAILED) {
		pthread_mutex_lock(&device_lock);
		emu_memory_used -= length;
		pthread_mutex_unlock(&device_lock);
		return nil;
	}
	b = (EmuBuffer *)[EmuBuffer alloc];
	/* Managed without unified memory: the CPU's copy, zero-filled. */
	if (options == MTLResourceStorageModeManaged && !unified() &&
	    (b->cpu = calloc(1, length)) == NULL) {
		munmap(m, data + 2 * page);
		b->map = NULL;
		b->length = length;	/* dealloc returns it */
		[b release];
		return nil;
	}
	if (getenv("METAL_EMU_TRACE") != NULL &&
	    strcmp(getenv("METAL_EMU_TRACE"), "1") == 0)
		emu_log("newBufferWithLength: %lu bytes, storage %s%s",
		    (unsigned long)length, options ==
		    MTLResourceStorageModeManaged ? "managed" : "shared",
		    b->cpu != NULL ? " (a CPU and a GPU copy)" : "");
	b->map = m;
	b->maplen = data + 2 * page;
	b->bytes = m + page + data - ((length + 15) & ~(size_t)15);
	b->length = length;
	return b;
}

/*
 * A metallib: only the emulator's own kind, which tests make to stand for
 * one compiled on a Mac (README.md): "MTLB" (a real metallib's magic),
 * "EMU1", the language version it was compiled at (MTLLanguageVersion,
 * 4 bytes little-endian), then its Metal source. A Mac refuses a library of
 * a language version newer than its macOS has with the text quoted below
 * (as reported in other projects' trackers); so does this.
 */
- (nullable id <MTLLibrary>)newLibraryWithData:(dispatch_data_t)data
    error:(__autoreleasing NSError * _Nullable * _Nullable)error
{
	const uint8_t *p;
	size_t n;
	uint32_t lv;
	unsigned version, newest = device_newest_language();

	emu_forked("newLibraryWithData:error:", 1);
	emu_dispatch_bytes(data, &p, &n);
	if (n < 12 || memcmp(p, "MTLBEMU1", 8) != 0) {
		if (error != NULL)
			*error = emu_error(1, "metallib is not supported by the "
			    "Metal emulator: it compiles Metal source only (the "
			    "client sends source when its host has no Metal "
			    "compiler), and the test harness's own metallibs "
			    "(MTLBEMU1)");
		return nil;
	}
	lv = (uint32_t)p[8] | (uint32_t)p[9] << 8 | (uint32_t)p[10] << 16 |
	    (uint32_t)p[11] << 24;
	if ((version = metal_version(lv)) == 0 || version > newest) {
		if (error != NULL)
			*error = emu_error(1, "This library is using language "
			    "version %u.%u which is not supported on this OS",
			    (unsigned)(lv >> 16), (unsigned)(lv & 0xffff));
		return nil;
	}
	if (getenv("METAL_EMU_TRACE") != NULL &&
	    strcmp(getenv("METAL_EMU_TRACE"), "1") == 0)
		emu_log("newLibraryWithData: a metallib of language version "
		    "%u.%u", (unsigned)(lv >> 16), (unsigned)(lv & 0xffff));
	return emu_library((const char *)p + 12, n - 12, version, EMU_MATH_SAFE,
	    error);
}

- (nullable id <MTLLibrary>)newLibraryWithSource:(NSString *)source
    options:(nullable MTLCompileOptions *)options
    error:(__autoreleasing NSError * _Nullable * _Nullable)error
{
	MTLLanguageVersion lv = options != nil ? [options languageVersion] : 0;
	unsigned version = metal_version(lv);
	const char *src = [source UTF8String];

	/*
	 * METAL_EMU_NO_COMPILER=1: Apple's compiler service (MTLCompilerService,
	 * which compiles source over XPC) cannot be reached, as reported for
	 * Metal in launchd daemons: every source compile fails, with the text
	 * those reports quote. The code a Mac gives was not seen here;
	 * MTLLibraryErrorInternal (2) is a guess. Metallibs do not go through
	 * the service and are unaffected. In a child of fork() that has not
	 * exec'd, as reported from a Mac for a forked daemon (btxchain/btx#51).
	 */
	if ((getenv("METAL_EMU_NO_COMPILER") != NULL &&
	    strcmp(getenv("METAL_EMU_NO_COMPILER"), "1") == 0) ||
	    emu_forked("newLibraryWithSource:options:error:", 0)) {
		if (error != NULL)
			*error = emu_error(2, "Unable to reach MTLCompilerService. "
			    "The process is unavailable because the compiler is "
			    "no longer active. Latest invalidation reason: "
			    "Connection init failed at lookup with error 3 - No "
			    "such process");
		return nil;
	}
	if (version == 0) {
		if (error != NULL)
			*error = emu_error(2, "unknown MTLLanguageVersion "
			    "0x%lx", (unsigned long)lv);
		return nil;
	}
	/* A language version newer than this macOS has (METAL_EMU_MACOS).
	 * The text a Mac gives was not seen here; this one is a guess. */
	if (version > device_newest_language()) {
		if (error != NULL)
			*error = emu_error(3, "Metal language version %lu.%lu is "
			    "not supported on this OS and device (macOS %s%s, "
			    "whose newest is %u.%u) [emulated: the text a Mac "
			    "gives is not known]", (unsigned long)(lv >> 16),
			    (unsigned long)(lv & 0xffff),
			    getenv("METAL_EMU_MACOS") ? getenv("METAL_EMU_MACOS") :
			    "26.0", emu_metal4() || newest_language() < 400 ? "" :
			    ", a GPU without the Metal 4 family",
			    device_newest_language() / 100,
			    device_newest_language() / 10 % 10);
		return nil;
	}
	if (getenv("METAL_EMU_TRACE") != NULL &&
	    strcmp(getenv("METAL_EMU_TRACE"), "1") == 0)
		emu_log("newLibraryWithSource: compile options set: %s",
		    options == nil ? "none (nil)" :
		    ((EmuCompileOptions *)options)->setters[0] == '\0' ?
		    "none" : ((EmuCompileOptions *)options)->setters);
	/* Relaxed is fast math that honours infinities and NaNs. The FP32
	 * functions are the C library's either way (README.md). */
	return emu_library(src, strlen(src), version, options == nil ?
	    EMU_MATH_FAST : (int)((EmuCompileOptions *)options)->mathmode,
	    error);
}

- (nullable id <MTLComputePipelineState>)newComputePipelineStateWithFunction:
    (id <MTLFunction>)function options:(MTLPipelineOption)options
    reflection:(MTLAutoreleasedComputePipelineReflection _Nullable * _Nullable)reflection
    error:(__autoreleasing NSError * _Nullable * _Nullable)error
{
	EmuFunction *f = (EmuFunction *)function;
	EmuPipeline *p;

	emu_forked("newComputePipelineStateWithFunction:options:reflection:"
	    "error:", 1);
	if (f == nil) {
		if (error != NULL)
			*error = emu_error(1, "no function");
		return nil;
	}
	p = (EmuPipeline *)[EmuPipeline alloc];
	p->lib = [f->lib retain];
	p->k = f->k;
	p->threaded = emu_lib_threaded(f->lib->lib);
	/* METAL_EMU_NO_REFLECTION=1: none, as the runner must allow for. */
	if (reflection != NULL)
		*reflection = getenv("METAL_EMU_NO_REFLECTION") != NULL ? nil :
		    emu_reflection(f->k, options);
	return p;
}

- (void)dealloc
{
	pthread_mutex_lock(&device_lock);
	if (the_devices[index] == self)
		the_devices[index] = nil;
	pthread_mutex_unlock(&device_lock);
	/* A model of a dual-GPU Mac's: the system powers a GPU while a
	 * process holds its device, so the last release is when this
	 * process lets it power down (tests/test_metal_isolation.py). */
	emu_log("device %d released in process %ld: no reference to it is "
	    "left there", index, (long)getpid());
	[super dealloc];
}

@end

/* Devices listed: 1, or with METAL_EMU_DEVICES=2 two, as on a Mac with an
 * integrated (low-power) and a discrete GPU, the low-power one first. */
static int
device_count(void)
{
	const char *n = getenv("METAL_EMU_DEVICES");

	return n != NULL && strcmp(n, "2") == 0 ? 2 : 1;
}

/* Device i, shared while anyone holds it; retained for the caller. */
static EmuDevice *
device_get(int i)
{
	EmuDevice *d;

	pthread_mutex_lock(&device_lock);
	if (the_devices[i] == nil)
		the_devices[i] = [(EmuDevice *)[EmuDevice alloc] initAt:i
		    of:device_count()];
	else
		[the_devices[i] retain];
	d = the_devices[i];
	pthread_mutex_unlock(&device_lock);
	return d;
}

/*
 * METAL_EMU_GONE=PATH: while PATH exists the GPU is gone for a process
 * that looks for it (an eGPU unplugged): no default device, none listed.
 * A file, so that a test can take it away from a runner's later processes
 * (spawned sessions) and not from the runner.
 */
static int
gone(void)
{
	const char *p = getenv("METAL_EMU_GONE");

	return p != NULL && access(p, F_OK) == 0;
}

/* The default device is the high-power one when there are two. */
id <MTLDevice> _Nullable
MTLCreateSystemDefaultDevice(void)
{
	if (getenv("METAL_EMU_NO_DEFAULT_DEVICE") != NULL)
		return nil;	/* as for a tool that does not link CoreGraphics */
	if (gone() || emu_forked("MTLCreateSystemDefaultDevice", 0))
		return nil;
	return device_get(device_count() - 1);
}

NSArray<id <MTLDevice>> *
MTLCopyAllDevices(void)
{
	EmuDevice *d[2];
	NSArray *all;
	int i, n = gone() || emu_forked("MTLCopyAllDevices", 0) ? 0 :
	    device_count();

	for (i = 0; i < n; i++)
		d[i] = device_get(i);
	all = emu_array((id *)d, (NSUInteger)n);
	for (i = 0; i < n; i++)
		[d[i] release];
	return all;
}
