/*
 * session.c: one client connection: its serve loop, framing and replies.
 *
 * A session reads frames from a blocking socket through an input buffer
 * that grows only as bytes arrive (never to a size a client merely
 * declares), validates each header and fixed part whole, then dispatches
 * to the request handlers (handshake.c, buffers.c, programs.c, launch.c).
 * Bulk Twrite data is received straight into the checked destination;
 * Rread data is sent straight from the buffer. Replies collect in an
 * output buffer that is flushed whenever the session would block reading,
 * so a pipelined burst costs one send; launched work is handed to the
 * device at the same moment (backend.h, idle).
 *
 * Requests without a reply that fail queue their Rerror; queued errors go
 * out ahead of the next reply, so none is lost and order is kept.
 */
#include <sys/types.h>

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "monotime.h"
#include "session.h"
#include "slots.h"

#define IN_MIN 65536		/* input buffer kept between frames */
#define MAX_QUEUED_ERRORS 64

int
sess_grow(uint8_t **p, size_t *cap, size_t need)
{
	size_t n = *cap ? *cap : 4096;
	uint8_t *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	if ((q = realloc(*p, n)) == NULL)
		return -1;
	*p = q;
	*cap = n;
	return 0;
}

int
sess_flush(struct session *s)
{
	if (s->outlen == 0)
		return 0;
	if (resume_send(s, s->out, s->outlen, NULL, 0) == -1)
		return -1;
	s->bytes_out += s->outlen;
	s->outlen = 0;
	return 0;
}

/* Move queued errors into the output, ahead of the reply that follows. */
int
sess_drain_errors(struct session *s)
{
	if (s->errqlen > 0) {
		if (sess_grow(&s->out, &s->outcap,
		    s->outlen + s->errqlen) == -1)
			return -1;
		memcpy(s->out + s->outlen, s->errq, s->errqlen);
		s->outlen += s->errqlen;
		s->errqlen = 0;
		s->nqueued = 0;
	}
	if (s->dropped > 0) {
		char text[64];
		uint8_t frame[128];
		size_t n;

		snprintf(text, sizeof(text), "%u more errors not shown",
		    s->dropped);
		n = proto_put_rerror(frame, sizeof(frame), s->dropped_tag,
		    PROTO_EMORE, text);
		if (sess_grow(&s->out, &s->outcap, s->outlen + n) == -1)
			return -1;
		memcpy(s->out + s->outlen, frame, n);
		s->outlen += n;
		s->dropped = 0;
	}
	return 0;
}

/* Queue an Rerror for tag with text cut to maxtext bytes; past
 * MAX_QUEUED_ERRORS (or with no memory) it is only counted, for EMORE. */
static void
queue_rerror(struct session *s, uint32_t tag, uint32_t code, const char *text,
    size_t maxtext)
{
	size_t need = PROTO_HDR_SIZE + 8 + maxtext;

	if (s->nqueued >= MAX_QUEUED_ERRORS ||
	    sess_grow(&s->errq, &s->errqcap, s->errqlen + need) == -1) {
		s->dropped++;
		s->dropped_tag = tag;
		return;
	}
	s->errqlen += proto_put_rerror_n(s->errq + s->errqlen, need, tag, code,
	    text, maxtext);
	s->nqueued++;
}

/* Queue an Rerror for tag. Returns -1 so handlers can "return sess_errorf()";
 * a failed request is never fatal to the session by itself. */
int
sess_errorf(struct session *s, uint32_t tag, uint32_t code, const char *fmt,
    ...)
{
	char text[PROTO_MAX_ERRTEXT + 1];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	log_info("session %u: tag %u: %s: %s", s->id, tag,
	    proto_error_name(code), text);
	queue_rerror(s, tag, code, text, PROTO_MAX_ERRTEXT);
	return -1;
}

/*
 * Queue an Rerror whose text may pass PROTO_MAX_ERRTEXT: a compiler's
 * whole output (protocol.md, Tload), which a person needs whole to fix the
 * kernel. The log keeps only its first line.
 */
