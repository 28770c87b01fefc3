/*
 * isolate.c: starting sessions, in the one of three isolations the
 * backend and --isolation ask for (mr_isolation, config.c), behind one
 * isolate_start() with one rollback; and ending them.
 *
 * Process isolation (the CPU backend's default): each session runs in a
 * forked process. A kernel is arbitrary machine code from the client; when
 * it crashes or runs away, only its own process dies, and everything the
 * session held is returned by the kernel when that process exits. The cost
 * is one fork per connection, paid once, not per request.
 *
 * Spawned processes (the Metal backend's process isolation, and its
 * default; --isolation spawn for the CPU backend): Metal is not fork-safe
 * once the device is open, so each session is a fresh process of the same
 * binary, started with posix_spawn and handed the connection and the
 * descriptors of what a forked session would inherit (below). It opens
 * the device itself, so a GPU that macOS revokes from one session's
 * process (after its work hangs) ends that session only. The cost, a new
 * process and device per session, was measured on the Metal emulator at a
 * few ms more at session start than a thread (bench/session_spawn.py,
 * docs/metal.md); the CPU backend keeps fork, cheaper still.
 *
 * Thread isolation (--isolation thread): each session is a thread sharing
 * the device and, for Metal, the compiled-pipeline cache. A crashing CPU
 * kernel would take down the daemon in this mode, which is why the CPU
 * backend does not use it unless asked; for Metal, a GPU lost to the
 * process is lost to every session, and the runner exits.
 *
 * A spawned session starts with the runner's command line, from which it
 * reads the same configuration (main.c), and these descriptors, moved to
 * 3, 4, ... in this order:
 *
 *	the connection; the session table (slots.c, shared memory: shm.c);
 *	its inbox for peers (peer_route.c); its resume control socket
 *	(resume.c); the peer broker (peer_net.c); the cache's byte count
 *	(cache.c); a pipe holding the token in force (handshake.c: SIGHUP
 *	may have replaced the file's); the write end of every session's
 *	inbox, for a connection that turns out to be a peer.
 *
 * --session-spawn gives the hand-over (struct handover, written and read
 * here): the slot, the session number, the runner's pid, where each
 * descriptor is (-1: none) and the capabilities the runner's device
 * offers; --session-routes the session of each inbox write end,
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
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __APPLE__
#include <mach-o/dyld.h>
#endif

#include "cache.h"
#include "config.h"
#include "confine.h"
#include "isolate.h"
#include "metal_runner.h"
#include "monotime.h"
#include "proto.h"
#include "resume.h"
#include "session.h"
#include "slots.h"

struct thread_arg {
	const struct mr_server_ctx *ctx;
	int fd;
	uint32_t id;
	int slot;
	char peer[64];
};

/* Spawned sessions in a row whose process could not open the device (reap):
 * at NODEVICE_STOP the device is taken to be gone (an eGPU unplugged), and
 * the runner stops as after a loss, so that a service manager restarts it
 * and it stops advertising a GPU it cannot give. */
static int nodevice;
#define NODEVICE_STOP	3
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slots_idle = PTHREAD_COND_INITIALIZER;
static int nactive;

/*
 * Wait for session processes that have ended (block: all of them), by
 * their pids: waitpid(-1) would also take the exit status of children an
 * embedding program started itself (popen, system), and wait for them.
 */
