/*
 * server.c: the accept loop and session isolation.
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
 * descriptors of what a forked session would inherit (procspawn.c). It opens
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
 * The session table, its memory limits and the authentication penalty
 * are slots.c's; this file takes a slot for each connection and frees it.
 *
 * Handshakes: a connection is a session only once its Thello (and Tauth)
 * is done, and until then it counts against --max-startups, not
 * --max-sessions, so connections that never speak cannot lock clients
 * out. The handshake runs in the session itself, in either mode, under a
 * deadline of --handshake-timeout (session.c); the session then moves its
 * slot to the session count, or ends with ELIMIT if that is full
 * (handshake.c). Doing it here before the fork instead would mean an
 * event loop of half-done handshakes, parsing untrusted bytes and sleeping
 * out authentication penalties in the one process that must not fail; a
 * fork per startup costs little next to that, and is bounded by the limit.
 */
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "confine.h"
#include "metal_runner.h"
#include "monotime.h"
#include "proto.h"
#include "resume.h"
#include "session.h"
#include "slots.h"
#include "procspawn.h"

struct thread_arg {
	const struct mr_server_ctx *ctx;
	int fd;
	uint32_t id;
	int slot;
	char peer[64];
};

/* Set by mr_stop(), from any thread, and by SIGINT and SIGTERM; lock-free,
 * so the signal handler may set it too. */
static atomic_int stopping;
/* What stopped it, for its last line: the signal, or STOP_STDIN. */
static atomic_int stop_why;
#define STOP_STDIN	(-1)
/* Set while stop_sessions() waits for session threads that cannot be
 * interrupted. */
static atomic_int stop_waiting;
/* Spawned sessions in a row whose process could not open the device (reap):
 * at NODEVICE_STOP the device is taken to be gone (an eGPU unplugged), and
 * the runner stops as after a loss, so that a service manager restarts it
 * and it stops advertising a GPU it cannot give. */
static int nodevice;
#define NODEVICE_STOP	3
/* Set by SIGHUP when the program asked for it (cfg->on_hup). */
static atomic_int hup;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slots_idle = PTHREAD_COND_INITIALIZER;
static int nactive;
/* The accept loop's poll set: file-scope, so a forked session process
 * still reaches it (valgrind counts it in use, not lost). */
static struct pollfd *pfds;
static int *pslots;

static const struct backend *backends[] = {
#ifdef MR_BACKEND_METAL
	&be_metal,
#endif
	&be_cpu,
};

void
mr_config_defaults(struct mr_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->host = "127.0.0.1";
	cfg->port = 6667;
	cfg->maxmsg = PROTO_DEFAULT_MAXMSG;
	cfg->max_handles = 65536;
	cfg->max_sessions = 64;
	cfg->frame_timeout = 60;
	cfg->handshake_timeout = 10;
	cfg->cache_size = (uint64_t)4 << 30;
	cfg->resume_grace = 60;
	cfg->resume_log = 4 << 20;
}

enum be_isolation
mr_isolation(const struct mr_config *cfg, const struct backend *be)
{
	enum be_isolation iso = cfg->isolation ? cfg->isolation :
	    be->isolation;

	return iso == BE_ISOLATE_PROCESS && be->no_fork ? BE_ISOLATE_SPAWN :
	    iso;
}

const struct backend *
mr_find_backend(const char *name)
{
	size_t i;

	if (name == NULL)
		return backends[0];
	for (i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
		if (strcmp(backends[i]->name, name) == 0)
			return backends[i];
	return NULL;
}

void
mr_stop(void)
{
	stopping = 1;
}

int
mr_stopping(void)
{
	return stopping;
}

static void
on_hup_signal(int sig)
{
	(void)sig;
	hup = 1;
}

static void
on_stop_signal(int sig)
{
	/* A second one while stop_sessions() waits for session threads ends
	 * the program at once, as a user who presses ^C twice expects. */
	if (stop_waiting) {
		signal(sig, SIG_DFL);
		raise(sig);
	}
	stop_why = sig;
	stopping = 1;
}

/*
 * Wait for session processes that have ended (block: all of them), by
 * their pids: waitpid(-1) would also take the exit status of children an
 * embedding program started itself (popen, system), and wait for them.
 */
static void
reap(int block)
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
		else if (WIFSIGNALED(status) && stopping)
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
	server_session_run(ctx, fd, id, slot, peer, 0);
}

