/*
 * resume_ring.c: what a session that may be resumed keeps of the replies
 * it sent, to send again those its client missed (resume.c).
 *
 * The bytes it copied as they went out (replies from the output buffer)
 * are in a ring of the last --resume-log of them. The data of a large
 * Rread, sent straight from the buffer, is not copied: it is kept as a
 * reference to the buffer's memory, and copied only when a request that
 * may change a buffer comes before the client acknowledged the reply
 * (Tack). Frames are whole in the stream, and a resume must start at a
 * frame boundary: the ring's oldest whole frame is tracked as it is
 * overwritten, so a resume can walk the headers from there.
 */
#include <sys/types.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resume.h"
#include "session.h"

/* The n bytes at copied count c, from the ring or, past what it holds, from
 * p (the bytes being put): a header never spans the two. */
static void
ring_get(const struct resume *rs, uint64_t c, const uint8_t *p, uint8_t *out,
    size_t n)
{
	size_t at, k;

	if (c >= rs->copied) {
		memcpy(out, p + (c - rs->copied), n);
		return;
	}
	at = (size_t)(c % rs->cap);
	k = (size_t)min64(n, rs->cap - at);
	memcpy(out, rs->ring + at, k);
	memcpy(out + k, rs->ring, n - k);
}

/* Step over the frame at stream offset *at, copied count *c: its size, or
 * 0 if the header there is not a frame the runner sends. An Rread whose
 * data went by reference has only its fixed part in the ring. */
static uint32_t
frame_step(const struct resume *rs, uint64_t *at, uint64_t *c,
    const uint8_t *p)
{
	uint8_t h[PROTO_HDR_SIZE];
	uint32_t size;
	unsigned type;

	if (p == NULL && (*c >= rs->copied || rs->copied - *c > rs->cap))
		return 0;	/* not in the ring */
	ring_get(rs, *c, p, h, sizeof(h));
	size = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
	    (uint32_t)h[3] << 24;
	type = (unsigned)(h[4] | h[5] << 8);
	if (size < PROTO_HDR_SIZE || proto_is_request(type))
		return 0;
	*at += size;
	*c += type == PROTO_RREAD && size > sizeof(struct proto_rread) +
	    PROTO_RREAD_INLINE ? sizeof(struct proto_rread) : size;
	return size;
}

static void
ring_put(struct resume *rs, const uint8_t *p, size_t n)
{
	size_t k, head;

	/* Move the oldest frame past the bytes about to be overwritten. */
	while (rs->copied + n > rs->cap && rs->fcopied < rs->copied + n -
	    rs->cap)
		if (frame_step(rs, &rs->frame, &rs->fcopied, p) == 0) {
			rs->frame = rs->fcopied = UINT64_MAX;	/* none */
			break;
		}
	rs->total += n;
	if (n >= rs->cap) {	/* only the tail fits */
		p += n - rs->cap;
		rs->copied += n - rs->cap;
		n = rs->cap;
	}
	head = (size_t)(rs->copied % rs->cap);
	k = (size_t)min64(n, rs->cap - head);
	memcpy(rs->ring + head, p, k);
	memcpy(rs->ring, p + k, n - k);
	rs->copied += n;
}

static void
ref_drop(struct session *s, unsigned i)
{
	struct resume *rs = s->rs;

	if (rs->refs[i].own != NULL) {
		free(rs->refs[i].own);
		rs->owned -= rs->refs[i].len;
	} else
		s->rread_refs--;
	memmove(rs->refs + i, rs->refs + i + 1, (rs->nrefs - i - 1) *
	    sizeof(rs->refs[0]));
	rs->nrefs--;
}

/* The data of an Rread, sent straight from src: kept by reference. */
static void
ref_add(struct session *s, const uint8_t *src, size_t n)
{
	struct resume *rs = s->rs;

	if (rs->nrefs == PROTO_RESUME_REFS)
		ref_drop(s, 0);
	rs->refs[rs->nrefs].at = rs->total;
	rs->refs[rs->nrefs].len = n;
	rs->refs[rs->nrefs].src = src;
	rs->refs[rs->nrefs].own = NULL;
	rs->nrefs++;
	s->rread_refs++;
	rs->total += n;
}

int
resume_send(struct session *s, const void *a, size_t alen, const void *b,
    size_t blen)
{
	struct resume *rs = s->rs;

	if (rs != NULL) {
		size_t skip = (size_t)min64(rs->skip, alen);
		rs->skip -= skip;
		ring_put(rs, (const uint8_t *)a + skip, alen - skip);
		if (blen > 0)
			ref_add(s, b, blen);
	}
	if (s->linkdown)
		return rs != NULL ? 0 : -1;
	if (net_sendv_all(s->fd, a, alen, b, blen) == 0)
		return 0;
	log_info("session %u: send failed: %s", s->id, strerror(errno));
	/* The bytes are in the ring: they go again on a resume. */
	s->linkdown = 1;
	return rs != NULL ? 0 : -1;
}

