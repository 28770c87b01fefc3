/*
 * link.c: links between runners (protocol.md, Links between runners).
 *
 * A link is a TCP connection between a session of this runner and a
 * session of another, set up once (Tlisten on the receiving session, which
 * issues a link grant; Tdial on the sending one, which connects and proves
 * it, as a copy between runners does) and then used by every run of a
 * graph: a link program sends a buffer range on it, or receives the next
 * message into one. So the data of a sharded step goes runner to runner
 * inside each runner's graph, with no grant, no connection and no client
 * round trip per copy.
 *
 * Each message carries a sequence number and the channel the client gave
 * both ends, so one run's data is never taken for another's: a message out
 * of turn, of another channel or another size breaks the link. So does a
 * peer that closes, fails or stalls past the frame timeout. A broken link
 * fails every later use with EPEER until the client frees it and makes a
 * new one; the session itself goes on.
 *
 * Sends never block the session: what the socket does not take at once
 * waits in the link's out buffer (a copy, so later kernels may overwrite
 * the range), and goes out while the session waits to receive, or at the
 * end of the run. Two runners that send to each other before they receive
 * therefore never wait for each other. A request ends only when its bytes
 * left the out buffers, so a link that breaks holding some fails the
 * request that sent them (lost), never a later one alone.
 */
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monotime.h"
#include "session.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0	/* macOS: SO_NOSIGPIPE, set in net_tune() */
#endif

enum { LINK_SEND = 1, LINK_RECV = 2 };

struct link {
	uint32_t handle;
	int dir;		/* LINK_SEND (Tdial) or LINK_RECV (Tlisten) */
	int fd;			/* -1: no peer connected yet, or broken */
	uint64_t seq;		/* the last message sent or received */
	char peer[PROTO_MAX_PEER_HOST + 16];	/* what the link reaches */
	char broken[256];	/* why it can no longer be used, or "" */
	uint8_t *out;		/* bytes sent but not yet taken by the socket */
	size_t outoff, outlen, outcap;
	int lost;		/* broke holding bytes of the current request */
	struct link *next;
};

static const char *
dir_name(int dir)
{
	return dir == LINK_SEND ? "sends" : "receives";
}

static struct link *
new_link(struct session *s, uint32_t tag, uint32_t handle, int dir)
{
	struct link *l;

	if (htab_get(&s->links, handle) != NULL) {
		sess_errorf(s, tag, PROTO_EEXIST, "link handle %u is already "
		    "in use", handle);
		return NULL;
	}
	if (sess_count_handle(s, tag, &s->nlinks, "links") == -1)
		return NULL;
	if ((l = calloc(1, sizeof(*l))) == NULL ||
	    htab_put(&s->links, handle, l) == -1) {
		free(l);
		s->nlinks--;
		sess_errorf(s, tag, PROTO_ENOMEM, "out of host memory");
		return NULL;
	}
	l->handle = handle;
	l->dir = dir;
	l->fd = -1;
	l->next = s->linklist;
	s->linklist = l;
	return l;
}

