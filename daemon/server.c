/*
 * server.c: the accept loop and session isolation.
 *
 * Process isolation (the CPU backend's default): each session runs in a
 * forked process. A kernel is arbitrary machine code from the client; when
 * it crashes or runs away, only its own process dies, and everything the
 * session held is returned by the kernel when that process exits. The cost
 * is one fork per connection, paid once, not per request.
 *
 * Thread isolation (the Metal backend's default, as Metal is not fork-safe):
 * each session is a thread sharing the device and the compiled-pipeline
 * cache. A crashing CPU kernel would take down the daemon in this mode,
 * which is why the CPU backend does not use it unless asked.
 *
 * Memory limits are counted in a shared anonymous mapping, one counter per
 * session slot plus a total, so they hold across session processes and a
 * dead process's share is returned by the parent.
 */
#include <sys/mman.h>
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

#include "metal_runner.h"
#include "proto.h"

struct slot {
	_Atomic uint64_t mem;	/* bytes reserved by the session */
	pid_t pid;		/* process isolation: the session's process */
	int fd;			/* thread isolation: the session's socket */
	uint32_t id;
	int busy;
};

struct shared {
	_Atomic uint64_t total;
	_Atomic int64_t auth_next;	/* ms: when the next failed auth may answer */
	uint64_t limit;
	uint32_t nslots;
	struct slot slots[];
};

struct thread_arg {
	const struct mr_server_ctx *ctx;
	int fd;
	uint32_t id;
	int slot;
	char peer[64];
};

static volatile sig_atomic_t stopping;
static struct shared *shared;
static size_t shared_len;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slots_idle = PTHREAD_COND_INITIALIZER;
static int nactive;

static const struct backend *backends[] = {
#ifdef __APPLE__
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

static void
on_stop_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

/* Map the session table: nslots slots and a limit of limit bytes for all
 * sessions together. mr_serve() calls it; a harness that drives
 * sess_serve() directly (tests/fuzz) calls it once itself. */
int
mr_mem_init(uint32_t nslots, uint64_t limit)
{
	size_t len = sizeof(*shared) + nslots * sizeof(struct slot);
	struct shared *sh;
	uint32_t i;

	sh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANON,
	    -1, 0);
	if (sh == MAP_FAILED)
		return -1;
	sh->limit = limit;
	sh->nslots = nslots;
	for (i = 0; i < nslots; i++)
		sh->slots[i].fd = -1;
	shared = sh;
	shared_len = len;
	return 0;
}

int
mr_mem_reserve(int slot, uint64_t n, uint64_t session_limit, char *err)
{
	struct slot *sl = &shared->slots[slot];
	uint64_t cur = atomic_load(&shared->total);

	if (session_limit != 0 && (n > session_limit ||
	    atomic_load(&sl->mem) > session_limit - n)) {
		snprintf(err, PROTO_ERRLEN, "allocating %llu bytes would pass "
		    "this session's limit of %llu bytes (%llu in use)",
		    (unsigned long long)n, (unsigned long long)session_limit,
		    (unsigned long long)atomic_load(&sl->mem));
		return -1;
	}
	do {
		if (n > shared->limit || cur > shared->limit - n) {
			snprintf(err, PROTO_ERRLEN, "allocating %llu bytes would "
			    "pass the runner's limit of %llu bytes (%llu in use "
			    "by all sessions)", (unsigned long long)n,
			    (unsigned long long)shared->limit,
			    (unsigned long long)cur);
			return -1;
		}
	} while (!atomic_compare_exchange_weak(&shared->total, &cur, cur + n));
	atomic_fetch_add(&sl->mem, n);
	return 0;
}

void
mr_mem_release(int slot, uint64_t n)
{
	atomic_fetch_sub(&shared->slots[slot].mem, n);
	atomic_fetch_sub(&shared->total, n);
}

/* A failed authentication waits its turn: failures from all sessions are
 * answered at most one per second between them, so parallel connections do
 * not multiply the rate at which tokens can be guessed. */
void
mr_auth_penalty(void)
{
	struct timespec ts;
	int64_t now, cur, start, wait;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	cur = atomic_load(&shared->auth_next);
	do	/* take the next free second: start..start+1000 */
		start = cur < now ? now : cur;
	while (!atomic_compare_exchange_weak(&shared->auth_next, &cur,
	    start + 1000));
	wait = start + 1000 - now;
	usleep((useconds_t)(wait % 1000) * 1000);
	sleep((unsigned)(wait / 1000));
}

