/*
 * procspawn.c: process isolation where the backend cannot fork (Metal): each
 * session is a fresh process of the runner's own binary, started with
 * posix_spawn and handed the connection.
 *
 * A forked session inherits what it needs; a spawned one starts with the
 * runner's command line, from which it reads the same configuration
 * (main.c), and these descriptors, moved to 3, 4, ... in this order:
 *
 *	the connection; the session table (slots.c, shared memory: shm.c);
 *	its inbox for peers (peer_route.c); its resume control socket
 *	(resume.c); the peer broker (peer_net.c); the cache's byte count
 *	(cache.c); a pipe holding the token in force (handshake.c: SIGHUP
 *	may have replaced the file's); the write end of every session's
 *	inbox, for a connection that turns out to be a peer.
 *
 * --session-spawn gives the slot, the session number, the runner's pid,
 * where each descriptor is (-1: none) and the capabilities the runner's
 * device offers, --session-routes the session of each inbox write end,
 * --session-peer the client's address. The session process then opens
 * the device itself, as a second runner would: nothing of the runner's
 * device crosses the process boundary, so a GPU lost to one session's
 * process (macOS revokes a process's access after its work hangs) is not
 * lost to the others. What the runner found out at a cost when it opened
 * its own comes with the capabilities, so that a session does not find
 * it out again (Metal: whether source compiles, a compile at start-up).
 *
 * Everything else is closed in the new process: the platform choice of
 * how is made here, once (glibc 2.34's closefrom action, macOS's
 * POSIX_SPAWN_CLOEXEC_DEFAULT, else the session closes what it was not
 * meant to have before it reads anything).
 */
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/types.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __APPLE__
#include <mach-o/dyld.h>
#endif

#include "cache.h"
#include "metal_runner.h"
#include "proto.h"
#include "session.h"
#include "slots.h"
#include "procspawn.h"

extern char **environ;

/* The descriptors handed down, in this order; routes follow. */
enum { FD_CONN, FD_SLOTS, FD_INBOX, FD_CTL, FD_BROKER, FD_CACHE, FD_TOKEN,
    NFIXED };
#define SPAWN_FD0	3
#define SPAWN_MAXFDS	(NFIXED + 8192)

/* This binary, to start again. */
static const char *
self_path(char *buf, size_t len, const struct mr_config *cfg)
{
#if defined(__linux__)
	(void)buf;
	(void)len;
	(void)cfg;
	return "/proc/self/exe";
#elif defined(__APPLE__)
	uint32_t n = (uint32_t)len;

	if (_NSGetExecutablePath(buf, &n) == 0)
		return buf;
	return cfg->argv[0];
#else
	(void)buf;
	(void)len;
	return cfg->argv[0];
#endif
}

