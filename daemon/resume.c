/*
 * resume.c: sessions that survive a dropped link.
 *
 * A session that asked for a resume key (Tresumekey) does not end when
 * its connection fails: it waits up to --resume-grace seconds for its
 * client to come back on a new connection and prove, with an HMAC under
 * the key over the new connection's fresh nonce, that it is the client
 * that holds the key (Tresume). Both sides count: the runner the requests
 * it has processed since the handshake and the bytes of replies it has
 * sent, the client the requests it has sent and the bytes of whole
 * replies it has received. The runner processes a connection's requests
 * one at a time and in order, so "processed N" says exactly which of the
 * client's requests to send again, and "received B" which reply bytes.
 * Nothing is run twice: a request is counted once its handler returned
 * (a Twrite whose data was cut off is not, and comes again whole).
 *
 * What the runner keeps for that: the count, and the bytes it sent since
 * the key, as far back as it can. The bytes it copied as they went out
 * (replies from the output buffer) are in a ring of the last --resume-log
 * of them. The data of a large Rread, sent straight from the buffer, is
 * not copied: it is kept as a reference to the buffer's memory, and copied
 * only when a request that may change a buffer comes before the client
 * acknowledged the reply (Tack). So bulk reads cost no copy, and a client
 * that acknowledges what it received (the Python client does, after each
 * large read) never causes one. A resume that needs bytes no longer held
 * is refused with ERESUME and the session ends.
 *
 * Frames are whole in the stream, and a resume must start at a frame
 * boundary: the ring's oldest whole frame is tracked as it is overwritten,
 * so a resume can walk the headers from there to check where the client
 * says it stopped, and that every frame it missed fits the new
 * connection's maxmsg.
 *
 * How a new connection reaches the session: the connection does its
 * handshake in a session of its own, like any other (server.c), whose
 * Tresume sends it, with the socket (SCM_RIGHTS), up a control socket to
 * the accept loop; the accept loop passes it down the control socket of
 * the session the Tresume names, and the named session checks the proof
 * itself. So the accept loop reads nothing from a client and never sees a
 * key; a session process needs no more system calls than sendmsg and
 * recvmsg, which it has (confine.c). Thread isolation works the same way,
 * with both ends of each control socket in one process.
 */
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "monotime.h"
#include "resume.h"
#include "session.h"
#include "slots.h"

/* Message boundaries, and an end that wakes the other side when closed. */
#ifdef __linux__
#define CTL_TYPE SOCK_SEQPACKET
#else
#define CTL_TYPE SOCK_STREAM	/* fixed-size messages; read whole */
#endif

static const char resume_client[] = "metal_runner-resume-v1 client";
static const char resume_server[] = "metal_runner-resume-v1 server";

/* The data of an Rread sent straight from a buffer: read from there again
 * on a resume, or from own once a request may have changed the buffer. */
struct rref {
	uint64_t at;		/* stream offset of its first byte */
	uint64_t len;
	const uint8_t *src;
	uint8_t *own;
};

struct resume {
	uint8_t secret[PROTO_MAC_SIZE];
	uint64_t total;		/* bytes of the stream sent since the key */
	uint8_t *ring;		/* the last cap bytes that were copied */
	size_t cap;
	uint64_t copied;	/* stream bytes copied into the ring, in all */
	uint64_t frame;		/* the oldest frame whose header the ring */
	uint64_t fcopied;	/* holds: its stream offset and its copied count */
	uint64_t acked;		/* the client received this many (Tack) */
	struct rref refs[PROTO_RESUME_REFS];	/* in stream order */
	unsigned nrefs;
	uint64_t owned;		/* bytes of copies in refs */
	size_t skip;		/* bytes of the output buffer that precede the
				 * key (handshake replies): not the session's */
	int switched;		/* a resume replaced the link while it served */
	int lost;		/* a proven resume could not be honoured */
	uint32_t resumes;
};

/* What a connection's Tresume sends up to the accept loop and down to the
 * session it names, with the connection's socket. */