/* Return a finished session's slot and whatever memory it still held. */
static void
slot_free(int i)
{
	struct slot *sl = &shared->slots[i];
	uint64_t left = atomic_exchange(&sl->mem, 0);

	atomic_fetch_sub(&shared->total, left);
	sl->busy = 0;
	sl->pid = 0;
	sl->fd = -1;
}

static int
slot_take(void)
{
	uint32_t i;

	for (i = 0; i < shared->nslots; i++)
		if (!shared->slots[i].busy) {
			shared->slots[i].busy = 1;
			return (int)i;
		}
	return -1;
}

static void
reap(int block)
{
	pid_t pid;
	int status;
	uint32_t i;

	while ((pid = waitpid(-1, &status, block ? 0 : WNOHANG)) > 0) {
		for (i = 0; i < shared->nslots; i++) {
			struct slot *sl = &shared->slots[i];
			if (!sl->busy || sl->pid != pid)
				continue;
			if (WIFSIGNALED(status) && stopping)
				log_info("session %u stopped", sl->id);
			else if (WIFSIGNALED(status))
				log_warn("session %u ended by signal %d", sl->id,
				    WTERMSIG(status));
			else if (WEXITSTATUS(status) == 3)
				log_warn("session %u ended: a kernel crashed",
				    sl->id);
			else if (WEXITSTATUS(status) == 4)
				log_warn("session %u ended: a kernel ran past "
				    "the time limit", sl->id);
			slot_free((int)i);
			nactive--;
		}
	}
}

static void
refuse(int fd, uint32_t code, const char *text)
{
	uint8_t frame[256];
	size_t n = proto_put_rerror(frame, sizeof(frame), 0, code, text);

	net_send_all(fd, frame, n);
	close(fd);
}

static void *
session_thread(void *arg)
{
	struct thread_arg *ta = arg;

	sess_serve(ta->ctx, ta->fd, ta->id, ta->slot, ta->peer);
	pthread_mutex_lock(&slots_lock);
	slot_free(ta->slot);
	nactive--;
	pthread_cond_signal(&slots_idle);
	pthread_mutex_unlock(&slots_lock);
	free(ta);
	return NULL;
}

static void
session_process(const struct mr_server_ctx *ctx, int lfd, int fd, uint32_t id,
    int slot, const char *peer)
{
	struct sigaction sa;
	int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGALRM };
	size_t i;

	close(lfd);
#ifdef __linux__
	/* A session must not outlive its runner (a SIGKILLed daemon would
	 * leave orphans serving and holding memory). The parent may already
	 * be gone by the time this runs: check after arming. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() == 1)
		_exit(1);
#endif
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sa.sa_handler = sess_crash_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_NODEFER | SA_RESETHAND;
	for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, NULL);
	sess_crash_handlers = 1;
	sess_serve(ctx, fd, id, slot, peer);
	_exit(0);
}

static void
stop_sessions(enum be_isolation iso)
{
	uint32_t i;
	time_t deadline = time(NULL) + 5;

	if (iso == BE_ISOLATE_PROCESS) {
		for (i = 0; i < shared->nslots; i++)
			if (shared->slots[i].busy && shared->slots[i].pid > 0)
				kill(shared->slots[i].pid, SIGTERM);
		while (nactive > 0 && time(NULL) < deadline) {
			reap(0);
			usleep(10000);
		}
		for (i = 0; i < shared->nslots; i++)
			if (shared->slots[i].busy && shared->slots[i].pid > 0)
				kill(shared->slots[i].pid, SIGKILL);
		while (nactive > 0)
			reap(1);
		return;
	}
	/* Threads: wake each session out of recv; it cleans up and exits. */
	pthread_mutex_lock(&slots_lock);
	for (i = 0; i < shared->nslots; i++)
		if (shared->slots[i].busy && shared->slots[i].fd != -1)
			shutdown(shared->slots[i].fd, SHUT_RDWR);
	while (nactive > 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&slots_idle, &slots_lock, &ts);
		if (time(NULL) >= deadline) {
			log_warn("%d sessions still busy at shutdown", nactive);
			break;
		}
	}
	pthread_mutex_unlock(&slots_lock);
}