void
server_session_run(struct mr_server_ctx *ctx, int fd, uint32_t id, int slot,
    const char *peer, int open_be)
{
	static struct be_info info;
	struct sigaction sa;
	sigset_t none;
	int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS, SIGALRM };
	char err[PROTO_ERRLEN];
	size_t i;

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
	if (!ctx->be->no_fork) {
		sa.sa_handler = sess_crash_signal;
		sigemptyset(&sa.sa_mask);
		sa.sa_flags = SA_NODEFER | SA_RESETHAND;
		for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
			sigaction(sigs[i], &sa, NULL);
		sess_crash_handlers = 1;
	}
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
 * --exit-with-stdin: stdin is a pipe whose other end the program that
 * started the runner holds, however that program ends (SIGKILL too) the
 * pipe closes. Unlike Linux's PR_SET_PDEATHSIG, which fires when the
 * thread that started the runner ends, this works on macOS too. Whatever
 * arrives is read and dropped; the end of the file, or an error, is the
 * answer.
 */
static int
stdin_ended(void)
{
	char buf[512];
	ssize_t n;

	while ((n = read(STDIN_FILENO, buf, sizeof(buf))) == -1 &&
	    errno == EINTR)
		;
	return n == 0 || (n == -1 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* The backend's device is gone for good (backend.h, lost), or NULL. */
static const char *
device_lost(const struct mr_server_ctx *ctx)
{
	static char why[160];

	if (nodevice >= NODEVICE_STOP) {
		snprintf(why, sizeof(why), "%d sessions in a row could not "
		    "open the %s device (their lines above say why): it is "
		    "taken to be gone", nodevice, ctx->be->name);
		return why;
	}
	return ctx->be->lost != NULL ? ctx->be->lost() : NULL;
}

/*
 * End every session. After a device loss (lost) a session thread is woken
 * by shutting only the receiving side of its socket, so that it can still
 * tell its client why (session.c, end_lost); one that has not ended a
 * second later has both sides shut, as for any stop.
 */
static void
stop_sessions(int processes, int lost)
{
	uint32_t i;
	time_t deadline = time(NULL) + 5;
	int64_t lost_deadline;

	if (processes) {
		for (i = 0; i < slot_count(); i++)
			if (slot_get(i)->busy && slot_get(i)->pid > 0)
				kill(slot_get(i)->pid, SIGTERM);
		while (nactive > 0 && time(NULL) < deadline) {
			reap(0);
			usleep(10000);
		}
		for (i = 0; i < slot_count(); i++)
			if (slot_get(i)->busy && slot_get(i)->pid > 0)
				kill(slot_get(i)->pid, SIGKILL);
		while (nactive > 0)
			reap(1);
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
	stop_waiting = 1;
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
	stop_waiting = 0;
	pthread_mutex_unlock(&slots_lock);
}

static int
serve(const struct mr_config *cfg)
{
	struct mr_server_ctx ctx;
	struct be_info info;
	struct sigaction sa;
	enum be_isolation iso;
	const char *lost;
	char err[PROTO_ERRLEN], peer[64];
	uint32_t next_id = 1, max_startups;
	int lfd = -1, port = 0, rc = -1;

	log_verbose = cfg->verbose;
	nodevice = 0;
	memset(&ctx, 0, sizeof(ctx));
	ctx.cfg = cfg;
	if ((ctx.be = mr_find_backend(cfg->backend)) == NULL) {
		log_warn("no backend named %s in this build", cfg->backend);
		return -1;
	}
	if (cfg->token != NULL && (cfg->tokenlen == 0 ||
	    cfg->tokenlen > MR_TOKEN_MAX)) {
		log_warn("the token is %zu bytes; it must be 1 to %d",
		    cfg->tokenlen, MR_TOKEN_MAX);
		return -1;
	}
	iso = mr_isolation(cfg, ctx.be);
	if (iso == BE_ISOLATE_SPAWN && cfg->argv == NULL) {
		log_warn("%s: spawned session processes need the runner's "
		    "command line (mr_config argv); use --isolation thread",
		    ctx.be->name);
		return -1;
	}
	/* --user and confinement are checked here, so that an embedding
	 * program gets them as the command line does. */
	if (confine_init(cfg) == -1)
		return -1;
	/* Confined session processes make peer connections through the
	 * broker (peer_net.c); without it they copy through the client.
	 * Forked before the device is opened: Metal's must not be open in a
	 * process that forks. */
	if (iso != BE_ISOLATE_THREAD && peer_broker_start(cfg, err) == -1)
		log_warn("%s; copies between runners go through clients", err);
	if (ctx.be->open(&info, cfg->device, NULL, err) == -1) {
		log_warn("cannot open the %s backend: %s", ctx.be->name, err);
		peer_broker_stop();
		return -1;
	}
	ctx.info = &info;
	/* A cache that cannot work is no reason not to serve: said once
	 * here, and CAP_CACHE is not offered. */
	if (cfg->cache_dir != NULL && !cache_enabled() &&
	    cache_open(cfg->cache_dir, cfg->cache_size, iso !=
	    BE_ISOLATE_THREAD ? 1 : cfg->max_sessions, err) == -1)
		log_warn("cache: %s; running without the cache", err);
	/* By default a burst of as many clients as there may be sessions can
	 * all be in their handshake, and a few more. */
	max_startups = cfg->max_startups ? cfg->max_startups :
	    cfg->max_sessions > 10 ? cfg->max_sessions : 10;

	if (slot_init(cfg->max_sessions, max_startups, cfg->total_mem ?
	    cfg->total_mem : info.memory) == -1) {
		log_warn("cannot map session table: %s", strerror(errno));
		goto out;
	}

	if (peer_routes_init(slot_count()) == -1) {
		log_warn("cannot allocate the session inboxes");
		goto out;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);	/* no SA_RESTART: poll returns EINTR */
	sigaction(SIGTERM, &sa, NULL);
	if (cfg->on_hup != NULL) {
		/* Acted on here, in the accept loop, not in the handler: no
		 * thread of its own, which a forked session would inherit the
		 * memory of (qemu-user cannot even run such a fork's threads). */
		sa.sa_handler = on_hup_signal;
		sigaction(SIGHUP, &sa, NULL);
	}
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);

	if ((lfd = net_listen(cfg->host, cfg->port, &port, err)) == -1) {
		log_error("%s", err);
		goto out;
	}
	/* A Metal runner's cpu is its macOS version (protocol.md). */
	fprintf(stderr, "metal_runner %s: backend %s (%s, %s %s%s), %s "
	    "isolation, listening on %s:%d\n", MR_VERSION, ctx.be->name,
	    info.name, info.arch, info.backend == PROTO_BACKEND_METAL ?
	    "macOS " : "", info.cpu, iso == BE_ISOLATE_THREAD ? "thread" :
	    iso == BE_ISOLATE_SPAWN ? "process (spawned)" : "process",
	    cfg->host, port);
	if (cfg->on_listen != NULL)
		cfg->on_listen(cfg->host, port, cfg->on_listen_arg);

	/* The listening socket, a control socket per slot, and stdin. */
	if ((pfds = calloc(slot_count() + 2, sizeof(*pfds))) == NULL ||
	    (pslots = calloc(slot_count() + 1, sizeof(*pslots))) == NULL) {
		log_warn("out of memory");
		goto out;
	}
	/* A device lost for good (a session saw it) stops the runner as a
	 * stop request does, but as a failure: see below. */
	while (!stopping && device_lost(&ctx) == NULL) {
		int fd, slot, n, i, nctl, nfds, full;

		if (iso != BE_ISOLATE_THREAD)
			reap(0);
		if (hup && cfg->on_hup != NULL) {
			hup = 0;
			cfg->on_hup(cfg->on_hup_arg);
		}
		mr_log_handshake_flush();
		/* The listening socket, and the control sockets a session
		 * passes a resuming connection up (resume.c). */
		pthread_mutex_lock(&slots_lock);
		resume_sweep();
		pfds[0].fd = lfd;
		pfds[0].events = POLLIN;
		pfds[0].revents = 0;
		nctl = resume_pollfds(pfds + 1, pslots, (int)slot_count());
		pthread_mutex_unlock(&slots_lock);
		nfds = nctl + 1;
		if (cfg->watch_stdin) {
			pfds[nfds].fd = STDIN_FILENO;
			pfds[nfds].events = POLLIN;
			pfds[nfds++].revents = 0;
		}
		n = poll(pfds, (nfds_t)nfds, 500);
		if (n <= 0)
			continue;
		pthread_mutex_lock(&slots_lock);
		for (i = 0; i < nctl; i++)
			if (pfds[i + 1].revents & POLLIN)
				resume_route(pslots[i]);
		pthread_mutex_unlock(&slots_lock);
		if (cfg->watch_stdin && pfds[nctl + 1].revents != 0 &&
		    stdin_ended()) {
			stop_why = STOP_STDIN;
			stopping = 1;
			continue;
		}
		if (!(pfds[0].revents & POLLIN))
			continue;
		if ((fd = net_accept(lfd, peer, sizeof(peer))) == -1)
			continue;
		if (net_tune(fd, cfg->frame_timeout) == -1) {
			close(fd);
			continue;
		}
		/* A full session table is told at once, before a handshake it
		 * could not use; too many handshakes are refused without
		 * touching the sessions' places. */
		pthread_mutex_lock(&slots_lock);
		if ((full = slot_sessions() >= cfg->max_sessions) ||
		    slot_starting() >= max_startups)
			slot = -1;
		else if ((slot = slot_take()) != -1) {
			/* With thread isolation the slot's last session may
			 * have ended since the sweep, leaving a resume it
			 * passed up in its control socket. */
			resume_reclaim(slot);
			slot_get(slot)->id = next_id;
			nactive++;
		}
		pthread_mutex_unlock(&slots_lock);
		if (slot == -1 && full) {
			mr_log_handshake("refusing %s: %u sessions is the limit",
			    peer, cfg->max_sessions);
			net_refuse(fd, 0, PROTO_ELIMIT, "the runner is serving "
			    "as many sessions as it allows; try again later");
			continue;
		}
		if (slot == -1) {
			mr_log_handshake("refusing %s: %u connections in their "
			    "handshake is the limit", peer, max_startups);
			net_refuse(fd, 0, PROTO_ELIMIT, "too many connections "
			    "are in their handshake; try again later");
			continue;
		}
		log_info("session %u: accepted a connection from %s", next_id,
		    peer);
		if (resume_open(cfg, slot) == -1)
			log_warn("session %u: no control socket (%s): it cannot "
			    "be resumed", next_id, strerror(errno));
		peer_route_open(slot, next_id);
		if (iso != BE_ISOLATE_THREAD) {
			pid_t pid;
			if (iso == BE_ISOLATE_SPAWN) {
				pid = spawn_session(cfg, &info, fd, next_id,
				    slot, peer, err);
			} else if ((pid = fork()) == 0)
				session_process(&ctx, lfd, fd, next_id, slot,
				    peer);
			else if (pid == -1)
				snprintf(err, sizeof(err), "fork: %s",
				    strerror(errno));
			if (pid == -1) {
				log_warn("session %u: %s", next_id, err);
				net_refuse(fd, 0, PROTO_ENOMEM, "cannot start a "
				    "session");
				resume_forked(slot);
				peer_route_close(slot);
				slot_free(slot);
				nactive--;
			} else {
				slot_get(slot)->pid = pid;
				resume_forked(slot);
				close(fd);
				peer_route_forked(slot, 0);
			}
		} else {
			struct thread_arg *ta = calloc(1, sizeof(*ta));
			pthread_t t;
			if (ta != NULL) {
				ta->ctx = &ctx;
				ta->fd = fd;
				ta->id = next_id;
				ta->slot = slot;
				snprintf(ta->peer, sizeof(ta->peer), "%s", peer);
				slot_get(slot)->fd = fd;
			}
			if (ta == NULL || pthread_create(&t, NULL,
			    session_thread, ta) != 0) {
				log_warn("cannot start a session thread");
				net_refuse(fd, 0, PROTO_ENOMEM, "cannot start a "
				    "session");
				pthread_mutex_lock(&slots_lock);
				resume_forked(slot);
				peer_route_close(slot);
				slot_free(slot);
				nactive--;
				pthread_mutex_unlock(&slots_lock);
				free(ta);
			} else
				pthread_detach(t);
		}
		next_id++;
	}
	if ((lost = device_lost(&ctx)) != NULL)
		log_warn("stopping, %d sessions open: %s", nactive, lost);
	else if (stop_why == STOP_STDIN)
		log_notice("stopping: stdin closed, so the program that started "
		    "the runner is gone (--exit-with-stdin); %d sessions open",
		    nactive);
	else if (stop_why != 0)
		log_notice("stopping on %s: %d sessions open", stop_why ==
		    SIGINT ? "SIGINT" : "SIGTERM", nactive);
	else
		log_notice("stopping: %d sessions open", nactive);
	close(lfd);
	lfd = -1;
	stop_sessions(iso != BE_ISOLATE_THREAD, lost != NULL);	/* none left */
	resume_close();
	/* Exit non-zero after a loss, so that launchd (KeepAlive:
	 * SuccessfulExit false) or systemd (Restart=on-failure) restarts the
	 * process, and with it the device. */
	rc = lost != NULL ? -1 : 0;
out:
	peer_broker_stop();
	peer_routes_free();
	if (lfd != -1)
		close(lfd);
	free(pfds);
	free(pslots);
	pfds = NULL;
	pslots = NULL;
	ctx.be->close();
	slot_unmap();
	return rc;
}

int
mr_serve(const struct mr_config *cfg)
{
	int rc = serve(cfg);

	/* A stop ends the serve it finds, or the next one if it comes first
	 * (a program may stop its runner before its thread got this far);
	 * after that a program may serve again. */
	stopping = 0;
	stop_why = 0;
	return rc;
}
