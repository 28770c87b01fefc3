/*
 * peer.c: copies between runners, in a session (protocol.md, Copies
 * between runners).
 *
 * The destination session issues a grant (Tgrant): a random secret bound
 * to this session, one range of one buffer and a deadline, good for one
 * transfer. The client gives it to the source session (Tpeersend), which
 * gets a connection to the destination runner (peer_net.c), proves the
 * grant and streams the range. The destination runner serves that
 * connection like any other until its first frame shows it is a peer
 * (Tpeer); then sess_peer_route() hands the socket to the session that
 * owns the grant (peer_route.c, through that session's inbox), and that
 * session checks the grant and receives the bytes straight into the
 * granted range, between two requests of its own client.
 *
 * The grant, not the runner's token, authenticates a peer: its secret
 * is 32 random bytes that only the destination session and its
 * authenticated client know, and it allows nothing but writing at most
 * its count bytes into its range once, before it expires.
 */
#include <sys/types.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monotime.h"
#include "session.h"

static int
range_ok(uint64_t size, uint64_t offset, uint64_t count)
{
	return offset <= size && count <= size - offset;
}

int
sess_grant(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tgrant *t = &m->tgrant;
	struct buffer *b = htab_get(&s->bufs, t->handle);
	struct peer_grant *g;

	(void)frame;
	if (b == NULL)
		sess_errorf(s, t->h.tag, PROTO_EHANDLE, "no buffer with handle "
		    "%u", t->handle);
	else if (!range_ok(b->size, t->offset, t->count))
		sess_errorf(s, t->h.tag, PROTO_ERANGE, "grant of %llu bytes at "
		    "offset %llu is outside buffer %u of %llu bytes",
		    (unsigned long long)t->count,
		    (unsigned long long)t->offset, t->handle,
		    (unsigned long long)b->size);
	else if (t->count == 0 || t->ttl == 0 || t->ttl > PROTO_MAX_GRANT_TTL)
		sess_errorf(s, t->h.tag, PROTO_EINVAL, "a grant needs a count "
		    "above 0 and a ttl of 1 to %d s (count %llu, ttl %u)",
		    PROTO_MAX_GRANT_TTL, (unsigned long long)t->count, t->ttl);
	else if ((g = grant_new(s, t->h.tag, t->ttl)) != NULL) {
		g->handle = t->handle;
		g->offset = t->offset;
		g->count = t->count;
		return grant_reply(s, PROTO_RGRANT, t->h.tag, g);
	}
	return sess_fail_reply(s);
}