int
sess_error_long(struct session *s, uint32_t tag, uint32_t code,
    const char *prefix, const char *text)
{
	size_t plen = strlen(prefix), tlen = strlen(text);
	char *full;

	if ((full = malloc(plen + tlen + 1)) == NULL)
		return sess_errorf(s, tag, code, "%s%s", prefix, text);
	memcpy(full, prefix, plen);
	memcpy(full + plen, text, tlen + 1);
	log_info("session %u: tag %u: %s: %.*s (%zu bytes)", s->id, tag,
	    proto_error_name(code), (int)strcspn(full, "\n"), full,
	    plen + tlen);
	queue_rerror(s, tag, code, full, PROTO_MAX_COMPILER_TEXT);
	free(full);
	return -1;
}

/* Append a reply (fixed part and optional small data) after queued errors. */
int
sess_reply(struct session *s, union proto_msg *m, const void *data, size_t len)
{
	size_t fixed = proto_fixed_size(m->h.type);

	m->h.size = (uint32_t)(fixed + len);
	m->h.flags = 0;
	if (sess_drain_errors(s) == -1 ||
	    sess_grow(&s->out, &s->outcap, s->outlen + fixed + len) == -1)
		return -1;
	proto_put(s->out + s->outlen, fixed, m);
	if (len > 0)
		memcpy(s->out + s->outlen + fixed, data, len);
	s->outlen += fixed + len;
	return 0;
}

/* Rlaunch, Rgraphrun, Rpeersend or Rdial: a time in ns. */
int
sess_reply_ns(struct session *s, unsigned type, uint32_t tag, uint64_t ns)
{
	union proto_msg r;

	memset(&r, 0, sizeof(r));
	r.h.type = (uint16_t)type;
	r.h.tag = tag;
	r.rtime.ns = ns;
	return sess_reply(s, &r, NULL, 0);
}

/* A request that waits failed: its error is its reply. */
int
sess_fail_reply(struct session *s)
{
	return sess_drain_errors(s);
}

void
sess_end(struct session *s, const char *fmt, ...)
{
	va_list ap;

	if (s->end[0] != '\0')
		return;
	va_start(ap, fmt);
	vsnprintf(s->end, sizeof(s->end), fmt, ap);
	va_end(ap);
}

/* A framing or state error: tell the client, then end the session. */
int
sess_fatal(struct session *s, uint32_t tag, uint32_t code, const char *text)
{
	sess_end(s, "%s: %s", proto_error_name(code), text);
	sess_errorf(s, tag, code, "%s", text);
	sess_drain_errors(s);
	sess_flush(s);
	return -1;
}

/* Wait at most ms for fd to have something for recv() to return
 * (data, end of stream or an error): 1 if it has, 0 on timeout. */
static int
wait_readable(int fd, int64_t ms)
{
	struct pollfd pfd = { fd, POLLIN, 0 };
	int n;

	do
		n = poll(&pfd, 1, ms > INT_MAX ? INT_MAX : (int)ms);
	while (n == -1 && errno == EINTR);
	return n != 0;
}

/* Until the handshake is done every wait ends at its deadline, however
 * the bytes trickle in: a connection that never finishes it holds one of
 * the runner's few startup places (server.c) only for so long. */
static int
handshake_wait(struct session *s)
{
	int64_t left;

	if (s->state == S_READY || s->hs_deadline == 0)
		return 0;
	left = s->hs_deadline - mono_ms();
	if (left > 0 && wait_readable(s->fd, left))
		return 0;
	mr_log_handshake("session %u: closing %s: no handshake within %d s",
	    s->id, s->peer, s->ctx->cfg->handshake_timeout);
	sess_end(s, "no handshake within %d s",
	    s->ctx->cfg->handshake_timeout);
	return -1;
}

/*
 * Make n bytes of the current frame available at s->in + s->inoff.
 * Returns 1, 0 at a clean end of stream between frames, -1 on error.
 */
