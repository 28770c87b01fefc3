/*
 * runner.m: the Metal backend, be_metal (macOS only): its table, open and
 * close, and command encoding: copies, launches and graphs. The rest is in
 * files below it (mtl.h lists them): a session's queue and command buffers
 * in mtl_queue.m, buffers in mtl_buffers.m, Tload (compiling, reflection,
 * the pipeline cache) in mtl_programs.m, the device and this macOS in
 * mtl_device.m.
 *
 * Never run on Apple hardware, nor compiled against Apple's SDK. How it is
 * checked instead, all on Linux: the Metal emulator (tests/metal_emulator,
 * a test harness that implements the Metal API used here on the CPU) runs
 * these files unchanged, compiled by clang against tests/metal_stub
 * (make -C daemon emu: metal_runner_emu), under the Metal tests
 * (tests/test_metal_*.py; the conformance suite too, on demand:
 * tests/conformance --backend metal); tests/test_metal_typecheck.py and the
 * metal-cpp and PyObjC checks (tests/metal_api.py) hold each Metal call to
 * Apple's declarations; zig compiles and links them for macOS on arm64 and
 * x86_64 with -Werror (make -C daemon macos-check, tests/test_macos_build.py)
 * against the same stubs, as zig has no Apple SDK. A Mac's SDK, compiler
 * and GPU first meet them in .github/workflows/macos.yml.
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
 * Ownership: manual retain/release; these files must be compiled without
 * ARC (-fno-objc-arc, clang's default), like ggml-metal. Every object
 * obtained from alloc/new.../...Create.../...Copy... or sent -retain is
 * owned by exactly one field (mtl.h's structures, mtl_dev) and released in
 * the matching free, unload, session_close or close; nothing else is kept.
 * Objects that come back autoreleased (command buffers, encoders, NSErrors,
 * strings) live only in the @autoreleasepool of the entry point that made
 * them; the one exception, a session's command buffers, is retained.
 * Session threads are plain pthreads with no pool of their own, so every
 * entry point that may create an autoreleased object opens one around its
 * work.
 *
 * macOS build flags: -fno-objc-arc -framework Metal -framework Foundation
 * -framework CoreGraphics (MTLCreateSystemDefaultDevice needs CoreGraphics
 * linked in a command-line tool; see mtl_device.m's mtl_device).
 */

#include "mtl.h"

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

/* ---- open and close ---- */

static int
mtl_open_body(struct be_info *info, const char *device,
    const struct be_info *known, char *err)
{
	char *why = NULL;

	if (mtl_dev_open(info, device, err) == -1)
		return -1;
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
	@autoreleasepool {
		mtl_cache_clear();
		[mtl_dev release];
		mtl_dev = nil;
	}
}

/* ---- copies ---- */

static int
mtl_copy_body(struct be_session *s, struct be_buffer *dst, uint64_t dstoff,
    struct be_buffer *src, uint64_t srcoff, uint64_t count,
    struct be_span *span, char *err)
{
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
	/* Start a blit pass; it runs after the passes encoded before it. */
	if ((blit = mtl_blit(s, err)) == nil)
		return -1;
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
