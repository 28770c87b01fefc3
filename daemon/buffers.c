/*
 * buffers.c: a session's buffers: Talloc, Tfree, Twrite, Tread, Tcopy.
 *
 * Every buffer is reserved against the session's and the runner's memory
 * limits (slots.c) before the backend allocates it, and every offset and
 * count is checked against its size before the backend sees it. Host
 * access to the contents first waits for launched work (settle).
 */
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "session.h"

/* Host access to buffer contents must wait for launched work. */
static int
settle(struct session *s, uint32_t tag)
{
	if (!s->dirty)
		return 0;
	s->dirty = 0;
	if (s->be->sync(s->bs, s->err) == -1)
		return sess_errorf(s, tag, PROTO_EDEVICE, "%s", s->err);
	return 0;
}

/* The host reads b's contents next: the backend brings the device's
 * writes into them first (backend.h, host_read). 0, or -1 with s->err. */
int
sess_host_read(struct session *s, struct buffer *b)
{
	if (s->be->host_read == NULL)
		return 0;
	return s->be->host_read(s->bs, b->b, s->err);
}

/* The host is about to write count bytes into b's contents: a part of
 * them takes the device's writes first (host_read); all of them need not. */
int
sess_host_writes(struct session *s, struct buffer *b, uint64_t count)
{
	return count < b->size ? sess_host_read(s, b) : 0;
}

/* The host wrote count bytes at offset of b's contents. */
void
sess_host_wrote(struct session *s, struct buffer *b, uint64_t offset,
    uint64_t count)
{
	if (s->be->host_wrote != NULL && count > 0)
		s->be->host_wrote(b->b, offset, count);
}

static int
range_ok(uint64_t size, uint64_t offset, uint64_t count)
{
	/* Never offset + count, which can wrap. */
	return offset <= size && count <= size - offset;
}

static struct buffer *
get_buffer(struct session *s, uint32_t tag, uint32_t h)
{
	struct buffer *b = htab_get(&s->bufs, h);

	if (b == NULL)
		sess_errorf(s, tag, PROTO_EHANDLE, "no buffer with handle %u",
		    h);
	return b;
}

int
sess_alloc(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_talloc *t = &m->talloc;
	uint32_t tag = t->h.tag;
	struct buffer *b;

	(void)frame;
	if (htab_get(&s->bufs, t->handle) != NULL)
		return sess_errorf(s, tag, PROTO_EEXIST,
		    "buffer handle %u is already in use", t->handle);
	if (t->size == 0)
		return sess_errorf(s, tag, PROTO_EINVAL, "buffer size is 0");
	if (t->size > s->ctx->info->maxbuf)
		return sess_errorf(s, tag, PROTO_ELIMIT, "buffer of %llu bytes "
		    "is larger than the largest this runner allows, %llu",
		    (unsigned long long)t->size,
		    (unsigned long long)s->ctx->info->maxbuf);
	if (mr_mem_reserve(s->slot, t->size, s->ctx->cfg->session_mem,
	    s->err) == -1)
		return sess_errorf(s, tag, PROTO_ELIMIT, "%s", s->err);
	if (sess_count_handle(s, tag, &s->nbufs, "buffers") == -1)
		goto fail;
	if ((b = calloc(1, sizeof(*b))) == NULL) {
		sess_errorf(s, tag, PROTO_ENOMEM, "out of host memory");
		goto fail_handle;
	}
	if ((b->b = s->be->alloc(s->bs, t->size, s->err)) == NULL) {
		sess_errorf(s, tag, PROTO_ENOMEM, "%s", s->err);
		free(b);
		goto fail_handle;
	}
	b->size = t->size;
	if (htab_put(&s->bufs, t->handle, b) == -1) {
		sess_errorf(s, tag, PROTO_ENOMEM, "out of host memory");
		s->be->free(s->bs, b->b);
		free(b);
		goto fail_handle;
	}
	s->mem += t->size;
	return 0;
fail_handle:
	s->nbufs--;
fail:
	mr_mem_release(s->slot, t->size);
	return -1;
}

static void
free_buffer(struct session *s, struct buffer *b)
{
	s->be->free(s->bs, b->b);
	mr_mem_release(s->slot, b->size);
	s->mem -= b->size;
	s->nbufs--;
	free(b);
}

int
sess_free(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tfree *t = &m->tfree;
	struct buffer *b = htab_del(&s->bufs, t->handle);

	(void)frame;
	if (b == NULL)
		return sess_errorf(s, t->h.tag, PROTO_EHANDLE,
		    "no buffer with handle %u (never allocated or already "
		    "freed)", t->handle);
	free_buffer(s, b);
	return 0;
}

uint8_t *
sess_write_dst(struct session *s, uint32_t tag, uint32_t handle,
    uint64_t offset, uint64_t count, struct buffer **bp)
{
	struct buffer *b = *bp = get_buffer(s, tag, handle);

	if (b != NULL && !range_ok(b->size, offset, count))
		sess_errorf(s, tag, PROTO_ERANGE, "write of %llu bytes at "
		    "offset %llu is outside buffer %u of %llu bytes",
		    (unsigned long long)count, (unsigned long long)offset,
		    handle, (unsigned long long)b->size);
	else if (b != NULL && settle(s, tag) == 0) {
		if (sess_host_writes(s, b, count) == 0)
			return (uint8_t *)s->be->contents(b->b) + offset;
		sess_errorf(s, tag, PROTO_EDEVICE, "%s", s->err);
	}
	return NULL;
}

/* Twrite: the data is still in the socket; it goes straight into the
 * buffer, or is discarded when the request fails. With FCACHE the cache
 * keeps a copy too, named by the hash it computes (cachelink.c). */
