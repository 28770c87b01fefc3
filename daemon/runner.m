/*
 * runner.m: the Metal backend, be_metal (macOS only).
 *
 * Not yet run on Apple hardware: type-checked on Linux against
 * tests/metal_stub only (tests/test_metal_typecheck.py). Every Metal call
 * below was checked against Apple's documented signature, not against a
 * GPU; .github/workflows/macos.yml is where it first meets one.
 *
 * Shape (models: llama.cpp's ggml-metal, Apple's MetalComputeBasic): one
 * device per process (the runner's own process lets go of it after
 * open's probe, and with thread isolation takes it again for its first
 * session: mtl_dev_get); one command queue per session;
 * pipelines compiled once per process and cached by the SHA-256 of (kind,
 * name, data): across sessions with --isolation thread, while a spawned
 * session's process starts with none and compiles each program again
 * (only macOS's own shader cache, under the user's cache directory, can
 * make that fast: not measured here; tests/mac_report.py times a first
 * and a second session of a tinygrad.llm model in both modes).
 * Metal is not fork-safe, so a session is a process of its own started
 * fresh (BE_ISOLATE_SPAWN, isolate.c: it opens the device itself), or with
 * --isolation thread a thread of one process; the pipeline cache has its
 * own mutex for that case, while a session's command buffers and encoders
 * are only touched by its thread.
 *
 * Ownership: manual retain/release; this file must be compiled without ARC
 * (-fno-objc-arc, clang's default), like ggml-metal. Every object obtained
 * from alloc/new.../...Create.../...Copy... or sent -retain is owned by
 * exactly one field below and released in the matching free, unload,
 * session_close or close; nothing else is kept. Objects that come back
 * autoreleased (command buffers, encoders, NSErrors, strings) live only in
 * the @autoreleasepool of the entry point that made them; the one exception,
 * a session's command buffers, is retained. Session threads are plain
 * pthreads with no pool of their own, so every entry point that may create
 * an autoreleased object opens one around its work.
 *
 * macOS build flags: -fno-objc-arc -framework Metal -framework Foundation
 * -framework CoreGraphics (MTLCreateSystemDefaultDevice needs CoreGraphics
 * linked in a command-line tool; see mtl_open_body).
 */

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <dispatch/dispatch.h>
#ifdef __APPLE__
#include <mach/mach_time.h>
#endif

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "metal_runner.h"
#include "protocol.h"

#if __has_feature(objc_arc)
#error "runner.m manages memory by hand: compile it with -fno-objc-arc"
#endif

/*
 * Pipelined launches and copies (no reply expected) are encoded into one open
 * command buffer per session, committed as soon as the session has
 * processed all the input that has arrived (backend.h, idle: the moment it
 * also sends its replies), when a waiting request needs the results (a
 * waited launch, sync, a CPU-side copy; the session calls sync before it
 * reads or writes buffer contents), or after MTL_BATCH commands. So the GPU
 * starts on a burst's first launches while the rest still crosses the
 * network, as tinygrad's own ops_metal commits each kernel outside graphs,
 * and launches that arrive together still share a command buffer. The cap
 * keeps a command buffer short: on a Mac with a display the GPU watchdog
 * acts per submission, so kernels that each pass on their own could fail
 * together in one long buffer. 16 is a guess to be measured on an M-series
 * Mac; nothing here has been.
 */
#define MTL_BATCH 16

/* Committed command buffers a session tracks: the queue allows at most 64
 * uncompleted ones (newCommandQueue), so more would only block anyway. */
#define MTL_INFLIGHT 64

/* Buffer argument table entries per kernel (Metal feature set tables; the
 * same 31 as tinygrad's setMaxKernelBufferBindCount_). Buffers and integer
 * arguments both take entries. */
#define MTL_MAX_ARGS 31

/* Compiled pipelines no program uses any more that the cache keeps, so a
 * client that reconnects does not compile everything again. */
#define MTL_CACHE_IDLE 256

/*
 * The buffer bindings a kernel declares, from its pipeline's reflection:
 * tinygrad binds its buffers at 0 .. nbufs-1 and its integers (setBytes)
 * after them, so a Tload whose nbufs, nvals or value widths disagree would
 * bind wrong (Apple's validation layer stops the process on that; without
 * it a kernel reads short or past its data).
 */
struct mtl_binds {
	int known;			/* 0: Metal gave no reflection */
	uint32_t mask;			/* bit i: a buffer binding at index i */
	uint32_t used;			/* bit i: one the kernel uses (MTLBinding
					 * used, MTLArgument active): only those
					 * are held to Tload's count and widths */
	NSUInteger size[MTL_MAX_ARGS];	/* its bufferDataSize */
	NSUInteger align[MTL_MAX_ARGS];	/* its bufferAlignment */
};

/* A compiled pipeline, shared by every program loaded with the same key. */
struct mtl_pipe {
	struct mtl_pipe *next;
	uint8_t digest[32];		/* SHA-256 of kind[2] name NUL data */
	id <MTLComputePipelineState> pipe;	/* owned */
	NSUInteger maxthreads;		/* pipe.maxTotalThreadsPerThreadgroup */
	struct mtl_binds binds;		/* what its kernel binds */
	unsigned refs;			/* be_programs using it */
	uint64_t used;			/* when refs last dropped to 0 (LRU) */
};

struct be_program {
	struct mtl_pipe *pipe;		/* holds one of its refs */
	uint16_t nbufs;
	uint16_t nvals;
	uint32_t wide;			/* bit i: value i is 64-bit (Tload.entry) */
	/* Buffer i's offset must be a multiple of align[i] (backend.h). */
	uint32_t align[MTL_MAX_ARGS];
	char name[PROTO_MAX_NAME + 1];
	/* Owned, or nil: "kernel NAME", the label of the compute encoder of
	 * each launch of it alone, by which a failed command buffer's error
	 * names the kernel that faulted (mtl_faulted). */
	NSString *label;
};

struct be_buffer {
	id <MTLBuffer> buf;		/* owned */
	void *ptr;			/* [buf contents], fixed for its life */
	uint64_t size;			/* its length */
	uint64_t useq;			/* the session's last command buffer
					 * that uses it (its seq), 0: none */
	int gpuw;			/* managed storage: the GPU may have
					 * written it since the CPU's copy was
					 * last synchronized (mtl_host_read) */
};

struct be_session {
	id <MTLCommandQueue> queue;	/* owned */
	/* Owned, or nil before macOS 11: an MTLCommandBufferDescriptor with
	 * MTLCommandBufferErrorOptionEncoderExecutionStatus, from which every
	 * command buffer is made, so that a failed one says which encoder
	 * faulted (mtl_faulted). Typed id: the class is macOS 11's. */
	id desc;
	id <MTLCommandBuffer> open;	/* owned; being encoded, not committed */
	size_t nopen;			/* commands encoded into open */
	uint64_t seq;			/* command buffers started, numbered
					 * from 1: open's number, if open */
	id <MTLCommandBuffer> flight[MTL_INFLIGHT];	/* owned; committed */
	uint64_t fseq[MTL_INFLIGHT];	/* their numbers, oldest first */
	size_t nflight;
	/* Profiling: where the GPU times of open and of each flight[i] go
	 * once it completes, or NULL. A profiled command buffer holds one
	 * launch or copy, the only way to time each with GPUStartTime. */
	struct be_span *ospan;
	struct be_span *fspan[MTL_INFLIGHT];
	char err[BE_ERR_MAX];		/* first failure of a committed buffer */
	/* Loads that compiled a pipeline, and loads the cache answered: the
	 * log shows that a second session of a model compiles nothing with
	 * thread isolation, and as much as the first in a spawned process. */
	unsigned compiled, reused;
};

/* owned. Set by open; in the runner's own process (no known info: not a
 * spawned session) released again once open has learnt what Rhello says,
 * and set again, under mtl_lock, by the first session_open (thread
 * isolation): mtl_dev_get. Read-only while any session is open. */
static id <MTLDevice> mtl_dev;
/* The device open was asked for (--device), to take it again. */
static char mtl_devspec[16];
/* The runner's macOS, major, minor, patch (mtl_os_read); read-only after
 * open. */
static int mtl_os[3];
/* No unified memory (an Intel Mac's discrete GPU): buffers are Managed,
 * a CPU and a GPU copy (mtl_host_read, mtl_host_wrote). Read-only after
 * open. */
static int mtl_managed;
/* The device supports MTLGPUFamilyMetal4 (macOS 26: Apple silicon; no
 * Intel Mac's GPU has it), without which MSL 4.0 is not offered or used
 * (mtl_language, mtl_newest). Read-only after open. */
static int mtl_metal4;
static pthread_mutex_t mtl_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mtl_pipe *mtl_cache;	/* under mtl_lock */
static uint64_t mtl_clock;		/* under mtl_lock */
#ifdef __APPLE__
static mach_timebase_info_data_t mtl_timebase;	/* read-only after open */
#endif
/* Set once when the GPU is lost to the process (mtl_cberr); the reason is
 * written, under mtl_lock, before the flag. */
static char mtl_lost_why[BE_ERR_MAX];
static atomic_int mtl_lost_set;

static void mtl_seterr(char *, const char *, ...)
    __attribute__((format(printf, 2, 3)));

/* Cut a message that vsnprintf truncated back to whole UTF-8 characters. */
static void
mtl_trim_utf8(char *s)
{
	size_t i = strlen(s), cont = 0, need;
	unsigned char c;

	while (i > 0 && cont < 3 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) {
		i--;
		cont++;
	}
	if (i == 0)
		return;
	c = (unsigned char)s[i - 1];
	need = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
	if (c >= 0xc0 && cont < need)
		s[i - 1] = '\0';
}

