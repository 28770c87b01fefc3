/*
 * mtl_buffers.m: the Metal backend's buffers: allocating them (Shared
 * storage on unified memory, Managed without: an Intel Mac's discrete
 * GPU), releasing one once no work of its session uses it, and keeping a
 * Managed buffer's CPU and GPU copies in step. Copies between buffers are
 * commands, in runner.m. runner.m's header describes the backend as a whole.
 */

#include "mtl.h"

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

struct be_buffer *
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
void
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
void *
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
int
mtl_host_read_body(struct be_session *s, struct be_buffer *b, char *err)
{
	id <MTLBlitCommandEncoder> blit;

	if (!mtl_managed || !b->gpuw)
		return 0;
	/* Start a blit pass, after the session's earlier work. */
	if ((blit = mtl_blit(s, err)) == nil)
		return -1;
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

int
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
void
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
