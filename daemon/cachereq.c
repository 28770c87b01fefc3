/*
 * cachereq.c: a session's cache requests: Thave and Twritehash.
 *
 * Thave tells the client which contents the runner holds, and pins them
 * for the session (cache.c), so a Twritehash the client then sends without
 * waiting cannot find its content gone. The content itself is always
 * verified against its hash before it reaches a buffer (cache.c). Twrite
 * with FCACHE, which fills the cache, is in buffers.c.
 */
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "session.h"

int
sess_have(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_have *t = &m->have;
	const uint8_t *body = frame + proto_fixed_size(m->h.type);
	union proto_msg r;
	uint8_t *held;
	int rc;

	/* The frame is here whole, so count is bounded by maxmsg / 32. */
	if ((held = calloc(1, t->count ? t->count : 1)) == NULL) {
		sess_errorf(s, t->h.tag, PROTO_ENOMEM, "out of host memory");
		return sess_fail_reply(s);
	}
	/* A runner without a cache holds nothing. */
	if (s->cache != NULL)
		cache_link_have(s->cache, body, t->count, held);
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RHAVE;
	r.h.tag = t->h.tag;
	r.have.count = t->count;
	rc = sess_reply(s, &r, held, t->count);
	free(held);
	return rc;
}

int
sess_writehash(struct session *s, const union proto_msg *m,
    const uint8_t *frame)
{
	const struct proto_twritehash *t = &m->twritehash;
	struct be_span *span;
	struct buffer *b;
	uint8_t *dst;
	int rc;

	(void)frame;
	if ((dst = sess_write_dst(s, t->h.tag, t->handle, t->offset,
	    t->count, &b)) == NULL)
		return -1;
	if (s->cache == NULL)
		return sess_errorf(s, t->h.tag, PROTO_ENOTCACHED, "this runner "
		    "has no cache");
	/* Profiling: a PROF_WRITE, as for the Twrite it stands for. */
	if ((span = sess_prof_add(s, PROTO_PROF_WRITE, t->h.tag, t->handle, 0,
	    0, t->count)) != NULL)
		span->start = sess_prof_now(s);
	rc = cache_link_get(s->cache, t->hash, t->count, dst, s->err);
	if (span != NULL && rc == 0)
		span->end = sess_prof_now(s);
	else if (span != NULL)
		sess_prof_drop(s, 1);
	switch (rc) {
	case 0:
		s->cache_in += t->count;
		sess_host_wrote(s, b, t->offset, t->count);
		return 0;
	case CACHE_NOTHELD:
		return sess_errorf(s, t->h.tag, PROTO_ENOTCACHED, "%s", s->err);
	case CACHE_BADLEN:
		return sess_errorf(s, t->h.tag, PROTO_EINVAL, "%s", s->err);
	default:
		return sess_errorf(s, t->h.tag, PROTO_ECACHE, "%s", s->err);
	}
}
