/*
 * server.c: mr_serve(): the runner's start, its accept loop and its stop.
 *
 * Each accepted connection gets a slot and its session is started in the
 * isolation its backend asks for (isolate.c, which also ends sessions);
 * the session table, its memory limits and the authentication penalty
 * are slots.c's; the loop also passes resuming connections to their
 * sessions (resume.c).
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
#include <sys/types.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "config.h"
#include "confine.h"
#include "isolate.h"
#include "metal_runner.h"
#include "proto.h"
#include "resume.h"
#include "session.h"
#include "slots.h"

/* A serve's state, from its start to its stop. */
struct server {
	struct mr_server_ctx ctx;
	struct be_info info;
	enum be_isolation iso;
	int lfd;
	uint32_t next_id, max_startups;
};

/* Set by SIGHUP when the program asked for it (cfg->on_hup). */
static atomic_int hup;
/* The accept loop's poll set: file-scope, so a forked session process
 * still reaches it (valgrind counts it in use, not lost). */
static struct pollfd *pfds;
static int *pslots;

static void
on_hup_signal(int sig)
{
	(void)sig;
	hup = 1;
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
	int n;

	if ((n = isolate_nodevice()) > 0) {
		snprintf(why, sizeof(why), "%d sessions in a row could not "
		    "open the %s device (their lines above say why): it is "
		    "taken to be gone", n, ctx->be->name);
		return why;
	}
	return ctx->be->lost != NULL ? ctx->be->lost() : NULL;
}

/* Check the configuration and open the device: 0, or -1 with nothing left
 * to undo. */