static int
need(struct session *s, size_t n, int boundary)
{
	const struct mr_config *cfg = s->ctx->cfg;
	ssize_t r;
	int reset;

	while (s->inlen - s->inoff < n) {
		if (s->linkdown)
			return -1;
		/* Make room only when the buffer is full, and then by at most
		 * doubling: memory follows the bytes that arrived, never the
		 * size a header declares. */
		if (s->inlen == s->incap && s->inoff > 0) {
			memmove(s->in, s->in + s->inoff, s->inlen - s->inoff);
			s->inlen -= s->inoff;
			s->inoff = 0;
		} else if (s->inlen == s->incap && sess_grow(&s->in, &s->incap,
		    min64(n, s->incap * 2)) == -1) {
			log_warn("session %u: out of memory", s->id);
			return -1;
		}
		/* About to read: what is processed goes out, replies to the
		 * client and launched work to the device (backend.h, idle), so
		 * a burst costs one send and its kernels start as it arrives. */
		if (s->be->idle != NULL)
			s->be->idle(s->bs);
		if (sess_flush(s) == -1 || handshake_wait(s) == -1)
			return -1;
		/* Between requests a peer may come through the inbox, and a
		 * resume naming this session through its control socket. */
		if (boundary && s->inlen == s->inoff && s->state == S_READY &&
		    (r = sess_peer_wait(s)) != 1) {
			if (r == 0)
				continue;
			if (r == -2)
				return -1;
			/* Idle: a session that may be resumed counts it as a
			 * dropped link and waits for its client. */
			if (s->rs != NULL)
				s->linkdown = 1;
			/* What was asked for: the closing line says it. */
			log_info("session %u: client stalled between frames "
			    "for %d s; ending the %s", s->id,
			    cfg->idle_timeout, s->rs != NULL ? "connection" :
			    "session");
			sess_end(s, "idle for %d s (--idle-timeout)",
			    cfg->idle_timeout);
			return -1;
		}
		/* Before the handshake is done the idle limit applies here (once
		 * it is, sess_peer_wait() above applies it); the socket's receive
		 * timeout is the frame timeout, which may be longer. */
		if (boundary && s->inlen == s->inoff && cfg->idle_timeout > 0 &&
		    s->state != S_READY &&
		    !wait_readable(s->fd, (int64_t)cfg->idle_timeout * 1000)) {
			log_info("session %u: client stalled between frames "
			    "for %d s; ending the session", s->id,
			    cfg->idle_timeout);
			sess_end(s, "idle for %d s (--idle-timeout)",
			    cfg->idle_timeout);
			return -1;
		}
		r = resume_recv(s, s->in + s->inlen, s->incap - s->inlen);
		/* A client's ordinary exit often resets the connection rather
		 * than closing it: the library's close sends Tresumekey OFF and
		 * closes at once, so its Rresumekey meets a closed socket (and
		 * any reply a client leaves unread does the same). */
		reset = r < 0 && errno == ECONNRESET && !s->linkdown;
		if (r == 0 || reset) {
			s->linkdown = 1;
			if (boundary && s->inlen == s->inoff) {
				sess_end(s, "the client disconnected%s", reset ?
				    " (connection reset)" : "");
				return 0;
			}
			log_info("session %u: connection %s mid-frame", s->id,
			    reset ? "reset" : "closed");
			sess_end(s, "connection %s mid-frame", reset ? "reset" :
			    "closed");
			return -1;
		}
		if (r < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				if (!s->linkdown)
					log_warn("session %u: connection "
					    "lost: recv: %s", s->id,
					    strerror(errno));
				sess_end(s, "connection lost: recv: %s",
				    strerror(errno));
				s->linkdown = 1;
				return -1;
			}
			if (boundary && s->inlen == s->inoff &&
			    (cfg->idle_timeout == 0 || time(NULL) -
			    s->last_active < cfg->idle_timeout))
				continue;
			s->linkdown = 1;
			log_warn("session %u: client stalled %s for %d s; "
			    "ending the %s", s->id, boundary &&
			    s->inlen == s->inoff ? "between frames" :
			    "mid-frame", boundary && s->inlen == s->inoff ?
			    cfg->idle_timeout : cfg->frame_timeout,
			    s->rs != NULL ? "connection" : "session");
			if (boundary && s->inlen == s->inoff)
				sess_end(s, "idle for %d s (--idle-timeout)",
				    cfg->idle_timeout);
			else
				sess_end(s, "stalled mid-frame for %d s "
				    "(--frame-timeout)", cfg->frame_timeout);
			return -1;
		}
		s->inlen += (size_t)r;
		s->bytes_in += (uint64_t)r;
	}
	return 1;
}