void
isolate_reap(int block)
{
	pid_t pid;
	int status;
	uint32_t i;

	for (i = 0; i < slot_count(); i++) {
		struct slot *sl = slot_get(i);
		if (!sl->busy || sl->pid <= 0)
			continue;
		while ((pid = waitpid(sl->pid, &status, block ? 0 : WNOHANG)) ==
		    -1 && errno == EINTR)
			;
		if (pid == 0)
			continue;
		if (pid == -1)	/* SIGCHLD ignored: the kernel reaped it */
			log_warn("session %u ended: %s", sl->id,
			    strerror(errno));
		else if (WIFSIGNALED(status) && mr_stopping())
			/* Its own line, as a thread's session logs it. */
			(sl->announced ? log_notice : log_info)("session %u: "
			    "ended: the runner stopped; %.1f s, %llu requests",
			    sl->id, (double)(mono_ms() - sl->started) / 1000,
			    (unsigned long long)sl->nreq);
		else if (WIFSIGNALED(status))
			log_warn("session %u ended by signal %d", sl->id,
			    WTERMSIG(status));
		else if (WEXITSTATUS(status) == SESS_EXIT_CRASH)
			log_warn("session %u ended: a kernel crashed", sl->id);
		else if (WEXITSTATUS(status) == SESS_EXIT_TIMEOUT)
			log_warn("session %u ended: a kernel ran past the time "
			    "limit", sl->id);
		else if (WEXITSTATUS(status) == SESS_EXIT_LOST)
			log_warn("session %u ended: the device was lost to its "
			    "process; the other sessions go on", sl->id);
		/* Any other end had a device, or ended before it looked. */
		if (pid > 0 && WIFEXITED(status) &&
		    WEXITSTATUS(status) == SESS_EXIT_NODEVICE)
			nodevice++;
		else if (pid > 0)
			nodevice = 0;
		peer_route_close((int)i);
		slot_free((int)i);
		nactive--;
	}
}

static void session_run(struct mr_server_ctx *, int, uint32_t, int,
    const char *, int) __attribute__((noreturn));

static void *
session_thread(void *arg)
{
	struct thread_arg *ta = arg;

	sess_serve(ta->ctx, ta->fd, ta->id, ta->slot, ta->peer);
	pthread_mutex_lock(&slots_lock);
	peer_route_close(ta->slot);
	slot_free(ta->slot);
	nactive--;
	pthread_cond_signal(&slots_idle);
	pthread_mutex_unlock(&slots_lock);
	free(ta);
	return NULL;
}

static void
session_process(struct mr_server_ctx *ctx, int lfd, int fd, uint32_t id,
    int slot, const char *peer)
{
	close(lfd);
	resume_child();
	peer_route_forked(slot, 1);
#ifdef __linux__
	/* A session must not outlive its runner (a SIGKILLed daemon would
	 * leave orphans serving and holding memory). The parent may already
	 * be gone by the time this runs: check after arming. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() == 1)
		_exit(1);
#endif
	session_run(ctx, fd, id, slot, peer, 0);
}

/*
 * The rest of a session process, forked or spawned (open_be: it opens the
 * device itself, after its cache helper is forked, given the runner's
 * ctx->info as what the runner's own open found). Ends the process: 0, 1
 * (could not start), 3 or 4 (a kernel crashed or ran too long: crash.c),
 * 5 (the device was lost to it), 6 (it could not open the device).
 */
static void
session_run(struct mr_server_ctx *ctx, int fd, uint32_t id, int slot,
    const char *peer, int open_be)
{
	static struct be_info info;
	struct sigaction sa;
	sigset_t none;
	char err[PROTO_ERRLEN];

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sa.sa_handler = SIG_IGN;	/* a reload is the runner's business */
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGPIPE, &sa, NULL);
	/* The mask is the forking thread's: a program embedding the runner
	 * may block SIGTERM there to sigwait() for it, and stop_sessions()
	 * must still end this process with it. */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	/* The cache helper (cachelink.c) must exist before the session is
	 * confined; it is a forked child and the session goes on in this
	 * process. Without one the session runs without the cache. */
	if (cache_enabled() && cache_helper_start(ctx->cfg, fd, err) == -1)
		log_warn("session %u: no cache for this session: %s", id, err);
	/* A spawned session opens its own device after that fork, in the
	 * process that was exec'd: Metal must not be used in a child of
	 * fork() (before an exec), nor be open in a process that forks. */
	if (open_be) {
		if (ctx->be->open(&info, ctx->cfg->device, ctx->info,
		    err) == -1) {
			log_warn("session %u: cannot open the %s backend: %s",
			    id, ctx->be->name, err);
			net_refuse(fd, 0, PROTO_EDEVICE, "the runner cannot "
			    "open the device for this session; its log says "
			    "why");
			_exit(SESS_EXIT_NODEVICE);
		}
		ctx->info = &info;
	}
	/* CPU kernels run here; a GPU's faults come back from its driver,
	 * whose own handlers (the emulator's) must stay. */
	if (!ctx->be->no_fork)
		sess_crash_install();
	/* Before the first byte from the client is read: a kernel is code
	 * from the client, and so is anything a parser bug would run. A
	 * backend that cannot fork is a driver not made for a filter. */
	if (peer_broker_attach(err) == -1 || (!ctx->be->no_fork &&
	    confine_session(ctx->cfg, err) == -1)) {
		log_warn("session %u: %s", id, err);
		net_refuse(fd, 0, PROTO_EDEVICE, "the runner cannot start a "
		    "confined session; its log says why");
		_exit(1);
	}
	sess_serve(ctx, fd, id, slot, peer);
	/* Its own device's loss is this session's alone: the runner goes on
	 * (the session told its client why). */
	if (ctx->be->lost != NULL && ctx->be->lost() != NULL)
		_exit(SESS_EXIT_LOST);
	_exit(0);
}

