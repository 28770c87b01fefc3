/*
 * cachelink.c: how a session reaches the cache store (cache.c).
 *
 * With thread isolation the session thread calls the store itself. With
 * process isolation it cannot: the session process is confined (confine.c)
 * before it reads a request, and its seccomp filter allows no open, rename
 * or unlink. A filter cannot restrict openat to one directory (it sees the
 * path only as a pointer), and a session process runs the client's native
 * code, so it must never hold a descriptor that can name files. Instead
 * each session process forks, before it is confined, a *cache helper*: the
 * helper is the child, keeps the cache directory, and serves the confined
 * session over a socketpair; the session holds only its end of that socket.
 *
 * The helper trusts nothing the session sends: a kernel may have taken the
 * session over. It reads fixed 16-byte requests and bounded payloads, names
 * every file itself from the SHA-256 it computes over the bytes it stores
 * (never from anything the session names as a path), serves only content
 * that hashes to what was asked, and on any malformed request closes the
 * socket, which leaves the session without the cache, nothing more. The
 * worst a subverted session can do is store junk under the junk's own hash,
 * fill the cache up to --cache-size (evicting others' content, which is a
 * cost, never a wrong answer), or learn whether content whose hash it
 * already knows is cached. The helper runs as --user like the session, but
 * without a system call filter.
 *
 * The session stays in the process the runner started, and the helper is
 * the child of the fork: a spawned Metal session then opens its device in a
 * process that was exec'd and has not forked since (Apple's fork(2): no
 * framework is safe in a child of fork() until it execs; docs/metal.md),
 * and the helper is plain C that never calls Metal. The runner's slot
 * holds the session's own pid, so it sees the session's exit status (its
 * log of crashes and time limits); the session ignores SIGCHLD, so a helper
 * that ends first leaves no zombie. The session dies with the runner and
 * the helper with its session (PR_SET_PDEATHSIG; elsewhere the helper ends
 * when its socket does, at the session's exit).
 *
 * Requests, session to helper, in host byte order (same binary, same host):
 *   HAVE n, hash[32*n]        ->  held[n]
 *   GET len, hash[32]         ->  status[4] textlen[4] text, data[len] if 0
 *   PUT len, data[len]        ->  nothing
 */
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/socket.h>
#include <sys/types.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "confine.h"
#include "proto.h"

#define OP_HAVE 1
#define OP_GET 2
#define OP_PUT 3
#define BATCH 1024		/* hashes per helper read */
#define CHUNK (1 << 20)	/* bytes per helper read of PUT data */

struct req {
	uint32_t op;
	uint32_t pad;
	uint64_t n;
};

struct rep {
	int32_t status;
	uint32_t textlen;
};

struct cache_link {
	int fd;				/* the helper, -1: the store itself */
	struct cache_pins *pins;	/* the store itself: this session's */
};

static int helper_fd = -1;	/* in a session process with a helper */
static int helper_failed;	/* in a session process without one */
/* Thread isolation: the runner process's one store queue. */
static struct storeq *own_queue;
static pthread_once_t own_queue_once = PTHREAD_ONCE_INIT;

static void
own_queue_new(void)
{
	own_queue = storeq_new();
}