int
mr_serve(const struct mr_config *cfg)
{
	struct mr_server_ctx ctx;
	struct be_info info;
	struct sigaction sa;
	enum be_isolation iso;
	char err[PROTO_ERRLEN], peer[64];
	uint32_t next_id = 1;
	int lfd = -1, port = 0, rc = -1;

	log_verbose = cfg->verbose;
	memset(&ctx, 0, sizeof(ctx));
	ctx.cfg = cfg;
	if ((ctx.be = mr_find_backend(cfg->backend)) == NULL) {
		log_warn("no backend named %s in this build", cfg->backend);
		return -1;
	}
	iso = cfg->isolation ? cfg->isolation : ctx.be->isolation;
	if (ctx.be->open(&info, cfg->device, err) == -1) {
		log_warn("cannot open the %s backend: %s", ctx.be->name, err);
		return -1;
	}
	ctx.info = &info;

	if (mr_mem_init(cfg->max_sessions, cfg->total_mem ? cfg->total_mem :
	    info.memory) == -1) {
		log_warn("cannot map session table: %s", strerror(errno));
		goto out;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);	/* no SA_RESTART: poll returns EINTR */
	sigaction(SIGTERM, &sa, NULL);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);

	if ((lfd = net_listen(cfg->host, cfg->port, &port, err)) == -1) {
		log_warn("%s", err);
		goto out;
	}
	fprintf(stderr, "metal_runner %s: backend %s (%s, %s %s), %s "
	    "isolation, listening on %s:%d\n", MR_VERSION, ctx.be->name,
	    info.name, info.arch, info.cpu, iso == BE_ISOLATE_PROCESS ?
	    "process" : "thread", cfg->host, port);
	if (cfg->on_listen != NULL)
		cfg->on_listen(cfg->host, port, cfg->on_listen_arg);

	while (!stopping) {
		struct pollfd pfd = { lfd, POLLIN, 0 };
		int fd, slot, n;

		if (iso == BE_ISOLATE_PROCESS)
			reap(0);
		n = poll(&pfd, 1, 500);
		if (n <= 0)
			continue;
		if ((fd = net_accept(lfd, peer, sizeof(peer))) == -1)
			continue;
		if (net_tune(fd, cfg->frame_timeout) == -1) {
			close(fd);
			continue;
		}
		pthread_mutex_lock(&slots_lock);
		slot = slot_take();
		if (slot != -1) {
			shared->slots[slot].id = next_id;
			nactive++;
		}
		pthread_mutex_unlock(&slots_lock);
		if (slot == -1) {
			log_warn("refusing %s: %u sessions is the limit", peer,
			    cfg->max_sessions);
			refuse(fd, PROTO_ELIMIT, "the runner is serving as many "
			    "sessions as it allows; try again later");
			continue;
		}
		log_info("session %u: connected from %s", next_id, peer);
		if (iso == BE_ISOLATE_PROCESS) {
			pid_t pid = fork();
			if (pid == 0)
				session_process(&ctx, lfd, fd, next_id, slot,
				    peer);
			if (pid == -1) {
				log_warn("fork: %s", strerror(errno));
				refuse(fd, PROTO_ENOMEM, "cannot start a session");
				slot_free(slot);
				nactive--;
			} else {
				shared->slots[slot].pid = pid;
				close(fd);
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
				shared->slots[slot].fd = fd;
			}
			if (ta == NULL || pthread_create(&t, NULL,
			    session_thread, ta) != 0) {
				log_warn("cannot start a session thread");
				refuse(fd, PROTO_ENOMEM, "cannot start a session");
				pthread_mutex_lock(&slots_lock);
				slot_free(slot);
				nactive--;
				pthread_mutex_unlock(&slots_lock);
				free(ta);
			} else
				pthread_detach(t);
		}
		next_id++;
	}
	log_info("stopping: %d sessions open", nactive);
	close(lfd);
	lfd = -1;
	stop_sessions(iso);
	rc = 0;
out:
	if (lfd != -1)
		close(lfd);
	ctx.be->close();
	if (shared != NULL && nactive == 0) {
		munmap(shared, shared_len);
		shared = NULL;
	}
	return rc;
}