/*
 * End every session. After a device loss (lost) a session thread is woken
 * by shutting only the receiving side of its socket, so that it can still
 * tell its client why (session.c, end_lost); one that has not ended a
 * second later has both sides shut, as for any stop.
 */
void
isolate_stop(int processes, int lost)
{
	uint32_t i;
	time_t deadline = time(NULL) + 5;
	int64_t lost_deadline;

	if (processes) {
		for (i = 0; i < slot_count(); i++)
			if (slot_get(i)->busy && slot_get(i)->pid > 0)
				kill(slot_get(i)->pid, SIGTERM);
		while (nactive > 0 && time(NULL) < deadline) {
			isolate_reap(0);
			usleep(10000);
		}
		for (i = 0; i < slot_count(); i++)
			if (slot_get(i)->busy && slot_get(i)->pid > 0)
				kill(slot_get(i)->pid, SIGKILL);
		while (nactive > 0)
			isolate_reap(1);
		return;
	}
	/* Threads: wake each session out of recv (or out of its wait for a
	 * resume); it cleans up and exits. A thread running a kernel cannot
	 * be interrupted: it ends when the kernel does, and until then it
	 * uses the backend and the server's context, which serve() must not
	 * free under it. So this waits for every thread, saying why. */
	pthread_mutex_lock(&slots_lock);
	resume_stop();
	for (i = 0; i < slot_count(); i++)
		if (slot_get(i)->busy && slot_get(i)->fd != -1)
			shutdown(slot_get(i)->fd, lost ? SHUT_RD : SHUT_RDWR);
	deadline = time(NULL) + 1;
	lost_deadline = mono_ms() + 1000;
	mr_stop_waiting(1);
	while (nactive > 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&slots_idle, &slots_lock, &ts);
		if (nactive > 0 && lost && mono_ms() >= lost_deadline) {
			lost = 0;
			for (i = 0; i < slot_count(); i++)
				if (slot_get(i)->busy && slot_get(i)->fd != -1)
					shutdown(slot_get(i)->fd, SHUT_RDWR);
			deadline = time(NULL) + 1;
		} else if (nactive > 0 && time(NULL) >= deadline) {
			log_warn("waiting for %d session threads still running a "
			    "kernel (a thread cannot be interrupted; a second "
			    "SIGINT or SIGTERM ends the runner now)", nactive);
			deadline = time(NULL) + 10;
		}
	}
	mr_stop_waiting(0);
	pthread_mutex_unlock(&slots_lock);
}

extern char **environ;

/* The descriptors handed down, in this order; routes follow. */
enum { FD_CONN, FD_SLOTS, FD_INBOX, FD_CTL, FD_BROKER, FD_CACHE, FD_TOKEN,
    NFIXED };
#define SPAWN_FD0	3
#define SPAWN_MAXFDS	(NFIXED + 8192)

/*
 * What a spawned session is handed (--session-spawn), by name at both
 * ends: spawn_session() fills it in and mr_spawned_session() reads it;
 * only handover_put() and handover_get() know its order on the command
 * line, a list of integers.
 */