pid_t
spawn_session(const struct mr_config *cfg, const struct be_info *info, int fd,
    uint32_t id, int slot, const char *peer, char *err)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	char spec[256], path[PATH_MAX], **argv = NULL, *routes = NULL;
	int src[SPAWN_MAXFDS], at[NFIXED], *w = NULL, n = 0, nfix, nw, i, rc;
	int base, tp[2] = { -1, -1 };
	uint32_t *ids = NULL;
	size_t rlen;
	pid_t pid = -1;

	if (cfg->argv == NULL || cfg->argc < 1) {
		snprintf(err, PROTO_ERRLEN, "spawned sessions need the "
		    "runner's command line (mr_config argv)");
		return -1;
	}
	nw = (int)slot_count();
	if ((ids = calloc((size_t)nw + 1, sizeof(*ids))) == NULL ||
	    (w = calloc((size_t)nw + 1, sizeof(*w))) == NULL ||
	    (routes = malloc((size_t)nw * 11 + 2)) == NULL ||
	    (argv = calloc((size_t)cfg->argc + 8, sizeof(*argv))) == NULL) {
		snprintf(err, PROTO_ERRLEN, "out of memory");
		goto fail;
	}
	src[FD_CONN] = fd;
	src[FD_SLOTS] = slot_fd();
	nw = peer_route_fds(slot, &src[FD_INBOX], ids, w, nw);
	src[FD_CTL] = slot_get((uint32_t)slot)->ctl;
	src[FD_BROKER] = peer_broker_fd();
	src[FD_CACHE] = cache_approx_fd();
	src[FD_TOKEN] = -1;
	if (cfg->token != NULL) {
		/* Whole in the pipe's buffer: the token is at most 4K. */
		if (pipe(tp) == -1) {
			snprintf(err, PROTO_ERRLEN, "cannot pass the token: %s",
			    strerror(errno));
			goto fail;
		}
		/* mr_token_send closes its end, failed or not. */
		rc = mr_token_send(cfg, tp[1]);
		tp[1] = -1;
		if (rc == -1) {
			snprintf(err, PROTO_ERRLEN, "cannot pass the token: %s",
			    strerror(errno));
			goto fail;
		}
		src[FD_TOKEN] = tp[0];
	}
	/* Present ones get the next place from 3; at[] says where. */
	for (i = 0; i < NFIXED; i++)
		if (src[i] != -1) {
			at[i] = SPAWN_FD0 + n;
			src[n++] = src[i];
		} else
			at[i] = -1;
	nfix = n;
	for (i = 0; i < nw && n < SPAWN_MAXFDS; i++)
		src[n++] = w[i];
	nw = n - nfix;
	/* Two moves: up past every source, then down to 3, ..., so that no
	 * move overwrites a source not yet moved. */
	for (base = SPAWN_FD0 + n, i = 0; i < n; i++)
		if (src[i] >= base)
			base = src[i] + 1;
	rlen = 0;
	routes[0] = '\0';
	for (i = 0; i < nw; i++)
		rlen += (size_t)snprintf(routes + rlen, 12, "%s%u", i ? "," : "",
		    ids[i]);
	if (nw == 0)
		snprintf(routes, 2, "-");
	snprintf(spec, sizeof(spec), "%d,%u,%ld,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%u",
	    slot, id, (long)getpid(), at[FD_CONN], at[FD_SLOTS], at[FD_INBOX],
	    at[FD_CTL], at[FD_BROKER], at[FD_CACHE], at[FD_TOKEN],
	    SPAWN_FD0 + nfix, nw, base + n, (unsigned)info->caps);
	argv[0] = cfg->argv[0];
	argv[1] = "--session-spawn";
	argv[2] = spec;
	argv[3] = "--session-routes";
	argv[4] = routes;
	argv[5] = "--session-peer";
	argv[6] = (char *)peer;
	for (i = 1; i < cfg->argc; i++)
		argv[6 + i] = cfg->argv[i];

	if (posix_spawn_file_actions_init(&fa) != 0) {
		snprintf(err, PROTO_ERRLEN, "posix_spawn_file_actions_init "
		    "failed");
		goto fail;
	}
	posix_spawnattr_init(&attr);
	for (i = 0; i < n; i++)
		posix_spawn_file_actions_adddup2(&fa, src[i], base + i);
	for (i = 0; i < n; i++)
		posix_spawn_file_actions_adddup2(&fa, base + i, SPAWN_FD0 + i);
#if defined(__APPLE__)
	/* Only what the actions name is inherited: stdio by name too, if
	 * open (XNU fails the whole spawn, EBADF, on a closed one; main.c
	 * opens /dev/null on them, a program embedding the runner may not). */
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_CLOEXEC_DEFAULT);
	for (i = 0; i < 3; i++)
		if (fcntl(i, F_GETFD) != -1)
			posix_spawn_file_actions_addinherit_np(&fa, i);
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && \
    __GLIBC_MINOR__ >= 34))
	posix_spawn_file_actions_addclosefrom_np(&fa, SPAWN_FD0 + n);
#endif
	rc = posix_spawn(&pid, self_path(path, sizeof(path), cfg), &fa, &attr,
	    argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	if (rc != 0) {
		snprintf(err, PROTO_ERRLEN, "posix_spawn: %s", strerror(rc));
		pid = -1;
	}
fail:
	if (tp[0] != -1)
		close(tp[0]);
	if (tp[1] != -1)
		close(tp[1]);
	free(ids);
	free(w);
	free(routes);
	free(argv);
	return pid;
}