static void
mtl_seterr(char *err, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(err, BE_ERR_MAX, fmt, ap);
	va_end(ap);
	if (n >= BE_ERR_MAX)
		mtl_trim_utf8(err);
}

/*
 * An NSError's localizedDescription into err, never swallowed. For compile
 * errors that is the compiler's own multi-line text, which the client wants
 * verbatim (the one exception to backend.h's one-line messages).
 */
static void
mtl_nserr(char *err, const char *what, NSError *e)
{
	const char *text = NULL;

	if (e != nil)
		text = [[e localizedDescription] UTF8String];
	mtl_seterr(err, "%s: %s", what,
	    text != NULL ? text : "(Metal gave no description)");
}

/*
 * A failed command buffer's error into err, as mtl_nserr. Three codes mean,
 * as Apple documents them, that the process gets no more GPU work done:
 * access revoked ("responsible for too many timeouts or hangs"), not
 * permitted ("doesn't have access to a GPU device"), the device removed.
 * Every later command buffer of every session would fail, so the device
 * is marked lost (mtl_lost): the runner ends each session, saying why, and
 * exits non-zero, for launchd or systemd to start it again. The error's
 * domain is MTLCommandBufferErrorDomain ([cb error]), so its code is one
 * of MTLCommandBufferError's.
 */
/*
 * The label of the encoder that faulted, from a failed command buffer's
 * error (macOS 11: the command buffer was made with EncoderExecutionStatus;
 * userInfo's MTLCommandBufferEncoderInfoErrorKey is "an array of
 * MTLCommandBufferEncoderInfo", one per encoder, each with its label and
 * errorState), as " in LABEL" into out: " in kernel NAME" for a launch,
 * " in a graph of N kernels: ..." for a graph's one pass, " in a copy" for
 * a blit (unlabelled). "" when Metal names no encoder as the cause (a
 * failure injected whole, a GPU already lost, a macOS before 11). So in a
 * batch of MTL_BATCH launches the one whose kernel faulted is named.
 */
static void
mtl_faulted(NSError *e, char *out, size_t len)
{
	NSUInteger i, n;
	const char *l;

	out[0] = '\0';
	if (e == nil)
		return;
	if (@available(macOS 11.0, *)) {
		NSArray<id <MTLCommandBufferEncoderInfo>> *all;
		id <MTLCommandBufferEncoderInfo> x;

		all = [[e userInfo]
		    objectForKey:MTLCommandBufferEncoderInfoErrorKey];
		for (i = 0, n = all != nil ? [all count] : 0; i < n; i++) {
			x = [all objectAtIndex:i];
			if ([x errorState] != MTLCommandEncoderErrorStateFaulted)
				continue;
			l = [x label] != nil ? [[x label] UTF8String] : NULL;
			snprintf(out, len, " in %s", l != NULL && *l != '\0' ?
			    l : "a copy");
			return;
		}
	}
}

static void
mtl_cberr(char *err, const char *what0, id <MTLCommandBuffer> cb)
{
	NSError *e = [cb error];
	const char *name, *text = NULL;
	char what[PROTO_MAX_NAME + 128], in[PROTO_MAX_NAME + 64];

	mtl_faulted(e, in, sizeof(in));
	snprintf(what, sizeof(what), "%s%s", what0, in);
	switch (e != nil ? (NSUInteger)[e code] : 0) {
	case MTLCommandBufferErrorAccessRevoked:
		name = "MTLCommandBufferErrorAccessRevoked (4)";
		break;
	case MTLCommandBufferErrorNotPermitted:
		name = "MTLCommandBufferErrorNotPermitted (7)";
		break;
	case MTLCommandBufferErrorDeviceRemoved:
		name = "MTLCommandBufferErrorDeviceRemoved (11)";
		break;
	default:
		mtl_nserr(err, what, e);
		return;
	}
	text = [[e localizedDescription] UTF8String];
	pthread_mutex_lock(&mtl_lock);
	if (!atomic_load(&mtl_lost_set)) {
		/* Thread isolation: the process is the runner, which exits
		 * for its service manager to restart it; a session process
		 * (isolate.c) ends only its own session. */
		mtl_seterr(mtl_lost_why, "the GPU is lost to this process "
		    "(%s: %s); it ends (with thread isolation the runner "
		    "exits, to be restarted)", name, text != NULL ? text :
		    "(Metal gave no description)");
		atomic_store(&mtl_lost_set, 1);
	}
	pthread_mutex_unlock(&mtl_lock);
	mtl_seterr(err, "%s: %s", what, mtl_lost_why);
}

/* backend.h, lost: the reason the GPU is gone for good, or NULL. */
static const char *
mtl_lost(void)
{
	return atomic_load(&mtl_lost_set) ? mtl_lost_why : NULL;
}

/* ---- the pipeline cache ---- */

/*
 * Programs are found by the SHA-256 of their key (protocol.md): a collision,
 * which would hand one client another client's program, would take a break
 * of SHA-256, so the key bytes themselves need not be kept.
 */
static struct mtl_pipe *
mtl_cache_find(const uint8_t digest[32])
{
	struct mtl_pipe *p;

	for (p = mtl_cache; p != NULL; p = p->next)
		if (memcmp(p->digest, digest, 32) == 0)
			return p;
	return NULL;
}

static void
mtl_pipe_free(struct mtl_pipe *p)
{
	[p->pipe release];
	free(p);
}

/*
 * Drop the least recently used unreferenced pipelines beyond MTL_CACHE_IDLE.
 * A session may still have command buffers in flight that use one: they
 * hold their own reference to it (makeCommandBuffer() keeps "pipeline
 * states" alive until the command buffer completes).
 */
static void
mtl_cache_trim(void)
{
	struct mtl_pipe **pp, **oldest, *victim;
	size_t idle;

	for (;;) {
		idle = 0;
		oldest = NULL;
		for (pp = &mtl_cache; *pp != NULL; pp = &(*pp)->next) {
			if ((*pp)->refs != 0)
				continue;
			idle++;
			if (oldest == NULL || (*pp)->used < (*oldest)->used)
				oldest = pp;
		}
		if (idle <= MTL_CACHE_IDLE)
			return;
		victim = *oldest;
		*oldest = victim->next;
		mtl_pipe_free(victim);
	}
}

/* ---- bindings (reflection) ---- */

/* One buffer binding into b; -1 for an index past the argument table. */
static int
mtl_bind_add(struct mtl_binds *b, NSUInteger index, NSUInteger size,
    NSUInteger align, BOOL used, char *err)
{
	if (index >= MTL_MAX_ARGS) {
		mtl_seterr(err, "the kernel binds a buffer at index %lu; the "
		    "argument table has %d entries", (unsigned long)index,
		    MTL_MAX_ARGS);
		return -1;
	}
	b->mask |= 1u << index;
	if (used)
		b->used |= 1u << index;
	b->size[index] = size;
	/* An alignment of 0 would mean none; offsets are checked with %. */
	b->align[index] = align != 0 ? align : 1;
	return 0;
}

/*
 * -1 for a binding that is not a buffer, naming it: the runner binds
 * buffers only (setBuffer, setBytes), so a kernel that takes threadgroup
 * memory, a texture or a sampler as a parameter would run with it unbound
 * (the validation layer stops the process). tinygrad declares its
 * threadgroup memory inside the kernel, which is no binding. type is an
 * MTLBindingType or MTLArgumentType: the two enums share these values, by
 * number here since either name would need its own availability guard.
 */
static int
mtl_bind_other(NSInteger type, NSUInteger index, char *err)
{
	const char *what;

	switch (type) {
	case 1:		/* ...ThreadgroupMemory */
		what = "threadgroup memory";
		break;
	case 2:		/* ...Texture */
		what = "a texture";
		break;
	case 3:		/* ...Sampler */
		what = "a sampler";
		break;
	default:
		what = "an argument";
		break;
	}
	mtl_seterr(err, "the kernel takes %s (Metal binding type %ld) at index "
	    "%lu as a parameter; the runner binds buffers only", what,
	    (long)type, (unsigned long)index);
	return -1;
}

/*
 * The buffer bindings of a pipeline built with reflection into b, or -1
 * for a kernel with a binding the runner cannot fill. From macOS 13
 * reflection lists MTLBindings (MTLPipelineOptionBindingInfo); before, it
 * lists MTLArguments (MTLPipelineOptionArgumentInfo, since deprecated).
 * The built-in ids are in neither. An MTLArgument's buffer properties are
 * asked of buffers only: Apple makes them a fatal error on any other type.
 */
