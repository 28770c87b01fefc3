/*
 * resume_conn.c: a resume arriving for a session on its control socket
 * (resume.c says how a new connection gets there): the proof of the
 * session's key, the new connection in place of the old, and the replies
 * the client missed sent on it from what the session kept (resume_ring.c).
 *
 * Below the session's input (session.c), which takes a resume that arrives
 * while it waits for its client, between frames or in the middle of one;
 * resume.c's wait after a dropped link takes one the same way. So it calls
 * nothing above it: the sockets (net.c), the slot (slots.c), the record of
 * the replies (resume_ring.c) and the MACs (sha256.c).
 */
#include <sys/socket.h>
#include <sys/types.h>

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "resume.h"
#include "session.h"
#include "slots.h"

static const char resume_client[] = "metal_runner-resume-v1 client";
static const char resume_server[] = "metal_runner-resume-v1 server";

int
resume_offered(const struct session *s)
{
	return s->ctx->cfg->resume_grace > 0 && slot_ctl(s->slot) != -1;
}

static void
put_le(uint8_t *p, uint64_t v, int n)
{
	int i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void
client_mac(const struct resume *rs, const struct resume_handover *h,
    uint8_t out[32])
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
server_mac(const struct resume *rs, const struct resume_handover *h,
    uint8_t out[32])
{
	uint8_t msg[sizeof(resume_server) + 2 * PROTO_NONCE_SIZE];
	size_t l = strlen(resume_server);

	memcpy(msg, resume_server, l);
	memcpy(msg + l, h->cnonce, PROTO_NONCE_SIZE);
	memcpy(msg + l + 32, h->snonce, PROTO_NONCE_SIZE);
	hmac_sha256(rs->secret, sizeof(rs->secret), msg, l + 64, out);
}

/* A proven resume the session cannot honour: the session is lost. */
static int
lose(struct session *s, const struct resume_handover *h, int fd,
    const char *text)
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
	struct resume_handover h;
	union proto_msg r;
	uint8_t want[32], frame[sizeof(struct proto_rresume)], diff = 0;
	char text[256];
	uint64_t back;
	size_t i;
	int fd;

	if (resume_handover_recv(slot_ctl(s->slot), &h, &fd) == -1) {
		struct pollfd p = { slot_ctl(s->slot), POLLIN, 0 };
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
	if (resume_missed(rs, h.received, h.maxmsg, -1, text,
	    sizeof(text)) == -1)
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
	    resume_missed(rs, h.received, h.maxmsg, fd, text,
	    sizeof(text)) == -1)
		s->linkdown = 1;	/* and the client may try again */
	back = rs->total - h.received;
	s->bytes_out += sizeof(frame) + back;
	log_notice("session %u: resumed from %s (resume %u): %llu requests "
	    "processed, %llu bytes of replies sent again", s->id, h.peer,
	    rs->resumes, (unsigned long long)s->nproc,
	    (unsigned long long)back);
	return 1;
}

int
resume_switch(struct session *s)
{
	int n = resume_take(s);

	/* The client gave the link up (a half-open link after a network
	 * change): resume_wait() goes on on the new one. */
	if (n == 1)
		s->rs->switched = 1;
	if (n == 0)
		return 0;
	s->linkdown = 1;
	return -1;
}
