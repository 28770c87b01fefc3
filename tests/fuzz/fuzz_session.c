/*
 * fuzz_session.c: libFuzzer target for the whole request path of a session:
 * framing (need/take), the hello/auth/ready state machine, every request
 * handler, the error queue and the replies, over the bookkeeping-only
 * backend (backend_null.c).
 *
 * Input: one options byte, then the bytes a client sends. A peer thread
 * writes them into one end of a socketpair, closes its write side, and
 * reads the replies until the session closes; sess_serve() runs in the
 * calling thread on the other end, exactly as the daemon runs it.
 *
 * Every session has a content cache in a temporary directory (cache.c).
 *
 * Oracles besides the sanitizers: the backend's assertions (the session
 * passed a bad handle, range or count, or leaked an object); every reply is
 * a well-formed frame (a known reply type whose size agrees with its counts
 * and is within maxmsg; no frame cut short); and after the session its
 * memory reservation is all returned.
 */
#include <sys/socket.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "metal_runner.h"
#include "proto.h"
#include "backend_null.h"

/* Options byte. */
#define OPT_TOKEN 1	/* demand Tauth (the fuzzer can only fail it) */
#define OPT_SESSION_MEM 2	/* a 1 MiB per-session memory limit */
#define OPT_FEW_HANDLES 4	/* at most 8 handles */
#define OPT_SMALL_MSG 8	/* maxmsg = PROTO_MIN_MAXMSG */
#define OPT_PROCESS 16	/* as in a session process: launches arm the
			 * crash report (no handler is installed) */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct be_info info;

#define check(cond) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "fuzz_session: %s: assertion failed: %s\n", \
		    __func__, #cond);					\
		abort();						\
	}								\
} while (0)

/* A failed Tauth costs the client a second (session.c rate-limits
 * guessing); here that would only slow the fuzzer down. This definition
 * takes the place of libc's for the whole fuzzer binary. */
unsigned int
sleep(unsigned int seconds)
{
	(void)seconds;
	return 0;
}

int
usleep(useconds_t usec)
{
	(void)usec;
	return 0;
}

struct peer {
	int fd;
	const uint8_t *in;
	size_t inlen;
	uint32_t maxmsg;
	/* Reply parser: the fixed part being collected, then the payload
	 * to skip. */
	uint8_t fixed[512];
	size_t have;
	uint64_t skip;
};

/* A reply's fixed part is complete: check it, then skip its payload. */
static void
check_reply(struct peer *p, union proto_msg *m)
{
	char err[PROTO_ERRLEN];

	check(proto_get(p->fixed, p->have, m, err) == 0);
	check(proto_check_size(m, err) == 0);
	if (m->h.type == PROTO_RERROR) {
		check(m->rerror.count <= PROTO_MAX_ERRTEXT);
		check(proto_error_name(m->rerror.code)[0] == 'E');
	}
	p->skip = m->h.size - p->have;
	p->have = 0;
}

/* Check each reply frame as it streams past; payloads are skipped. */
static void
parse_replies(struct peer *p, const uint8_t *b, size_t n)
{
	struct proto_hdr h;
	union proto_msg m;
	size_t k, want = PROTO_HDR_SIZE;

	for (;;) {
		if (p->have >= PROTO_HDR_SIZE) {
			proto_get_hdr(p->fixed, &h);
			want = proto_fixed_size(h.type);
			check(want != 0 && !proto_is_request(h.type));
			check(h.size >= want && h.size <= p->maxmsg);
			if (p->have == want) {
				check_reply(p, &m);
				want = PROTO_HDR_SIZE;
			}
		}
		if (n == 0)
			return;
		if (p->skip > 0) {
			k = p->skip < n ? (size_t)p->skip : n;
			p->skip -= k;
		} else {
			k = want - p->have < n ? want - p->have : n;
			memcpy(p->fixed + p->have, b, k);
			p->have += k;
		}
		b += k;
		n -= k;
	}
}