static int
mtl_binds_read(MTLComputePipelineReflection *refl, struct mtl_binds *b,
    char *err)
{
	NSUInteger i, n;

	memset(b, 0, sizeof(*b));
	if (refl == nil) {
		/* Unknown: mtl_binds_check lets it pass, as before. */
		log_warn("metal: Metal gave no reflection for a pipeline, so "
		    "its kernel's bindings and offsets are not checked");
		return 0;
	}
	b->known = 1;
	if (@available(macOS 13.0, *)) {
		/* mtl_os as well, so that the Metal emulator's
		 * METAL_EMU_MACOS=12.0 takes the older path; on a Mac the two
		 * agree. */
		if (mtl_os[0] >= 13) {
			NSArray<id <MTLBinding>> *all = [refl bindings];
			id <MTLBinding> x;

			for (i = 0, n = [all count]; i < n; i++) {
				x = [all objectAtIndex:i];
				if ([x type] != MTLBindingTypeBuffer)
					return mtl_bind_other([x type],
					    [x index], err);
				if (mtl_bind_add(b, [x index],
				    [(id <MTLBufferBinding>)x bufferDataSize],
				    [(id <MTLBufferBinding>)x bufferAlignment],
				    [x isUsed], err) == -1)
					return -1;
			}
			return 0;
		}
	}
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
	{
		NSArray<MTLArgument *> *all = [refl arguments];
		MTLArgument *a;

		for (i = 0, n = [all count]; i < n; i++) {
			a = [all objectAtIndex:i];
			if ([a type] != MTLArgumentTypeBuffer)
				return mtl_bind_other((NSInteger)[a type],
				    [a index], err);
			if (mtl_bind_add(b, [a index], [a bufferDataSize],
			    [a bufferAlignment], [a isActive], err) == -1)
				return -1;
		}
	}
#pragma clang diagnostic pop
	return 0;
}

/* Build fn's compute pipeline, and read what it binds into b. */
static id <MTLComputePipelineState>
mtl_pipeline(id <MTLFunction> fn, struct mtl_binds *b, char *err)
{
	MTLComputePipelineReflection *refl = nil;
	id <MTLComputePipelineState> pipe;
	MTLPipelineOption opt;
	NSError *e = nil;

	/* Ask for the buffer bindings with their sizes and alignments. */
	if (@available(macOS 13.0, *))
		opt = MTLPipelineOptionBindingInfo |
		    MTLPipelineOptionBufferTypeInfo;
	else {
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
		opt = MTLPipelineOptionArgumentInfo |
		    MTLPipelineOptionBufferTypeInfo;
#pragma clang diagnostic pop
	}
	/* Build the compute pipeline; refl is autoreleased. */
	pipe = [mtl_dev newComputePipelineStateWithFunction:fn options:opt
	    reflection:&refl error:&e];
	if (pipe == nil) {
		mtl_nserr(err, "Metal pipeline creation failed", e);
		return nil;
	}
	if (mtl_binds_read(refl, b, err) == -1) {
		[pipe release];
		return nil;
	}
	return pipe;
}

/*
 * Tload's nbufs, nvals and value widths against what the kernel binds:
 * buffer bindings at exactly 0 .. nbufs+nvals-1, each value's 4 or 8
 * bytes. Called at every load, also of a cached pipeline, as another
 * client may state other bindings for the same kernel. A binding the
 * kernel does not use (reflection's used / active NO) is no reason to
 * refuse: its width is not checked and, past Tload's count, it may stay
 * unbound, as nothing reads it (tinygrad builds its pipelines with no
 * reflection at all). Whether Apple's compiler lists such parameters, and
 * as unused, is what tests/mac_report.py logs from a Mac (not seen yet);
 * on the emulator a parameter its body does not name is unused. A missing
 * index below Tload's count is still refused: a used value after it would
 * be bound one place off.
 */
static int
mtl_binds_check(const struct mtl_binds *b, const struct be_program_desc *d,
    char *err)
{
	unsigned i, n = (unsigned)d->nbufs + d->nvals, k, want;

	if (!b->known)
		return 0;
	k = (unsigned)__builtin_popcount(b->mask);
	if (k != n && (k < n || (b->used & (n >= 32 ? 0 :
	    ~((1u << n) - 1))) != 0)) {
		mtl_seterr(err, "kernel %s binds %u buffers, Tload says %u "
		    "(%u buffers and %u values)", d->name, k, n,
		    (unsigned)d->nbufs, (unsigned)d->nvals);
		return -1;
	}
	for (i = 0; i < n; i++)
		if ((b->mask >> i & 1) == 0) {
			mtl_seterr(err, "kernel %s binds no buffer at index %u; "
			    "Tload's %u arguments go to indices 0 to %u",
			    d->name, i, n, n - 1);
			return -1;
		}
	for (i = 0; i < d->nvals; i++) {
		k = d->nbufs + i;
		want = d->entry >> i & 1 ? 8 : 4;
		if (b->size[k] != want && (b->used >> k & 1)) {
			mtl_seterr(err, "kernel %s: value %u (index %u) is %lu "
			    "bytes in the kernel, Tload says %u", d->name, i, k,
			    (unsigned long)b->size[k], want);
			return -1;
		}
	}
	return 0;
}

/*
 * At -v, what reflection gave for the first MTL_BINDS_LOG kernels this
 * process compiles, and for every later one with a binding its kernel does
 * not use: whether Apple's compiler lists unused parameters, and marks
 * them so, decides how strict mtl_binds_check may be, and only a Mac can
 * say (tests/mac_report.py puts these lines in its report).
 */
#define MTL_BINDS_LOG 8

static void
mtl_binds_log(const char *name, const struct mtl_binds *b)
{
	static atomic_uint logged;
	char line[MTL_MAX_ARGS * 48 + 1];
	size_t k = 0;
	unsigned i;

	if (strcmp(name, "mtl_probe") == 0 || (atomic_fetch_add(&logged, 1) >=
	    MTL_BINDS_LOG && (!b->known || b->used == b->mask)))
		return;
	if (!b->known) {
		log_info("metal: reflection of kernel %s: none", name);
		return;
	}
	line[0] = '\0';
	for (i = 0; i < MTL_MAX_ARGS && k < sizeof(line); i++)
		if (b->mask >> i & 1)
			k += (size_t)snprintf(line + k, sizeof(line) - k,
			    "%s[%u] %lu B align %lu %s", k ? ", " : "", i,
			    (unsigned long)b->size[i], (unsigned long)b->align[i],
			    b->used >> i & 1 ? "used" : "UNUSED");
	log_info("metal: reflection of kernel %s: %u buffer bindings: %s", name,
	    (unsigned)__builtin_popcount(b->mask), line[0] ? line : "none");
}

/* ---- the macOS version ---- */

/* MTLLanguageVersion's values: (major << 16) + minor (MTLLibrary.h),
 * spelled as numbers, as SDKs lack the names of versions newer than
 * themselves and each name is available only from its macOS. */
#define MTL_LANG(major, minor) ((MTLLanguageVersion)((major) << 16 | (minor)))

/*
 * This Mac's macOS version into mtl_os. macOS 26 tells a program built
 * with an SDK older than its own that it is 16 (as Big Sur said 10.16):
 * that is 26 here, the version Metal's compiler has. Rhello reports it
 * (protocol.md: Metal runners' cpu), so that a client sends a metallib
 * only to a runner whose macOS is at least its own.
 */
static void
mtl_os_read(void)
{
	NSOperatingSystemVersion v;

	/* What macOS this is (macOS 10.10). */
	v = [[NSProcessInfo processInfo] operatingSystemVersion];
	mtl_os[0] = (int)v.majorVersion;
	mtl_os[1] = (int)v.minorVersion;
	mtl_os[2] = (int)v.patchVersion;
	if (mtl_os[0] == 16)
		mtl_os[0] = 26;
	else if (mtl_os[0] == 10 && mtl_os[1] == 16) {
		mtl_os[0] = 11;
		mtl_os[1] = 0;
	}
}

/*
 * The language version source is compiled at: the one tinygrad's
 * MetalCompiler pins for this macOS (ops_metal.py: metal4.0 from 26, 3.1
 * from 14, 3.0 on 13, else 2.0), not the newest the system has, so that a
 * kernel means here what it means to tinygrad on the same Mac. Taken from
 * mtl_os, not @available, so that it is the version Rhello reports (and
 * the Metal emulator's METAL_EMU_MACOS can stand for an older Mac). MSL
 * 4.0 is Metal 4's language: only for a device of the Metal 4 family
 * (mtl_metal4). tinygrad pins 4.0 from the macOS alone, which on an Intel
 * Mac with macOS 26 asks for what its GPU lacks; there the runner takes
 * 3.1, tinygrad's version for macOS 14 and 15. What Apple's compiler
 * answers to 4.0 on such a GPU has not been seen (no Mac here).
 */
static MTLLanguageVersion
mtl_language(void)
{
	if (mtl_os[0] >= 26 && mtl_metal4)
		return MTL_LANG(4, 0);
	if (mtl_os[0] >= 14)
		return MTL_LANG(3, 1);
	if (mtl_os[0] == 13)
		return MTL_LANG(3, 0);
	return MTL_LANG(2, 0);
}

/*
 * Rhello.features of a Metal runner: the newest language version this
 * macOS compiles, which a metallib may use ("MAJOR.MINOR"). Apple's
 * MTLLanguageVersion table: 4.0 macOS 26, 3.2 15, 3.1 14, 3.0 13, 2.4 12,
 * 2.3 11, 2.2 10.15; 4.0 only on a device of the Metal 4 family, else
 * 3.2 (macOS 26 on an Intel Mac).
 * https://developer.apple.com/documentation/metal/mtllanguageversion
 */