int
sess_write(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_twrite *t = &m->twrite;
	struct be_span *span = NULL;
	struct buffer *b;
	uint8_t *dst;
	int rc;

	(void)frame;
	dst = sess_write_dst(s, t->h.tag, t->handle, t->offset, t->count, &b);
	/* Profiling: the time the data took to arrive into the buffer. */
	if (dst != NULL && (span = sess_prof_add(s, PROTO_PROF_WRITE,
	    t->h.tag, t->handle, 0, 0, t->count)) != NULL)
		span->start = sess_prof_now(s);
	rc = sess_take(s, dst, t->count) == -1 ? -2 : 0;
	if (span != NULL)
		span->end = sess_prof_now(s);
	if (rc == 0 && dst != NULL)
		sess_host_wrote(s, b, t->offset, t->count);
	if (rc == 0 && dst != NULL && (t->h.flags & PROTO_FCACHE) &&
	    s->cache != NULL && t->count > 0) {
		cache_link_put(s->cache, dst, t->count);
		s->cache_stored += t->count;
	}
	return rc;
}

static int send_read(struct session *, const struct proto_tread *,
    const uint8_t *);

int
sess_read(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tread *t = &m->tread;
	struct buffer *b = get_buffer(s, t->h.tag, t->handle);
	const uint8_t *src;
	struct be_span *span;
	int rc;

	(void)frame;
	if (b == NULL)
		return sess_fail_reply(s);
	if (!range_ok(b->size, t->offset, t->count)) {
		sess_errorf(s, t->h.tag, PROTO_ERANGE, "read of %llu bytes at "
		    "offset %llu is outside buffer %u of %llu bytes",
		    (unsigned long long)t->count,
		    (unsigned long long)t->offset, t->handle,
		    (unsigned long long)b->size);
		return sess_fail_reply(s);
	}
	if (t->count > s->maxmsg - sizeof(struct proto_rread)) {
		sess_errorf(s, t->h.tag, PROTO_ELIMIT, "read of %llu bytes "
		    "does not fit in one %u-byte frame; split it",
		    (unsigned long long)t->count, s->maxmsg);
		return sess_fail_reply(s);
	}
	if (settle(s, t->h.tag) == -1)
		return sess_fail_reply(s);
	if (sess_host_read(s, b) == -1) {
		sess_errorf(s, t->h.tag, PROTO_EDEVICE, "%s", s->err);
		return sess_fail_reply(s);
	}
	src = (const uint8_t *)s->be->contents(b->b) + t->offset;
	/* Profiling: the time the data took to leave the buffer (into the
	 * output buffer, or the socket for a large read). */
	if ((span = sess_prof_add(s, PROTO_PROF_READ, t->h.tag, t->handle, 0,
	    0, t->count)) != NULL)
		span->start = sess_prof_now(s);
	rc = send_read(s, t, src);
	if (span != NULL)
		span->end = sess_prof_now(s);
	return rc;
}

/* The Rread for t, its data from src. */
static int
send_read(struct session *s, const struct proto_tread *t, const uint8_t *src)
{
	union proto_msg r;
	uint8_t hdr[sizeof(struct proto_rread)];

	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RREAD;
	r.h.tag = t->h.tag;
	r.h.size = (uint32_t)(sizeof(hdr) + t->count);
	r.rread.count = (uint32_t)t->count;
	proto_put(hdr, sizeof(hdr), &r);
	if (sess_drain_errors(s) == -1 ||
	    sess_grow(&s->out, &s->outcap, s->outlen + sizeof(hdr)) == -1)
		return -2;
	memcpy(s->out + s->outlen, hdr, sizeof(hdr));
	s->outlen += sizeof(hdr);
	/* Small reads ride in the output buffer; large ones go straight
	 * from the buffer's memory behind the pending bytes. */
	if (t->count <= PROTO_RREAD_INLINE) {
		if (sess_grow(&s->out, &s->outcap, s->outlen + t->count) == -1)
			return -2;
		memcpy(s->out + s->outlen, src, (size_t)t->count);
		s->outlen += (size_t)t->count;
		return 0;
	}
	if (resume_send(s, s->out, s->outlen, src, (size_t)t->count) == -1)
		return -2;
	s->bytes_out += s->outlen + t->count;
	s->outlen = 0;
	return 0;
}

int
sess_copy(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tcopy *t = &m->tcopy;
	struct buffer *d, *src;
	struct be_span *span;

	(void)frame;
	if ((d = get_buffer(s, t->h.tag, t->dst)) == NULL ||
	    (src = get_buffer(s, t->h.tag, t->src)) == NULL)
		return -1;
	if (!range_ok(d->size, t->dstoff, t->count) ||
	    !range_ok(src->size, t->srcoff, t->count))
		return sess_errorf(s, t->h.tag, PROTO_ERANGE, "copy of %llu "
		    "bytes from buffer %u offset %llu (%llu bytes) to buffer "
		    "%u offset %llu (%llu bytes) is out of range",
		    (unsigned long long)t->count, t->src,
		    (unsigned long long)t->srcoff,
		    (unsigned long long)src->size, t->dst,
		    (unsigned long long)t->dstoff,
		    (unsigned long long)d->size);
	span = sess_prof_add(s, PROTO_PROF_COPY, t->h.tag, t->dst, t->src, 0,
	    t->count);
	if (s->be->copy(s->bs, d->b, t->dstoff, src->b, t->srcoff, t->count,
	    span, s->err) == -1) {
		sess_prof_drop(s, span != NULL);
		return sess_errorf(s, t->h.tag, PROTO_EDEVICE, "%s", s->err);
	}
	s->dirty = 1;
	return 0;
}

void
sess_release_buffer(void *v, void *arg)
{
	free_buffer(arg, v);
}
