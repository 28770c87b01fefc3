/*
 * peer_net.c: the source runner's connection to a destination runner, for
 * a copy between runners (protocol.md, Copies between runners).
 *
 * peer_dial() connects, proves the grant (Tpeer) and checks that the far
 * end proves it too (the first Rpeer) before a byte of the buffer is
 * sent: a session only ever streams data to a runner that issued the
 * grant. A thread-isolated session dials itself. A session process cannot:
 * it is confined (confine.c) and may not open sockets. It asks the broker
 * instead, a small unconfined process forked when the runner starts, which
 * dials and does the same proof and passes back only a socket whose far
 * end proved the grant. So a confined session still cannot reach an
 * arbitrary address: all it can make the broker send anywhere is one
 * fixed-layout Tpeer frame, and the socket it gets back talks to a runner
 * that knows the grant's secret. The broker serves one request at a time
 * (a connect is bounded by PEER_CONNECT_MS).
 */
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "confine.h"
#include "session.h"

#define PEER_CONNECT_MS 3000	/* a destination that does not answer */
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

/* A request to the broker and its answer, one message each (PEER_SOCKTYPE). */
struct broker_req {
	uint64_t seq;
	uint64_t grant, count;
	uint8_t secret[PROTO_SECRET_SIZE];
	int32_t link;
	int32_t timeout_s;
	uint16_t port;
	char host[PROTO_MAX_PEER_HOST + 1];
};

struct broker_rep {
	uint64_t seq;
	uint32_t code;		/* 0: the socket came with it */
	uint8_t cnonce[PROTO_NONCE_SIZE];
	char err[PROTO_ERRLEN];
};

static int broker_fd = -1;	/* the sessions' end of the broker's socket */
static pid_t broker_pid = -1;
static int reply_fd[2] = { -1, -1 };	/* a session process's answers */
static uint64_t broker_seq;

static int fail(uint32_t *, uint32_t, char *, const char *, ...)
    __attribute__((format(printf, 4, 5)));

/* Leave code and a message for the caller; returns -1. */
static int
fail(uint32_t *code, uint32_t c, char *err, const char *fmt, ...)
{
	va_list ap;

	*code = c;
	va_start(ap, fmt);
	vsnprintf(err, PROTO_ERRLEN, fmt, ap);
	va_end(ap);
	return -1;
}

void
peer_mac(const uint8_t *secret, const char *label, uint64_t grant,
    uint64_t count, const uint8_t *cnonce, uint8_t out[32])
{
	uint8_t msg[64 + 16 + PROTO_NONCE_SIZE];
	size_t l = strlen(label), i;

	memcpy(msg, label, l);
	for (i = 0; i < 8; i++) {
		msg[l + i] = (uint8_t)(grant >> (8 * i));
		msg[l + 8 + i] = (uint8_t)(count >> (8 * i));
	}
	memcpy(msg + l + 16, cnonce, PROTO_NONCE_SIZE);
	hmac_sha256(secret, PROTO_SECRET_SIZE, msg, l + 16 + PROTO_NONCE_SIZE,
	    out);
}

