/*
 * linkemu.c: an emulated network link for the benchmark (a test harness,
 * not part of the product). A TCP relay on 127.0.0.1 that forwards every
 * accepted connection to a target and, in each direction, holds the bytes
 * for a one-way delay, paces them at a link rate and optionally adds
 * jitter.
 *
 *   linkemu TARGET_HOST:PORT DELAY_US RATE_MBIT [JITTER_US]
 *
 * prints "listening on 127.0.0.1:PORT" (a free port) first. RATE_MBIT 0 is
 * unlimited. A line "DELAY_US RATE_MBIT JITTER_US" on stdin switches every
 * connection to that profile (answered "ok"). Why a relay: netem is not
 * in these kernels, and tbf alone has no delay.
 *
 * The model is a store-and-forward link: bytes read from one side are cut
 * into packets of at most PKT bytes; a packet occupies the link for
 * len * 8 / rate after the previous one leaves (serialization), and is
 * delivered DELAY (+ jitter, never reordering) after it has left. Packets
 * wait in a delay queue with their due times, so pipelined traffic is
 * delayed once, not once per message. The queue holds at most QCAP bytes
 * per direction; past that the relay stops reading and TCP's own flow
 * control pushes back on the sender, as a full router queue and a closed
 * window would.
 *
 * One thread per connection runs both directions with ppoll(), sleeping
 * until the next packet is due. What it cannot do: its own hops add about
 * 20 µs to a round trip on this VM and a timed wakeup comes tens of µs
 * late, so the shortest RTT it gives is about 0.07 ms; the rate is bounded
 * by what one thread can copy (0.8 to 1.2 GB/s here, about 10 GbE);
 * bench/run.py measures RTT and rate through the relay and reports them
 * next to each profile.
 */
#include <sys/types.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define QCAP	(8u << 20)	/* bytes queued per direction */
#define MAXPKT	(64u << 10)
#define NREC	16384		/* packets queued per direction */

struct pkt {
	uint32_t len;
	int64_t due;		/* ns, monotonic: when it may be delivered */
};

struct dir {
	int in, out;		/* read from in, deliver to out */
	uint8_t *buf;		/* ring of QCAP bytes */
	size_t head, len;	/* unsent bytes start at head */
	size_t sent;		/* bytes of the head packet already delivered */
	struct pkt rec[NREC];
	uint32_t rhead, rlen;
	int64_t busy;		/* the link is busy serializing until then */
	int64_t lastdue;
	int eof;		/* in has closed: shut out down once drained */
};

static char *target_host, *target_port;
/* The profile: set at start, changed by lines on stdin. Read without a
 * lock: a packet in flight while it changes gets either setting. */
static volatile int64_t delay_ns, jitter_ns;
static volatile double ns_per_byte;	/* 0: unlimited */
static volatile uint32_t pkt_max;

static void
set_profile(double delay_us, double mbit, double jitter_us)
{
	uint32_t pkt;

	delay_ns = (int64_t)(delay_us * 1000);
	jitter_ns = (int64_t)(jitter_us * 1000);
	ns_per_byte = mbit > 0 ? 8000.0 / mbit : 0;
	/* Packets of about 100 µs at the link rate, within 1500..64 KiB:
	 * small enough that a short message does not queue long behind a
	 * bulk transfer, large enough to keep the syscalls few. */
	pkt = mbit > 0 ? (uint32_t)(mbit * 100 / 8) : MAXPKT;
	pkt_max = pkt < 1500 ? 1500 : pkt > MAXPKT ? MAXPKT : pkt;
}

/* "DELAY_US RATE_MBIT JITTER_US" per line on stdin sets a new profile for
 * every connection, so one set of connections can cross several links;
 * each line is answered "ok". */
static void *
control(void *arg)
{
	char line[256];
	double d, r, j;

	(void)arg;
	while (fgets(line, sizeof(line), stdin) != NULL) {
		if (sscanf(line, "%lf %lf %lf", &d, &r, &j) != 3) {
			printf("bad profile line\n");
		} else {
			set_profile(d, r, j);
			printf("ok\n");
		}
		fflush(stdout);
	}
	return NULL;
}