struct handover {
	long slot;
	long id;		/* the session's number */
	long ppid;		/* the runner's pid */
	long fd[NFIXED];	/* where each descriptor is, -1: none */
	long routes;		/* the first inbox write end */
	long nroutes;		/* how many follow it */
	long top;		/* nothing from here up was handed down */
	long caps;		/* the capabilities the runner's device offers */
};
#define HANDOVER_N	(7 + NFIXED)

static int parse_ints(const char *, long *, int);

static void
handover_put(const struct handover *h, char *buf, size_t len)
{
	size_t n;
	int i;

	n = (size_t)snprintf(buf, len, "%ld,%ld,%ld", h->slot, h->id, h->ppid);
	for (i = 0; i < NFIXED && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, ",%ld", h->fd[i]);
	if (n < len)
		snprintf(buf + n, len - n, ",%ld,%ld,%ld,%ld", h->routes,
		    h->nroutes, h->top, h->caps);
}

/* 0, or -1 if spec is not what a runner writes. */
static int
handover_get(const char *spec, struct handover *h)
{
	long v[HANDOVER_N];
	int i;

	if (parse_ints(spec, v, HANDOVER_N) == -1)
		return -1;
	h->slot = v[0];
	h->id = v[1];
	h->ppid = v[2];
	for (i = 0; i < NFIXED; i++)
		h->fd[i] = v[3 + i];
	h->routes = v[3 + NFIXED];
	h->nroutes = v[4 + NFIXED];
	h->top = v[5 + NFIXED];
	h->caps = v[6 + NFIXED];
	if (h->slot < 0 || h->fd[FD_CONN] != SPAWN_FD0 ||
	    h->fd[FD_SLOTS] != SPAWN_FD0 + 1 || h->nroutes < 0 ||
	    h->nroutes > SPAWN_MAXFDS || h->top < h->routes + h->nroutes ||
	    h->caps < 0 || h->caps > UINT16_MAX)
		return -1;
	return 0;
}

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

/*
 * What slot's session process is handed, into src[FD_*] (-1: none), and
 * the inboxes' write ends and their sessions into w and ids (*nw of them,
 * at most *nw); the token goes into a pipe whose read end is src[FD_TOKEN]
 * and tp[0]. 0, or -1 with a message in err.
 */
static int
handover_fds(const struct mr_config *cfg, int fd, int slot, int *src,
    uint32_t *ids, int *w, int *nw, int tp[2], char *err)
{
	int rc;

	src[FD_CONN] = fd;
	src[FD_SLOTS] = slot_fd();
	*nw = peer_route_fds(slot, &src[FD_INBOX], ids, w, *nw);
	src[FD_CTL] = slot_get((uint32_t)slot)->ctl;
	src[FD_BROKER] = peer_broker_fd();
	src[FD_CACHE] = cache_approx_fd();
	src[FD_TOKEN] = -1;
	if (cfg->token == NULL)
		return 0;
	/* Whole in the pipe's buffer: the token is at most 4K. */
	if (pipe(tp) == -1) {
		snprintf(err, PROTO_ERRLEN, "cannot pass the token: %s",
		    strerror(errno));
		return -1;
	}
	/* mr_token_send closes its end, failed or not. */
	rc = mr_token_send(cfg, tp[1]);
	tp[1] = -1;
	if (rc == -1) {
		snprintf(err, PROTO_ERRLEN, "cannot pass the token: %s",
		    strerror(errno));
		return -1;
	}
	src[FD_TOKEN] = tp[0];
	return 0;
}

/* posix_spawn this binary with argv, src[0..n) moved to 3, 4, ... by way
 * of base, base + 1, ...; its pid, or -1 with a message in err. */
static pid_t
spawn_exec(const struct mr_config *cfg, char **argv, const int *src, int n,
    int base, char *err)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	char path[PATH_MAX];
	pid_t pid = -1;
	int i, rc;

	if (posix_spawn_file_actions_init(&fa) != 0) {
		snprintf(err, PROTO_ERRLEN, "posix_spawn_file_actions_init "
		    "failed");
		return -1;
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
	return pid;
}