struct handover {
	uint32_t target;
	uint32_t tag;
	uint8_t snonce[PROTO_NONCE_SIZE];
	uint64_t sent, received;
	uint8_t cnonce[PROTO_NONCE_SIZE];
	uint8_t mac[PROTO_MAC_SIZE];
	uint32_t maxmsg;	/* the new connection's, from its Thello */
	char peer[64];
};

/* The accept loop's ends of the control sockets, by slot, and the
 * sessions' ends until the session has them (a session process may end,
 * and clear its slot, before the accept loop closes its copy). */
static int *pctl, *sctl;
static uint32_t npctl;

static int
send_fd(int ctl, const struct handover *h, int fd)
{
	return net_send_fd(ctl, h, sizeof(*h), fd);
}

/* One handover and its socket: 0, or -1 (nothing, or no socket came). */
static int
recv_fd(int ctl, struct handover *h, int *fd)
{
	if (net_recv_fd(ctl, h, sizeof(*h), fd) != (ssize_t)sizeof(*h) ||
	    *fd == -1) {
		if (*fd != -1)
			close(*fd);
		*fd = -1;
		return -1;
	}
	h->peer[sizeof(h->peer) - 1] = '\0';
	return 0;
}

/*
 * The accept loop's part.
 */

static int route_one(int);

int
resume_open(const struct mr_config *cfg, int slot)
{
	struct slot *sl = slot_get((uint32_t)slot);
	int sv[2];
	uint32_t i;

	if (cfg->resume_grace <= 0)
		return 0;
	if (pctl == NULL) {
		pctl = calloc(slot_count(), sizeof(*pctl));
		sctl = calloc(slot_count(), sizeof(*sctl));
		if (pctl == NULL || sctl == NULL) {
			free(pctl);
			free(sctl);
			pctl = sctl = NULL;
			return -1;
		}
		npctl = slot_count();
		for (i = 0; i < npctl; i++)
			pctl[i] = sctl[i] = -1;
	}
	if (socketpair(AF_UNIX, CTL_TYPE, 0, sv) == -1)
		return -1;
	fcntl(sv[0], F_SETFD, FD_CLOEXEC);
	fcntl(sv[1], F_SETFD, FD_CLOEXEC);
	fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
	pctl[slot] = sv[0];
	sl->ctl = sctl[slot] = sv[1];
	return 0;
}

void
resume_child(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1) {
			close(pctl[i]);
			pctl[i] = -1;
		}
}

void
resume_forked(int slot)
{
	/* The number stays in the table: it is the child's. */
	if (sctl != NULL && sctl[slot] != -1) {
		close(sctl[slot]);
		sctl[slot] = -1;
	}
}

void
resume_reclaim(int slot)
{
	if (pctl == NULL || pctl[slot] == -1)
		return;
	/* A connection passed up just before its session ended is still in
	 * the socket: route it first. */
	while (route_one(slot) == 0)
		;
	close(pctl[slot]);
	pctl[slot] = -1;
}

void
resume_sweep(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1 && !slot_get(i)->busy)
			resume_reclaim((int)i);
}

int
resume_pollfds(struct pollfd *p, int *slots, int max)
{
	uint32_t i;
	int n = 0;

	for (i = 0; pctl != NULL && i < npctl && n < max; i++)
		if (pctl[i] != -1 && slot_get(i)->busy) {
			p[n].fd = pctl[i];
			p[n].events = POLLIN;
			p[n].revents = 0;
			slots[n++] = (int)i;
		}
	return n;
}

void
resume_route(int from)
{
	while (route_one(from) == 0)
		;
}

/* Route one handover waiting in from's control socket: 0, or -1 if there
 * was none. */
