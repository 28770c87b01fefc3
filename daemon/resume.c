/*
 * resume.c: sessions that survive a dropped link: Tresumekey, Tresume and
 * Tack, and the session's wait for its client after the link dropped.
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
 * the key, as far back as it can (resume_ring.c: a ring of the bytes it
 * copied, references to the data of large Rreads, copied only when a
 * request that may change a buffer comes before the client acknowledged
 * them with Tack). So bulk reads cost no copy, and a client that
 * acknowledges what it received (the Python client does, after each large
 * read) never causes one. A resume that needs bytes no longer held is
 * refused with ERESUME and the session ends.
 *
 * How a new connection reaches the session: the connection does its
 * handshake in a session of its own, like any other, whose Tresume sends
 * it, with the socket (SCM_RIGHTS), up a control socket to the accept
 * loop; the accept loop passes it down the control socket of the session
 * the Tresume names (resume_route.c), and the named session checks the
 * proof itself (resume_conn.c, below the session's input, which takes a
 * resume that arrives while the link stands). So the accept loop reads
 * nothing from a client and never sees a key; a session process needs no
 * more system calls than sendmsg and recvmsg, which it has (confine.c).
 * Thread isolation works the same way, with both ends of each control
 * socket in one process.
 */
#include <sys/types.h>

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monotime.h"
#include "resume.h"
#include "session.h"
#include "slots.h"

int
resume_ack(struct session *s, const union proto_msg *m,
    const uint8_t *frame)
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
	resume_ring_acked(s);
	return 0;
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
	if (rs->switched) {	/* the session's input took a resume already */
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
		struct pollfd p[2] = { { slot_ctl(s->slot), POLLIN, 0 },
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
resume_key(struct session *s, const union proto_msg *m,
    const uint8_t *frame)
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
		random_bytes(rs->secret, sizeof(rs->secret));
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
	struct resume_handover h;

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
	if (resume_handover_send(slot_ctl(s->slot), &h, s->fd) == -1)
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
	int ctl = slot_ctl(s->slot);

	resume_free(s);
	if (ctl != -1) {
		struct resume_handover h;
		int fd;
		/* Resumes that came too late: answer them rather than let
		 * their connections close without a word. */
		while (resume_handover_recv(ctl, &h, &fd) == 0)
			net_refuse(fd, h.tag, PROTO_ERESUME, "the session has "
			    "ended");
		close(ctl);
		slot_get((uint32_t)s->slot)->ctl = -1;
	}
}