static void
mtl_newest(char *out, size_t len)
{
	static const struct {
		int macos;
		unsigned major, minor;
	} tab[] = {
		{ 26, 4, 0 }, { 15, 3, 2 }, { 14, 3, 1 }, { 13, 3, 0 },
		{ 12, 2, 4 }, { 11, 2, 3 },
	};
	size_t i;

	for (i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		if (mtl_os[0] >= tab[i].macos && (tab[i].major < 4 ||
		    mtl_metal4)) {
			snprintf(out, len, "%u.%u", tab[i].major, tab[i].minor);
			return;
		}
	snprintf(out, len, "2.2");
}

/*
 * Compile d into a pipeline the caller owns, or nil with err set; for a
 * compile error *longerr gets the compiler's whole text, which does not
 * fit err (the client wants it verbatim, as tinygrad shows it locally).
 * What the kernel binds goes into binds.
 */
static id <MTLComputePipelineState>
mtl_compile(const struct be_program_desc *d, struct mtl_binds *binds,
    char *err, char **longerr)
{
	dispatch_data_t data = nil;
	NSString *src = nil, *name = nil;
	MTLCompileOptions *opt = nil;
	id <MTLLibrary> lib = nil;
	id <MTLFunction> fn = nil;
	id <MTLComputePipelineState> pipe = nil;
	/* One NSError per call: a library that compiles with warnings comes
	 * with an error too (MTLLibraryErrorCompileWarning), which must never
	 * stand for a later call's failure. */
	NSError *e = nil;
	const char *text;

	if (d->kind == PROTO_PROG_METALLIB) {
		/* Wrap the metallib; the default destructor copies the bytes. */
		data = dispatch_data_create(d->data, d->datalen, NULL,
		    DISPATCH_DATA_DESTRUCTOR_DEFAULT);
		if (data == nil) {
			fprintf(stderr, "%s: dispatch_data_create failed\n",
			    __func__);
			mtl_seterr(err, "out of memory for a %zu-byte metallib",
			    d->datalen);
			goto fail;
		}
		/* Load the precompiled library. */
		lib = [mtl_dev newLibraryWithData:data error:&e];
		if (lib == nil) {
			mtl_nserr(err, "metallib rejected", e);
			goto fail;
		}
	} else {
		/* The source is not NUL-terminated: take exactly datalen bytes. */
		src = [[NSString alloc] initWithBytes:d->data
		    length:d->datalen encoding:NSUTF8StringEncoding];
		if (src == nil) {
			mtl_seterr(err, "Metal source is not valid UTF-8");
			goto fail;
		}
		opt = [[MTLCompileOptions alloc] init];
		if (opt == nil) {
			fprintf(stderr, "%s: MTLCompileOptions init failed\n",
			    __func__);
			mtl_seterr(err, "out of memory");
			goto fail;
		}
		/*
		 * The language version tinygrad pins for this macOS
		 * (mtl_language). It comes first: mathMode's default "depends
		 * on the language standard version" (MTLLibrary.h), so the
		 * math settings follow it.
		 */
		opt.languageVersion = mtl_language();
		/*
		 * IEEE-safe math, as tinygrad compiles (-fno-fast-math) unless
		 * METAL_FAST_MATH is set; Metal's own default is fast math.
		 * From macOS 15 that is two settings, both set here rather than
		 * left to the deprecated fastMathEnabled's mapping: mathMode
		 * Safe, and the precise FP32 functions (the header's default
		 * is Fast). SDKs before 15 (no __MAC_15_0) declare neither, and
		 * systems before 15 know only fastMathEnabled.
		 */
#ifdef __MAC_15_0
		if (@available(macOS 15.0, *)) {
			/* No unsafe floating-point optimizations. */
			opt.mathMode = MTLMathModeSafe;
			/* The precise FP32 math functions. */
			opt.mathFloatingPointFunctions =
			    MTLMathFloatingPointFunctionsPrecise;
		} else
#endif
		{
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
			opt.fastMathEnabled = NO;
#pragma clang diagnostic pop
		}
		/* Compile the source. */
		lib = [mtl_dev newLibraryWithSource:src options:opt error:&e];
		if (lib == nil) {
			mtl_nserr(err, "Metal compile failed", e);
			if (e != nil && (text = [[e localizedDescription]
			    UTF8String]) != NULL && (*longerr = malloc(
			    strlen(text) + 32)) != NULL)
				snprintf(*longerr, strlen(text) + 32,
				    "Metal compile failed: %s", text);
			goto fail;
		}
	}

	/* Find the kernel. */
	name = [[NSString alloc] initWithBytes:d->name length:strlen(d->name)
	    encoding:NSUTF8StringEncoding];
	if (name == nil) {
		mtl_seterr(err, "kernel name is not valid UTF-8");
		goto fail;
	}
	fn = [lib newFunctionWithName:name];
	if (fn == nil) {
		mtl_seterr(err, "the program has no kernel named %s", d->name);
		goto fail;
	}

	if ((pipe = mtl_pipeline(fn, binds, err)) != nil)
		mtl_binds_log(d->name, binds);

fail:
	[fn release];
	[lib release];
	[name release];
	[opt release];
	[src release];
	if (data != nil)
		dispatch_release(data);
	return pipe;
}

/* ---- device ---- */

/*
 * Compile a one-line kernel from source (with the standard header, as
 * tinygrad's kernels have it), as ggml-metal compiles its library
 * when it opens the device. Source goes through Apple's compiler service
 * (MTLCompilerService, over XPC), which processes that launchd starts as
 * daemons have been reported unable to reach ("Unable to reach
 * MTLCompilerService ... Connection init failed"): such a runner would
 * advertise source, answer the handshake and fail every kernel. Metallibs do
 * not need the service. Not seen on a Mac by this project: the Metal
 * emulator's METAL_EMU_NO_COMPILER=1 stands in for it. Returns 0, or -1 with
 * the whole error text in *why (malloc'd; the caller frees it).
 */
static int
mtl_probe(char **why)
{
	static const char src[] = "#include <metal_stdlib>\n"
	    "kernel void mtl_probe(device int *out) { out[0] = 1; }\n";
	struct be_program_desc d;
	struct mtl_binds binds;
	id <MTLComputePipelineState> pipe;
	char err[BE_ERR_MAX];

	memset(&d, 0, sizeof(d));
	d.kind = PROTO_PROG_METAL_SOURCE;
	d.name = "mtl_probe";
	d.data = (const uint8_t *)src;
	d.datalen = sizeof(src) - 1;
	*why = NULL;
	/* The same compile, options and pipeline as a client's source. */
	pipe = mtl_compile(&d, &binds, err, why);
	if (pipe != nil) {
		[pipe release];
		return 0;
	}
	if (*why == NULL)
		*why = strdup(err);
	return -1;
}

/* Rhello.arch: the newest Apple GPU family the device supports ("Apple10"
 * ... "Apple1"), else "Mac2". */
static const char *
mtl_family(id <MTLDevice> dev)
{
	static const struct {
		MTLGPUFamily family;
		const char *name;
	} older[] = {
		{ MTLGPUFamilyApple6, "Apple6" },
		{ MTLGPUFamilyApple5, "Apple5" },
		{ MTLGPUFamilyApple4, "Apple4" },
		{ MTLGPUFamilyApple3, "Apple3" },
		{ MTLGPUFamilyApple2, "Apple2" },
		{ MTLGPUFamilyApple1, "Apple1" },
	};
	size_t i;

	/* Newest first: a GPU supports every older Apple family too. The
	 * families newer than supportsFamily: itself (macOS 10.15) are asked
	 * about only on systems whose SDK era knows them. */
	/* MTLGPUFamilyApple10 = 1010 (the macOS 26 SDK's MTLDevice.h; M5),
	 * spelled as its value: SDKs before 26, and the pinned metal-cpp,
	 * lack its name.
	 * https://developer.apple.com/documentation/metal/mtlgpufamily/apple10 */
	if (@available(macOS 26.0, *)) {
		if ([dev supportsFamily:(MTLGPUFamily)1010])
			return "Apple10";
	}
	if (@available(macOS 14.0, *)) {
		if ([dev supportsFamily:MTLGPUFamilyApple9])
			return "Apple9";
	}
	if (@available(macOS 13.0, *)) {
		if ([dev supportsFamily:MTLGPUFamilyApple8])
			return "Apple8";
	}
	if (@available(macOS 11.0, *)) {
		if ([dev supportsFamily:MTLGPUFamilyApple7])
			return "Apple7";
	}
	for (i = 0; i < sizeof(older) / sizeof(older[0]); i++)
		if ([dev supportsFamily:older[i].family])
			return older[i].name;
	return "Mac2";
}

/*
 * Without a system default device: of the devices Metal lists, the first
 * that is not low-power, else the first. A dual-GPU Intel Mac lists its
 * integrated GPU (low-power) before the discrete one, which the system
 * would have chosen. Retained for the caller, or nil.
 */
static id <MTLDevice>
mtl_pick(NSArray<id <MTLDevice>> *all)
{
	NSUInteger i, n = [all count];

	for (i = 0; i < n; i++)
		if (![all objectAtIndex:i].lowPower)
			return [[all objectAtIndex:i] retain];
	return n > 0 ? [[all objectAtIndex:0] retain] : nil;
}

/* The device named by device (NULL or "": the system's default, else a
 * number), retained for the caller, or nil with err set. */
static id <MTLDevice>
mtl_device(const char *device, char *err)
{
	NSArray<id <MTLDevice>> *all = nil;
	id <MTLDevice> dev = nil;
	unsigned long idx = 0;
	const char *p;

	if (device == NULL || *device == '\0') {
		/* Take the system's default GPU. */
		dev = MTLCreateSystemDefaultDevice();
		if (dev == nil) {
			/* A command-line tool gets no default device unless it
			 * links CoreGraphics: choose among those listed. */
			all = MTLCopyAllDevices();
			dev = mtl_pick(all);
		}
		if (dev == nil)
			mtl_seterr(err, "no Metal device found");
	} else {
		/* A decimal index into the devices Metal lists. */
		for (p = device; *p != '\0'; p++) {
			if (*p < '0' || *p > '9' || p - device >= 9) {
				mtl_seterr(err, "Metal device \"%s\" is not a "
				    "device number (0, 1, ...)", device);
				return nil;
			}
			idx = idx * 10 + (unsigned long)(*p - '0');
		}
		all = MTLCopyAllDevices();
		if (idx >= [all count])
			mtl_seterr(err, "Metal device %lu does not exist: this "
			    "Mac has %lu, numbered from 0", idx,
			    (unsigned long)[all count]);
		else
			dev = [[all objectAtIndex:idx] retain];
	}
	[all release];
	return dev;
}

/*
 * The device, taken again if open released it (the runner's own process,
 * thread isolation: its first session). The runner's process releases it
 * after open because with process isolation, the default, it never uses
 * it: each session's spawned process opens its own. Kept, the device
 * object keeps the GPU in use by the runner for as long as it serves, and
 * on a dual-GPU Intel MacBook that keeps the discrete GPU powered (the
 * system powers it while a process holds it: Apple, "GPU selection in
 * macOS"). With thread isolation the first session takes it again and it
 * is kept from then on, with the pipeline cache that belongs to it. The
 * same choice (--device) is made as at open, as a spawned session makes
 * it; a Mac whose GPUs changed in between may give another (the session
 * then uses that one).
 */
static int
mtl_dev_get(char *err)
{
	int r = 0;

	pthread_mutex_lock(&mtl_lock);
	if (mtl_dev == nil && (mtl_dev = mtl_device(mtl_devspec, err)) == nil)
		r = -1;
	pthread_mutex_unlock(&mtl_lock);
	return r;
}

static int
mtl_open_body(struct be_info *info, const char *device,
    const struct be_info *known, char *err)
{
	const char *name;
	char *why = NULL;

	if (device != NULL && strlen(device) >= sizeof(mtl_devspec)) {
		mtl_seterr(err, "Metal device \"%s\" is not a device number "
		    "(0, 1, ...)", device);
		goto fail;
	}
	snprintf(mtl_devspec, sizeof(mtl_devspec), "%s",
	    device != NULL ? device : "");
	if ((mtl_dev = mtl_device(device, err)) == nil)
		goto fail;

#ifdef __APPLE__
	/* Ticks to ns, for the profile clock (mtl_now_ns). */
	if (mach_timebase_info(&mtl_timebase) != 0 || mtl_timebase.denom == 0) {
		mtl_seterr(err, "mach_timebase_info failed");
		goto fail;
	}
#endif
	memset(info, 0, sizeof(*info));
	info->backend = PROTO_BACKEND_METAL;
	info->caps = PROTO_CAP_METALLIB | PROTO_CAP_METAL_SOURCE;
	/* Without unified memory buffers are Managed (mtl_alloc_body). */
	mtl_managed = ![mtl_dev hasUnifiedMemory];
	if (!mtl_managed)
		info->caps |= PROTO_CAP_UNIFIED;
	info->ncores = 1;
	info->memory = [mtl_dev recommendedMaxWorkingSetSize];
	info->maxbuf = [mtl_dev maxBufferLength];
	name = [[mtl_dev name] UTF8String];
	snprintf(info->name, sizeof(info->name), "%s",
	    name != NULL ? name : "Metal device");
	snprintf(info->arch, sizeof(info->arch), "%s", mtl_family(mtl_dev));
	/* Rhello: the macOS and the newest language version it compiles. */
	mtl_os_read();
	/* Whether the device has Metal 4 (MSL 4.0): MTLGPUFamilyMetal4 =
	 * 5002 (the macOS 26 SDK's MTLDevice.h), spelled as its value, as
	 * SDKs before 26 and the pinned metal-cpp lack its name.
	 * https://developer.apple.com/documentation/metal/mtlgpufamily/metal4 */
	mtl_metal4 = 0;
	if (@available(macOS 26.0, *)) {
		if (mtl_os[0] >= 26 &&
		    [mtl_dev supportsFamily:(MTLGPUFamily)5002])
			mtl_metal4 = 1;
	}
	snprintf(info->cpu, sizeof(info->cpu), "%d.%d.%d", mtl_os[0],
	    mtl_os[1], mtl_os[2]);
	mtl_newest(info->features, sizeof(info->features));
	/* Check that source compiles here; offer it only if it does. A
	 * spawned session takes the runner's answer (known) instead of
	 * compiling again: the same binary on the same Mac. */
	if (known != NULL) {
		if (!(known->caps & PROTO_CAP_METAL_SOURCE))
			info->caps &= (uint16_t)~PROTO_CAP_METAL_SOURCE;
	} else if (mtl_probe(&why) == -1) {
		info->caps &= (uint16_t)~PROTO_CAP_METAL_SOURCE;
		log_warn("metal: a one-line test kernel does not compile here "
		    "(%s), so this runner does not offer Metal source (no "
		    "CAP_METAL_SOURCE in Rhello) and serves metallibs only. "
		    "Apple's compiler service, MTLCompilerService, is reported "
		    "out of reach for Metal in a process that launchd starts "
		    "as a LaunchDaemon: run the runner in a logged-in user's "
		    "session instead, or have clients send metallibs compiled "
		    "on a Mac (docs/service.md, \"The Metal compiler service\")",
		    why != NULL ? why : "Metal compile failed: out of memory");
		free(why);
	}
	if (known == NULL) {
		/* The runner's own process: let go of the GPU until a session
		 * of its own needs it (mtl_dev_get); the probe's pipeline is
		 * released already. */
		[mtl_dev release];
		mtl_dev = nil;
	}
	return 0;

fail:
	[mtl_dev release];
	mtl_dev = nil;
	return -1;
}

static int
mtl_open(struct be_info *info, const char *device,
    const struct be_info *known, char *err)
{
	int r;

	@autoreleasepool {
		r = mtl_open_body(info, device, known, err);
	}
	return r;
}

/* At shutdown, after every session is closed. */
static void
mtl_close(void)
{
	struct mtl_pipe *p;

	@autoreleasepool {
		pthread_mutex_lock(&mtl_lock);
		while ((p = mtl_cache) != NULL) {
			mtl_cache = p->next;
			mtl_pipe_free(p);
		}
		pthread_mutex_unlock(&mtl_lock);
		[mtl_dev release];
		mtl_dev = nil;
	}
}

/* ---- command buffers ---- */

/*
 * The clock of GPUStartTime and GPUEndTime, in ns: host time, the
 * mach_absolute_time base (CACurrentMediaTime is it in seconds). Ticks
 * times numer / denom cannot overflow for centuries of uptime (numer 125
 * at 24 MHz on Apple silicon). The emulator build (tests/metal_emulator,
 * Linux) has no mach time: it stamps command buffers with CLOCK_MONOTONIC.
 */
static uint64_t
mtl_now_ns(void)
{
#ifdef __APPLE__
	return mach_absolute_time() * mtl_timebase.numer / mtl_timebase.denom;
#else
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

/* A completed command buffer's GPU times into span (seconds to ns). */
static void
mtl_span(id <MTLCommandBuffer> cb, struct be_span *span)
{
	CFTimeInterval t0 = [cb GPUStartTime], t1 = [cb GPUEndTime];

	if ([cb status] != MTLCommandBufferStatusCompleted || t0 <= 0 ||
	    t1 < t0)
		return;		/* failed work keeps 0, 0 */
	span->start = (uint64_t)(t0 * 1e9);
	span->end = (uint64_t)(t1 * 1e9);
}

/*
 * Release the session's committed command buffers that have finished (all
 * of them, waiting, with waitall), keeping the first failure for sync.
 */
static void
mtl_reap(struct be_session *s, int waitall)
{
	id <MTLCommandBuffer> cb;
	MTLCommandBufferStatus st;
	size_t i, k = 0;

	for (i = 0; i < s->nflight; i++) {
		cb = s->flight[i];
		/* Wait for the GPU to finish it. */
		if (waitall)
			[cb waitUntilCompleted];
		st = [cb status];
		if (st != MTLCommandBufferStatusCompleted &&
		    st != MTLCommandBufferStatusError) {
			s->fspan[k] = s->fspan[i];
			s->fseq[k] = s->fseq[i];
			s->flight[k++] = cb;
			continue;
		}
		if (st == MTLCommandBufferStatusError && s->err[0] == '\0')
			mtl_cberr(s->err, "GPU work failed", cb);
		if (s->fspan[i] != NULL)
			mtl_span(cb, s->fspan[i]);
		[cb release];
	}
	s->nflight = k;
}

/* Submit the open command buffer, if any, without waiting. */
static void
mtl_commit(struct be_session *s)
{
	if (s->open == nil)
		return;
	mtl_reap(s, 0);
	if (s->nflight == MTL_INFLIGHT) {
		/* Wait for the oldest; the queue would block us anyway. */
		[s->flight[0] waitUntilCompleted];
		mtl_reap(s, 0);
	}
	/* Submit the command buffer; the queue runs them in order. */
	[s->open commit];
	s->fspan[s->nflight] = s->ospan;
	s->fseq[s->nflight] = s->seq;
	s->flight[s->nflight++] = s->open;	/* the list takes our reference */
	s->ospan = NULL;
	s->open = nil;
	s->nopen = 0;
}

/* Submit everything and wait until the GPU has done all of it. */
static void
mtl_drain(struct be_session *s)
{
	mtl_commit(s);
	mtl_reap(s, 1);
}

/* The session's open command buffer, started if there is none. */
static id <MTLCommandBuffer>
mtl_cmdbuf(struct be_session *s, char *err)
{
	id <MTLCommandBuffer> cb;

	if (s->open != nil)
		return s->open;
	/* Start a command buffer; it keeps what it uses alive until done. */
	cb = nil;
	if (@available(macOS 11.0, *)) {
		/* With each encoder's status kept for a failure. */
		if (s->desc != nil)
			cb = [s->queue commandBufferWithDescriptor:
			    (MTLCommandBufferDescriptor *)s->desc];
		else
			cb = [s->queue commandBuffer];
	} else
		cb = [s->queue commandBuffer];
	if (cb == nil) {
		fprintf(stderr, "%s: commandBuffer returned nil\n", __func__);
		mtl_seterr(err, "Metal could not create a command buffer");
		return nil;
	}
	s->open = [cb retain];
	s->seq++;
	return cb;
}

/* ---- sessions ---- */

static struct be_session *
mtl_session_open_body(char *err)
{
	struct be_session *s;

	if (mtl_dev_get(err) == -1)
		return NULL;
	if ((s = calloc(1, sizeof(*s))) == NULL) {
		mtl_seterr(err, "out of memory");
		return NULL;
	}
	/*
	 * One command queue per session rather than one shared: a queue runs
	 * its command buffers in order and allows only 64 uncompleted ones
	 * (newCommandQueue), so with a shared queue one client streaming work
	 * would delay every other client's sync and could block their
	 * commandBuffer calls. Separate queues keep sessions independent. A
	 * queue is made once per connection and kept for its whole life, as
	 * Apple advises for queues ("create one or more command queues when
	 * your app launches and then keep them").
	 */
	s->queue = [mtl_dev newCommandQueue];
	if (s->queue == nil) {
		fprintf(stderr, "%s: newCommandQueue returned nil\n", __func__);
		mtl_seterr(err, "Metal could not create a command queue");
		free(s);
		return NULL;
	}
	if (@available(macOS 11.0, *)) {
		MTLCommandBufferDescriptor *d;

		/* Command buffers that keep each encoder's execution status
		 * for their error, so that the text of a failure in a batch
		 * names the kernel (mtl_faulted). Apple presents this as
		 * light enough to leave on in a shipping app (WWDC 2020,
		 * "Debug GPU-side errors in Metal"); its cost here has not
		 * been measured on a Mac. Without it (nil) plain ones. */
		if ((d = [[MTLCommandBufferDescriptor alloc] init]) != nil)
			d.errorOptions =
			    MTLCommandBufferErrorOptionEncoderExecutionStatus;
		s->desc = d;
	}
	return s;
}

static struct be_session *
mtl_session_open(char *err)
{
	struct be_session *s;

	@autoreleasepool {
		s = mtl_session_open_body(err);
	}
	return s;
}

/* The session has freed or abandoned its handles; a pending error is moot. */
static void
mtl_session_close(struct be_session *s)
{
	if (s->compiled + s->reused > 0)
		log_info("metal: a session compiled %u programs and took %u from "
		    "the pipeline cache", s->compiled, s->reused);
	@autoreleasepool {
		mtl_drain(s);
		[s->desc release];
		[s->queue release];
	}
	free(s);
}

/* backend.h, idle: the session has read all that arrived; start its work. */
static void
mtl_idle(struct be_session *s)
{
	if (s->open == nil)
		return;
	@autoreleasepool {
		mtl_commit(s);
	}
}

static int
mtl_sync(struct be_session *s, char *err)
{
	@autoreleasepool {
		mtl_drain(s);
	}
	if (s->err[0] != '\0') {
		memcpy(err, s->err, BE_ERR_MAX);
		s->err[0] = '\0';
		return -1;
	}
	return 0;
}

/* ---- buffers ---- */

static struct be_buffer *
mtl_alloc_body(uint64_t size, char *err)
{
	struct be_buffer *b;

	if ((b = calloc(1, sizeof(*b))) == NULL) {
		mtl_seterr(err, "out of memory");
		return NULL;
	}
	/* Allocate memory CPU and GPU share (zero-filled by Metal), or
	 * without unified memory a CPU and a GPU copy of it (Managed). */
	b->buf = [mtl_dev newBufferWithLength:(NSUInteger)size
	    options:mtl_managed ? MTLResourceStorageModeManaged :
	    MTLResourceStorageModeShared];
	if (b->buf == nil) {
		mtl_seterr(err, "Metal could not allocate %llu bytes",
		    (unsigned long long)size);
		free(b);
		return NULL;
	}
	b->ptr = [b->buf contents];
	b->size = size;
	return b;
}

static struct be_buffer *
mtl_alloc(struct be_session *s, uint64_t size, char *err)
{
	struct be_buffer *b;

	(void)s;
	@autoreleasepool {
		b = mtl_alloc_body(size, err);
	}
	return b;
}

/*
 * Release b once no command buffer of the session that uses it is still to
 * run: commit the open one if it uses b, then wait for those committed up
 * to b's last use (the queue completes them in order). Metal would keep the
 * MTLBuffer alive for them anyway (a command buffer retains what it uses),
 * but the session returns b's reservation when this returns: released at
 * once, the memory would still be the GPU's but no longer counted, and a
 * client freeing and allocating at the limit could make the GPU hold more
 * than Rhello.memory (protocol.md, Tfree). A buffer no pending work uses
 * is released without waiting. A failure of the work waited for stays in
 * s->err for the next request that waits.
 */
static void
mtl_free(struct be_session *s, struct be_buffer *b)
{
	@autoreleasepool {
		if (s->open != nil && b->useq == s->seq)
			mtl_commit(s);
		while (s->nflight > 0 && s->fseq[0] <= b->useq) {
			/* Wait for the GPU to finish the oldest. */
			[s->flight[0] waitUntilCompleted];
			mtl_reap(s, 0);
		}
		[b->buf release];
	}
	free(b);
}

/*
 * Storage mode shared: the pointer is the memory itself. The session calls
 * sync before it touches contents, so no GPU work on it is outstanding
 * (storageModeShared: "Ensure that all changes you schedule on either the
 * CPU or GPU ... complete before accessing that resource on the other").
 * Managed: the pointer is the CPU's copy, which mtl_host_read and
 * mtl_host_wrote keep in step with the GPU's.
 */
static void *
mtl_contents(struct be_buffer *b)
{
	return b->ptr;
}

/*
 * backend.h, host_read: managed storage only. The GPU's writes reach the
 * CPU's copy only through a blit synchronizeResource: ("synchronizes the
 * CPU's copy of a managed resource ... with its GPU copy"), run after the
 * work that wrote it and waited for. A buffer no GPU work has written
 * since is current already.
 */
static int
mtl_host_read_body(struct be_session *s, struct be_buffer *b, char *err)
{
	id <MTLCommandBuffer> cb;
	id <MTLBlitCommandEncoder> blit;

	if (!mtl_managed || !b->gpuw)
		return 0;
	if ((cb = mtl_cmdbuf(s, err)) == nil)
		return -1;
	/* Start a blit pass, after the session's earlier work. */
	blit = [cb blitCommandEncoder];
	if (blit == nil) {
		fprintf(stderr, "%s: blitCommandEncoder returned nil\n",
		    __func__);
		mtl_seterr(err, "Metal could not create a blit encoder");
		return -1;
	}
	/* Copy the GPU's version of the buffer into the CPU's. */
	[blit synchronizeResource:b->buf];
	b->useq = s->seq;
	/* End the blit pass. */
	[blit endEncoding];
	/* Submit, and wait for it and all before it. */
	mtl_drain(s);
	if (s->err[0] != '\0') {
		memcpy(err, s->err, BE_ERR_MAX);
		s->err[0] = '\0';
		return -1;
	}
	b->gpuw = 0;
	return 0;
}

static int
mtl_host_read(struct be_session *s, struct be_buffer *b, char *err)
{
	int r;

	@autoreleasepool {
		r = mtl_host_read_body(s, b, err);
	}
	return r;
}

/* backend.h, host_wrote: managed storage only; tell the GPU which bytes
 * of the CPU's copy changed, which Metal then copies to the GPU's. */
static void
mtl_host_wrote(struct be_buffer *b, uint64_t off, uint64_t count)
{
	if (!mtl_managed || count == 0)
		return;
	@autoreleasepool {
		/* Mark the CPU's changes for the GPU. */
		[b->buf didModifyRange:NSMakeRange((NSUInteger)off,
		    (NSUInteger)count)];
	}
}

static int
mtl_copy_body(struct be_session *s, struct be_buffer *dst, uint64_t dstoff,
    struct be_buffer *src, uint64_t srcoff, uint64_t count,
    struct be_span *span, char *err)
{
	id <MTLCommandBuffer> cb;
	id <MTLBlitCommandEncoder> blit;
	int overlap;

	if (count == 0)
		return 0;
	/* The session checked both ranges, so these sums cannot wrap. */
	overlap = dst == src && dstoff < srcoff + count &&
	    srcoff < dstoff + count;
	if (overlap || (dstoff | srcoff | count) % 4 != 0) {
		/*
		 * A blit between overlapping ranges of one buffer is undefined,
		 * and on macOS blit offsets and size must be multiples of 4.
		 * Wait for the GPU, then memmove on the CPU (managed storage:
		 * from the source's CPU copy, brought up to date first, and
		 * the range written marked for the GPU after).
		 */
		mtl_drain(s);
		if (mtl_host_read_body(s, src, err) == -1 || (dst != src &&
		    count < dst->size && mtl_host_read_body(s, dst, err) == -1))
			return -1;
		if (span != NULL)
			span->start = mtl_now_ns();
		memmove((uint8_t *)dst->ptr + dstoff,
		    (const uint8_t *)src->ptr + srcoff, (size_t)count);
		if (span != NULL)
			span->end = mtl_now_ns();
		mtl_host_wrote(dst, dstoff, count);
		return 0;
	}
	/* Profiling: the copy gets a command buffer of its own. */
	if (span != NULL)
		mtl_commit(s);
	if ((cb = mtl_cmdbuf(s, err)) == nil)
		return -1;
	/* Start a blit pass; it runs after the passes encoded before it. */
	blit = [cb blitCommandEncoder];
	if (blit == nil) {
		fprintf(stderr, "%s: blitCommandEncoder returned nil\n",
		    __func__);
		mtl_seterr(err, "Metal could not create a blit encoder");
		return -1;
	}
	/* Copy on the GPU. */
	[blit copyFromBuffer:src->buf sourceOffset:(NSUInteger)srcoff
	    toBuffer:dst->buf destinationOffset:(NSUInteger)dstoff
	    size:(NSUInteger)count];
	src->useq = dst->useq = s->seq;
	dst->gpuw = 1;
	/* End the blit pass. */
	[blit endEncoding];
	if (span != NULL) {
		s->ospan = span;
		mtl_commit(s);
	} else if (++s->nopen >= MTL_BATCH)
		mtl_commit(s);
	return 0;
}

static int
mtl_copy(struct be_session *s, struct be_buffer *dst, uint64_t dstoff,
    struct be_buffer *src, uint64_t srcoff, uint64_t count,
    struct be_span *span, char *err)
{
	int r;

	@autoreleasepool {
		r = mtl_copy_body(s, dst, dstoff, src, srcoff, count, span,
		    err);
	}
	return r;
}

/* ---- programs ---- */

/* Drop a program's reference to its pipeline. */
static void
mtl_unref(struct mtl_pipe *p)
{
	@autoreleasepool {
		pthread_mutex_lock(&mtl_lock);
		if (--p->refs == 0)
			p->used = ++mtl_clock;
		mtl_cache_trim();
		pthread_mutex_unlock(&mtl_lock);
	}
}

/*
 * Check d's bindings against the pipeline's and take each buffer's
 * alignment: Apple, setBuffer:offset:atIndex:, "for buffers binding to an
 * argument using the device address space, align the offset to the data
 * type's size". Unknown bindings (no reflection) ask for none.
 */
static int
mtl_prog_binds(struct be_program *prog, const struct be_program_desc *d,
    char *err)
{
	const struct mtl_binds *b = &prog->pipe->binds;
	uint16_t i;

	if (mtl_binds_check(b, d, err) == -1)
		return -1;
	/* An unused buffer's offset is no concern of its kernel's. */
	for (i = 0; i < d->nbufs; i++)
		prog->align[i] = b->known && (b->used >> i & 1) ?
		    (uint32_t)b->align[i] : 1;
	return 0;
}

static struct be_program *
mtl_load_body(const struct be_program_desc *d, char *err, char **longerr,
    unsigned *compiled)
{
	struct be_program *prog = NULL;
	struct mtl_pipe *p, *q, *fresh = NULL;
	id <MTLComputePipelineState> pipe;
	uint8_t *key, digest[32];
	size_t namelen, keylen;

	if (d->kind != PROTO_PROG_METALLIB &&
	    d->kind != PROTO_PROG_METAL_SOURCE) {
		mtl_seterr(err, "backend metal does not accept CPU images");
		return NULL;
	}
	if (d->nvals < 32 && d->entry >> d->nvals != 0) {
		mtl_seterr(err, "%s: the value widths (entry 0x%x) name values "
		    "past its %u", d->name, (unsigned)d->entry,
		    (unsigned)d->nvals);
		return NULL;
	}
	if ((unsigned)d->nbufs + d->nvals > MTL_MAX_ARGS) {
		mtl_seterr(err, "%s takes %u arguments; a Metal kernel can "
		    "bind at most %d (buffers and integers together)", d->name,
		    (unsigned)d->nbufs + d->nvals, MTL_MAX_ARGS);
		return NULL;
	}

	if ((prog = calloc(1, sizeof(*prog))) == NULL ||
	    (fresh = calloc(1, sizeof(*fresh))) == NULL) {
		mtl_seterr(err, "out of memory");
		goto fail;
	}
	/* kind[2] name NUL data: the name holds no NUL, so the key is unique. */
	namelen = strlen(d->name);
	keylen = 2 + namelen + 1 + d->datalen;
	if ((key = malloc(keylen)) == NULL) {
		mtl_seterr(err, "out of memory");
		goto fail;
	}
	key[0] = (uint8_t)(d->kind & 0xff);
	key[1] = (uint8_t)(d->kind >> 8);
	memcpy(key + 2, d->name, namelen + 1);
	memcpy(key + 2 + namelen + 1, d->data, d->datalen);
	sha256(key, keylen, digest);
	free(key);

	pthread_mutex_lock(&mtl_lock);
	if ((p = mtl_cache_find(digest)) != NULL)
		p->refs++;
	pthread_mutex_unlock(&mtl_lock);

	if (p == NULL) {
		/* Compile outside the lock; other sessions keep running. */
		if ((pipe = mtl_compile(d, &fresh->binds, err, longerr)) == nil)
			goto fail;
		(*compiled)++;
		fresh->maxthreads = [pipe maxTotalThreadsPerThreadgroup];
		pthread_mutex_lock(&mtl_lock);
		if ((q = mtl_cache_find(digest)) != NULL) {
			/* Another session compiled it meanwhile: use theirs. */
			q->refs++;
			pthread_mutex_unlock(&mtl_lock);
			[pipe release];
			p = q;
		} else {
			memcpy(fresh->digest, digest, sizeof(digest));
			fresh->pipe = pipe;
			fresh->refs = 1;
			fresh->next = mtl_cache;
			mtl_cache = fresh;
			pthread_mutex_unlock(&mtl_lock);
			p = fresh;
			fresh = NULL;
		}
	}

	free(fresh);
	fresh = NULL;
	prog->pipe = p;
	if (mtl_prog_binds(prog, d, err) == -1) {
		mtl_unref(p);
		goto fail;
	}
	prog->nbufs = d->nbufs;
	prog->nvals = d->nvals;
	prog->wide = d->entry;
	snprintf(prog->name, sizeof(prog->name), "%s", d->name);
	/* Its encoders' label; a name that is not UTF-8 leaves none. */
	if ((key = malloc(namelen + 8)) != NULL) {
		snprintf((char *)key, namelen + 8, "kernel %s", d->name);
		prog->label = [[NSString alloc] initWithBytes:key
		    length:namelen + 7 encoding:NSUTF8StringEncoding];
		free(key);
	}
	return prog;

fail:
	free(fresh);
	free(prog);
	return NULL;
}

static struct be_program *
mtl_load(struct be_session *s, const struct be_program_desc *d, char *err,
    char **longerr)
{
	struct be_program *prog;

	@autoreleasepool {
		unsigned compiled = 0;

		prog = mtl_load_body(d, err, longerr, &compiled);
		if (prog != NULL && compiled)
			s->compiled++;
		else if (prog != NULL)
			s->reused++;
	}
	return prog;
}

static void
mtl_unload(struct be_session *s, struct be_program *prog)
{
	(void)s;
	mtl_unref(prog->pipe);
	[prog->label release];
	free(prog);
}

/* backend.h, align: fixed at load, so a launch checks with one % each. */
static const uint32_t *
mtl_align(const struct be_program *prog)
{
	return prog->align;
}

/* ---- launches ---- */

/* Everything Metal would reject, checked before anything is encoded. */
static int
mtl_check(const struct be_launch *l, char *err)
{
	const struct be_program *prog = l->prog;
	uint64_t threads;
	uint16_t i;

	threads = (uint64_t)l->local[0] * l->local[1];
	if (l->local[2] != 0 && threads > UINT64_MAX / l->local[2])
		threads = UINT64_MAX;
	else
		threads *= l->local[2];
	if (threads > prog->pipe->maxthreads) {
		mtl_seterr(err, "%s: local size %ux%ux%u is %llu threads per "
		    "threadgroup; this pipeline allows %lu "
		    "(maxTotalThreadsPerThreadgroup)", prog->name,
		    l->local[0], l->local[1], l->local[2],
		    (unsigned long long)threads,
		    (unsigned long)prog->pipe->maxthreads);
		return -1;
	}
	/* A 32-bit value (int or uint): accept what either can hold. */
	for (i = 0; i < l->nvals; i++)
		if ((prog->wide >> i & 1) == 0 && (l->vals[i] < INT32_MIN ||
		    l->vals[i] > (int64_t)UINT32_MAX)) {
			mtl_seterr(err, "%s: value argument %u is %lld, which "
			    "does not fit the kernel's 32-bit int", prog->name,
			    (unsigned)i, (long long)l->vals[i]);
			return -1;
		}
	return 0;
}

static void
mtl_encode(id <MTLComputeCommandEncoder> enc, const struct be_launch *l)
{
	uint64_t off;
	uint32_t v;
	int64_t v8;
	uint16_t i;

	/* Select the kernel. */
	[enc setComputePipelineState:l->prog->pipe->pipe];
	/* Bind the buffers to entries 0 .. nbufs-1. An offset equal to the
	 * buffer's size (an empty range, which the protocol allows) is
	 * outside the buffer for Metal, whose validation layer stops the
	 * process on it (setBuffer:offset:atIndex: wants offset < length):
	 * such a range is bound at offset 0. The kernel may touch none of
	 * its bytes either way. */
	for (i = 0; i < l->nbufs; i++) {
		off = l->offsets[i] < l->bufs[i]->size ? l->offsets[i] : 0;
		[enc setBuffer:l->bufs[i]->buf offset:(NSUInteger)off atIndex:i];
	}
	/* Copy each integer in after them, with the width the kernel
	 * declares: constant int& (32 bits), or constant long& (64) for a
	 * variable whose range needs it, as tinygrad's ops_metal.py binds
	 * dt.itemsize bytes. A wrong width reads past or short of the
	 * binding (the validation layer reports it). */
	for (i = 0; i < l->nvals; i++) {
		if (l->prog->wide >> i & 1) {
			v8 = l->vals[i];
			[enc setBytes:&v8 length:sizeof(v8)
			    atIndex:(NSUInteger)l->nbufs + i];
			continue;
		}
		v = (uint32_t)l->vals[i];
		[enc setBytes:&v length:sizeof(v)
		    atIndex:(NSUInteger)l->nbufs + i];
	}
	/* Launch global threadgroups of local threads each. */
	[enc dispatchThreadgroups:MTLSizeMake(l->global[0], l->global[1],
	    l->global[2]) threadsPerThreadgroup:MTLSizeMake(l->local[0],
	    l->local[1], l->local[2])];
}

/* The buffers of l are used by the session's open command buffer (mtl_free). */
static void
mtl_used(struct be_session *s, const struct be_launch *l)
{
	uint16_t i;

	for (i = 0; i < l->nbufs; i++) {
		l->bufs[i]->useq = s->seq;
		/* Which a kernel writes is not known: any may be. */
		l->bufs[i]->gpuw = 1;
	}
}

/*
 * The label of a pass of n launches: its kernel's (n 1), else "a graph of
 * N kernels: a, b, ..." (Metal names a faulting encoder, not the dispatch
 * in it that faulted, so a graph's failure names all its kernels, cut at
 * about 400 bytes).
 */
static void
mtl_label(id <MTLComputeCommandEncoder> enc, const struct be_launch *l,
    size_t n)
{
	char buf[448];
	NSString *label;
	size_t i, k;

	if (n == 1) {
		[enc setLabel:l[0].prog->label];
		return;
	}
	k = (size_t)snprintf(buf, sizeof(buf), "a graph of %zu kernels:", n);
	for (i = 0; i < n && k < 400; i++)
		k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%s %s",
		    i > 0 ? "," : "", l[i].prog->name);
	if (i < n && k < sizeof(buf) - 8)
		k += (size_t)snprintf(buf + k, sizeof(buf) - k, ", ...");
	if (k >= sizeof(buf))
		k = sizeof(buf) - 1;
	buf[k] = '\0';
	mtl_trim_utf8(buf);
	label = [[NSString alloc] initWithBytes:buf length:strlen(buf)
	    encoding:NSUTF8StringEncoding];
	[enc setLabel:label];
	[label release];
}

/* Start a compute pass in cb. */
static id <MTLComputeCommandEncoder>
mtl_pass(id <MTLCommandBuffer> cb, char *err)
{
	id <MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];

	if (enc == nil) {
		fprintf(stderr, "%s: computeCommandEncoder returned nil\n",
		    __func__);
		mtl_seterr(err, "Metal could not create a compute encoder");
	}
	return enc;
}