/* n comma-separated integers of s into v: 0, or -1 if s is not that. */
static int
parse_ints(const char *s, long *v, int n)
{
	char *end;
	int i;

	for (i = 0; i < n; i++) {
		errno = 0;
		v[i] = strtol(s, &end, 10);
		if (errno != 0 || end == s || *end != (i + 1 < n ? ',' : '\0'))
			return -1;
		s = end + 1;
	}
	return 0;
}

/* The token the runner passed down in fd: 0, or -1. */
static int
read_token(struct mr_config *cfg, int fd)
{
	static uint8_t token[MR_TOKEN_MAX];
	ssize_t n;
	size_t len = 0;

	while (len < sizeof(token) && ((n = read(fd, token + len,
	    sizeof(token) - len)) > 0 || (n == -1 && errno == EINTR)))
		if (n > 0)
			len += (size_t)n;
	close(fd);
	if (len == 0)
		return -1;
	cfg->token = token;
	cfg->tokenlen = len;
	return 0;
}

void
mr_spawned_session(struct mr_config *cfg, const char *spec,
    const char *routes, const char *peer)
{
	static struct mr_server_ctx ctx;
	static struct be_info known;	/* what the runner's open found */
	long v[14], top, fd;
	uint32_t *ids = NULL;
	int *w = NULL, slot, nw, i;
	char err[PROTO_ERRLEN];

	log_verbose = cfg->verbose;
	if (parse_ints(spec, v, 14) == -1 || v[0] < 0 || v[3] != SPAWN_FD0 ||
	    v[4] != SPAWN_FD0 + 1 || v[11] < 0 || v[11] > SPAWN_MAXFDS ||
	    v[12] < v[10] + v[11] || v[13] < 0 || v[13] > UINT16_MAX) {
		log_error("--session-spawn %s: not what a runner passes (an "
		    "internal option: sessions are started by the runner)", spec);
		_exit(1);
	}
	/* Before anything else: only what was handed down stays open. */
	top = v[12];
	for (fd = v[10] + v[11]; fd < top; fd++)
		close((int)fd);
#if !defined(__APPLE__) && !(defined(__GLIBC__) && (__GLIBC__ > 2 || \
    (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34)))
	for (top = sysconf(_SC_OPEN_MAX); fd < top && fd < 65536; fd++)
		close((int)fd);
#endif
#ifdef __linux__
	/* As a forked session: not outliving the runner. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() != (pid_t)v[2])
		_exit(1);
#endif
	slot = (int)v[0];
	nw = (int)v[11];
	/* Without the token a session would take anyone. */
	if (v[9] != -1 && read_token(cfg, (int)v[9]) == -1) {
		log_warn("session %ld: the runner passed no token", v[1]);
		_exit(1);
	}
	if (slot_attach((int)v[4]) == -1 || (uint32_t)slot >= slot_count()) {
		log_warn("session %ld: cannot map the session table: %s", v[1],
		    strerror(errno));
		_exit(1);
	}
	if ((ids = calloc((size_t)nw + 1, sizeof(*ids))) == NULL ||
	    (w = calloc((size_t)nw + 1, sizeof(*w))) == NULL) {
		log_warn("session %ld: out of memory", v[1]);
		_exit(1);
	}
	for (i = 0; i < nw; i++) {
		char *end;
		ids[i] = (uint32_t)strtoul(routes, &end, 10);
		w[i] = (int)v[10] + i;
		routes = *end == ',' ? end + 1 : end;
	}
	/* The number in the table is the runner's; this process's is v[6]. */
	slot_get((uint32_t)slot)->ctl = (int)v[6];
	if (peer_route_adopt(slot_count(), slot, (int)v[5], ids, w, nw) == -1) {
		log_warn("session %ld: out of memory", v[1]);
		_exit(1);
	}
	free(ids);
	free(w);
	if (v[7] != -1)
		peer_broker_adopt((int)v[7]);
	if (v[8] != -1 && cfg->cache_dir != NULL && cache_attach(cfg->cache_dir,
	    cfg->cache_size, (int)v[8], err) == -1)
		log_warn("session %ld: no cache for this session: %s", v[1], err);
	ctx.cfg = cfg;
	if ((ctx.be = mr_find_backend(cfg->backend)) == NULL)
		_exit(1);
	known.caps = (uint16_t)v[13];
	ctx.info = &known;
	server_session_run(&ctx, (int)v[3], (uint32_t)v[1], slot, peer, 1);
}
