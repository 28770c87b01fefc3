/*
 * echo.c: the loopback link's limit, measured the way the runner is used.
 *
 *   echo server                        64-byte echo server (TCP_NODELAY)
 *   echo rtt PORT N [SIZE]             N round trips of SIZE bytes (default 64)
 *   echo sink [SOCKBUF]                stream receiver: reads until EOF, answers 1 byte
 *   echo stream PORT BYTES [SOCKBUF]   sends BYTES in 4 MiB writes, waits for the answer
 *
 * Servers listen on 127.0.0.1, port 0, and print "listening on 127.0.0.1:PORT"
 * first; they serve one connection at a time until killed. Clients print one
 * JSON object. SOCKBUF sets both socket buffers of a stream's end (default
 * 4 MiB; SO_SNDBUFFORCE/SO_RCVBUFFORCE where allowed, so net.core.*mem_max
 * does not cap them); 0 leaves them to the kernel's autotuning, which on
 * loopback is often the faster of the two.
 */
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (4 << 20)

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void __attribute__((noreturn))
die(const char *what)
{
	fprintf(stderr, "echo: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int sockbuf = 4 << 20;

static void
bufsizes(int fd)
{
	int n = sockbuf;

	if (n == 0)
		return;

	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &n, sizeof(n)) == -1)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &n, sizeof(n));
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &n, sizeof(n)) == -1)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &n, sizeof(n));
}

static void
nodelay(int fd)
{
	int one = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == -1)
		die("TCP_NODELAY");
}

static int
full(int fd, void *buf, size_t n, int rd)
{
	char *p = buf;
	ssize_t r;

	while (n > 0) {
		r = rd ? read(fd, p, n) : write(fd, p, n);
		if (r == -1 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int
listener(int big)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int fd, one = 1;

	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) == -1)
		die("socket");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (big)
		bufsizes(fd);	/* inherited by accepted sockets */
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == -1 ||
	    listen(fd, 16) == -1 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) == -1)
		die("listen");
	printf("listening on 127.0.0.1:%d\n", ntohs(sa.sin_port));
	fflush(stdout);
	return fd;
}

static int
dial(int port, int big)
{
	struct sockaddr_in sa;
	int fd;

	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) == -1)
		die("socket");
	if (big)
		bufsizes(fd);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons((uint16_t)port);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == -1)
		die("connect");
	return fd;
}

/* Echo whatever arrives, as it arrives: the reply to a 64-byte message is
 * sent as soon as its bytes are in. */
static void __attribute__((noreturn))
serve_echo(void)
{
	char buf[65536];
	ssize_t n;
	int lfd = listener(0), fd;

	for (;;) {
		if ((fd = accept(lfd, NULL, NULL)) == -1)
			die("accept");
		nodelay(fd);
		while ((n = read(fd, buf, sizeof(buf))) > 0)
			if (full(fd, buf, (size_t)n, 0) == -1)
				break;
		close(fd);
	}
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int
client_rtt(int port, long n, size_t size)
{
	char buf[65536];
	double *t, t0, total;
	long i;
	int fd = dial(port, 0);

	if (size == 0 || size > sizeof(buf) || n < 1)
		return fprintf(stderr, "echo: bad size or count\n"), 1;
	nodelay(fd);
	memset(buf, 'x', size);
	if ((t = calloc((size_t)n, sizeof(*t))) == NULL)
		die("calloc");
	for (i = 0; i < 1000; i++)	/* warm up */
		if (full(fd, buf, size, 0) || full(fd, buf, size, 1))
			die("warm-up");
	total = now();
	for (i = 0; i < n; i++) {
		t0 = now();
		if (full(fd, buf, size, 0) || full(fd, buf, size, 1))
			die("round trip");
		t[i] = now() - t0;
	}
	total = now() - total;
	qsort(t, (size_t)n, sizeof(*t), cmp_double);
	printf("{\"n\": %ld, \"size\": %zu, \"mean_us\": %.3f, \"median_us\": %.3f, "
	    "\"p90_us\": %.3f, \"min_us\": %.3f}\n", n, size, total / n * 1e6,
	    t[n / 2] * 1e6, t[n * 9 / 10] * 1e6, t[0] * 1e6);
	close(fd);
	free(t);
	return 0;
}

static void __attribute__((noreturn))
serve_sink(void)
{
	char *buf = malloc(CHUNK), ack = 'k';
	ssize_t n;
	int lfd = listener(1), fd;

	if (buf == NULL)
		die("malloc");
	memset(buf, 0, CHUNK);
	for (;;) {
		if ((fd = accept(lfd, NULL, NULL)) == -1)
			die("accept");
		while ((n = read(fd, buf, CHUNK)) > 0)
			;
		full(fd, &ack, 1, 0);
		close(fd);
	}
}

static int
client_stream(int port, long long bytes)
{
	char *buf = malloc(CHUNK), ack;
	long long left = bytes;
	double t;
	int fd = dial(port, 1);

	if (buf == NULL)
		die("malloc");
	memset(buf, 'x', CHUNK);
	t = now();
	while (left > 0) {
		size_t n = left < CHUNK ? (size_t)left : CHUNK;
		if (full(fd, buf, n, 0) == -1)
			die("write");
		left -= (long long)n;
	}
	shutdown(fd, SHUT_WR);
	if (full(fd, &ack, 1, 1) == -1)
		die("ack");
	t = now() - t;
	printf("{\"bytes\": %lld, \"seconds\": %.6f, \"gbps\": %.4f}\n", bytes, t,
	    bytes / t / 1e9);
	close(fd);
	free(buf);
	return 0;
}

int
main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc == 2 && strcmp(argv[1], "server") == 0)
		serve_echo();
	if ((argc == 2 || argc == 3) && strcmp(argv[1], "sink") == 0) {
		sockbuf = argc == 3 ? atoi(argv[2]) : sockbuf;
		serve_sink();
	}
	if ((argc == 4 || argc == 5) && strcmp(argv[1], "rtt") == 0)
		return client_rtt(atoi(argv[2]), atol(argv[3]),
		    argc == 5 ? (size_t)atol(argv[4]) : 64);
	if ((argc == 4 || argc == 5) && strcmp(argv[1], "stream") == 0) {
		sockbuf = argc == 5 ? atoi(argv[4]) : sockbuf;
		return client_stream(atoi(argv[2]), atoll(argv[3]));
	}
	fprintf(stderr, "usage: echo server | sink [SOCKBUF] | rtt PORT N [SIZE] | "
	    "stream PORT BYTES [SOCKBUF]\n");
	return 2;
}