/*
 * Profiling: each launch in a command buffer of its own, whose GPU start
 * and end times are that kernel's. This costs a commit per kernel, and a
 * graph is no longer one submission while the client profiles (protocol.md,
 * Tprofile). Counter sample buffers (MTLCounterSampleBuffer) could time
 * the kernels inside one command buffer, with a pass per kernel where the
 * GPU samples only at pass boundaries; the Metal emulator does not have
 * them, so that is left until it can be tested on a Mac.
 */
static int
mtl_launch_each(struct be_session *s, const struct be_launch *l, size_t n,
    int wait, uint64_t *ns, char *err)
{
	id <MTLCommandBuffer> cb, first = nil, last = nil;
	id <MTLComputeCommandEncoder> enc;
	CFTimeInterval t;
	size_t i;
	int r = -1;

	mtl_commit(s);
	for (i = 0; i < n; i++) {
		/* Start a compute pass for this one launch. */
		if ((cb = mtl_cmdbuf(s, err)) == nil ||
		    (enc = mtl_pass(cb, err)) == nil) {
			/*
			 * Launches 0 .. i-1 are committed, each writing its
			 * times into its span when it completes, but a failed
			 * request keeps no profile records: the session drops
			 * theirs and reuses the places. Wait for them first
			 * (backend.h: a failed launch leaves none of its work
			 * running), so that no span is written afterwards.
			 */
			if (i > 0)
				mtl_drain(s);
			goto done;
		}
		/* Name the pass after its kernel. */
		[enc setLabel:l[i].prog->label];
		mtl_encode(enc, &l[i]);
		mtl_used(s, &l[i]);
		/* End the compute pass. */
		[enc endEncoding];
		if (wait && first == nil)
			first = [cb retain];
		if (wait && i == n - 1)
			last = [cb retain];
		/* Submit it, with where its times go. */
		s->ospan = l[i].span;
		mtl_commit(s);
	}
	if (!wait)
		return 0;
	/* Wait for the GPU; a failure of any of them is this launch's. */
	mtl_drain(s);
	if (s->err[0] != '\0') {
		memcpy(err, s->err, BE_ERR_MAX);
		s->err[0] = '\0';
		goto done;
	}
	t = [last GPUEndTime] - [first GPUStartTime];
	if (ns != NULL && t > 0)
		*ns = (uint64_t)(t * 1e9);
	r = 0;
done:
	[first release];
	[last release];
	return r;
}