static int
rd(int fd, void *buf, size_t n)
{
	uint8_t *p = buf;
	ssize_t r;

	while (n > 0) {
		if ((r = read(fd, p, n)) <= 0) {
			if (r == -1 && errno == EINTR)
				continue;
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* ---- the helper ---- */

/* After the session's earlier stores are done: what it wrote is held. */
static int
serve_have(int fd, uint64_t n, struct cache_pins *ps, struct storeq *sq)
{
	uint8_t hashes[BATCH * PROTO_HASH_SIZE], held[BATCH];
	uint64_t k, i;

	if (n > (uint64_t)1 << 24)
		return -1;
	storeq_drain(sq);
	while (n > 0) {
		k = n < BATCH ? n : BATCH;
		if (rd(fd, hashes, k * PROTO_HASH_SIZE) == -1)
			return -1;
		for (i = 0; i < k; i++)
			held[i] = (uint8_t)cache_pin(ps,
			    hashes + i * PROTO_HASH_SIZE);
		if (net_send_all(fd, held, k) == -1)
			return -1;
		n -= k;
	}
	return 0;
}

static int
serve_get(int fd, uint64_t len, struct cache_pins *ps)
{
	uint8_t hash[PROTO_HASH_SIZE], *data;
	char err[PROTO_ERRLEN];
	struct rep r;
	int rc;

	if (rd(fd, hash, sizeof(hash)) == -1)
		return -1;
	/* cache_get allocates the pinned content's own length, and only
	 * when len equals it: never what the session declares. */
	r.status = cache_get(ps, hash, len, &data, err);
	r.textlen = r.status == 0 ? 0 : (uint32_t)strlen(err);
	rc = net_send_all(fd, &r, sizeof(r)) == -1 ||
	    net_send_all(fd, err, r.textlen) == -1 || (data != NULL &&
	    net_send_all(fd, data, (size_t)len) == -1) ? -1 : 0;
	free(data);
	return rc;
}

/* The bytes go into their file as they are read; the hash and the name
 * come later, while the helper reads the session's next request
 * (storeq.c). */
static int
serve_put(int fd, uint64_t len, struct storeq *sq)
{
	static uint8_t buf[CHUNK];
	struct cache_put *pp = cache_put_begin(len);
	uint64_t k, left;

	for (left = len; left > 0; left -= k) {
		k = left < CHUNK ? left : CHUNK;
		if (rd(fd, buf, (size_t)k) == -1) {
			if (pp != NULL)
				cache_put_finish(pp);	/* short: dropped */
			return -1;
		}
		if (pp != NULL)
			cache_put_write(pp, buf, (size_t)k);
	}
	if (pp != NULL)
		storeq_put(sq, pp, len);
	return 0;
}

static void
helper_loop(int fd)
{
	struct cache_pins *ps = cache_pins_new();
	struct storeq *sq = storeq_new();
	struct req q;
	int rc;

	while (ps != NULL && rd(fd, &q, sizeof(q)) == 0) {
		switch (q.op) {
		case OP_HAVE:
			rc = serve_have(fd, q.n, ps, sq);
			break;
		case OP_GET:
			rc = serve_get(fd, q.n, ps);
			break;
		case OP_PUT:
			rc = serve_put(fd, q.n, sq);
			break;
		default:
			rc = -1;
		}
		if (rc == -1)
			break;
	}
	/* What was put is stored before the session sees the end. */
	storeq_free(sq);
	cache_pins_free(ps);
	close(fd);
}

int
cache_helper_start(const struct mr_config *cfg, int clientfd, char *err)
{
	int sv[2], sockbuf = 4 << 20;
	pid_t child;
#ifdef __linux__
	pid_t session = getpid();	/* the helper's parent, checked below */
#endif

	/* Without a helper, the confined session must not touch the store
	 * itself (its filter would end it): no cache for it. */
	helper_failed = 1;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == -1) {
		snprintf(err, PROTO_ERRLEN, "socketpair: %s", strerror(errno));
		return -1;
	}
	/* A PUT's megabyte in few wakeups of each side, not one per default
	 * socket buffer (about 200 KB); the system may give less. */
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
	if ((child = fork()) == -1) {
		snprintf(err, PROTO_ERRLEN, "fork: %s", strerror(errno));
		close(sv[0]);
		close(sv[1]);
		return -1;
	}
	helper_failed = 0;
	if (child != 0) {
		/* The session: this process goes on. Its helper is reaped by
		 * the kernel when it ends. */
		close(sv[0]);
		helper_fd = sv[1];
		signal(SIGCHLD, SIG_IGN);
		return 0;
	}
	/* The helper: not outliving its session (on Linux: other systems
	 * have no parent-death signal, and it ends when the session's end
	 * of the socket closes), no client socket, the session's user, then
	 * serve. Plain C only from here: no device, no Metal. */
	close(sv[1]);
	close(clientfd);
#ifdef __linux__
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() != session)
		_exit(1);
#endif
	if (confine_user(cfg, err) == -1) {
		log_warn("cache helper: %s; the session runs without the cache",
		    err);
		close(sv[0]);
	} else
		helper_loop(sv[0]);
	_exit(0);
}

/* ---- the session's side ---- */

struct cache_link *
cache_link_open(void)
{
	struct cache_link *l;

	if (!cache_enabled() || helper_failed ||
	    (l = calloc(1, sizeof(*l))) == NULL)
		return NULL;
	l->fd = helper_fd;
	helper_fd = -1;
	if (l->fd == -1 && (l->pins = cache_pins_new()) == NULL) {
		free(l);
		return NULL;
	}
	return l;
}

void
cache_link_close(struct cache_link *l)
{
	struct pollfd p;
	uint8_t c;
	int i;

	if (l == NULL)
		return;
	/* Thread isolation: the session's stores are done when it ends, as
	 * with a helper (below). */
	if (l->fd == -1)
		storeq_drain(own_queue);
	if (l->fd >= 0) {
		/* The helper finishes what was PUT (its store queue: at most
		 * STOREQ_MAX bytes wait) when it reads the end of the socket,
		 * and it dies with this process: a session that ended right
		 * after an FCACHE write lost the content. So say the end and
		 * give the helper up to 2 s to close its side (shutdown, poll
		 * and read: what the confined session may). */
		shutdown(l->fd, SHUT_WR);
		p.fd = l->fd;
		p.events = POLLIN;
		for (i = 0; i < 100 && poll(&p, 1, 20) >= 0; i++)
			if ((p.revents & (POLLIN | POLLHUP)) != 0 &&
			    read(l->fd, &c, 1) <= 0)
				break;
	}
	if (l->fd != -1)
		close(l->fd);
	cache_pins_free(l->pins);
	free(l);
}

/* The helper is gone or out of step: go on without the cache. */
static void
broken(struct cache_link *l)
{
	log_warn("cache: lost the cache helper (%s); this session goes on "
	    "without the cache", errno ? strerror(errno) : "closed");
	close(l->fd);
	l->fd = -2;
}

int
cache_link_have(struct cache_link *l, const uint8_t *hashes, uint32_t n,
    uint8_t *held)
{
	struct req q = { OP_HAVE, 0, n };
	uint32_t i;

	memset(held, 0, n);
	if (l->fd == -1) {
		storeq_drain(own_queue);	/* as the helper's serve_have */
		for (i = 0; i < n; i++)
			held[i] = (uint8_t)cache_pin(l->pins,
			    hashes + (size_t)i * PROTO_HASH_SIZE);
		return 0;
	}
	if (l->fd == -2)
		return 0;
	/* In batches, as the helper answers them: neither side's socket
	 * buffer has to hold all n hashes. */
	if (net_send_all(l->fd, &q, sizeof(q)) == -1)
		goto fail;
	for (i = 0; i < n; i += BATCH) {
		uint32_t k = n - i < BATCH ? n - i : BATCH;
		if (net_send_all(l->fd, hashes + (size_t)i * PROTO_HASH_SIZE,
		    (size_t)k * PROTO_HASH_SIZE) == -1 ||
		    rd(l->fd, held + i, k) == -1)
			goto fail;
	}
	for (i = 0; i < n; i++)
		held[i] = held[i] == 1;
	return 0;
fail:
	memset(held, 0, n);
	broken(l);
	return 0;
}

int
cache_link_get(struct cache_link *l, const uint8_t hash[PROTO_HASH_SIZE],
    uint64_t len, uint8_t *dst, char *err)
{
	struct req q = { OP_GET, 0, len };
	struct rep r;
	uint8_t *data;
	int rc;

	if (l->fd == -1) {
		if ((rc = cache_get(l->pins, hash, len, &data, err)) == 0) {
			memcpy(dst, data, (size_t)len);
			free(data);
		}
		return rc;
	}
	if (l->fd == -2) {
		snprintf(err, PROTO_ERRLEN, "the cache is not available to this "
		    "session any more (the runner's log says why)");
		return CACHE_BAD;
	}
	if (net_send_all(l->fd, &q, sizeof(q)) == -1 ||
	    net_send_all(l->fd, hash, PROTO_HASH_SIZE) == -1 ||
	    rd(l->fd, &r, sizeof(r)) == -1)
		goto fail;
	if (r.status != 0) {
		if (r.textlen >= PROTO_ERRLEN || rd(l->fd, err, r.textlen) == -1)
			goto fail;
		err[r.textlen] = '\0';
		return r.status == CACHE_NOTHELD || r.status == CACHE_BADLEN ?
		    r.status : CACHE_BAD;
	}
	/* Verified by the helper before it sent the status. */
	if (rd(l->fd, dst, (size_t)len) == -1)
		goto fail;
	return 0;
fail:
	broken(l);
	snprintf(err, PROTO_ERRLEN, "lost the cache helper; the cache is not "
	    "available to this session any more");
	return CACHE_BAD;
}

void
cache_link_put(struct cache_link *l, const void *p, uint64_t len)
{
	struct req q = { OP_PUT, 0, len };
	struct cache_put *pp;

	if (l->fd == -1) {
		/* The bytes into their file now (the buffer may change once
		 * this returns), the hash and the name later. */
		pthread_once(&own_queue_once, own_queue_new);
		if ((pp = cache_put_begin(len)) != NULL) {
			cache_put_write(pp, p, (size_t)len);
			storeq_put(own_queue, pp, len);
		}
	} else if (l->fd >= 0 && (net_send_all(l->fd, &q, sizeof(q)) == -1 ||
	    net_send_all(l->fd, p, (size_t)len) == -1))
		broken(l);
}