int
sess_peersend(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tpeersend *t = &m->tpeersend;
	const uint8_t *body = frame + proto_fixed_size(m->h.type);
	struct buffer *b = htab_get(&s->bufs, t->handle);
	char host[PROTO_MAX_PEER_HOST + 1];
	uint8_t cnonce[PROTO_NONCE_SIZE];
	const uint8_t *src;
	uint32_t code;
	int64_t t0 = mono_ns();
	int fd;

	if (peer_host(host, body, t->hostlen, t->port) == -1 ||
	    t->count == 0) {
		sess_errorf(s, t->h.tag, PROTO_EINVAL, "Tpeersend needs a host "
		    "of 1 to %d bytes without NUL, a port and a count above 0",
		    PROTO_MAX_PEER_HOST);
		return sess_fail_reply(s);
	}
	if (b == NULL) {
		sess_errorf(s, t->h.tag, PROTO_EHANDLE, "no buffer with handle "
		    "%u", t->handle);
		return sess_fail_reply(s);
	}
	if (!range_ok(b->size, t->offset, t->count)) {
		sess_errorf(s, t->h.tag, PROTO_ERANGE, "send of %llu bytes at "
		    "offset %llu is outside buffer %u of %llu bytes",
		    (unsigned long long)t->count,
		    (unsigned long long)t->offset, t->handle,
		    (unsigned long long)b->size);
		return sess_fail_reply(s);
	}
	/* The copy observes the session's earlier work on the buffer. */
	if (s->dirty) {
		s->dirty = 0;
		if (s->be->sync(s->bs, s->err) == -1) {
			sess_errorf(s, t->h.tag, PROTO_EDEVICE, "%s", s->err);
			return sess_fail_reply(s);
		}
	}
	if (sess_host_read(s, b) == -1) {
		sess_errorf(s, t->h.tag, PROTO_EDEVICE, "%s", s->err);
		return sess_fail_reply(s);
	}
	if (sess_flush(s) == -1)	/* queued replies go out before a wait */
		return -2;
	if ((fd = peer_connect(host, t->port, t->grant, t->secret, t->count,
	    0, s->ctx->cfg->frame_timeout, cnonce, &code, s->err)) == -1) {
		sess_errorf(s, t->h.tag, code, "%s", s->err);
		return sess_fail_reply(s);
	}
	src = (const uint8_t *)s->be->contents(b->b) + t->offset;
	if (net_send_all(fd, src, (size_t)t->count) == -1) {
		code = PROTO_EPEER;
		snprintf(s->err, sizeof(s->err), "sending to the destination "
		    "runner: %s", strerror(errno));
	} else if (peer_finish(fd, t->grant, t->secret, cnonce, t->count,
	    &code, s->err) == 0)
		code = 0;
	close(fd);
	grant_wipe(cnonce, sizeof(cnonce));
	if (code != 0) {
		sess_errorf(s, t->h.tag, code, "%s", s->err);
		return sess_fail_reply(s);
	}
	log_info("session %u: sent %llu bytes to the runner at %s:%u in %lld "
	    "us", s->id, (unsigned long long)t->count, host, t->port,
	    (long long)(mono_ns() - t0) / 1000);
	return sess_reply_ns(s, PROTO_RPEERSEND, t->h.tag,
	    (uint64_t)(mono_ns() - t0));
}

/* One line in the default log per runner that proved a grant of this
 * session: a sharded step makes a connection per link, and those are -v's.
 * host comes with the connection from the inbox (a confined session may
 * not ask the socket). */
static void
announce_peer(struct session *s, const char *host)
{
	unsigned i;

	for (i = 0; i < s->npeers_seen; i++)
		if (strcmp(s->peers_seen[i], host) == 0)
			return;
	if (s->npeers_seen == 8)
		return;
	snprintf(s->peers_seen[s->npeers_seen++], sizeof(s->peers_seen[0]),
	    "%s", host);
	log_notice("session %u: runner at %s connected to copy or link into "
	    "it%s", s->id, host, s->npeers_seen == 8 ? " (more runners are "
	    "logged with -v only)" : "");
}