static int
route_one(int from)
{
	struct handover h;
	uint32_t i;
	int fd;

	if (pctl == NULL || pctl[from] == -1 || recv_fd(pctl[from], &h, &fd) ==
	    -1)
		return -1;
	for (i = 0; i < npctl; i++) {
		struct slot *sl = slot_get(i);
		int stage = atomic_load(&sl->stage);
		if ((int)i != from && sl->busy && sl->id == h.target &&
		    pctl[i] != -1 && (stage == SLOT_SESSION ||
		    stage == SLOT_WAITING))
			break;
	}
	if (i == npctl) {
		log_info("resume of session %u from %s: no such session",
		    h.target, h.peer);
		net_refuse(fd, h.tag, PROTO_ERESUME, "no session with that "
		    "number to resume: it never existed, ended, or was not "
		    "resumed within the runner's grace period");
		return 0;
	}
	if (send_fd(pctl[i], &h, fd) == -1) {
		net_refuse(fd, h.tag, PROTO_ERESUME, "the session is busy "
		    "with another resume; try again");
		return 0;
	}
	close(fd);	/* the session has its own copy now */
	return 0;
}

void
resume_stop(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1)
			shutdown(pctl[i], SHUT_RDWR);
}

void
resume_close(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1)
			close(pctl[i]);
	free(pctl);
	free(sctl);
	pctl = sctl = NULL;
	npctl = 0;
}

/*
 * The session's part.
 */

static int
ctl_fd(const struct session *s)
{
	return s->slot >= 0 ? slot_get((uint32_t)s->slot)->ctl : -1;
}

int
resume_pollfd(const struct session *s)
{
	return ctl_fd(s);
}

int
resume_offered(const struct session *s)
{
	return s->ctx->cfg->resume_grace > 0 && ctl_fd(s) != -1;
}

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

int
resume_ack(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tack *t = &m->tack;
	struct resume *rs = s->rs;

	(void)frame;
	if (!resume_offered(s))
		return sess_fatal(s, t->h.tag, PROTO_EPROTO, "this runner does "
		    "not take acknowledgements (no CAP_ACK)") == -1 ? -2 : 0;
	if (rs == NULL || t->received <= rs->acked)
		return 0;
	if (t->received > rs->total)
		return sess_errorf(s, t->h.tag, PROTO_EINVAL, "Tack of %llu "
		    "bytes, but the runner sent %llu", (unsigned long long)
		    t->received, (unsigned long long)rs->total);
	rs->acked = t->received;
	while (rs->nrefs > 0 && rs->refs[0].at + rs->refs[0].len <= rs->acked)
		ref_drop(s, 0);
	return 0;
}