static int
serve_open(struct server *sv, const struct mr_config *cfg)
{
	char err[PROTO_ERRLEN];

	log_verbose = cfg->verbose;
	isolate_init();
	memset(sv, 0, sizeof(*sv));
	sv->ctx.cfg = cfg;
	sv->lfd = -1;
	sv->next_id = 1;
	if ((sv->ctx.be = mr_find_backend(cfg->backend)) == NULL) {
		log_warn("no backend named %s in this build", cfg->backend);
		return -1;
	}
	if (cfg->token != NULL && (cfg->tokenlen == 0 ||
	    cfg->tokenlen > MR_TOKEN_MAX)) {
		log_warn("the token is %zu bytes; it must be 1 to %d",
		    cfg->tokenlen, MR_TOKEN_MAX);
		return -1;
	}
	sv->iso = mr_isolation(cfg, sv->ctx.be);
	if (sv->iso == BE_ISOLATE_SPAWN && cfg->argv == NULL) {
		log_warn("%s: spawned session processes need the runner's "
		    "command line (mr_config argv); use --isolation thread",
		    sv->ctx.be->name);
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
	if (sv->iso != BE_ISOLATE_THREAD && peer_broker_start(cfg, err) == -1)
		log_warn("%s; copies between runners go through clients", err);
	if (sv->ctx.be->open(&sv->info, cfg->device, NULL, err) == -1) {
		log_warn("cannot open the %s backend: %s", sv->ctx.be->name,
		    err);
		peer_broker_stop();
		return -1;
	}
	sv->ctx.info = &sv->info;
	return 0;
}

/* The session table, the signals, the listening socket: 0, or -1 (then
 * serve_close() undoes what was done). */
static int
serve_listen(struct server *sv)
{
	const struct mr_config *cfg = sv->ctx.cfg;
	const struct be_info *info = &sv->info;
	struct sigaction sa;
	char err[PROTO_ERRLEN];
	int port = 0;

	/* A cache that cannot work is no reason not to serve: said once
	 * here, and CAP_CACHE is not offered. */
	if (cfg->cache_dir != NULL && !cache_enabled() &&
	    cache_open(cfg->cache_dir, cfg->cache_size, sv->iso !=
	    BE_ISOLATE_THREAD ? 1 : cfg->max_sessions, err) == -1)
		log_warn("cache: %s; running without the cache", err);
	/* By default a burst of as many clients as there may be sessions can
	 * all be in their handshake, and a few more. */
	sv->max_startups = cfg->max_startups ? cfg->max_startups :
	    cfg->max_sessions > 10 ? cfg->max_sessions : 10;

	if (slot_init(cfg->max_sessions, sv->max_startups, cfg->total_mem ?
	    cfg->total_mem : info->memory) == -1) {
		log_warn("cannot map session table: %s", strerror(errno));
		return -1;
	}

	if (peer_routes_init(slot_count()) == -1) {
		log_warn("cannot allocate the session inboxes");
		return -1;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = mr_stop_signal;
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

	if ((sv->lfd = net_listen(cfg->host, cfg->port, &port, err)) == -1) {
		log_error("%s", err);
		return -1;
	}
	/* A Metal runner's cpu is its macOS version (protocol.md). */
	fprintf(stderr, "metal_runner %s: backend %s (%s, %s %s%s), %s "
	    "isolation, listening on %s:%d\n", MR_VERSION, sv->ctx.be->name,
	    info->name, info->arch, info->backend == PROTO_BACKEND_METAL ?
	    "macOS " : "", info->cpu, sv->iso == BE_ISOLATE_THREAD ? "thread" :
	    sv->iso == BE_ISOLATE_SPAWN ? "process (spawned)" : "process",
	    cfg->host, port);
	if (cfg->on_listen != NULL)
		cfg->on_listen(cfg->host, port, cfg->on_listen_arg);

	/* The listening socket, a control socket per slot, and stdin. */
	if ((pfds = calloc(slot_count() + 2, sizeof(*pfds))) == NULL ||
	    (pslots = calloc(slot_count() + 1, sizeof(*pslots))) == NULL) {
		log_warn("out of memory");
		return -1;
	}
	return 0;
}

/* A connection is waiting on the listening socket: take it, and start its
 * session or refuse it. */
static void
serve_accept(struct server *sv)
{
	const struct mr_config *cfg = sv->ctx.cfg;
	char peer[64];
	int fd, slot, full;

	if ((fd = net_accept(sv->lfd, peer, sizeof(peer))) == -1)
		return;
	if (net_tune(fd, cfg->frame_timeout) == -1) {
		close(fd);
		return;
	}
	/* A full session table is told at once, before a handshake it could
	 * not use; too many handshakes are refused without touching the
	 * sessions' places. */
	slot = isolate_admit(cfg, sv->max_startups, sv->next_id, &full);
	if (slot == -1 && full) {
		mr_log_handshake("refusing %s: %u sessions is the limit", peer,
		    cfg->max_sessions);
		net_refuse(fd, 0, PROTO_ELIMIT, "the runner is serving as many "
		    "sessions as it allows; try again later");
		return;
	}
	if (slot == -1) {
		mr_log_handshake("refusing %s: %u connections in their "
		    "handshake is the limit", peer, sv->max_startups);
		net_refuse(fd, 0, PROTO_ELIMIT, "too many connections are in "
		    "their handshake; try again later");
		return;
	}
	log_info("session %u: accepted a connection from %s", sv->next_id,
	    peer);
	isolate_start(&sv->ctx, sv->iso, sv->lfd, fd, sv->next_id, slot, peer);
	sv->next_id++;
}

/* Until a stop or a lost device: accept connections and pass resuming
 * ones to their sessions. */
static void
serve_loop(struct server *sv)
{
	const struct mr_config *cfg = sv->ctx.cfg;
	int n, i, nctl, nfds;

	/* A device lost for good (a session saw it) stops the runner as a
	 * stop request does, but as a failure: see serve(). */
	while (!mr_stopping() && device_lost(&sv->ctx) == NULL) {
		if (sv->iso != BE_ISOLATE_THREAD)
			isolate_reap(0);
		if (hup && cfg->on_hup != NULL) {
			hup = 0;
			cfg->on_hup(cfg->on_hup_arg);
		}
		mr_log_handshake_flush();
		/* The listening socket, and the control sockets a session
		 * passes a resuming connection up (resume.c). */
		isolate_lock();
		resume_sweep();
		pfds[0].fd = sv->lfd;
		pfds[0].events = POLLIN;
		pfds[0].revents = 0;
		nctl = resume_pollfds(pfds + 1, pslots, (int)slot_count());
		isolate_unlock();
		nfds = nctl + 1;
		if (cfg->watch_stdin) {
			pfds[nfds].fd = STDIN_FILENO;
			pfds[nfds].events = POLLIN;
			pfds[nfds++].revents = 0;
		}
		n = poll(pfds, (nfds_t)nfds, 500);
		if (n <= 0)
			continue;
		isolate_lock();
		for (i = 0; i < nctl; i++)
			if (pfds[i + 1].revents & POLLIN)
				resume_route(pslots[i]);
		isolate_unlock();
		if (cfg->watch_stdin && pfds[nctl + 1].revents != 0 &&
		    stdin_ended()) {
			mr_stop_for(STOP_STDIN);
			continue;
		}
		if (pfds[0].revents & POLLIN)
			serve_accept(sv);
	}
}

static void
serve_close(struct server *sv)
{
	peer_broker_stop();
	peer_routes_free();
	if (sv->lfd != -1)
		close(sv->lfd);
	free(pfds);
	free(pslots);
	pfds = NULL;
	pslots = NULL;
	sv->ctx.be->close();
	slot_unmap();
}

static int
serve(const struct mr_config *cfg)
{
	struct server sv;
	const char *lost;
	int nactive, rc = -1;

	if (serve_open(&sv, cfg) == -1)
		return -1;
	if (serve_listen(&sv) == -1)
		goto out;
	serve_loop(&sv);
	nactive = isolate_active();
	if ((lost = device_lost(&sv.ctx)) != NULL)
		log_warn("stopping, %d sessions open: %s", nactive, lost);
	else if (mr_stop_why() == STOP_STDIN)
		log_notice("stopping: stdin closed, so the program that started "
		    "the runner is gone (--exit-with-stdin); %d sessions open",
		    nactive);
	else if (mr_stop_why() != 0)
		log_notice("stopping on %s: %d sessions open", mr_stop_why() ==
		    SIGINT ? "SIGINT" : "SIGTERM", nactive);
	else
		log_notice("stopping: %d sessions open", nactive);
	close(sv.lfd);
	sv.lfd = -1;
	/* none left */
	isolate_stop(sv.iso != BE_ISOLATE_THREAD, lost != NULL);
	resume_close();
	/* Exit non-zero after a loss, so that launchd (KeepAlive:
	 * SuccessfulExit false) or systemd (Restart=on-failure) restarts the
	 * process, and with it the device. */
	rc = lost != NULL ? -1 : 0;
out:
	serve_close(&sv);
	return rc;
}

int
mr_serve(const struct mr_config *cfg)
{
	int rc = serve(cfg);

	/* A stop ends the serve it finds, or the next one if it comes first
	 * (a program may stop its runner before its thread got this far);
	 * after that a program may serve again. */
	mr_stop_reset();
	return rc;
}