/* Take count bytes of frame data into dst, or discard them if dst is NULL:
 * first what is buffered, then straight from the socket. */
int
sess_take(struct session *s, uint8_t *dst, uint64_t count)
{
	size_t n = (size_t)min64(s->inlen - s->inoff, count);
	ssize_t r;

	if (dst != NULL)
		memcpy(dst, s->in + s->inoff, n);
	s->inoff += n;
	count -= n;
	if (dst != NULL)
		dst += n;
	if (count > 0 && sess_flush(s) == -1)
		return -1;
	while (count > 0) {
		if (dst != NULL)
			r = resume_recv(s, dst, (size_t)count);
		else {
			s->inoff = s->inlen = 0;
			r = resume_recv(s, s->in, (size_t)min64(count, s->incap));
		}
		if (r <= 0) {
			s->linkdown = 1;
			log_info("session %u: connection %s mid-frame", s->id,
			    r == 0 ? "closed" : "stalled");
			sess_end(s, "connection %s mid-frame", r == 0 ?
			    "closed" : "stalled");
			return -1;
		}
		count -= (uint64_t)r;
		s->bytes_in += (uint64_t)r;
		if (dst != NULL)
			dst += r;
	}
	return 0;
}

/* Take one handle of a namespace whose count is *n: maxhandles applies
 * to each namespace (buffers, programs, graphs) on its own. */
int
sess_count_handle(struct session *s, uint32_t tag, uint32_t *n,
    const char *what)
{
	uint32_t max = s->ctx->cfg->max_handles;

	if (max != 0 && *n >= max)
		return sess_errorf(s, tag, PROTO_ELIMIT,
		    "session has %u %s, the limit", max, what);
	(*n)++;
	return 0;
}

static int
do_sync(struct session *s, const union proto_msg *m)
{
	union proto_msg r;

	s->dirty = 0;
	if (s->be->sync(s->bs, s->err) == -1) {
		sess_errorf(s, m->h.tag, PROTO_EDEVICE, "%s", s->err);
		return sess_fail_reply(s);
	}
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RSYNC;
	r.h.tag = m->h.tag;
	return sess_reply(s, &r, NULL, 0);
}

static int
do_ping(struct session *s, const union proto_msg *m, const uint8_t *data)
{
	union proto_msg r;

	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RPING;
	r.h.tag = m->h.tag;
	r.ping.count = m->ping.count;
	return sess_reply(s, &r, data, m->ping.count);
}

/* May this request change the contents of a buffer? Read-only requests are
 * listed; anything else may. */
static int
changes_buffers(unsigned type)
{
	switch (type) {
	case PROTO_TPING: case PROTO_TSYNC: case PROTO_TREAD:
	case PROTO_TCLOCK: case PROTO_TPROFILE: case PROTO_THAVE:
	case PROTO_TGRANT: case PROTO_TPEERSEND: case PROTO_TACK:
	case PROTO_TLISTEN: case PROTO_TDIAL: case PROTO_TUNLINK:
	case PROTO_TLOAD: case PROTO_TUNLOAD: case PROTO_TGRAPH:
	case PROTO_TGRAPHFREE: case PROTO_TALLOC: case PROTO_TRESUMEKEY:
		return 0;
	}
	return 1;
}