static void
free_link(struct session *s, struct link *l)
{
	struct link **pp;

	for (pp = &s->linklist; *pp != NULL; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	if (l->fd != -1)
		close(l->fd);
	grant_drop_link(s, l->handle);
	free(l->out);
	free(l);
	s->nlinks--;
}

/* The link can no longer be used: close it and say why, once. */
static void
break_link(struct session *s, struct link *l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
break_link(struct session *s, struct link *l, const char *fmt, ...)
{
	va_list ap;

	if (l->broken[0] == '\0') {
		va_start(ap, fmt);
		vsnprintf(l->broken, sizeof(l->broken), fmt, ap);
		va_end(ap);
		log_info("session %u: link %u (%s %s) broke: %s", s->id,
		    l->handle, dir_name(l->dir), l->peer, l->broken);
	}
	if (l->fd != -1)
		close(l->fd);
	l->fd = -1;
	/* Kept bytes are always the current request's (each request that
	 * sends waits for them at its end): that request must fail. */
	if (l->outlen > 0)
		l->lost = 1;
	l->outlen = l->outoff = 0;
}

static int
link_error(struct session *s, uint32_t tag, const struct link *l)
{
	return sess_errorf(s, tag, PROTO_EPEER, "link %u (%s %s): %s",
	    l->handle, dir_name(l->dir), l->peer, l->broken);
}

int
sess_listen(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tlisten *t = &m->tlisten;
	struct peer_grant *g;
	struct link *l;

	(void)frame;
	if ((l = new_link(s, t->h.tag, t->link, LINK_RECV)) == NULL)
		return sess_fail_reply(s);
	if ((g = grant_new(s, t->h.tag, t->ttl)) == NULL) {
		htab_del(&s->links, t->link);
		free_link(s, l);
		return sess_fail_reply(s);
	}
	g->islink = 1;
	g->handle = t->link;
	snprintf(l->peer, sizeof(l->peer), "from the runner that dials it");
	return grant_reply(s, PROTO_RLISTEN, t->h.tag, g);
}

int
sess_dial(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tdial *t = &m->tdial;
	const uint8_t *body = frame + proto_fixed_size(m->h.type);
	char host[PROTO_MAX_PEER_HOST + 1];
	uint8_t cnonce[PROTO_NONCE_SIZE];
	struct link *l;
	uint32_t code;
	int64_t t0 = mono_ns();
	int fd;

	if (peer_host(host, body, t->hostlen, t->port) == -1) {
		sess_errorf(s, t->h.tag, PROTO_EINVAL, "Tdial needs a host of "
		    "1 to %d bytes without NUL and a port", PROTO_MAX_PEER_HOST);
		return sess_fail_reply(s);
	}
	if ((l = new_link(s, t->h.tag, t->link, LINK_SEND)) == NULL)
		return sess_fail_reply(s);
	snprintf(l->peer, sizeof(l->peer), "to %s:%u", host, t->port);
	if (sess_flush(s) == -1)	/* queued replies go out before a wait */
		return -2;
	if ((fd = peer_connect(host, t->port, t->grant, t->secret, 0, 1,
	    s->ctx->cfg->frame_timeout, cnonce, &code, s->err)) == -1) {
		htab_del(&s->links, t->link);
		free_link(s, l);
		sess_errorf(s, t->h.tag, code, "%s", s->err);
		return sess_fail_reply(s);
	}
	l->fd = fd;
	log_info("session %u: link %u %s connected in %lld us", s->id,
	    l->handle, l->peer, (long long)(mono_ns() - t0) / 1000);
	return sess_reply_ns(s, PROTO_RDIAL, t->h.tag,
	    (uint64_t)(mono_ns() - t0));
}

int
sess_unlink(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tunlink *t = &m->tunlink;
	struct link *l = htab_del(&s->links, t->link);

	(void)frame;
	if (l == NULL)
		return sess_errorf(s, t->h.tag, PROTO_EHANDLE, "no link with "
		    "handle %u", t->link);
	free_link(s, l);
	return 0;
}

void
link_accept(struct session *s, int fd, const struct peer_grant *g,
    const struct proto_tpeer *p)
{
	struct link *l = htab_get(&s->links, g->handle);
	uint8_t mac[PROTO_MAC_SIZE];

	if (l == NULL || l->fd != -1 || l->broken[0] != '\0')
		return grant_refuse(s, fd, p->h.tag, PROTO_EHANDLE, "the link "
		    "was freed since its grant was issued");
	if (p->count != 0)
		return grant_refuse(s, fd, p->h.tag, PROTO_EINVAL, "a link's "
		    "Tpeer has count 0");
	peer_mac(g->secret, "metal_runner link dst", g->id, 0, p->cnonce, mac);
	if (peer_send_rpeer(fd, p->h.tag, 0, mac) == -1) {
		close(fd);
		return;
	}
	l->fd = fd;
	log_info("session %u: link %u connected (receives)", s->id,
	    l->handle);
}

int
link_check_load(struct session *s, const struct proto_tload *t)
{
	if (t->nbufs != 1 || t->nvals != 2 || t->corearg != PROTO_NO_CORE ||
	    t->arch != 0 || t->datalen != 0)
		return sess_errorf(s, t->h.tag, PROTO_EINVAL, "a link program "
		    "takes 1 buffer and 2 values, no core argument, arch 0 "
		    "and no data (it has %u, %u, corearg %u, arch %u, %u "
		    "bytes)", t->nbufs, t->nvals, t->corearg, t->arch,
		    t->datalen);
	return 0;
}

int
link_check(struct session *s, uint32_t tag, const struct program *p,
    const struct proto_arg *args, const int64_t *vals)
{
	struct link *l = htab_get(&s->links, p->link);
	struct buffer *b = htab_get(&s->bufs, args[0].handle);
	int dir = p->kind == PROTO_PROG_LINK_SEND ? LINK_SEND : LINK_RECV;

	if (l == NULL)
		return sess_errorf(s, tag, PROTO_EHANDLE, "%s: no link with "
		    "handle %u", p->name, p->link);
	if (l->dir != dir)
		return sess_errorf(s, tag, PROTO_EINVAL, "%s: link %u %s; "
		    "this program %s", p->name, p->link, dir_name(l->dir),
		    dir_name(dir));
	if (b == NULL)
		return sess_errorf(s, tag, PROTO_EHANDLE, "%s: no buffer with "
		    "handle %u", p->name, args[0].handle);
	if (vals[0] <= 0 || args[0].offset > b->size ||
	    (uint64_t)vals[0] > b->size - args[0].offset)
		return sess_errorf(s, tag, PROTO_ERANGE, "%s: %lld bytes at "
		    "offset %llu do not fit buffer %u of %llu bytes", p->name,
		    (long long)vals[0], (unsigned long long)args[0].offset,
		    args[0].handle, (unsigned long long)b->size);
	return 0;
}

/* Send what l->out holds, as far as the socket takes it now. */
static int
push(struct session *s, struct link *l)
{
	ssize_t n;

	while (l->outlen > 0) {
		n = send(l->fd, l->out + l->outoff, l->outlen,
		    MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0) {
			break_link(s, l, "sending: %s", strerror(errno));
			return -1;
		}
		l->outoff += (size_t)n;
		l->outlen -= (size_t)n;
	}
	l->outoff = 0;
	return 0;
}

/*
 * A sending link never reads: anything readable on it means the receiving
 * runner closed it (or broke it). A send() after the peer's close would
 * still succeed once (TCP), so check first: the peer's next use fails.
 */
static int
peer_closed(struct session *s, struct link *l)
{
	uint8_t c;
	ssize_t n = recv(l->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

	if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK ||
	    errno == EINTR))
		return 0;
	if (n == 0)
		break_link(s, l, "the receiving runner closed the link");
	else if (n > 0)
		break_link(s, l, "the receiving runner sent data on a link "
		    "that only sends");
	else
		break_link(s, l, "sending: %s", strerror(errno));
	return -1;
}

static int
send_msg(struct session *s, uint32_t tag, struct link *l, const uint8_t *data,
    uint64_t count, uint64_t channel)
{
	uint8_t hdr[PROTO_LINK_HDR_SIZE];
	struct iovec iov[2];
	struct msghdr mh;
	size_t done = 0, hd = 0, total = sizeof(hdr) + (size_t)count;
	ssize_t n;

	if (peer_closed(s, l) == -1)
		return link_error(s, tag, l);
	proto_put_linkhdr(hdr, ++l->seq, channel, count);
	if (push(s, l) == -1)
		return link_error(s, tag, l);
	/* Straight from the buffer when nothing waits before it. hd: the
	 * bytes of the header sent, done - hd those of the data. */
	while (l->outlen == 0 && done < total) {
		iov[0].iov_base = hdr + hd;
		iov[0].iov_len = sizeof(hdr) - hd;
		iov[1].iov_base = (uint8_t *)data + (done - hd);
		iov[1].iov_len = (size_t)count - (done - hd);
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = iov;
		mh.msg_iovlen = 2;
		n = sendmsg(l->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			break_link(s, l, "sending: %s", strerror(errno));
			return link_error(s, tag, l);
		}
		done += (size_t)n;
		hd = done < sizeof(hdr) ? done : sizeof(hdr);
	}
	if (done == total)
		return 0;
	/* The rest waits in out, copied: later kernels may change the range. */
	if (sess_grow(&l->out, &l->outcap, l->outoff + l->outlen + total -
	    done) == -1) {
		/* Part of the message may be out: the stream is cut. */
		break_link(s, l, "no host memory for %zu bytes to send",
		    total - done);
		return sess_errorf(s, tag, PROTO_ENOMEM, "link %u: no memory "
		    "for %zu bytes to send", l->handle, total - done);
	}
	memcpy(l->out + l->outoff + l->outlen, hdr + hd, sizeof(hdr) - hd);
	l->outlen += sizeof(hdr) - hd;
	memcpy(l->out + l->outoff + l->outlen, data + (done - hd),
	    (size_t)count - (done - hd));
	l->outlen += (size_t)count - (done - hd);
	return 0;
}

/*
 * Wait for the session's links: until l (if not NULL) is readable, or
 * until every link has sent what it holds. Sends go on all the while.
 * 1 when l is readable, 0 when every out buffer is empty (sent, or dropped
 * by a link that broke: break_link marks it lost), -1 when nothing moved
 * for the frame timeout (the links that wait are then broken).
 */
static int
wait_links(struct session *s, struct link *l)
{
	int ms = s->ctx->cfg->frame_timeout * 1000;
	struct pollfd p[64];
	struct link *who[64], *x;
	int n, i, rc;

	for (;;) {
		n = 0;
		if (l != NULL) {
			p[n].fd = l->fd;
			p[n].events = POLLIN;
			who[n++] = l;
		}
		for (x = s->linklist; x != NULL && n < 64; x = x->next)
			if (x->outlen > 0 && x->fd != -1) {
				p[n].fd = x->fd;
				p[n].events = POLLOUT;
				who[n++] = x;
			}
		if (n == 0)
			return 0;
		for (i = 0; i < n; i++)
			p[i].revents = 0;
		if ((rc = poll(p, (nfds_t)n, ms)) == -1 && errno == EINTR)
			continue;
		if (rc <= 0) {
			for (i = 0; i < n; i++)
				break_link(s, who[i], "%s for %d s (the frame "
				    "timeout)", who[i] == l ? "no message "
				    "came" : "the receiving runner took no "
				    "data", s->ctx->cfg->frame_timeout);
			return -1;
		}
		for (i = 0; i < n; i++) {
			if (p[i].revents == 0)
				continue;
			if (who[i] == l && (p[i].events & POLLIN))
				return 1;
			push(s, who[i]);
		}
	}
}

/* Receive exactly n bytes of l into dst, sending on other links while it
 * waits. -1: the link broke (said in l->broken). */
static int
recv_exact(struct session *s, struct link *l, uint8_t *dst, size_t n)
{
	int64_t t0;
	ssize_t r;
	int rc;

	while (n > 0) {
		if (l->fd == -1)
			return -1;
		r = recv(l->fd, dst, n, MSG_DONTWAIT);
		if (r > 0) {
			dst += r;
			n -= (size_t)r;
			continue;
		}
		if (r == 0) {
			break_link(s, l, "the sending runner closed the link");
			return -1;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			break_link(s, l, "receiving: %s", strerror(errno));
			return -1;
		}
		t0 = mono_ns();
		rc = wait_links(s, l);
		s->link_wait_ns += (uint64_t)(mono_ns() - t0);
		if (rc == -1)
			return -1;
	}
	return 0;
}

static int
recv_msg(struct session *s, uint32_t tag, struct link *l, uint8_t *dst,
    uint64_t count, uint64_t channel)
{
	uint8_t hdr[PROTO_LINK_HDR_SIZE];
	struct proto_linkhdr h;

	if (recv_exact(s, l, hdr, sizeof(hdr)) == -1)
		return link_error(s, tag, l);
	proto_get_linkhdr(hdr, &h);
	if (h.magic != PROTO_LINK_MAGIC || h.seq != l->seq + 1 ||
	    h.channel != channel || h.count != count) {
		break_link(s, l, "message %llu of channel %llu with %llu bytes "
		    "came where message %llu of channel %llu with %llu bytes "
		    "was due%s", (unsigned long long)h.seq,
		    (unsigned long long)h.channel, (unsigned long long)h.count,
		    (unsigned long long)l->seq + 1,
		    (unsigned long long)channel, (unsigned long long)count,
		    h.magic != PROTO_LINK_MAGIC ? " (not a link message)" : "");
		return link_error(s, tag, l);
	}
	if (recv_exact(s, l, dst, (size_t)count) == -1)
		return link_error(s, tag, l);
	l->seq++;
	return 0;
}

int
link_run(struct session *s, uint32_t tag, const struct program *p,
    const struct proto_arg *args, const int64_t *vals)
{
	struct link *l = htab_get(&s->links, p->link);
	struct buffer *b = htab_get(&s->bufs, args[0].handle);
	uint8_t *at = (uint8_t *)s->be->contents(b->b) + args[0].offset;

	if (l->broken[0] != '\0')
		return link_error(s, tag, l);
	if (l->fd == -1)
		return sess_errorf(s, tag, PROTO_EPEER, "link %u (%s %s): no "
		    "runner has connected to it", l->handle, dir_name(l->dir),
		    l->peer);
	if (l->dir == LINK_SEND) {
		if (sess_host_read(s, b) == -1)
			return sess_errorf(s, tag, PROTO_EDEVICE, "%s", s->err);
		return send_msg(s, tag, l, at, (uint64_t)vals[0],
		    (uint64_t)vals[1]);
	}
	if (sess_host_writes(s, b, (uint64_t)vals[0]) == -1)
		return sess_errorf(s, tag, PROTO_EDEVICE, "%s", s->err);
	if (s->rread_refs > 0)	/* the message lands in a buffer */
		resume_keep(s);
	if (recv_msg(s, tag, l, at, (uint64_t)vals[0], (uint64_t)vals[1]) == -1)
		return -1;
	sess_host_wrote(s, b, args[0].offset, (uint64_t)vals[0]);
	return 0;
}

/*
 * The end of a request that ran link programs: wait until the links took
 * every byte it sent, or broke. The first link that broke holding some of
 * them, or NULL; the marks are cleared for the next request.
 */
static struct link *
settle(struct session *s)
{
	struct link *l, *lost = NULL;

	wait_links(s, NULL);
	for (l = s->linklist; l != NULL; l = l->next) {
		if (l->lost && lost == NULL)
			lost = l;
		l->lost = 0;
	}
	return lost;
}

int
link_flush(struct session *s, uint32_t tag)
{
	struct link *l = settle(s);

	return l == NULL ? 0 : link_error(s, tag, l);
}

void
link_drain(struct session *s)
{
	(void)settle(s);
}

void
sess_links_free(struct session *s)
{
	while (s->linklist != NULL) {
		htab_del(&s->links, s->linklist->handle);
		free_link(s, s->linklist);
	}
	htab_clear(&s->links, NULL, NULL);
}
