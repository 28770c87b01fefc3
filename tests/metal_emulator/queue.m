/*
 * queue.m: command queues, command buffers and encoders, with the checks
 * of Apple's Metal API Validation layer (MTL_DEBUG_LAYER=1) that matter
 * for compute. TEST HARNESS ONLY (see README.md).
 *
 * Each queue has a thread that runs its committed command buffers in the
 * order they were committed, asynchronously to the committing thread, as
 * a GPU does; status, error, GPUStartTime/GPUEndTime and
 * waitUntilCompleted follow Metal's documented semantics, and a queue
 * allows 64 uncompleted command buffers (commandBuffer blocks past that).
 *
 * A misuse the validation layer reports (a binding missing or of the wrong
 * size, an offset outside its buffer or not aligned to its data type, a
 * threadgroup too large, a blit
 * offset not a multiple of 4 on macOS, encoding into a committed buffer)
 * is kept and fails the command buffer with the layer's message when it
 * runs; the real layer stops the process instead, which would end every
 * session of a runner, so failing the one command buffer keeps a test
 * informative. Nothing is repaired: the work is not run. With
 * MTL_DEBUG_LAYER=1 in the environment a violation stops the process at
 * once, as Apple's layer does (its default error mode, assert).
 *
 * Knobs a test sets in the environment to make this device fail as a real
 * one can (README.md, "Injecting failures"): METAL_EMU_FAIL=CODE@N (the Nth
 * command buffer committed fails with MTLCommandBufferError CODE; 4, 7 and
 * 11 mean the GPU is lost to the process, so every later one fails too),
 * METAL_EMU_NIL_COMMAND_BUFFER=N and METAL_EMU_NIL_ENCODER=N (the Nth call
 * returns nil, as the nullable declarations allow), and METAL_EMU_TRACE=1
 * (a line per commit and per completion, numbered across the process).
 */
#import "emu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EMU_MAX_UNCOMPLETED 64	/* newCommandQueue: 64 uncompleted buffers */

/* MTLCommandBufferError (MTLCommandBuffer.h): the codes after which, as
 * Apple documents them, the process gets no more GPU work done. */
#define EMU_ERR_ACCESS_REVOKED 4
#define EMU_ERR_NOT_PERMITTED 7
#define EMU_ERR_DEVICE_REMOVED 11

/* Process-wide counts, for the knobs and the trace. */
static atomic_ulong emu_ncommits, emu_ncmdbufs, emu_nencoders;
/* The code every command buffer now fails with (the GPU is lost), or 0. */
static atomic_long emu_lost;

enum { CMD_DISPATCH = 1, CMD_COPY, CMD_SYNC };

struct emu_cmd {
	int type;
	int enc;			/* its encoder, from 0 in its buffer */
	/* CMD_DISPATCH */
	EmuPipeline *pipe;			/* retained */
	EmuBuffer *bufs[EMU_ARG_TABLE];		/* retained */
	void *bytes[EMU_ARG_TABLE];		/* setBytes copies */
	struct emu_dispatch d;
	/* CMD_COPY; CMD_SYNC: dst */
	EmuBuffer *src, *dst;			/* retained */
	size_t srcoff, dstoff, size;
};

@class EmuCommandBuffer;

@interface EmuQueue : NSObject <MTLCommandQueue> {
@public
	pthread_mutex_t mu;
	pthread_cond_t cv;		/* broadcast on every change */
	pthread_t thread;
	int running;			/* thread started */
	int stop;
	EmuCommandBuffer *head, *tail;	/* committed, not yet run: retained */
	unsigned uncompleted;
	id dev;				/* retained */
}
@end

@interface EmuCommandBuffer : NSObject <MTLCommandBuffer> {
@public
	EmuQueue *queue;		/* retained */
	EmuCommandBuffer *next;
	unsigned long seq;		/* commit number in the process, from 1 */
	_Atomic MTLCommandBufferStatus status;
	NSError *err;			/* retained */
	double t0, t1;
	struct emu_cmd *cmds;
	size_t ncmds, capcmds;
	id encoder;			/* the active EmuEncoder, not retained */
	char invalid[512];		/* the first validation failure */
	int invalid_enc;		/* the encoder it was in, or -1 */
	/* Its encoders, in order: each one's label (retained, or nil), for
	 * MTLCommandBufferEncoderInfo; the errorOptions it was made with. */
	NSString **labels;
	int nenc;
	MTLCommandBufferErrorOption erropts;
}
- (void)invalid:(const char *)fmt, ... __attribute__((format(printf, 1, 2)));
- (struct emu_cmd *)newCommand;
@end

