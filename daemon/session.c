/*
 * session.c: the session's core, below its request handlers: frame input,
 * replies and the error queue. It calls no handler (dispatch.c does).
 *
 * A session reads frames from a blocking socket through an input buffer
 * that grows only as bytes arrive (never to a size a client merely
 * declares); dispatch.c validates each header and fixed part whole, then
 * calls the request's handler from its table.
 * Bulk Twrite data is received straight into the checked destination;
 * Rread data is sent straight from the buffer. Replies collect in an
 * output buffer that is flushed whenever the session would block reading,
 * so a pipelined burst costs one send; launched work is handed to the
 * device at the same moment (backend.h, idle).
 *
 * Requests without a reply that fail queue their Rerror; queued errors go
 * out ahead of the next reply, so none is lost and order is kept.
 *
 * Between frames the input waits for all of the session's sockets: its
 * client's, the inbox of peer connections (served by what peer.c installed,
 * s->peer_serve) and the control socket a resume arrives on (taken by
 * resume_conn.c, below this file, as in the middle of a frame).
 */
#include <sys/socket.h>
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

#include "monotime.h"
#include "session.h"
#include "slots.h"

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
 * Between frames, with nothing buffered, in a ready session: wait for the
 * client's next request, a peer in the inbox or a resume naming this
 * session, whichever comes first. 1: the client's socket is readable (or a
 * resume came for a session with a key: sess_recv() takes it); 0: a peer
 * was served or a resume refused (or a grant may have expired): ask again;
 * -1: the client has been idle past --idle-timeout; -2: the runner is
 * stopping. The inbox is peer.c's, served through the hooks it installed
 * (session.h, peer_tick and peer_serve).
 */
static int
wait_between(struct session *s)
{
	int idle = s->ctx->cfg->idle_timeout, ms;
	struct pollfd p[3];
	int n;

	ms = s->peer_tick(s);
	if (idle > 0) {
		int64_t left = ((int64_t)s->last_active + idle - time(NULL)) *
		    1000;
		if (left <= 0)
			return -1;
		if (ms == -1 || left < ms)
			ms = (int)(left < INT32_MAX ? left : INT32_MAX);
	}
	/* The client, the inbox, and a resume of this session arriving
	 * (sess_recv() takes that). */
	p[0].fd = s->fd;
	p[1].fd = s->inbox;
	p[2].fd = slot_ctl(s->slot);
	p[0].events = p[1].events = p[2].events = POLLIN;
	p[0].revents = p[1].revents = p[2].revents = 0;
	if ((n = poll(p, p[2].fd != -1 ? 3 : 2, ms)) <= 0)
		return n == 0 || errno == EINTR ? 0 : 1;
	if (p[0].revents != 0 || (p[2].revents != 0 && s->rs != NULL))
		return 1;
	/* A session without a key answers a resume naming it here. */
	if (p[2].revents != 0 && resume_take(s) == -1)
		return -2;
	if (p[1].revents != 0)
		s->peer_serve(s);
	return 0;
}

/* recv() from the client that also notices a resume arriving while the
 * link stands: in a session with a key, a recv that would block watches
 * the control socket too. */
static ssize_t
sess_recv(struct session *s, void *buf, size_t len)
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
	if (s->rs == NULL || slot_ctl(s->slot) == -1)
		return net_recv(s->fd, buf, len);
	for (;;) {
		/* What has arrived is taken without a poll: only a recv that
		 * would block waits, watching the control socket too. */
		if ((r = recv(s->fd, buf, len, MSG_DONTWAIT)) >= 0 ||
		    (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			return r;
		p[0].fd = s->fd;
		p[1].fd = slot_ctl(s->slot);
		p[0].events = p[1].events = POLLIN;
		p[0].revents = p[1].revents = 0;
		if ((n = poll(p, 2, tmo)) == -1 && errno == EINTR)
			continue;
		if (n == 0) {
			errno = EAGAIN;
			return -1;
		}
		/* A resume while this link stands (resume_conn.c): refused,
		 * or the link is gone. */
		if (p[1].revents != 0 && resume_switch(s) == -1) {
			errno = ECONNRESET;
			return -1;
		}
	}
}

/*
 * Make n bytes of the current frame available at s->in + s->inoff.
 * Returns 1, 0 at a clean end of stream between frames, -1 on error.
 */
int
sess_need(struct session *s, size_t n, int boundary)
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
		    (r = wait_between(s)) != 1) {
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
		 * it is, wait_between() above applies it); the socket's receive
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
		r = sess_recv(s, s->in + s->inlen, s->incap - s->inlen);
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
			r = sess_recv(s, dst, (size_t)count);
		else {
			s->inoff = s->inlen = 0;
			r = sess_recv(s, s->in, (size_t)min64(count, s->incap));
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