static int64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void
nodelay_nonblock(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Read what in has, as packets, into the delay queue. */
static int
dir_read(struct dir *d, int64_t now)
{
	while (d->len < QCAP && d->rlen < NREC) {
		size_t tail = (d->head + d->len) % QCAP;
		size_t room = QCAP - d->len;
		ssize_t n;
		int64_t due;

		if (room > QCAP - tail)
			room = QCAP - tail;	/* contiguous part */
		if (room > pkt_max)
			room = pkt_max;
		n = recv(d->in, d->buf + tail, room, 0);
		if (n == 0) {
			d->eof = 1;
			return 0;
		}
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		if (d->busy < now)
			d->busy = now;
		d->busy += (int64_t)(n * ns_per_byte);
		due = d->busy + delay_ns;
		if (jitter_ns > 0)
			due += (int64_t)(drand48() * (double)jitter_ns);
		if (due < d->lastdue)
			due = d->lastdue;	/* a link does not reorder */
		d->lastdue = due;
		d->rec[(d->rhead + d->rlen) % NREC] =
		    (struct pkt){ (uint32_t)n, due };
		d->rlen++;
		d->len += (size_t)n;
	}
	return 0;
}

/* Deliver the packets that are due. Returns -1 on error, else 0. */
static int
dir_write(struct dir *d, int64_t now)
{
	while (d->rlen > 0 && d->rec[d->rhead].due <= now) {
		struct pkt *p = &d->rec[d->rhead];
		size_t left = p->len - d->sent;
		size_t chunk = QCAP - d->head < left ? QCAP - d->head : left;
		ssize_t n = send(d->out, d->buf + d->head, chunk, MSG_NOSIGNAL);

		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		d->head = (d->head + (size_t)n) % QCAP;
		d->len -= (size_t)n;
		d->sent += (size_t)n;
		if (d->sent == p->len) {
			d->sent = 0;
			d->rhead = (d->rhead + 1) % NREC;
			d->rlen--;
		}
	}
	if (d->eof == 1 && d->rlen == 0) {
		shutdown(d->out, SHUT_WR);
		d->eof = 2;
	}
	return 0;
}

static void *
relay(void *arg)
{
	int c = (int)(intptr_t)arg, t = -1;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	struct dir *d = NULL;
	int i;

	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	if (getaddrinfo(target_host, target_port, &hints, &ai) != 0 ||
	    (t = socket(ai->ai_family, SOCK_STREAM, 0)) == -1 ||
	    connect(t, ai->ai_addr, ai->ai_addrlen) == -1) {
		fprintf(stderr, "linkemu: cannot reach %s:%s: %s\n",
		    target_host, target_port, strerror(errno));
		goto done;
	}
	if ((d = calloc(2, sizeof(*d))) == NULL ||
	    (d[0].buf = malloc(QCAP)) == NULL ||
	    (d[1].buf = malloc(QCAP)) == NULL)
		goto done;
	nodelay_nonblock(c);
	nodelay_nonblock(t);
	d[0].in = c, d[0].out = t;
	d[1].in = t, d[1].out = c;
	for (;;) {
		struct pollfd pf[4];
		struct timespec ts, *tp = NULL;
		int64_t now = now_ns(), next = INT64_MAX;
		int np = 0;

		for (i = 0; i < 2; i++)
			if (dir_write(&d[i], now) == -1)
				goto done;
		if (d[0].eof == 2 && d[1].eof == 2)
			break;
		for (i = 0; i < 2; i++) {
			struct dir *x = &d[i];

			if (!x->eof && x->len < QCAP && x->rlen < NREC)
				pf[np++] = (struct pollfd){ x->in, POLLIN, 0 };
			if (x->rlen > 0 && x->rec[x->rhead].due <= now)
				pf[np++] = (struct pollfd){ x->out, POLLOUT, 0 };
			else if (x->rlen > 0 && x->rec[x->rhead].due < next)
				next = x->rec[x->rhead].due;
		}
		if (next != INT64_MAX) {
			/* A timed sleep on a VM wakes tens of µs late; the
			 * caller calibrates the delay against a measured RTT.
			 * Never spin: a spinning relay takes CPU from the
			 * runner it serves on the same host (measured: +1 ms
			 * per MLP step on 2 vCPUs), which a real link never
			 * does. */
			int64_t w = next - now;

			ts.tv_sec = w / 1000000000;
			ts.tv_nsec = w % 1000000000;
			tp = &ts;
		}
		if (ppoll(pf, (nfds_t)np, tp, NULL) == -1 && errno != EINTR)
			goto done;
		now = now_ns();
		for (i = 0; i < 2; i++)
			if (!d[i].eof && dir_read(&d[i], now) == -1)
				goto done;
	}
done:
	if (ai != NULL)
		freeaddrinfo(ai);
	if (d != NULL) {
		free(d[0].buf);
		free(d[1].buf);
		free(d);
	}
	close(c);
	if (t != -1)
		close(t);
	return NULL;
}

int
main(int argc, char **argv)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	char *colon;
	int s, one = 1;

	if (argc < 4 || argc > 5 || (colon = strrchr(argv[1], ':')) == NULL) {
		fprintf(stderr, "usage: linkemu TARGET_HOST:PORT DELAY_US "
		    "RATE_MBIT [JITTER_US]\n");
		return 2;
	}
	*colon = '\0';
	target_host = argv[1];
	target_port = colon + 1;
	set_profile(atof(argv[2]), atof(argv[3]), argc == 5 ? atof(argv[4]) : 0);
	signal(SIGPIPE, SIG_IGN);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((s = socket(AF_INET, SOCK_STREAM, 0)) == -1 ||
	    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == -1 ||
	    bind(s, (struct sockaddr *)&sa, sizeof(sa)) == -1 ||
	    listen(s, 64) == -1 ||
	    getsockname(s, (struct sockaddr *)&sa, &sl) == -1) {
		perror("linkemu");
		return 1;
	}
	printf("listening on 127.0.0.1:%d\n", ntohs(sa.sin_port));
	fflush(stdout);
	{
		pthread_t th;

		if (pthread_create(&th, NULL, control, NULL) == 0)
			pthread_detach(th);
	}
	for (;;) {
		pthread_t th;
		int c = accept(s, NULL, NULL);

		if (c == -1) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("linkemu: accept");
			return 1;
		}
		if (pthread_create(&th, NULL, relay, (void *)(intptr_t)c) != 0) {
			close(c);
			continue;
		}
		pthread_detach(th);
	}
}