/* A peer connection from the inbox: check its grant, take its bytes. */
static void
peer_accept(struct session *s, int fd, const uint8_t *frame, size_t len)
{
	const struct proto_tpeer *p;
	struct peer_grant g;
	struct buffer *b;
	union proto_msg m;
	uint8_t mac[PROTO_MAC_SIZE];
	int64_t t0 = mono_ms();
	size_t fixed = proto_fixed_size(PROTO_TPEER);
	char host[64];

	if (len < fixed || len - fixed >= sizeof(host) ||
	    proto_get(frame, fixed, &m, NULL) == -1 || m.h.type != PROTO_TPEER) {
		close(fd);
		return;
	}
	memcpy(host, frame + fixed, len - fixed);
	host[len - fixed] = '\0';
	p = &m.tpeer;
	if (grant_take(s, fd, p, &g) == -1)
		return;
	announce_peer(s, host);
	if (p->magic != PROTO_MAGIC) {
		grant_refuse(s, fd, p->h.tag, PROTO_EVERSION, "bad magic: not a "
		    "metal_runner peer");
		goto out;
	}
	if (g.islink) {
		link_accept(s, fd, &g, p);
		goto out;
	}
	if (p->count > g.count) {
		char text[128];
		snprintf(text, sizeof(text), "the peer offers %llu bytes; the "
		    "grant allows %llu", (unsigned long long)p->count,
		    (unsigned long long)g.count);
		grant_refuse(s, fd, p->h.tag, PROTO_ERANGE, text);
		goto out;
	}
	if ((b = htab_get(&s->bufs, g.handle)) == NULL ||
	    !range_ok(b->size, g.offset, p->count)) {
		grant_refuse(s, fd, p->h.tag, PROTO_EHANDLE, "the granted buffer was "
		    "freed or replaced since the grant");
		goto out;
	}
	/* Later work of the session observes the bytes (they land before
	 * its next request is read); earlier work that may read the range
	 * finishes before they land. */
	if (s->dirty) {
		s->dirty = 0;
		if (s->be->sync(s->bs, s->err) == -1) {
			grant_refuse(s, fd, p->h.tag, PROTO_EDEVICE, s->err);
			goto out;
		}
	}
	if (sess_host_writes(s, b, p->count) == -1) {
		grant_refuse(s, fd, p->h.tag, PROTO_EDEVICE, s->err);
		goto out;
	}
	peer_mac(g.secret, "metal_runner peer dst", g.id, p->count, p->cnonce,
	    mac);
	if (peer_send_rpeer(fd, p->h.tag, 0, mac) == -1 ||
	    peer_recv_all(fd, (uint8_t *)s->be->contents(b->b) + g.offset,
	    (size_t)p->count) == -1) {
		log_info("session %u: a peer's transfer broke off: %s", s->id,
		    strerror(errno));
		close(fd);
		goto out;
	}
	sess_host_wrote(s, b, g.offset, p->count);
	peer_mac(g.secret, "metal_runner peer done", g.id, p->count,
	    p->cnonce, mac);
	peer_send_rpeer(fd, p->h.tag, p->count, mac);
	close(fd);
	log_info("session %u: received %llu bytes from a peer into buffer %u "
	    "in %lld ms", s->id, (unsigned long long)p->count, g.handle,
	    (long long)(mono_ms() - t0));
out:
	grant_wipe(&g, sizeof(g));
}

/* Before each wait between frames (session.c): with grants to drop as
 * they expire, a turn again within a second. */
static int
peer_tick(struct session *s)
{
	if (s->ngrants == 0)
		return -1;
	grant_prune(s);
	return 1000;
}

void
sess_peer_open(struct session *s)
{
	s->inbox = peer_inbox(s->slot);
	s->peer_tick = peer_tick;
	s->peer_serve = sess_peer_take;
}

void
sess_peer_take(struct session *s)
{
	uint8_t frame[256];
	ssize_t n;
	int fd;

	n = net_recv_fd(s->inbox, frame, sizeof(frame), &fd);
	if (n == 0) {		/* no one can hand us peers any more */
		close(s->inbox);
		s->inbox = -1;
	} else if (n > 0 && fd != -1) {
		if (s->rread_refs > 0)	/* the peer writes into a buffer */
			resume_keep(s);
		peer_accept(s, fd, frame, (size_t)n);
	} else if (fd != -1)
		close(fd);
}

int
sess_peer_route(struct session *s, const union proto_msg *m,
    const uint8_t *frame)
{
	uint32_t owner = (uint32_t)(m->tpeer.grant >> 32);
	size_t fixed = proto_fixed_size(PROTO_TPEER), hl;
	const char *colon = strrchr(s->peer, ':');
	uint8_t msg[256];

	/* The frame, then the peer's host without its port. */
	hl = colon != NULL ? (size_t)(colon - s->peer) : strlen(s->peer);
	hl = min64(hl, 63);
	memcpy(msg, frame, fixed);
	memcpy(msg + fixed, s->peer, hl);
	if (peer_handoff(owner, msg, fixed + hl, s->fd, s->err) == -1) {
		uint8_t out[PROTO_HDR_SIZE + 8 + 256];
		size_t n;

		log_notice("session %u: peer connection from %s for session "
		    "%u: %s", s->id, s->peer, owner, s->err);
		n = proto_put_rerror(out, sizeof(out), m->h.tag, PROTO_EGRANT,
		    "no session of this runner holds that grant");
		net_send_all(s->fd, out, n);
		return -1;
	}
	log_info("session %u: peer connection from %s handed to session "
	    "%u", s->id, s->peer, owner);
	return 0;
}

void
sess_peer_free(struct session *s)
{
	grant_free(s);
	if (s->inbox != -1)
		close(s->inbox);
	s->inbox = -1;
}