static void
put_le(uint8_t *p, uint64_t v, int n)
{
	int i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void
client_mac(const struct resume *rs, const struct handover *h, uint8_t out[32])
{
	uint8_t msg[sizeof(resume_client) + 2 * PROTO_NONCE_SIZE + 20];
	size_t l = strlen(resume_client);

	memcpy(msg, resume_client, l);
	memcpy(msg + l, h->snonce, PROTO_NONCE_SIZE);
	memcpy(msg + l + 32, h->cnonce, PROTO_NONCE_SIZE);
	put_le(msg + l + 64, h->target, 4);
	put_le(msg + l + 68, h->sent, 8);
	put_le(msg + l + 76, h->received, 8);
	hmac_sha256(rs->secret, sizeof(rs->secret), msg, l + 84, out);
}

static void
server_mac(const struct resume *rs, const struct handover *h, uint8_t out[32])
{
	uint8_t msg[sizeof(resume_server) + 2 * PROTO_NONCE_SIZE];
	size_t l = strlen(resume_server);

	memcpy(msg, resume_server, l);
	memcpy(msg + l, h->cnonce, PROTO_NONCE_SIZE);
	memcpy(msg + l + 32, h->snonce, PROTO_NONCE_SIZE);
	hmac_sha256(rs->secret, sizeof(rs->secret), msg, l + 64, out);
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
static int
missed(const struct resume *rs, uint64_t from, uint32_t maxmsg, int fd,
    char *text, size_t len)
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

/* A proven resume the session cannot honour: the session is lost. */
static int
lose(struct session *s, const struct handover *h, int fd, const char *text)
{
	log_warn("session %u: resume from %s refused, the session ends: %s",
	    s->id, h->peer, text);
	net_refuse(fd, h->tag, PROTO_ERESUME, text);
	s->rs->lost = 1;
	s->linkdown = 1;
	return -1;
}

/* A session without a key refuses every resume (EAUTH, as for a wrong
 * proof): the client gets its answer rather than waiting on a socket the
 * session never reads. */
int
resume_take(struct session *s)
{
	struct resume *rs = s->rs;
	struct handover h;
	union proto_msg r;
	uint8_t want[32], frame[sizeof(struct proto_rresume)], diff = 0;
	char text[256];
	uint64_t back;
	size_t i;
	int fd;

	if (recv_fd(ctl_fd(s), &h, &fd) == -1) {
		struct pollfd p = { ctl_fd(s), POLLIN, 0 };
		/* Nothing to read and the other end gone: stopping. */
		return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR))
		    ? -1 : 0;
	}
	if (rs == NULL) {	/* no key to prove: never taken, or withdrawn */
		log_warn("session %u: resume from %s refused: the session has "
		    "no resume key", s->id, h.peer);
		net_refuse(fd, h.tag, PROTO_EAUTH, "resume refused: wrong "
		    "proof of the session's resume key");
		return 0;
	}
	client_mac(rs, &h, want);
	for (i = 0; i < sizeof(want); i++)	/* constant time */
		diff |= want[i] ^ h.mac[i];
	if (diff != 0 || h.target != s->id) {
		log_warn("session %u: resume from %s refused: wrong proof",
		    s->id, h.peer);
		net_refuse(fd, h.tag, PROTO_EAUTH, "resume refused: wrong "
		    "proof of the session's resume key");
		return 0;
	}
	/* Output not yet sent belongs to the stream before the resume. */
	s->linkdown = 1;
	if (s->outlen > 0) {
		resume_send(s, s->out, s->outlen, NULL, 0);
		s->outlen = 0;
	}
	if (h.sent < s->nproc) {
		snprintf(text, sizeof(text), "the client says it sent %llu "
		    "requests, but the runner processed %llu",
		    (unsigned long long)h.sent, (unsigned long long)s->nproc);
		return lose(s, &h, fd, text);
	}
	if (h.received > rs->total) {
		snprintf(text, sizeof(text), "the client says it received %llu "
		    "bytes of replies, but the runner sent %llu",
		    (unsigned long long)h.received,
		    (unsigned long long)rs->total);
		return lose(s, &h, fd, text);
	}
	if (missed(rs, h.received, h.maxmsg, -1, text, sizeof(text)) == -1)
		return lose(s, &h, fd, text);
	if (s->fd != -1) {	/* the old link still stood: the proof wins */
		log_info("session %u: closing its old connection for a resume",
		    s->id);
		shutdown(s->fd, SHUT_RDWR);
		close(s->fd);
	}
	s->fd = fd;
	slot_get((uint32_t)s->slot)->fd = fd;
	s->inlen = s->inoff = 0;
	s->linkdown = 0;
	s->end[0] = '\0';	/* the drop did not end it */
	s->maxmsg = h.maxmsg;	/* the new connection's, from here on */
	s->last_active = time(NULL);	/* the idle limit runs from here */
	rs->resumes++;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RRESUME;
	r.h.size = sizeof(frame);
	r.h.tag = h.tag;
	r.rresume.processed = s->nproc;
	server_mac(rs, &h, r.rresume.mac);
	proto_put(frame, sizeof(frame), &r);
	if (net_send_all(fd, frame, sizeof(frame)) == -1 ||
	    missed(rs, h.received, h.maxmsg, fd, text, sizeof(text)) == -1)
		s->linkdown = 1;	/* and the client may try again */
	back = rs->total - h.received;
	s->bytes_out += sizeof(frame) + back;
	log_notice("session %u: resumed from %s (resume %u): %llu requests "
	    "processed, %llu bytes of replies sent again", s->id, h.peer,
	    rs->resumes, (unsigned long long)s->nproc,
	    (unsigned long long)back);
	return 1;
}

