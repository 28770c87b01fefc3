/*
 * mtl_queue.m: a session's command queue and its command buffers: the
 * session's start and end, the open command buffer that launches and
 * copies are encoded into, committing it, waiting for and releasing
 * committed ones, and what a failed one means (the faulting encoder's
 * label; a GPU lost to the process for good). runner.m's header describes
 * the backend as a whole.
 */

#include "mtl.h"

/* ---- a failed command buffer ---- */

/* Set once when the GPU is lost to the process (mtl_cberr); the reason is
 * written, under mtl_lock, before the flag. */
static char mtl_lost_why[BE_ERR_MAX];
static atomic_int mtl_lost_set;

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
void
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
const char *
mtl_lost(void)
{
	return atomic_load(&mtl_lost_set) ? mtl_lost_why : NULL;
}

/* ---- command buffers ---- */

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
void
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
void
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
void
mtl_drain(struct be_session *s)
{
	mtl_commit(s);
	mtl_reap(s, 1);
}

/* The session's open command buffer, started if there is none. */
id <MTLCommandBuffer>
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

/* A blit pass in the session's open command buffer: it runs after the
 * passes encoded before it. The caller ends it (endEncoding). */
id <MTLBlitCommandEncoder>
mtl_blit(struct be_session *s, char *err)
{
	id <MTLCommandBuffer> cb;
	id <MTLBlitCommandEncoder> blit;

	if ((cb = mtl_cmdbuf(s, err)) == nil)
		return nil;
	/* Start a blit pass. */
	blit = [cb blitCommandEncoder];
	if (blit == nil) {
		fprintf(stderr, "%s: blitCommandEncoder returned nil\n",
		    __func__);
		mtl_seterr(err, "Metal could not create a blit encoder");
	}
	return blit;
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

struct be_session *
mtl_session_open(char *err)
{
	struct be_session *s;

	@autoreleasepool {
		s = mtl_session_open_body(err);
	}
	return s;
}

/* The session has freed or abandoned its handles; a pending error is moot. */
void
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
void
mtl_idle(struct be_session *s)
{
	if (s->open == nil)
		return;
	@autoreleasepool {
		mtl_commit(s);
	}
}

int
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