static void *
peer_run(void *arg)
{
	struct peer *p = arg;
	uint8_t buf[65536];
	size_t off = 0;
	ssize_t r;

	if (p->inlen == 0)
		shutdown(p->fd, SHUT_WR);
	for (;;) {
		struct pollfd pfd = { p->fd, POLLIN, 0 };
		if (off < p->inlen)
			pfd.events |= POLLOUT;
		if (poll(&pfd, 1, -1) == -1) {
			check(errno == EINTR);
			continue;
		}
		if (pfd.revents & POLLOUT) {
			r = send(p->fd, p->in + off, p->inlen - off,
			    MSG_NOSIGNAL | MSG_DONTWAIT);
			if (r > 0 && (off += (size_t)r) == p->inlen)
				shutdown(p->fd, SHUT_WR);
			if (r == -1 && errno != EAGAIN) {
				/* The session closed early: stop writing. */
				off = p->inlen;
				shutdown(p->fd, SHUT_WR);
			}
		}
		if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
			r = recv(p->fd, buf, sizeof(buf), MSG_DONTWAIT);
			if (r == 0 || (r == -1 && errno != EAGAIN))
				break;
			if (r > 0)
				parse_replies(p, buf, (size_t)r);
		}
	}
	/* The session sends whole frames or nothing. */
	check(p->have == 0 && p->skip == 0);
	return NULL;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[PROTO_ERRLEN], dir[1024];
	const char *tmp = getenv("TMPDIR");

	(void)argc;
	(void)argv;
	signal(SIGPIPE, SIG_IGN);
	/* Every session has a content cache (as with --cache-dir, thread
	 * isolation: the store is called directly), in a fresh directory
	 * bounded to 8 MiB, so Thave, Twritehash and FCACHE reach it; under
	 * $TMPDIR, which run.sh points at its scratch directory. */
	snprintf(dir, sizeof(dir), "%s/fuzz_session_cache.XXXXXX",
	    tmp != NULL && *tmp != '\0' ? tmp : "/tmp");
	if (be_null.open(&info, NULL, NULL, err) == -1 ||
	    mr_mem_init(1, info.memory) == -1 || mkdtemp(dir) == NULL ||
	    cache_open(dir, 8 << 20, 1, err) == -1) {
		fprintf(stderr, "fuzz_session: cannot set up\n");
		abort();
	}
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t token[] = "fuzz-token";
	struct mr_config cfg;
	struct mr_server_ctx ctx;
	struct peer p;
	pthread_t t;
	char err[PROTO_ERRLEN];
	int sv[2];
	uint8_t opt;

	if (size < 1)
		return 0;
	opt = data[0];
	mr_config_defaults(&cfg);
	if (opt & OPT_TOKEN) {
		cfg.token = token;
		cfg.tokenlen = sizeof(token) - 1;
	}
	if (opt & OPT_SESSION_MEM)
		cfg.session_mem = 1 << 20;
	if (opt & OPT_FEW_HANDLES)
		cfg.max_handles = 8;
	if (opt & OPT_SMALL_MSG)
		cfg.maxmsg = PROTO_MIN_MAXMSG;
	sess_crash_handlers = (opt & OPT_PROCESS) != 0;
	ctx.cfg = &cfg;
	ctx.be = &be_null;
	ctx.info = &info;

	check(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	memset(&p, 0, sizeof(p));
	p.fd = sv[1];
	p.in = data + 1;
	p.inlen = size - 1;
	p.maxmsg = cfg.maxmsg;
	check(pthread_create(&t, NULL, peer_run, &p) == 0);
	sess_serve(&ctx, sv[0], 1, 0, "fuzz");	/* closes sv[0] */
	check(pthread_join(t, NULL) == 0);
	close(sv[1]);

	/* Every byte the session reserved was returned: the whole limit can
	 * be reserved again. */
	check(mr_mem_reserve(0, info.memory, 0, err) == 0);
	mr_mem_release(0, info.memory);
	return 0;
}