ssize_t
resume_recv(struct session *s, void *buf, size_t len)
{
	int tmo = s->ctx->cfg->frame_timeout > 0 ?
	    s->ctx->cfg->frame_timeout * 1000 : -1;
	struct pollfd p[2];
	ssize_t r;
	int n;

	if (s->linkdown) {
		errno = ECONNRESET;
		return -1;
	}
	if (s->rs == NULL || ctl_fd(s) == -1)
		return net_recv(s->fd, buf, len);
	for (;;) {
		/* What has arrived is taken without a poll: only a recv that
		 * would block waits, watching the control socket too. */
		if ((r = recv(s->fd, buf, len, MSG_DONTWAIT)) >= 0 ||
		    (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			return r;
		p[0].fd = s->fd;
		p[1].fd = ctl_fd(s);
		p[0].events = p[1].events = POLLIN;
		p[0].revents = p[1].revents = 0;
		if ((n = poll(p, 2, tmo)) == -1 && errno == EINTR)
			continue;
		if (n == 0) {
			errno = EAGAIN;
			return -1;
		}
		if (p[1].revents != 0) {
			/* A resume while this link stands: the client gave
			 * it up (a half-open link after a network change). */
			n = resume_take(s);
			if (n == 1)
				s->rs->switched = 1;
			if (n != 0) {
				s->linkdown = 1;
				errno = ECONNRESET;
				return -1;
			}
		}
	}
}

int
resume_wait(struct session *s)
{
	struct resume *rs = s->rs;
	int grace = s->ctx->cfg->resume_grace;
	int64_t deadline, left;
	char how[sizeof(s->end)];
	int n;

	if (rs == NULL || !s->linkdown || rs->lost)
		return -1;
	if (rs->switched) {	/* resume_recv() took a resume already */
		rs->switched = 0;
		s->linkdown = 0;
		return 0;
	}
	if (s->outlen > 0) {	/* into the ring, for the resume */
		resume_send(s, s->out, s->outlen, NULL, 0);
		s->outlen = 0;
	}
	if (s->fd != -1) {
		close(s->fd);
		s->fd = -1;
		slot_get((uint32_t)s->slot)->fd = -1;
	}
	log_notice("session %u: link lost after %llu requests; waiting up to %d "
	    "s for the client to resume", s->id, (unsigned long long)s->nproc,
	    grace);
	deadline = mono_ms() + (int64_t)grace * 1000;
	slot_wait(s->slot);
	while ((left = deadline - mono_ms()) > 0) {
		/* A copy between runners into this session is taken meanwhile:
		 * its source waits for it, not for this session's client. */
		struct pollfd p[2] = { { ctl_fd(s), POLLIN, 0 },
		    { s->inbox, POLLIN, 0 } };
		if ((n = poll(p, 2, left > INT_MAX ? INT_MAX : (int)left)) ==
		    -1 && errno == EINTR)
			continue;
		if (n == 0)
			break;
		if (p[1].revents != 0)	/* poll skips an inbox of -1 */
			sess_peer_take(s);
		if (p[0].revents == 0)
			continue;
		if ((n = resume_take(s)) == 1) {
			slot_resumed(s->slot);
			return 0;
		}
		if (n == -1)
			return -1;
	}
	log_warn("session %u: not resumed within %d s; ending it", s->id,
	    grace);
	snprintf(how, sizeof(how), "%s", s->end[0] ? s->end :
	    "connection lost");
	snprintf(s->end, sizeof(s->end), "the link dropped (%.64s) and the "
	    "client did not resume within %d s", how, grace);
	return -1;
}

int
resume_key(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tresumekey *t = &m->tresumekey;
	const struct mr_config *cfg = s->ctx->cfg;
	union proto_msg r;

	(void)frame;
	if (!resume_offered(s))
		return sess_fatal(s, t->h.tag, PROTO_EPROTO, "this runner does "
		    "not resume sessions (no CAP_RESUME)") == -1 ? -2 : 0;
	if (t->mode != PROTO_RESUME_OFF && t->mode != PROTO_RESUME_ON) {
		sess_errorf(s, t->h.tag, PROTO_EINVAL, "Tresumekey mode %u is "
		    "neither 0 (off) nor 1 (on)", t->mode);
		return sess_fail_reply(s);
	}
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RRESUMEKEY;
	r.h.tag = t->h.tag;
	if (t->mode == PROTO_RESUME_OFF) {
		resume_free(s);
		return sess_reply(s, &r, NULL, 0);
	}
	if (s->rs == NULL) {
		struct resume *rs = calloc(1, sizeof(*rs));
		if (rs == NULL || (rs->ring = malloc(cfg->resume_log)) ==
		    NULL) {
			free(rs);
			sess_errorf(s, t->h.tag, PROTO_ENOMEM, "no memory for "
			    "the session's reply log");
			return sess_fail_reply(s);
		}
		rs->cap = cfg->resume_log;
		/* What is in the output buffer now (Rhello, Rauth) goes out
		 * before the stream the counts are about. */
		rs->skip = s->outlen;
		sess_random(rs->secret, sizeof(rs->secret));
		s->rs = rs;
	}
	r.rresumekey.grace = (uint32_t)cfg->resume_grace;
	r.rresumekey.log = s->rs->cap;
	memcpy(r.rresumekey.secret, s->rs->secret, sizeof(s->rs->secret));
	log_info("session %u: resumable for %d s after a dropped link",
	    s->id, cfg->resume_grace);
	return sess_reply(s, &r, NULL, 0);
}

int
resume_request(struct session *s, const union proto_msg *m,
    const uint8_t *frame)
{
	const struct proto_tresume *t = &m->tresume;
	struct handover h;

	(void)frame;
	if (!resume_offered(s))
		return sess_fatal(s, t->h.tag, PROTO_EPROTO, "this runner does "
		    "not resume sessions (no CAP_RESUME)") == -1 ? -2 : 0;
	if (s->nproc != 0 || s->rs != NULL)
		return sess_fatal(s, t->h.tag, PROTO_ESTATE, "Tresume must be "
		    "the first request after the handshake") == -1 ? -2 : 0;
	/* Rhello and Rauth out first, so nothing of this session follows
	 * the bytes of the session it resumes. */
	if (sess_flush(s) == -1 || s->linkdown)
		return -2;
	memset(&h, 0, sizeof(h));
	h.target = t->session;
	h.tag = t->h.tag;
	memcpy(h.snonce, s->snonce, sizeof(h.snonce));
	h.sent = t->sent;
	h.received = t->received;
	h.maxmsg = s->maxmsg;
	memcpy(h.cnonce, t->cnonce, sizeof(h.cnonce));
	memcpy(h.mac, t->mac, sizeof(h.mac));
	snprintf(h.peer, sizeof(h.peer), "%s", s->peer);
	if (send_fd(ctl_fd(s), &h, s->fd) == -1)
		return sess_fatal(s, t->h.tag, PROTO_ERESUME, "the runner "
		    "cannot pass the connection on") == -1 ? -2 : 0;
	log_info("session %u: passed on to resume session %u", s->id,
	    t->session);
	sess_end(s, "passed on to resume session %u", t->session);
	s->handed = 1;
	return -2;
}

void
resume_end(struct session *s)
{
	int ctl = ctl_fd(s);

	resume_free(s);
	if (ctl != -1) {
		struct handover h;
		int fd;
		/* Resumes that came too late: answer them rather than let
		 * their connections close without a word. */
		while (recv_fd(ctl, &h, &fd) == 0)
			net_refuse(fd, h.tag, PROTO_ERESUME, "the session has "
			    "ended");
		close(ctl);
		slot_get((uint32_t)s->slot)->ctl = -1;
	}
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