/* What compute and blit encoders share: their command buffer, and the
 * rule that an encoder ends before another starts or the buffer commits. */
@interface EmuEncoder : NSObject {
@public
	EmuCommandBuffer *cb;		/* retained */
	int ended;
	int idx;			/* its place among cb's encoders */
}
+ (id)encoderFor:(EmuCommandBuffer *)cb as:(const char *)what;	/* autoreleased */
- (void)endEncoding;
- (nullable NSString *)label;
- (void)setLabel:(nullable NSString *)label;
@end

@interface EmuComputeEncoder : EmuEncoder <MTLComputeCommandEncoder> {
@public
	EmuPipeline *pipe;		/* retained */
	EmuBuffer *bufs[EMU_ARG_TABLE];	/* retained */
	NSUInteger offsets[EMU_ARG_TABLE];
	void *bytes[EMU_ARG_TABLE];	/* owned copies */
	NSUInteger lens[EMU_ARG_TABLE];
}
@end

@interface EmuBlitEncoder : EmuEncoder <MTLBlitCommandEncoder>
@end

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int
trace(void)
{
	const char *t = getenv("METAL_EMU_TRACE");

	return t != NULL && strcmp(t, "1") == 0;
}

/* Is this, the nth call counted by a knob, the one it names? */
static int
nth_call(const char *knob, atomic_ulong *count)
{
	const char *v = getenv(knob);
	unsigned long n = atomic_fetch_add(count, 1) + 1;

	return v != NULL && strtoul(v, NULL, 10) == n;
}

/* The text Metal gives a command buffer that failed with code, as Apple
 * GPUs word it (the failures an emulated device can be told to have). */
static const char *
fail_text(long code)
{
	switch (code) {
	case 1:
		return "Internal Error (0000000e:Internal Error)";
	case 2:
		return "Caused GPU Timeout Error (00000002:kIOGPUCommandBuffer"
		    "CallbackErrorTimeout)";
	case EMU_ERR_ACCESS_REVOKED:
		return "Ignored (for causing prior/excessive GPU errors) "
		    "(00000004:kIOGPUCommandBufferCallbackErrorSubmissions"
		    "Ignored)";
	case EMU_ERR_NOT_PERMITTED:
		return "Insufficient Permission (to submit GPU work from "
		    "background) (00000006:kIOGPUCommandBufferCallbackError"
		    "BackgroundExecutionNotPermitted)";
	case 8:
		return "Insufficient Memory (00000008:kIOGPUCommandBuffer"
		    "CallbackErrorOutOfMemory)";
	case EMU_ERR_DEVICE_REMOVED:
		return "Device Removed (the GPU is no longer available)";
	}
	return "GPU error";
}

/* METAL_EMU_FAIL=CODE@N: the code command buffer seq fails with, or 0. */
static long
injected_failure(unsigned long seq)
{
	const char *v = getenv("METAL_EMU_FAIL");
	unsigned long n;
	long code;
	char *end;

	if (v == NULL)
		return 0;
	code = strtol(v, &end, 10);
	if (*end != '@' || code <= 0)
		return 0;
	n = strtoul(end + 1, NULL, 10);
	return n == seq ? code : 0;
}

/* METAL_EMU_REVOKE=NAME: a command buffer that dispatches kernel NAME fails
 * with AccessRevoked (4), as when macOS takes the GPU from a process whose
 * work hung; so the GPU is lost to this process only, as on a Mac. */
static long
revoked_by(EmuCommandBuffer *cb, int *enc)
{
	const char *v = getenv("METAL_EMU_REVOKE");
	size_t i;

	for (i = 0; v != NULL && *v != '\0' && i < cb->ncmds; i++)
		if (cb->cmds[i].type == CMD_DISPATCH &&
		    strcmp(cb->cmds[i].pipe->k->name, v) == 0) {
			*enc = cb->cmds[i].enc;
			return EMU_ERR_ACCESS_REVOKED;
		}
	return 0;
}

static void
cmd_release(struct emu_cmd *c)
{
	int i;

	[c->pipe release];
	for (i = 0; i < EMU_ARG_TABLE; i++) {
		[c->bufs[i] release];
		free(c->bytes[i]);
	}
	[c->src release];
	[c->dst release];
	memset(c, 0, sizeof(*c));
}

/* ---- command buffer descriptors (macOS 11) ---- */

/* MTLCommandBufferEncoderInfoErrorKey: a constant whose address is its
 * identity; the emulator's NSDictionary finds keys by identity, and nothing
 * sends the key a message. */