static int
mtl_launch_body(struct be_session *s, const struct be_launch *l, size_t n,
    int wait, uint64_t *ns, char *err)
{
	id <MTLCommandBuffer> cb;
	id <MTLComputeCommandEncoder> enc;
	CFTimeInterval t;
	size_t i;

	for (i = 0; i < n; i++)
		if (mtl_check(&l[i], err) == -1)
			return -1;
	if (ns != NULL)
		*ns = 0;
	if (n == 0)
		return 0;
	/*
	 * Time only this work: earlier launches go in their own buffer, and
	 * are waited for first. The caller takes a waited launch as the end
	 * of all the session's work (protocol.md: it is a request that
	 * waits), so an earlier buffer's failure is reported here, and the
	 * launch, whose inputs it may have left wrong, is not run.
	 */
	if (wait) {
		mtl_drain(s);
		if (s->err[0] != '\0') {
			mtl_seterr(err, "not run: earlier work of this session "
			    "failed: %s", s->err);
			s->err[0] = '\0';
			return -1;
		}
	}
	if (l[0].span != NULL)
		return mtl_launch_each(s, l, n, wait, ns, err);
	if ((cb = mtl_cmdbuf(s, err)) == nil)
		return -1;

	/*
	 * Start a compute pass. One pass holds all n launches (a graph): its
	 * encoder "dispatches its compute commands serially", so each launch
	 * sees the writes of the one before, as with a pass per launch, at the
	 * cost of one encoder instead of n.
	 */
	if ((enc = mtl_pass(cb, err)) == nil)
		return -1;
	/* Name the pass after its kernel, or a graph's after its kernels. */
	mtl_label(enc, l, n);
	for (i = 0; i < n; i++) {
		mtl_encode(enc, &l[i]);
		mtl_used(s, &l[i]);
	}
	/* End the compute pass. */
	[enc endEncoding];
	s->nopen += n;

	if (!wait) {
		if (s->nopen >= MTL_BATCH)
			mtl_commit(s);
		return 0;
	}

	s->open = nil;
	s->nopen = 0;
	/* Submit, and wait for the GPU to finish. */
	[cb commit];
	[cb waitUntilCompleted];
	if ([cb status] == MTLCommandBufferStatusError) {
		mtl_cberr(err, "kernel failed on the GPU", cb);
		[cb release];
		return -1;
	}
	/* The GPU's own start and end times, in seconds. */
	t = [cb GPUEndTime] - [cb GPUStartTime];
	if (ns != NULL && t > 0)
		*ns = (uint64_t)(t * 1e9);
	[cb release];
	return 0;
}

static int
mtl_launch(struct be_session *s, const struct be_launch *l, size_t n,
    int wait, uint64_t *ns, char *err)
{
	int r;

	@autoreleasepool {
		r = mtl_launch_body(s, l, n, wait, ns, err);
	}
	return r;
}

const struct backend be_metal = {
	.name = "metal",
	.isolation = BE_ISOLATE_SPAWN,
	.no_fork = 1,	/* Metal is not fork-safe: sessions are spawned */
	.open = mtl_open,
	.close = mtl_close,
	.session_open = mtl_session_open,
	.session_close = mtl_session_close,
	.alloc = mtl_alloc,
	.free = mtl_free,
	.contents = mtl_contents,
	.host_read = mtl_host_read,
	.host_wrote = mtl_host_wrote,
	.copy = mtl_copy,
	.load = mtl_load,
	.unload = mtl_unload,
	.align = mtl_align,
	.launch = mtl_launch,
	.sync = mtl_sync,
	.idle = mtl_idle,
	.clock = mtl_now_ns,
	.lost = mtl_lost,
};