/* Does the runner answer this request (so its client waits for it)? */
static int
answered(const struct proto_hdr *h)
{
	switch (h->type) {
	case PROTO_THELLO: case PROTO_TAUTH: case PROTO_TPING:
	case PROTO_TSYNC: case PROTO_TREAD: case PROTO_TCLOCK:
	case PROTO_TPROFILE: case PROTO_THAVE: case PROTO_TRESUMEKEY:
	case PROTO_TRESUME: case PROTO_TGRANT:
	case PROTO_TPEERSEND: case PROTO_TLISTEN: case PROTO_TDIAL:
		return 1;
	case PROTO_TLAUNCH: case PROTO_TGRAPHRUN:
		return (h->flags & PROTO_FWAIT) != 0;
	}
	return 0;
}

/*
 * Act on one request whose whole frame is at frame. Returns 0, -1 for a
 * failed request (its error is queued), -2 to end the session.
 */
static int
dispatch(struct session *s, const union proto_msg *m, const uint8_t *frame,
    const char *peer)
{
	const uint8_t *body = frame + proto_fixed_size(m->h.type);
	int rc;

	/* A peer runner's connection (peer.c): it is handed to the session
	 * its grant names, and this one ends. Anything else is a client:
	 * it gives up the other sessions' inboxes (peer_route.c) first. */
	if (s->state == S_HELLO && m->h.type == PROTO_TPEER)
		return sess_peer_route(s, m, frame), -2;
	if (s->state == S_HELLO) {
		/* Announced at its first frame, not at accept: a peer's
		 * connection has its own line (peer.c), and one that never
		 * speaks is only a handshake timeout. */
		log_notice("session %u: client connected from %s", s->id, peer);
		s->announced = 1;
		slot_get((uint32_t)s->slot)->announced = 1;
		peer_forget();
		return sess_hello(s, m) == -1 ? -2 : 0;
	}
	if (s->state == S_AUTH)
		return sess_auth(s, m, peer) == -1 ? -2 : 0;
	if (s->rread_refs > 0 && changes_buffers(m->h.type))
		resume_keep(s);
	switch (m->h.type) {
	case PROTO_THELLO:
		return sess_fatal(s, m->h.tag, PROTO_ESTATE, "Thello was "
		    "already exchanged") == -1 ? -2 : 0;
	case PROTO_TAUTH:
		return sess_fatal(s, m->h.tag, PROTO_ESTATE, "Tauth is not "
		    "expected: this session is already authenticated or needs "
		    "none") == -1 ? -2 : 0;
	case PROTO_TPING:
		rc = do_ping(s, m, body);
		break;
	case PROTO_TSYNC:
		rc = do_sync(s, m);
		break;
	case PROTO_TALLOC:
		rc = sess_alloc(s, &m->talloc);
		break;
	case PROTO_TFREE:
		rc = sess_free(s, &m->tfree);
		break;
	case PROTO_TREAD:
		rc = sess_read(s, &m->tread);
		break;
	case PROTO_TCOPY:
		rc = sess_copy(s, &m->tcopy);
		break;
	case PROTO_TLOAD:
		rc = sess_load(s, &m->tload, body);
		break;
	case PROTO_TUNLOAD:
		rc = sess_unload(s, &m->tunload);
		break;
	case PROTO_TLAUNCH:
		rc = sess_launch(s, m, frame);
		break;
	case PROTO_TGRAPH:
		rc = sess_graph(s, &m->tgraph, frame);
		break;
	case PROTO_TGRAPHRUN:
		rc = sess_graphrun(s, &m->tgraphrun, frame);
		break;
	case PROTO_TGRAPHFREE:
		rc = sess_graphfree(s, &m->tgraphfree);
		break;
	case PROTO_TCLOCK:
		rc = sess_clock(s, m);
		break;
	case PROTO_TPROFILE:
		rc = sess_profile(s, &m->tprofile);
		break;
	case PROTO_THAVE:
		rc = sess_have(s, &m->have, body);
		break;
	case PROTO_TWRITEHASH:
		rc = sess_writehash(s, &m->twritehash);
		break;
	case PROTO_TRESUMEKEY:
		rc = resume_key(s, &m->tresumekey);
		break;
	case PROTO_TRESUME:
		rc = resume_request(s, &m->tresume);
		break;
	case PROTO_TACK:
		rc = resume_ack(s, &m->tack);
		break;
	case PROTO_TGRANT:
		rc = sess_grant(s, &m->tgrant);
		break;
	case PROTO_TPEERSEND:
		rc = sess_peersend(s, &m->tpeersend, body);
		break;
	case PROTO_TLISTEN:
		rc = sess_listen(s, &m->tlisten);
		break;
	case PROTO_TDIAL:
		rc = sess_dial(s, &m->tdial, body);
		break;
	case PROTO_TUNLINK:
		rc = sess_unlink(s, &m->tunlink);
		break;
	case PROTO_TPEER:
		return sess_fatal(s, m->h.tag, PROTO_ESTATE, "Tpeer is only the "
		    "first frame of a peer connection") == -1 ? -2 : 0;
	default:	/* proto_check_hdr admits only the types above */
		return sess_fatal(s, m->h.tag, PROTO_EPROTO,
		    "unexpected type") == -1 ? -2 : 0;
	}
	return rc;
}