/* The runner: start slot's session process for connection fd; its pid, or
 * -1 with a message in err. fd and the descriptors are the caller's. */
static pid_t
spawn_session(const struct mr_config *cfg, const struct be_info *info, int fd,
    uint32_t id, int slot, const char *peer, char *err)
{
	struct handover h;
	char spec[256], **argv = NULL, *routes = NULL;
	int src[SPAWN_MAXFDS], *w = NULL, n = 0, nfix, nw, i;
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
	if (handover_fds(cfg, fd, slot, src, ids, w, &nw, tp, err) == -1)
		goto fail;
	/* Present ones get the next place from 3; h.fd[] says where. */
	for (i = 0; i < NFIXED; i++)
		if (src[i] != -1) {
			h.fd[i] = SPAWN_FD0 + n;
			src[n++] = src[i];
		} else
			h.fd[i] = -1;
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
	h.slot = slot;
	h.id = id;
	h.ppid = (long)getpid();
	h.routes = SPAWN_FD0 + nfix;
	h.nroutes = nw;
	h.top = base + n;
	h.caps = info->caps;
	handover_put(&h, spec, sizeof(spec));
	argv[0] = cfg->argv[0];
	argv[1] = "--session-spawn";
	argv[2] = spec;
	argv[3] = "--session-routes";
	argv[4] = routes;
	argv[5] = "--session-peer";
	argv[6] = (char *)peer;
	for (i = 1; i < cfg->argc; i++)
		argv[6 + i] = cfg->argv[i];
	pid = spawn_exec(cfg, argv, src, n, base, err);
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
	struct handover h;
	long top, fd;
	uint32_t *ids = NULL;
	int *w = NULL, slot, nw, i;
	char err[PROTO_ERRLEN];

	log_verbose = cfg->verbose;
	if (handover_get(spec, &h) == -1) {
		log_error("--session-spawn %s: not what a runner passes (an "
		    "internal option: sessions are started by the runner)", spec);
		_exit(1);
	}
	/* Before anything else: only what was handed down stays open. */
	top = h.top;
	for (fd = h.routes + h.nroutes; fd < top; fd++)
		close((int)fd);
#if !defined(__APPLE__) && !(defined(__GLIBC__) && (__GLIBC__ > 2 || \
    (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34)))
	for (top = sysconf(_SC_OPEN_MAX); fd < top && fd < 65536; fd++)
		close((int)fd);
#endif
#ifdef __linux__
	/* As a forked session: not outliving the runner. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() != (pid_t)h.ppid)
		_exit(1);
#endif
	slot = (int)h.slot;
	nw = (int)h.nroutes;
	/* Without the token a session would take anyone. */
	if (h.fd[FD_TOKEN] != -1 && read_token(cfg, (int)h.fd[FD_TOKEN]) == -1) {
		log_warn("session %ld: the runner passed no token", h.id);
		_exit(1);
	}
	if (slot_attach((int)h.fd[FD_SLOTS]) == -1 ||
	    (uint32_t)slot >= slot_count()) {
		log_warn("session %ld: cannot map the session table: %s", h.id,
		    strerror(errno));
		_exit(1);
	}
	if ((ids = calloc((size_t)nw + 1, sizeof(*ids))) == NULL ||
	    (w = calloc((size_t)nw + 1, sizeof(*w))) == NULL) {
		log_warn("session %ld: out of memory", h.id);
		_exit(1);
	}
	for (i = 0; i < nw; i++) {
		char *end;
		ids[i] = (uint32_t)strtoul(routes, &end, 10);
		w[i] = (int)h.routes + i;
		routes = *end == ',' ? end + 1 : end;
	}
	/* The number in the table is the runner's; this process's is here. */
	slot_get((uint32_t)slot)->ctl = (int)h.fd[FD_CTL];
	if (peer_route_adopt(slot_count(), slot, (int)h.fd[FD_INBOX], ids, w,
	    nw) == -1) {
		log_warn("session %ld: out of memory", h.id);
		_exit(1);
	}
	free(ids);
	free(w);
	if (h.fd[FD_BROKER] != -1)
		peer_broker_adopt((int)h.fd[FD_BROKER]);
	if (h.fd[FD_CACHE] != -1 && cfg->cache_dir != NULL &&
	    cache_attach(cfg->cache_dir, cfg->cache_size, (int)h.fd[FD_CACHE],
	    err) == -1)
		log_warn("session %ld: no cache for this session: %s", h.id,
		    err);
	ctx.cfg = cfg;
	if ((ctx.be = mr_find_backend(cfg->backend)) == NULL)
		_exit(1);
	known.caps = (uint16_t)h.caps;
	ctx.info = &known;
	session_run(&ctx, (int)h.fd[FD_CONN], (uint32_t)h.id, slot, peer, 1);
}

