/*
 * net.c: TCP sockets, in the manner of redis's anet.c. Blocking sockets with
 * kernel timeouts: a session reads whole frames in a plain loop, and a peer
 * that stalls mid-frame or stops reading replies times out instead of
 * holding a session forever.
 */
#include <sys/socket.h>
#include <sys/uio.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "metal_runner.h"
#include "proto.h"

#ifdef MSG_NOSIGNAL
#define SEND_FLAGS MSG_NOSIGNAL
#else
#define SEND_FLAGS 0	/* macOS: SO_NOSIGPIPE is set in net_tune() */
#endif

int
net_listen(const char *host, int port, int *bound_port, char *err)
{
	struct addrinfo hints, *res = NULL, *ai;
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	char portstr[16];
	int fd = -1, one = 1, rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	snprintf(portstr, sizeof(portstr), "%d", port);
	if ((rc = getaddrinfo(host, portstr, &hints, &res)) != 0) {
		snprintf(err, PROTO_ERRLEN, "cannot resolve %s: %s", host,
		    gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
		if (fd == -1)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
		    listen(fd, 64) == 0)
			break;
		snprintf(err, PROTO_ERRLEN, "cannot listen on %s:%d: %s%s",
		    host, port, strerror(errno), errno == EADDRINUSE ?
		    " (another runner, or another program, has that port: "
		    "stop it, or start this one with --port N, or --port 0 "
		    "for a free port)" : "");
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd == -1)
		return -1;
	if (getsockname(fd, (struct sockaddr *)&ss, &sslen) == 0)
		*bound_port = ntohs(ss.ss_family == AF_INET6 ?
		    ((struct sockaddr_in6 *)&ss)->sin6_port :
		    ((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

int
net_accept(int lfd, char *peer, size_t peerlen)
{
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	char host[NI_MAXHOST], serv[NI_MAXSERV];
	int fd;

	fd = accept(lfd, (struct sockaddr *)&ss, &sslen);
	if (fd == -1)
		return -1;
	if (getnameinfo((struct sockaddr *)&ss, sslen, host, sizeof(host),
	    serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0)
		snprintf(peer, peerlen, "%s:%s", host, serv);
	else
		snprintf(peer, peerlen, "?");
	return fd;
}

/* No Nagle delay (small replies go out at once), no SIGPIPE, and send and
 * receive timeouts so a stalled peer cannot block its session forever. */
int
net_tune(int fd, int timeout_s)
{
	struct timeval tv = { timeout_s, 0 };
	int one = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == -1)
		return -1;
#ifdef SO_NOSIGPIPE
	setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
	if (timeout_s > 0) {
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	return 0;
}

/* recv() that retries on EINTR; 0 at end of stream, -1 with errno. */
ssize_t
net_recv(int fd, void *buf, size_t len)
{
	ssize_t n;

	do
		n = recv(fd, buf, len, 0);
	while (n == -1 && errno == EINTR);
	return n;
}

int
net_sendv_all(int fd, const void *a, size_t alen, const void *b, size_t blen)
{
	struct iovec iov[2];
	struct msghdr msg;
	ssize_t n;

	iov[0].iov_base = (void *)a;
	iov[0].iov_len = alen;
	iov[1].iov_base = (void *)b;
	iov[1].iov_len = blen;
	while (iov[0].iov_len + iov[1].iov_len > 0) {
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = iov[0].iov_len ? iov : iov + 1;
		msg.msg_iovlen = iov[0].iov_len ? 2 : 1;
		n = sendmsg(fd, &msg, SEND_FLAGS);
		if (n == -1) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if ((size_t)n >= iov[0].iov_len) {
			n -= (ssize_t)iov[0].iov_len;
			iov[0].iov_len = 0;
			/* b is NULL for net_send_all: no arithmetic on it. */
			if (n > 0) {
				iov[1].iov_base = (char *)iov[1].iov_base + n;
				iov[1].iov_len -= (size_t)n;
			}
		} else {
			iov[0].iov_base = (char *)iov[0].iov_base + n;
			iov[0].iov_len -= (size_t)n;
		}
	}
	return 0;
}

int
net_send_all(int fd, const void *buf, size_t len)
{
	return net_sendv_all(fd, buf, len, NULL, 0);
}

int
net_is_loopback(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;

	if (strcmp(host, "localhost") == 0)
		return 1;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6);
	return 0;
}

/*
 * Descriptors passed between the runner's processes over unix sockets
 * (resume.c's handovers, peer.c's connections): one message, and with it
 * one descriptor or none. Neither call blocks.
 */
#ifdef MSG_CMSG_CLOEXEC
#define RECV_FD_FLAGS (MSG_DONTWAIT | MSG_CMSG_CLOEXEC)
#else
#define RECV_FD_FLAGS MSG_DONTWAIT
#endif

/* Send msg (and fd, unless -1) over a unix socket, without waiting. */
int
net_send_fd(int sock, const void *msg, size_t len, int fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { (void *)msg, len };
	struct msghdr mh;
	ssize_t r;

	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (fd != -1) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
		CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
		CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), &fd, sizeof(int));
	}
	do
		r = sendmsg(sock, &mh, SEND_FLAGS | MSG_DONTWAIT);
	while (r == -1 && errno == EINTR);
	return r == (ssize_t)len ? 0 : -1;
}

/* Receive a message and the descriptor that came with it (*fd, or -1).
 * Returns the message's length, 0 at end of stream, -1 on error. */
ssize_t
net_recv_fd(int sock, void *msg, size_t len, int *fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { msg, len };
	struct msghdr mh;
	struct cmsghdr *c;
	ssize_t r;

	*fd = -1;
	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = u.buf;
	mh.msg_controllen = sizeof(u.buf);
	do
		r = recvmsg(sock, &mh, RECV_FD_FLAGS);
	while (r == -1 && errno == EINTR);
	if (r < 0)
		return r;
	for (c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	/* A cut message (MSG_TRUNC, MSG_CTRUNC) is nothing we sent. */
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (*fd != -1)
			close(*fd);
		*fd = -1;
		errno = EMSGSIZE;
		return -1;
	}
	return r;
}

void
net_refuse(int fd, uint32_t tag, uint32_t code, const char *text)
{
	uint8_t frame[PROTO_HDR_SIZE + 8 + 256];
	size_t n = proto_put_rerror(frame, sizeof(frame), tag, code, text);

	net_send_all(fd, frame, n);
	close(fd);
}