/*
 * The backend lost its device for good (backend.h, lost): a final Rerror
 * says why, after the replies and errors still queued. It goes straight
 * to the socket: the runner wakes an idle session by shutting the
 * socket's receiving side (server.c), which the session takes for a
 * dropped link, while the sending side still works.
 */
static void
end_lost(struct session *s, const char *why)
{
	sess_errorf(s, 0, PROTO_EDEVICE, "%s", why);
	sess_drain_errors(s);
	if (s->fd != -1 && s->outlen > 0 &&
	    net_send_all(s->fd, s->out, s->outlen) == 0)
		s->bytes_out += s->outlen;
	s->outlen = 0;
}

void
sess_serve(const struct mr_server_ctx *ctx, int fd, uint32_t id, int slot,
    const char *peer)
{
	struct session *s;
	union proto_msg m;
	const char *why = NULL;
	size_t fixed;
	int rc;

	if ((s = calloc(1, sizeof(*s))) == NULL) {
		log_warn("session %u: out of memory", id);
		close(fd);
		return;
	}
	s->ctx = ctx;
	s->be = ctx->be;
	s->fd = fd;
	s->id = id;
	s->slot = slot;
	s->maxmsg = ctx->cfg->maxmsg;
	s->last_active = time(NULL);
	s->started = mono_ms();
	s->peer = peer;
	s->inbox = peer_inbox(slot);
	if (ctx->cfg->handshake_timeout > 0)
		s->hs_deadline = mono_ms() +
		    (int64_t)ctx->cfg->handshake_timeout * 1000;
	s->cache = cache_link_open();
	if (sess_grow(&s->in, &s->incap, IN_MIN) == -1 ||
	    (s->bs = s->be->session_open(s->err)) == NULL) {
		log_warn("session %u: cannot start: %s", id, s->in ?
		    s->err : "out of memory");
		goto done;
	}
	for (;;) {
		/* Nothing more can run: end, whatever the link's state. */
		if (s->be->lost != NULL && s->be->lost() != NULL)
			break;
		/* A link that failed (anywhere below) ends the session, unless
		 * the client resumes it: then the loop goes on from the first
		 * request it had not processed (resume.c). */
		if (s->linkdown && resume_wait(s) == -1)
			break;
		/* Keep an idle session small after a large frame. */
		if (s->inoff == s->inlen && s->incap > 4 * IN_MIN) {
			free(s->in);
			s->in = NULL;
			s->incap = s->inlen = s->inoff = 0;
			if (sess_grow(&s->in, &s->incap, IN_MIN) == -1)
				break;
		}
		if ((rc = need(s, PROTO_HDR_SIZE, 1)) <= 0) {
			if (s->linkdown)
				continue;
			break;
		}
		s->last_active = time(NULL);
		proto_get_hdr(s->in + s->inoff, &m.h);
		if (proto_check_hdr(&m.h, s->maxmsg, s->err) == -1) {
			sess_fatal(s, m.h.tag, PROTO_EPROTO, s->err);
			break;
		}
		s->nreq++;
		s->nreply += answered(&m.h);
		/* For the runner's line when it stops a session process. */
		atomic_store_explicit(&slot_get((uint32_t)slot)->nreq, s->nreq,
		    memory_order_relaxed);
		fixed = proto_fixed_size(m.h.type);
		if (need(s, fixed, 0) <= 0) {
			if (s->linkdown)
				continue;
			break;
		}
		if (proto_get(s->in + s->inoff, fixed, &m, s->err) == -1 ||
		    proto_check_size(&m, s->err) == -1) {
			sess_fatal(s, m.h.tag, PROTO_EPROTO, s->err);
			break;
		}
		/* Before hello and auth only fixed-size requests are valid:
		 * answer without reading any payload. */
		if (s->state != S_READY) {
			if (dispatch(s, &m, s->in + s->inoff, peer) == -2)
				break;
			s->inoff += fixed;
			continue;
		}
		if (m.h.type == PROTO_TWRITE) {
			if (s->rread_refs > 0)
				resume_keep(s);
			s->inoff += fixed;
			if (sess_write(s, &m.twrite) == -2) {
				/* Cut off: it comes again whole. */
				if (s->linkdown)
					continue;
				break;
			}
			s->nproc++;
			continue;
		}
		if (need(s, m.h.size, 0) <= 0) {
			if (s->linkdown)
				continue;
			break;
		}
		rc = dispatch(s, &m, s->in + s->inoff, peer);
		s->inoff += m.h.size;
		if (rc == -2)
			break;
		s->nproc++;
	}
	/* However the loop ended (the runner's stop may end it first). */
	if (s->be->lost != NULL && (why = s->be->lost()) != NULL)
		end_lost(s, why);
	sess_drain_errors(s);
	sess_flush(s);
	/* What ended it all comes before what the session saw of it. */
	if (why != NULL)
		snprintf(s->end, sizeof(s->end), "the device was lost: %s", why);
	else if (mr_stopping())
		snprintf(s->end, sizeof(s->end), "the runner stopped");
done:
	/* One line for a client that was announced: how it ended and what it
	 * used; the details are for -v. */
	(s->announced ? log_notice : log_info)("session %u: ended: %s; %.1f s, "
	    "%llu requests, %llu answered, %llu bytes in, %llu bytes out", id,
	    s->end[0] ? s->end : "the session could not go on",
	    (double)(mono_ms() - s->started) / 1000,
	    (unsigned long long)s->nreq, (unsigned long long)s->nreply,
	    (unsigned long long)s->bytes_in, (unsigned long long)s->bytes_out);
	if (s->cache != NULL)
		log_info("session %u: cache: %llu bytes written from it, %llu "
		    "bytes given to it", id, (unsigned long long)s->cache_in,
		    (unsigned long long)s->cache_stored);
	log_info("session %u: closing, freeing %u buffers (%llu bytes), %u "
	    "programs, %u graphs", id, s->bufs.count,
	    (unsigned long long)s->mem, s->progs.count, s->graphs.count);
	htab_clear(&s->graphs, sess_release_graph, s);
	if (s->bs != NULL)
		s->be->sync(s->bs, s->err);
	htab_clear(&s->bufs, sess_release_buffer, s);
	htab_clear(&s->progs, sess_release_program, s);
	if (s->bs != NULL)
		s->be->session_close(s->bs);
	sess_prof_free(s);
	cache_link_close(s->cache);
	sess_links_free(s);	/* before the grants its listening links hold */
	sess_peer_free(s);
	mr_session_leave(slot);
	resume_end(s);
	if (s->fd != -1)
		close(s->fd);
	free(s->in);
	free(s->out);
	free(s->errq);
	free(s->launches);
	free(s->lbufs);
	free(s->loffs);
	free(s);
}