static struct { void *isa; } emu_encoder_info_key;
NSErrorUserInfoKey const MTLCommandBufferEncoderInfoErrorKey =
    (NSErrorUserInfoKey)(void *)&emu_encoder_info_key;

/* A class cluster, as MTLCompileOptions (device.m): the stub declares no
 * ivars. Apple's default errorOptions is None. */
@interface EmuCommandBufferDescriptor : MTLCommandBufferDescriptor {
@public
	MTLCommandBufferErrorOption erropts;
}
@end

@implementation MTLCommandBufferDescriptor
+ (instancetype)alloc
{
	return (id)[EmuCommandBufferDescriptor allocPlain];
}
- (MTLCommandBufferErrorOption)errorOptions
{
	return ((EmuCommandBufferDescriptor *)self)->erropts;
}
- (void)setErrorOptions:(MTLCommandBufferErrorOption)opts
{
	((EmuCommandBufferDescriptor *)self)->erropts = opts;
}
@end

@implementation EmuCommandBufferDescriptor
@end

/* ---- command buffers ---- */

@implementation EmuCommandBuffer

- (void)invalid:(const char *)fmt, ...
{
	char msg[sizeof(invalid) - 64];
	const char *v;
	va_list ap;

	if (invalid[0] != '\0')
		return;
	invalid_enc = encoder != nil ? ((EmuEncoder *)encoder)->idx : -1;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(invalid, sizeof(invalid), "Metal API Validation "
	    "(emulated): %s", msg);
	emu_log("%s", invalid);
	if ((v = getenv("MTL_DEBUG_LAYER")) != NULL && strcmp(v, "1") == 0) {
		/* The real layer's default error mode: a failed assertion. */
		emu_log("MTL_DEBUG_LAYER=1: failed assertion `%s'; stopping the "
		    "process, as Apple's validation layer does", msg);
		abort();
	}
}

- (struct emu_cmd *)newCommand
{
	struct emu_cmd *more;

	if (ncmds == capcmds) {
		capcmds = capcmds ? capcmds * 2 : 8;
		if ((more = realloc(cmds, capcmds * sizeof(*cmds))) == NULL)
			abort();
		cmds = more;
	}
	memset(&cmds[ncmds], 0, sizeof(cmds[ncmds]));
	cmds[ncmds].enc = nenc - 1;	/* made by the latest encoder */
	return &cmds[ncmds++];
}

- (CFTimeInterval)GPUStartTime
{
	return atomic_load(&status) >= MTLCommandBufferStatusCompleted ? t0 : 0;
}

- (CFTimeInterval)GPUEndTime
{
	return atomic_load(&status) >= MTLCommandBufferStatusCompleted ? t1 : 0;
}

- (MTLCommandBufferStatus)status
{
	return atomic_load(&status);
}

- (nullable NSError *)error
{
	if (atomic_load(&status) != MTLCommandBufferStatusError)
		return nil;
	return [[err retain] autorelease];
}