/* Take a slot for connection id: -1 when there is none (*full: because the
 * session table is full, else too many connections are in their
 * handshake). */
int
isolate_admit(const struct mr_config *cfg, uint32_t max_startups,
    uint32_t id, int *full)
{
	int slot;

	pthread_mutex_lock(&slots_lock);
	if ((*full = slot_sessions() >= cfg->max_sessions) ||
	    slot_starting() >= max_startups)
		slot = -1;
	else if ((slot = slot_take()) != -1) {
		/* With thread isolation the slot's last session may have
		 * ended since the sweep, leaving a resume it passed up in its
		 * control socket. */
		resume_reclaim(slot);
		slot_get(slot)->id = id;
		nactive++;
	}
	pthread_mutex_unlock(&slots_lock);
	return slot;
}

/* Start the session of connection fd in slot, in iso; the connection is
 * the session's, or refused and closed (the slot is then free again). */
void
isolate_start(struct mr_server_ctx *ctx, enum be_isolation iso, int lfd,
    int fd, uint32_t id, int slot, const char *peer)
{
	struct thread_arg *ta = NULL;
	char err[PROTO_ERRLEN];
	pthread_t t;
	pid_t pid = -1;

	if (resume_open(ctx->cfg, slot) == -1)
		log_warn("session %u: no control socket (%s): it cannot be "
		    "resumed", id, strerror(errno));
	peer_route_open(slot, id);
	if (iso == BE_ISOLATE_SPAWN)
		pid = spawn_session(ctx->cfg, ctx->info, fd, id, slot, peer,
		    err);
	else if (iso == BE_ISOLATE_PROCESS) {
		if ((pid = fork()) == 0)
			session_process(ctx, lfd, fd, id, slot, peer);
		else if (pid == -1)
			snprintf(err, sizeof(err), "fork: %s", strerror(errno));
	} else if ((ta = calloc(1, sizeof(*ta))) != NULL) {
		ta->ctx = ctx;
		ta->fd = fd;
		ta->id = id;
		ta->slot = slot;
		snprintf(ta->peer, sizeof(ta->peer), "%s", peer);
		slot_get(slot)->fd = fd;
		if (pthread_create(&t, NULL, session_thread, ta) == 0) {
			pthread_detach(t);
			return;
		}
	}
	if (pid > 0) {
		slot_get(slot)->pid = pid;
		resume_forked(slot);
		close(fd);
		peer_route_forked(slot, 0);
		return;
	}
	if (iso == BE_ISOLATE_THREAD)
		log_warn("cannot start a session thread");
	else
		log_warn("session %u: %s", id, err);
	net_refuse(fd, 0, PROTO_ENOMEM, "cannot start a session");
	pthread_mutex_lock(&slots_lock);
	resume_forked(slot);
	peer_route_close(slot);
	slot_free(slot);
	nactive--;
	pthread_mutex_unlock(&slots_lock);
	free(ta);
}

void
isolate_lock(void)
{
	pthread_mutex_lock(&slots_lock);
}

void
isolate_unlock(void)
{
	pthread_mutex_unlock(&slots_lock);
}

int
isolate_active(void)
{
	return nactive;
}

/* Spawned sessions in a row that could not open the device; reset. */
int
isolate_nodevice(void)
{
	return nodevice >= NODEVICE_STOP ? nodevice : 0;
}

void
isolate_init(void)
{
	nodevice = 0;
}