int
peer_recv_all(int fd, void *buf, size_t n)
{
	uint8_t *p = buf;
	ssize_t r;

	while (n > 0) {
		if ((r = net_recv(fd, p, n)) <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Constant time: a wrong mac must not tell how much of it was right. */
int
peer_mac_equal(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;
	size_t i;

	for (i = 0; i < PROTO_MAC_SIZE; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

/* Read one reply from the destination: an Rpeer (returned in m) or an
 * Rerror (its code and text become ours). */
static int
read_reply(int fd, union proto_msg *m, uint32_t *code, char *err)
{
	uint8_t buf[PROTO_HDR_SIZE + 8 + PROTO_MAX_ERRTEXT];
	char text[PROTO_MAX_ERRTEXT + 1];
	size_t fixed;

	if (peer_recv_all(fd, buf, PROTO_HDR_SIZE) == -1)
		return fail(code, PROTO_EPEER, err, "the destination runner "
		    "closed the peer connection or did not answer");
	proto_get_hdr(buf, &m->h);
	if (m->h.type == PROTO_RERROR && m->h.size >= 20 &&
	    m->h.size <= sizeof(buf)) {
		if (peer_recv_all(fd, buf + PROTO_HDR_SIZE, m->h.size -
		    PROTO_HDR_SIZE) == -1 || proto_get(buf, m->h.size, m,
		    NULL) == -1 || m->rerror.count != m->h.size - 20)
			return fail(code, PROTO_EPEER, err, "the destination "
			    "runner's Rerror is malformed");
		memcpy(text, buf + 20, m->rerror.count);
		text[m->rerror.count] = '\0';
		/* A runner too busy to take the connection (its session or
		 * handshake limit) is, for this copy, one we cannot reach. */
		*code = m->rerror.code == PROTO_ELIMIT ? PROTO_EPEER :
		    m->rerror.code;
		snprintf(err, PROTO_ERRLEN, "destination runner: %.400s", text);
		return -1;
	}
	fixed = proto_fixed_size(PROTO_RPEER);
	if (m->h.type != PROTO_RPEER || m->h.size != fixed ||
	    peer_recv_all(fd, buf + PROTO_HDR_SIZE, fixed - PROTO_HDR_SIZE) ==
	    -1 || proto_get(buf, fixed, m, NULL) == -1)
		return fail(code, PROTO_EPEER, err, "the destination does not "
		    "answer as a metal_runner peer");
	return 0;
}

static int
connect_timed(const char *host, unsigned port, int timeout_s, uint32_t *code,
    char *err)
{
	struct addrinfo hints, *res = NULL, *ai;
	struct pollfd pfd;
	char serv[16];
	int fd = -1, e = 0, rc, flags;
	socklen_t elen = sizeof(e);

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(serv, sizeof(serv), "%u", port);
	if ((rc = getaddrinfo(host, serv, &hints, &res)) != 0)
		return fail(code, PROTO_EPEER, err, "cannot resolve %s: %s",
		    host, gai_strerror(rc));
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		if ((fd = socket(ai->ai_family, ai->ai_socktype, 0)) == -1)
			continue;
		flags = fcntl(fd, F_GETFL);
		fcntl(fd, F_SETFL, flags | O_NONBLOCK);
		if ((rc = connect(fd, ai->ai_addr, ai->ai_addrlen)) == -1 &&
		    errno == EINPROGRESS) {
			pfd.fd = fd;
			pfd.events = POLLOUT;
			if ((rc = poll(&pfd, 1, PEER_CONNECT_MS)) == 1 &&
			    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e,
			    &elen) == 0 && e == 0)
				rc = 0;
			else {
				errno = rc == 0 ? ETIMEDOUT : e ? e : errno;
				rc = -1;
			}
		}
		if (rc == 0) {
			fcntl(fd, F_SETFL, flags);
			net_tune(fd, timeout_s);
			break;
		}
		e = errno;
		close(fd);
		fd = -1;
		errno = e;
	}
	freeaddrinfo(res);
	if (fd == -1) {
		char where[PROTO_MAX_PEER_HOST + 16];

		snprintf(where, sizeof(where), "%s:%u", host, port);
		return fail(code, PROTO_EPEER, err, "cannot connect to the "
		    "destination runner at %s: %s", where, strerror(errno));
	}
	return fd;
}

/*
 * Connect to the destination runner at host:port and prove grant: send
 * Tpeer, check the Rpeer's proof. Returns the socket, ready for the count
 * bytes, with the nonce used in cnonce; or -1 with a protocol error code
 * (EPEER: unreachable or not a runner that issued the grant; else the
 * destination's own refusal, e.g. EGRANT) and a message.
 */
int
peer_dial(const char *host, unsigned port, uint64_t grant,
    const uint8_t *secret, uint64_t count, int link, int timeout_s,
    uint8_t *cnonce, uint32_t *code, char *err)
{
	union proto_msg m;
	uint8_t frame[sizeof(struct proto_tpeer) + 64], mac[PROTO_MAC_SIZE];
	size_t n;
	int fd;

	if ((fd = connect_timed(host, port, timeout_s, code, err)) == -1)
		return -1;
	random_bytes(cnonce, PROTO_NONCE_SIZE);
	memset(&m, 0, sizeof(m));
	m.h.type = PROTO_TPEER;
	m.h.size = (uint32_t)proto_fixed_size(PROTO_TPEER);
	m.tpeer.magic = PROTO_MAGIC;
	m.tpeer.grant = grant;
	m.tpeer.count = count;
	memcpy(m.tpeer.cnonce, cnonce, PROTO_NONCE_SIZE);
	peer_mac(secret, link ? "metal_runner link src" :
	    "metal_runner peer src", grant, count, cnonce, m.tpeer.mac);
	n = proto_put(frame, sizeof(frame), &m);
	if (net_send_all(fd, frame, n) == -1) {
		fail(code, PROTO_EPEER, err, "sending to the destination "
		    "runner: %s", strerror(errno));
		goto fail;
	}
	if (read_reply(fd, &m, code, err) == -1)
		goto fail;
	peer_mac(secret, link ? "metal_runner link dst" :
	    "metal_runner peer dst", grant, count, cnonce, mac);
	if (m.rpeer.count != 0 || !peer_mac_equal(mac, m.rpeer.mac)) {
		fail(code, PROTO_EPEER, err, "the destination did not prove "
		    "the grant: not the runner that issued it");
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return -1;
}

/* After the data: the destination's last Rpeer says it has all of it. */
int
peer_finish(int fd, uint64_t grant, const uint8_t *secret,
    const uint8_t *cnonce, uint64_t count, uint32_t *code, char *err)
{
	union proto_msg m;
	uint8_t mac[PROTO_MAC_SIZE];

	if (read_reply(fd, &m, code, err) == -1)
		return -1;
	peer_mac(secret, "metal_runner peer done", grant, count, cnonce, mac);
	if (m.rpeer.count != count || !peer_mac_equal(mac, m.rpeer.mac))
		return fail(code, PROTO_EPEER, err, "the destination's receipt "
		    "is wrong");
	return 0;
}

static void
broker_serve(int sock, int timeout_s)
{
	struct broker_req q;
	struct broker_rep a;
	struct pollfd pfd = { sock, POLLIN, 0 };
	ssize_t n;
	int rfd, fd;

	for (;;) {
		if (poll(&pfd, 1, -1) == -1 && errno != EINTR)
			return;
		if ((n = net_recv_fd(sock, &q, sizeof(q), &rfd)) == 0)
			return;	/* the runner closed its end: stop */
		if (n < 0 && errno != EAGAIN && errno != EMSGSIZE)
			return;
		if (n != (ssize_t)sizeof(q) || rfd == -1) {
			if (rfd != -1)
				close(rfd);
			continue;
		}
		memset(&a, 0, sizeof(a));
		a.seq = q.seq;
		q.host[PROTO_MAX_PEER_HOST] = '\0';
		/* The runner's own frame timeout, never one a session asks
		 * for: one broker serves all sessions, one at a time. */
		fd = peer_dial(q.host, q.port, q.grant, q.secret, q.count,
		    q.link, timeout_s, a.cnonce, &a.code, a.err);
		if (fd != -1)
			a.code = 0;
		net_send_fd(rfd, &a, sizeof(a), fd);
		if (fd != -1)
			close(fd);
		close(rfd);
	}
}

/*
 * Start the broker (process isolation): a child of the runner, unconfined,
 * which makes the peer connections of the confined session processes.
 * They inherit broker_fd.
 */
int
peer_broker_start(const struct mr_config *cfg, char *err)
{
	struct sigaction sa;
	int sp[2];
	pid_t pid;

	if (socketpair(AF_UNIX, PEER_SOCKTYPE, 0, sp) == -1) {
		snprintf(err, PROTO_ERRLEN, "%s: socketpair: %s", __func__,
		    strerror(errno));
		return -1;
	}
	if ((pid = fork()) == -1) {
		snprintf(err, PROTO_ERRLEN, "%s: fork: %s", __func__,
		    strerror(errno));
		close(sp[0]);
		close(sp[1]);
		return -1;
	}
	if (pid == 0) {
		close(sp[1]);
#ifdef __linux__
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() == 1)
			_exit(1);
		/* Tests and ps tell it from the session processes by name. */
		prctl(PR_SET_NAME, "mr_peer_broker");
#endif
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		if (confine_broker(cfg, err) == -1) {
			log_warn("peer broker: %s", err);
			_exit(1);
		}
		broker_serve(sp[0], cfg->frame_timeout);
		_exit(0);
	}
	close(sp[0]);
	broker_fd = sp[1];
	broker_pid = pid;
	return 0;
}

void
peer_broker_stop(void)
{
	int status;

	if (broker_fd != -1)
		close(broker_fd);
	broker_fd = -1;
	/* The sessions have ended, so the broker sees the end of its socket
	 * and exits by itself; a broker stuck in a connect is stopped. */
	if (broker_pid > 0) {
		int i;
		for (i = 0; i < 100 && waitpid(broker_pid, &status, WNOHANG) ==
		    0; i++)
			usleep(10000);
		if (i == 100) {
			kill(broker_pid, SIGTERM);
			while (waitpid(broker_pid, &status, 0) == -1 &&
			    errno == EINTR)
				;
		}
	}
	broker_pid = -1;
}

int
peer_broker_fd(void)
{
	return broker_fd;
}

void
peer_broker_adopt(int fd)
{
	broker_fd = fd;
}

/* In a session process, before it is confined: its private channel for
 * the broker's answers (the broker's socket is shared by all sessions). */
int
peer_broker_attach(char *err)
{
	if (broker_fd == -1)
		return 0;
	if (socketpair(AF_UNIX, PEER_SOCKTYPE, 0, reply_fd) == -1) {
		snprintf(err, PROTO_ERRLEN, "%s: socketpair: %s", __func__,
		    strerror(errno));
		return -1;
	}
	return 0;
}

/* peer_dial() here, or by the broker for a session process. */
int
peer_connect(const char *host, unsigned port, uint64_t grant,
    const uint8_t *secret, uint64_t count, int link, int timeout_s,
    uint8_t *cnonce, uint32_t *code, char *err)
{
	struct broker_req q;
	struct broker_rep a;
	struct pollfd pfd;
	ssize_t n;
	int fd, wait_ms;

#ifdef MR_FUZZ
	/* The fuzzer reaches here with hosts it made up: never dial them. */
	if (host != NULL)
		return fail(code, PROTO_EPEER, err, "the fuzz build makes no "
		    "connections (%s)", host);
#endif
	if (broker_fd == -1 || reply_fd[0] == -1)
		return peer_dial(host, port, grant, secret, count, link,
		    timeout_s, cnonce, code, err);
	memset(&q, 0, sizeof(q));
	q.seq = ++broker_seq;
	q.grant = grant;
	q.count = count;
	q.link = link;
	memcpy(q.secret, secret, PROTO_SECRET_SIZE);
	q.timeout_s = timeout_s;
	q.port = (uint16_t)port;
	snprintf(q.host, sizeof(q.host), "%s", host);
	if (net_send_fd(broker_fd, &q, sizeof(q), reply_fd[1]) == -1)
		return fail(code, PROTO_EPEER, err, "the runner's connection "
		    "broker does not answer: %s", strerror(errno));
	/* The broker serves one request at a time: allow for one ahead. */
	wait_ms = 2 * (PEER_CONNECT_MS + 2000 + (timeout_s > 0 ? timeout_s :
	    60) * 1000);
	for (;;) {
		pfd.fd = reply_fd[0];
		pfd.events = POLLIN;
		if ((n = poll(&pfd, 1, wait_ms)) == -1 && errno == EINTR)
			continue;
		if (n != 1)
			return fail(code, PROTO_EPEER, err, "the runner's "
			    "connection broker did not answer in time");
		if ((n = net_recv_fd(reply_fd[0], &a, sizeof(a), &fd)) !=
		    (ssize_t)sizeof(a)) {
			if (fd != -1)
				close(fd);
			if (n == -1 && errno == EAGAIN)
				continue;
			return fail(code, PROTO_EPEER, err, "the runner's "
			    "connection broker failed");
		}
		if (a.seq != q.seq) {	/* the answer to a request given up */
			if (fd != -1)
				close(fd);
			continue;
		}
		break;
	}
	if (a.code != 0 || fd == -1) {
		if (fd != -1)
			close(fd);
		a.err[sizeof(a.err) - 1] = '\0';
		*code = a.code ? a.code : PROTO_EPEER;
		snprintf(err, PROTO_ERRLEN, "%s", a.err);
		return -1;
	}
	memcpy(cnonce, a.cnonce, PROTO_NONCE_SIZE);
	return fd;
}

/* The host of a Tpeersend or Tdial, checked (1 to PROTO_MAX_PEER_HOST
 * bytes, no NUL, and a port), into host as a C string; -1: not valid. */
int
peer_host(char host[PROTO_MAX_PEER_HOST + 1], const uint8_t *body,
    uint16_t hostlen, uint16_t port)
{
	if (hostlen == 0 || hostlen > PROTO_MAX_PEER_HOST ||
	    memchr(body, '\0', hostlen) != NULL || port == 0)
		return -1;
	memcpy(host, body, hostlen);
	host[hostlen] = '\0';
	return 0;
}

int
peer_send_rpeer(int fd, uint32_t tag, uint64_t count, const uint8_t *mac)
{
	union proto_msg r;
	uint8_t frame[sizeof(struct proto_rpeer) + 16];
	size_t n;

	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RPEER;
	r.h.size = (uint32_t)proto_fixed_size(PROTO_RPEER);
	r.h.tag = tag;
	r.rpeer.count = count;
	memcpy(r.rpeer.mac, mac, PROTO_MAC_SIZE);
	n = proto_put(frame, sizeof(frame), &r);
	return net_send_all(fd, frame, n);
}