- (void)commit
{
	EmuQueue *q = queue;

	emu_forked("-[MTLCommandBuffer commit]", 1);
	if (atomic_load(&status) != MTLCommandBufferStatusNotEnqueued) {
		/* Metal asserts here, validation layer or not. */
		emu_log("-[MTLCommandBuffer commit]: commit an already "
		    "committed command buffer");
		abort();
	}
	if (encoder != nil)
		[self invalid:"command buffer committed with an encoder that "
		    "has not called endEncoding"];
	[self retain];		/* the queue's reference until it has run */
	seq = atomic_fetch_add(&emu_ncommits, 1) + 1;
	if (trace())
		emu_log("commit %lu (%zu commands)", seq, ncmds);
	pthread_mutex_lock(&q->mu);
	atomic_store(&status, MTLCommandBufferStatusCommitted);
	if (q->tail != nil)
		q->tail->next = self;
	else
		q->head = self;
	q->tail = self;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

- (void)waitUntilCompleted
{
	EmuQueue *q = queue;

	if (atomic_load(&status) == MTLCommandBufferStatusNotEnqueued) {
		/* On a Mac this waits forever. */
		emu_log("-[MTLCommandBuffer waitUntilCompleted] on a command "
		    "buffer that was never committed: it would never return");
		abort();
	}
	pthread_mutex_lock(&q->mu);
	while (atomic_load(&status) < MTLCommandBufferStatusCompleted)
		pthread_cond_wait(&q->cv, &q->mu);
	pthread_mutex_unlock(&q->mu);
}

- (nullable id <MTLComputeCommandEncoder>)computeCommandEncoder
{
	if (nth_call("METAL_EMU_NIL_ENCODER", &emu_nencoders))
		return nil;
	return [EmuComputeEncoder encoderFor:self as:"computeCommandEncoder"];
}

- (nullable id <MTLBlitCommandEncoder>)blitCommandEncoder
{
	if (nth_call("METAL_EMU_NIL_ENCODER", &emu_nencoders))
		return nil;
	return [EmuBlitEncoder encoderFor:self as:"blitCommandEncoder"];
}

- (void)dealloc
{
	EmuQueue *q;
	size_t i;

	if (atomic_load(&status) == MTLCommandBufferStatusNotEnqueued) {
		/* Never committed: it no longer counts against the queue. */
		pthread_mutex_lock(&queue->mu);
		queue->uncompleted--;
		pthread_cond_broadcast(&queue->cv);
		pthread_mutex_unlock(&queue->mu);
	}
	for (i = 0; i < ncmds; i++)
		cmd_release(&cmds[i]);
	free(cmds);
	for (i = 0; i < (size_t)nenc; i++)
		[labels[i] release];
	free(labels);
	[err release];
	q = queue;
	[super dealloc];
	/* Last: if this frees the queue, its log of live objects must no
	 * longer count this command buffer. */
	[q release];
}

@end

/* ---- encoders ---- */

@implementation EmuEncoder

+ (id)encoderFor:(EmuCommandBuffer *)b as:(const char *)what
{
	EmuEncoder *e;

	if (atomic_load(&b->status) != MTLCommandBufferStatusNotEnqueued)
		[b invalid:"%s on a committed command buffer", what];
	if (b->encoder != nil)
		[b invalid:"%s while another encoder is active: call "
		    "endEncoding first", what];
	e = [self alloc];
	e->cb = [b retain];
	b->encoder = e;
	if ((b->labels = realloc(b->labels, (size_t)(b->nenc + 1) *
	    sizeof(*b->labels))) == NULL)
		abort();
	b->labels[b->nenc] = nil;
	e->idx = b->nenc++;
	return [e autorelease];
}

/* @property(nullable, copy, atomic) NSString *label; kept by the command
 * buffer too, which names the encoder in its error (run). The emulator's
 * strings are immutable, so the copy is the string itself. */
- (nullable NSString *)label
{
	return cb->labels[idx];
}

- (void)setLabel:(nullable NSString *)label
{
	[label retain];
	[cb->labels[idx] release];
	cb->labels[idx] = label;
}

- (void)endEncoding
{
	if (ended)
		[cb invalid:"endEncoding called twice"];
	ended = 1;
	if (cb->encoder == self)
		cb->encoder = nil;
}

- (void)dealloc
{
	if (!ended) {
		[cb invalid:"%s released without endEncoding",
		    class_getName(emu_class(self))];
		if (cb->encoder == self)
			cb->encoder = nil;
	}
	[cb release];
	[super dealloc];
}

@end

static int
arg_index_ok(EmuCommandBuffer *cb, NSUInteger index, const char *what)
{
	if (index < EMU_ARG_TABLE)
		return 1;
	[cb invalid:"%s atIndex:%lu: the argument table has %d entries", what,
	    (unsigned long)index, EMU_ARG_TABLE];
	return 0;
}

@implementation EmuComputeEncoder

@dynamic label;	/* EmuEncoder's */

- (void)clearIndex:(NSUInteger)i
{
	[bufs[i] release];
	bufs[i] = nil;
	free(bytes[i]);
	bytes[i] = NULL;
	offsets[i] = lens[i] = 0;
}

- (void)setComputePipelineState:(id <MTLComputePipelineState>)state
{
	[(id)state retain];
	[pipe release];
	pipe = (EmuPipeline *)state;
}

- (void)setBuffer:(nullable id <MTLBuffer>)buffer offset:(NSUInteger)offset
    atIndex:(NSUInteger)index
{
	if (!arg_index_ok(cb, index, "setBuffer:offset:"))
		return;
	/* Checked here, at the call, whether or not the kernel uses the
	 * index: an offset at the end of the buffer is outside it too. */
	if (buffer != nil && offset >= ((EmuBuffer *)buffer)->length)
		[cb invalid:"setBuffer:offset:atIndex:%lu: offset(%lu) must be "
		    "< [buffer length](%lu)", (unsigned long)index,
		    (unsigned long)offset,
		    (unsigned long)((EmuBuffer *)buffer)->length];
	[self clearIndex:index];
	bufs[index] = [(id)buffer retain];
	offsets[index] = offset;
}

- (void)setBytes:(const void *)data length:(NSUInteger)length
    atIndex:(NSUInteger)index
{
	if (!arg_index_ok(cb, index, "setBytes:length:"))
		return;
	[self clearIndex:index];
	/* "Use this method for single-use data smaller than 4 KB." */
	if (length > 4096)
		[cb invalid:"setBytes:length:%lu atIndex:%lu: more than 4 KB",
		    (unsigned long)length, (unsigned long)index];
	if ((bytes[index] = malloc(length ? length : 1)) == NULL)
		abort();
	memcpy(bytes[index], data, length);
	lens[index] = length;
}

/* Everything the validation layer checks at a dispatch; 0 if valid. */
- (int)validate:(MTLSize)grid tg:(MTLSize)tg
{
	const struct metal_emu_kernel *k = pipe->k;
	const struct metal_emu_param *p;
	NSUInteger blen;
	unsigned i;

	if (tg.width * tg.height * tg.depth > EMU_MAX_THREADS) {
		[cb invalid:"dispatchThreadgroups: threadsPerThreadgroup "
		    "%lux%lux%lu is %lu threads, more than the pipeline's "
		    "maxTotalThreadsPerThreadgroup (%d)",
		    (unsigned long)tg.width, (unsigned long)tg.height,
		    (unsigned long)tg.depth,
		    (unsigned long)(tg.width * tg.height * tg.depth),
		    EMU_MAX_THREADS];
		return -1;
	}
	if (tg.width == 0 || tg.height == 0 || tg.depth == 0 ||
	    grid.width == 0 || grid.height == 0 || grid.depth == 0 ||
	    grid.width > UINT32_MAX || grid.height > UINT32_MAX ||
	    grid.depth > UINT32_MAX) {
		[cb invalid:"dispatchThreadgroups: %lux%lux%lu threadgroups "
		    "of %lux%lux%lu threads: a dimension is 0 or too large",
		    (unsigned long)grid.width, (unsigned long)grid.height,
		    (unsigned long)grid.depth, (unsigned long)tg.width,
		    (unsigned long)tg.height, (unsigned long)tg.depth];
		return -1;
	}
	for (i = 0; i < k->nparams; i++) {
		p = &k->params[i];
		/* A parameter the kernel does not use (reflection: used NO)
		 * is not checked: the emulator's reading of Apple's layer,
		 * which validates a dispatch against the pipeline's
		 * reflection; whether a Mac's checks one is not known. */
		if (p->kind == METAL_EMU_PARAM_BUILTIN || !p->used)
			continue;
		if (p->kind == METAL_EMU_PARAM_THREADGROUP) {
			[cb invalid:"Compute Function(%s): threadgroup memory "
			    "at index %d for parameter %u: the Metal emulator "
			    "does not implement setThreadgroupMemoryLength:"
			    "atIndex:", k->name, p->index, i];
			return -1;
		}
		if (bufs[p->index] == nil && bytes[p->index] == NULL) {
			[cb invalid:"Compute Function(%s): missing buffer "
			    "binding at index %d for parameter %u", k->name,
			    p->index, i];
			return -1;
		}
		if (bufs[p->index] != nil) {
			blen = bufs[p->index]->length;
			if (offsets[p->index] >= blen)
				return -1;	/* reported by setBuffer */
			/* "For buffers binding to an argument using the
			 * device address space, align the offset to the
			 * data type's size" (setBuffer:offset:atIndex:). */
			if (p->kind == METAL_EMU_PARAM_POINTER &&
			    p->align > 1 && offsets[p->index] % p->align != 0) {
				[cb invalid:"Compute Function(%s): buffer at "
				    "index %d is bound at offset(%lu), which is "
				    "not a multiple of its data type's size "
				    "(%zu)", k->name, p->index,
				    (unsigned long)offsets[p->index], p->align];
				return -1;
			}
			if (p->kind == METAL_EMU_PARAM_REFERENCE &&
			    blen - offsets[p->index] < p->size) {
				[cb invalid:"Compute Function(%s): argument at "
				    "index %d from a buffer with %lu bytes "
				    "after its offset, but the argument has "
				    "a length(%zu)", k->name, p->index,
				    (unsigned long)(blen - offsets[p->index]),
				    p->size];
				return -1;
			}
		} else if (p->kind == METAL_EMU_PARAM_REFERENCE &&
		    lens[p->index] != p->size) {
			[cb invalid:"Compute Function(%s): setBytes at index "
			    "%d has length(%lu), but the kernel declares that "
			    "argument with a length(%zu)", k->name, p->index,
			    (unsigned long)lens[p->index], p->size];
			return -1;
		}
	}
	return 0;
}

- (void)dispatchThreadgroups:(MTLSize)grid
    threadsPerThreadgroup:(MTLSize)tg
{
	struct emu_cmd *c;
	int i;

	if (ended) {
		[cb invalid:"dispatchThreadgroups after endEncoding"];
		return;
	}
	if (pipe == nil) {
		[cb invalid:"dispatchThreadgroups with no compute pipeline "
		    "state set"];
		return;
	}
	if ([self validate:grid tg:tg] == -1)
		return;
	c = [cb newCommand];
	c->type = CMD_DISPATCH;
	c->pipe = [pipe retain];
	c->d.k = pipe->k;
	c->d.threaded = pipe->threaded;
	c->d.grid[0] = (uint32_t)grid.width;
	c->d.grid[1] = (uint32_t)grid.height;
	c->d.grid[2] = (uint32_t)grid.depth;
	c->d.tg[0] = (uint32_t)tg.width;
	c->d.tg[1] = (uint32_t)tg.height;
	c->d.tg[2] = (uint32_t)tg.depth;
	/* The bindings as they are now: later set... calls do not change
	 * what this dispatch sees. */
	for (i = 0; i < EMU_ARG_TABLE; i++) {
		if (bufs[i] != nil) {
			c->bufs[i] = [bufs[i] retain];
			c->d.args[i].ptr = bufs[i]->bytes + offsets[i];
			c->d.args[i].len = bufs[i]->length - offsets[i];
			c->d.args[i].bound = 1;
		} else if (bytes[i] != NULL) {
			/* Zero-padded: an unused parameter may be declared
			 * wider than what was set (its thunk still reads it). */
			if ((c->bytes[i] = calloc(1, lens[i] < 16 ? 16 :
			    lens[i])) == NULL)
				abort();
			memcpy(c->bytes[i], bytes[i], lens[i]);
			c->d.args[i].ptr = c->bytes[i];
			c->d.args[i].len = lens[i];
			c->d.args[i].bound = 1;
		}
	}
}

- (void)dealloc
{
	NSUInteger i;

	for (i = 0; i < EMU_ARG_TABLE; i++)
		[self clearIndex:i];
	[pipe release];
	[super dealloc];
}

@end

/* ---- the blit encoder ---- */

@implementation EmuBlitEncoder

@dynamic label;	/* EmuEncoder's */

- (void)copyFromBuffer:(id <MTLBuffer>)src sourceOffset:(NSUInteger)srcoff
    toBuffer:(id <MTLBuffer>)dst destinationOffset:(NSUInteger)dstoff
    size:(NSUInteger)size
{
	EmuBuffer *s = (EmuBuffer *)src, *d = (EmuBuffer *)dst;
	struct emu_cmd *c;

	if (ended) {
		[cb invalid:"copyFromBuffer after endEncoding"];
		return;
	}
	/* "In macOS, sourceOffset needs to be a multiple of 4" (and so do
	 * destinationOffset and size). */
	if ((srcoff | dstoff | size) % 4 != 0) {
		[cb invalid:"copyFromBuffer: sourceOffset(%lu), "
		    "destinationOffset(%lu) and size(%lu) must be multiples "
		    "of 4 on macOS", (unsigned long)srcoff,
		    (unsigned long)dstoff, (unsigned long)size];
		return;
	}
	if (srcoff > s->length || size > s->length - srcoff ||
	    dstoff > d->length || size > d->length - dstoff) {
		[cb invalid:"copyFromBuffer: %lu bytes from offset %lu of a "
		    "%lu-byte buffer to offset %lu of a %lu-byte buffer is out "
		    "of bounds", (unsigned long)size, (unsigned long)srcoff,
		    (unsigned long)s->length, (unsigned long)dstoff,
		    (unsigned long)d->length];
		return;
	}
	if (s == d && srcoff < dstoff + size && dstoff < srcoff + size) {
		[cb invalid:"copyFromBuffer: source and destination ranges "
		    "overlap in one buffer"];
		return;
	}
	c = [cb newCommand];
	c->type = CMD_COPY;
	c->src = [s retain];
	c->dst = [d retain];
	c->srcoff = srcoff;
	c->dstoff = dstoff;
	c->size = size;
}

/* "Encodes a command that synchronizes the CPU's copy of a managed
 * resource ... with its GPU copy": runs in order with the rest. A buffer
 * with one copy (shared, or unified memory) has nothing to synchronize. */
- (void)synchronizeResource:(id <MTLResource>)resource
{
	EmuBuffer *b = (EmuBuffer *)resource;
	struct emu_cmd *c;

	if (ended) {
		[cb invalid:"synchronizeResource after endEncoding"];
		return;
	}
	if (b->cpu == NULL)
		return;
	c = [cb newCommand];
	c->type = CMD_SYNC;
	c->dst = [b retain];
}

@end

/* ---- the queue and its thread ---- */

/* MTLCommandEncoderErrorState (macOS 11; MTLCommandBuffer.h): the stub
 * names only Faulted, the one runner.m reads. */
enum { EMU_ENC_COMPLETED = 1, EMU_ENC_AFFECTED = 2, EMU_ENC_PENDING = 3,
	EMU_ENC_FAULTED = 4 };

@interface EmuEncoderInfo : NSObject <MTLCommandBufferEncoderInfo> {
@public
	NSString *label;	/* retained, or nil */
	MTLCommandEncoderErrorState state;
}
@end

@implementation EmuEncoderInfo
- (NSString *)label
{
	return label;
}
- (MTLCommandEncoderErrorState)errorState
{
	return state;
}
- (void)dealloc
{
	[label release];
	[super dealloc];
}
@end

/*
 * The userInfo of a failed command buffer made with
 * MTLCommandBufferErrorOptionEncoderExecutionStatus: under
 * MTLCommandBufferEncoderInfoErrorKey an array with an
 * MTLCommandBufferEncoderInfo per encoder, its label and its state. The
 * encoder faulted (cause, -1 for none known) is Faulted; those before it
 * Completed when ran (the GPU got as far as cause: a kernel's fault), else
 * Pending (nothing ran: validation, a revoked kernel); every other one
 * Pending. A failure with no cause (METAL_EMU_FAIL, a GPU lost before)
 * leaves each Affected. Apple says which state means what, not how a GPU
 * assigns them: this is the emulator's reading. NULL without the option.
 */
NSArray *emu_array(id *objs, NSUInteger n);	/* foundation.m */

static NSDictionary *
encoder_info(EmuCommandBuffer *cb, int cause, int ran)
{
	id infos[64], *all = infos;
	EmuEncoderInfo *x;
	NSArray *a;
	NSDictionary *d;
	int i;

	if (!(cb->erropts & MTLCommandBufferErrorOptionEncoderExecutionStatus))
		return NULL;
	if (cb->nenc > 64 && (all = calloc((size_t)cb->nenc, sizeof(id))) ==
	    NULL)
		abort();
	for (i = 0; i < cb->nenc; i++) {
		x = (EmuEncoderInfo *)[EmuEncoderInfo allocPlain];
		x->label = [cb->labels[i] retain];
		x->state = (MTLCommandEncoderErrorState)(cause < 0 ?
		    EMU_ENC_AFFECTED : i == cause ? EMU_ENC_FAULTED :
		    i < cause && ran ? EMU_ENC_COMPLETED : EMU_ENC_PENDING);
		all[i] = x;
	}
	a = emu_array(all, (NSUInteger)cb->nenc);
	for (i = 0; i < cb->nenc; i++)
		[all[i] release];
	if (all != infos)
		free(all);
	d = emu_dictionary(MTLCommandBufferEncoderInfoErrorKey, a);
	[a release];
	return emu_autorelease(d);
}

/* Run one command buffer: what the GPU does. */
static void
run(EmuCommandBuffer *cb)
{
	char err[1024] = "";
	struct emu_cmd *c;
	long code = 1, lost;	/* MTLCommandBufferErrorInternal */
	size_t i;
	int cause = -1, ran = 0;	/* the encoder that faulted */

	cb->t0 = now();
	if (cb->invalid[0] != '\0') {
		snprintf(err, sizeof(err), "%s", cb->invalid);
		cause = cb->invalid_enc;
	} else if ((lost = atomic_load(&emu_lost)) != 0 ||
	    (code = injected_failure(cb->seq)) != 0 ||
	    (code = revoked_by(cb, &cause)) != 0) {
		/* A lost GPU runs nothing more for this process, and code 4,
		 * 7 or 11 loses it. */
		if (lost != 0)
			code = lost;
		else if (code == EMU_ERR_ACCESS_REVOKED ||
		    code == EMU_ERR_NOT_PERMITTED ||
		    code == EMU_ERR_DEVICE_REMOVED)
			atomic_store(&emu_lost, lost = code);
		snprintf(err, sizeof(err), "Execution of the command buffer was "
		    "aborted due to an error during execution. %s [emulated: "
		    "MTLCommandBufferError %ld, %s]", fail_text(code), code,
		    lost != 0 ? "the GPU is lost to this process" :
		    "injected by METAL_EMU_FAIL or METAL_EMU_REVOKE");
	} else
		code = 1;
	for (i = 0; err[0] == '\0' && i < cb->ncmds; i++) {
		c = &cb->cmds[i];
		if (c->type == CMD_DISPATCH) {
			/* A fault: this encoder's, after the ones before. */
			if (emu_exec(&c->d, err, sizeof(err)) != 0) {
				cause = c->enc;
				ran = 1;
			}
		} else if (c->type == CMD_SYNC)	/* the GPU's copy to the CPU's */
			memcpy(c->dst->cpu, c->dst->bytes, c->dst->length);
		else
			memmove(c->dst->bytes + c->dstoff,
			    c->src->bytes + c->srcoff, c->size);
	}
	cb->t1 = now();
	if (err[0] != '\0')
		cb->err = [emu_error_info(code, encoder_info(cb, cause, ran),
		    "%s", err) retain];
	if (trace())
		emu_log("command buffer %lu %s", cb->seq, err[0] != '\0' ?
		    "failed" : "completed");
	/* Done with the resources: they were kept alive until now. */
	for (i = 0; i < cb->ncmds; i++)
		cmd_release(&cb->cmds[i]);
	cb->ncmds = 0;
}

static void *
queue_thread(void *arg)
{
	EmuQueue *q = arg;
	EmuCommandBuffer *cb;

	emu_exec_thread_init();
	pthread_mutex_lock(&q->mu);
	for (;;) {
		while (q->head == nil && !q->stop)
			pthread_cond_wait(&q->cv, &q->mu);
		if (q->head == nil)
			break;
		cb = q->head;
		if ((q->head = cb->next) == nil)
			q->tail = nil;
		cb->next = nil;
		atomic_store(&cb->status, MTLCommandBufferStatusScheduled);
		pthread_mutex_unlock(&q->mu);
		@autoreleasepool {
			run(cb);
		}
		pthread_mutex_lock(&q->mu);
		atomic_store(&cb->status, cb->err != nil ?
		    MTLCommandBufferStatusError :
		    MTLCommandBufferStatusCompleted);
		q->uncompleted--;
		pthread_cond_broadcast(&q->cv);
		pthread_mutex_unlock(&q->mu);
		[cb release];	/* the reference commit took */
		pthread_mutex_lock(&q->mu);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

@implementation EmuQueue

- (nullable id <MTLCommandBuffer>)commandBufferWithDescriptor:
    (MTLCommandBufferDescriptor *)descriptor
{
	EmuCommandBuffer *cb = (EmuCommandBuffer *)[self commandBuffer];

	if (cb != nil)
		cb->erropts = [descriptor errorOptions];
	return cb;
}

- (nullable id <MTLCommandBuffer>)commandBuffer
{
	EmuCommandBuffer *cb;

	emu_forked("-[MTLCommandQueue commandBuffer]", 1);
	if (nth_call("METAL_EMU_NIL_COMMAND_BUFFER", &emu_ncmdbufs))
		return nil;
	/* Block while 64 are uncompleted, as Metal does. */
	pthread_mutex_lock(&mu);
	while (uncompleted >= EMU_MAX_UNCOMPLETED)
		pthread_cond_wait(&cv, &mu);
	uncompleted++;
	pthread_mutex_unlock(&mu);
	cb = (EmuCommandBuffer *)[EmuCommandBuffer alloc];
	cb->queue = [self retain];
	atomic_init(&cb->status, MTLCommandBufferStatusNotEnqueued);
	return [cb autorelease];
}

- (void)dealloc
{
	char live[1024];

	pthread_mutex_lock(&mu);
	stop = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	if (running)
		pthread_join(thread, NULL);
	pthread_mutex_destroy(&mu);
	pthread_cond_destroy(&cv);
	[dev release];
	[super dealloc];
	/* A runner session ends by releasing its queue, last: what is left
	 * then is shared (the device, cached pipelines) or leaked. */
	if (getenv("METAL_EMU_LIVE") != NULL) {
		emu_live_objects(live, sizeof(live));
		emu_log("command queue released; live objects: %s",
		    live[0] ? live : "none");
	}
}

@end

id <MTLCommandQueue>
emu_queue_new(id <MTLDevice> dev)
{
	EmuQueue *q = (EmuQueue *)[EmuQueue alloc];

	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	q->dev = [(id)dev retain];
	if (pthread_create(&q->thread, NULL, queue_thread, q) != 0) {
		[q release];
		return nil;
	}
	q->running = 1;
	return q;
}