void
resume_keep(struct session *s)
{
	struct resume *rs = s->rs;
	unsigned i;

	/* Newest first: a client that did not acknowledge them most likely
	 * misses the last. What does not fit the log's size is let go. */
	for (i = rs->nrefs; i-- > 0;) {
		struct rref *r = &rs->refs[i];
		if (r->own != NULL)
			continue;
		if (rs->owned + r->len > rs->cap ||
		    (r->own = malloc((size_t)r->len)) == NULL) {
			ref_drop(s, i);
			continue;
		}
		memcpy(r->own, r->src, (size_t)r->len);
		rs->owned += r->len;
		s->rread_refs--;
	}
}

void
resume_ring_acked(struct session *s)
{
	struct resume *rs = s->rs;

	while (rs->nrefs > 0 && rs->refs[0].at + rs->refs[0].len <= rs->acked)
		ref_drop(s, 0);
}

/* Send the ring's bytes of copied counts [c0, c1): one or two pieces. */
static int
send_ring(int fd, const struct resume *rs, uint64_t c0, uint64_t c1)
{
	size_t at = (size_t)(c0 % rs->cap), n = (size_t)(c1 - c0);
	size_t k = (size_t)min64(n, rs->cap - at);

	return n == 0 ? 0 : net_sendv_all(fd, rs->ring + at, k, rs->ring,
	    n - k);
}

/*
 * The frames of the stream from byte from on, which the client missed.
 * With fd -1, check that the runner can send them again: from is a frame
 * boundary it still knows, every frame fits maxmsg (the new connection's)
 * and every Rread's data is held; 0, or -1 with the reason in text. With
 * an fd, send them.
 */
int
resume_missed(const struct resume *rs, uint64_t from, uint32_t maxmsg,
    int fd, char *text, size_t len)
{
	uint64_t at = rs->frame, c = rs->fcopied, c0, prev = at, fat, fc;
	uint32_t size;
	unsigned i = 0;

	if (from < rs->acked) {
		snprintf(text, len, "the client says it received %llu bytes of "
		    "replies, but it acknowledged %llu (Tack)",
		    (unsigned long long)from, (unsigned long long)rs->acked);
		return -1;
	}
	if (at == UINT64_MAX || from < at) {
		snprintf(text, len, "the replies the client missed (%llu "
		    "bytes) are no longer held: the runner keeps the last %zu "
		    "bytes it copied (--resume-log)", (unsigned long long)
		    (rs->total - from), rs->cap);
		return -1;
	}
	while (at < from) {
		prev = at;
		if (frame_step(rs, &at, &c, NULL) == 0)
			break;
	}
	if (at != from) {
		snprintf(text, len, "the client says it received %llu bytes of "
		    "replies, which ends inside the frame that starts at byte "
		    "%llu: a client counts whole frames only",
		    (unsigned long long)from, (unsigned long long)prev);
		return -1;
	}
	for (c0 = c; at < rs->total;) {
		fat = at;
		fc = c;
		if ((size = frame_step(rs, &at, &c, NULL)) == 0)
			break;
		if (size > maxmsg) {
			snprintf(text, len, "a reply the client missed is %u "
			    "bytes, larger than the new connection's maxmsg %u",
			    size, maxmsg);
			return -1;
		}
		if (at - fat == c - fc)		/* all in the ring */
			continue;
		/* An Rread whose data is kept by reference, after its
		 * fixed part. */
		while (i < rs->nrefs && rs->refs[i].at < fat + (c - fc))
			i++;
		if (i == rs->nrefs || rs->refs[i].at != fat + (c - fc)) {
			snprintf(text, len, "the data of an Rread the client "
			    "missed (%u bytes) is no longer held: a request "
			    "changed its buffer before the client acknowledged "
			    "it", size);
			return -1;
		}
		if (fd != -1 && (send_ring(fd, rs, c0, c) == -1 ||
		    net_send_all(fd, rs->refs[i].own != NULL ? rs->refs[i].own :
		    rs->refs[i].src, (size_t)rs->refs[i].len) == -1))
			return -1;
		c0 = c;
	}
	if (at != rs->total) {
		snprintf(text, len, "the runner's record of its replies is "
		    "inconsistent at byte %llu", (unsigned long long)at);
		return -1;
	}
	return fd != -1 ? send_ring(fd, rs, c0, c) : 0;
}

void
resume_free(struct session *s)
{
	if (s->rs == NULL)
		return;
	while (s->rs->nrefs > 0)
		ref_drop(s, 0);
	free(s->rs->ring);
	free(s->rs);
	s->rs = NULL;
}
