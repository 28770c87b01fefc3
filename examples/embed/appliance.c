/*
 * appliance.c: metal_runner embedded in a program of its own, as an
 * appliance would run it: its own token and limits, the runner on a thread
 * of its own, a clean stop on SIGTERM or SIGINT, and on SIGHUP the token
 * file read again (a rotated secret) while open sessions carry on.
 *
 *   appliance [-H host] [-p port] [-n] token-file
 *
 * The token file holds the shared secret clients must prove they know
 * (protocol.md, Tauth): arbitrary bytes, a trailing newline is ignored.
 * Provision each box with its own, readable by its owner only, e.g.
 * (umask 077; head -c 32 /dev/urandom > token), and give clients the same
 * file (METAL_RUNNER_TOKEN_FILE, which they refuse when others can read
 * it). There is no built-in token: every box that shared one would share
 * the secret.
 * -n turns off the system call filter of session processes, as
 * metal_runner --no-confine does: only for valgrind and qemu-user, which
 * cannot run under it.
 *
 * Signals. mr_serve() installs handlers of its own for SIGINT and SIGTERM
 * (they stop it) and ignores SIGPIPE, for the whole process. A program that
 * wants to act on a signal itself must not race those handlers: a signal
 * sent to the process goes to any one thread that does not block it, so if
 * only main blocked it, the runner's thread could take it, stop, and leave
 * main waiting for a signal that never comes. So main blocks the signals
 * before it starts any thread (a thread inherits its creator's mask, and so
 * do the runner's session threads; session processes reset theirs),
 * receives them all with sigwait(), and calls mr_stop(), which only sets a
 * flag and may be called from any thread; the runner notices within half a
 * second. mr_serve()'s handlers then never run. Nothing is done in a signal
 * handler, so nothing here has to be async-signal-safe.
 *
 * If mr_serve() returns by itself (it cannot listen, say), the runner's
 * thread wakes main with SIGUSR1, so main never waits forever.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metal_runner.h"

#define MAX_TOKEN 4096

struct appliance {
	struct mr_config cfg;
	pthread_t main, thread;
	int rc;			/* mr_serve()'s, once the thread has returned */
};

/* The whole file is the secret; a trailing newline from an editor is not. */
static uint8_t *
read_token(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	size_t n;

	if (f == NULL) {
		fprintf(stderr, "appliance: %s: %s\n", path, strerror(errno));
		return NULL;
	}
	/* One byte more than allowed tells a long file from a full one. */
	if ((buf = malloc(MAX_TOKEN + 1)) == NULL) {
		fclose(f);
		return NULL;
	}
	n = fread(buf, 1, MAX_TOKEN + 1, f);
	fclose(f);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n == 0 || n > MAX_TOKEN) {
		fprintf(stderr, "appliance: %s: the token must be 1 to %d bytes\n",
		    path, MAX_TOKEN);
		free(buf);
		return NULL;
	}
	*len = n;
	return buf;
}

/* Called by mr_serve() on the runner's thread once it listens. */
static void
on_listen(const char *host, int port, void *arg)
{
	(void)arg;
	printf("listening on %s:%d\n", host, port);
	fflush(stdout);
}

static void *
serve(void *arg)
{
	struct appliance *a = arg;

	a->rc = mr_serve(&a->cfg);
	pthread_kill(a->main, SIGUSR1);
	return NULL;
}

static int
start(struct appliance *a)
{
	if (pthread_create(&a->thread, NULL, serve, a) != 0) {
		fprintf(stderr, "appliance: cannot start the runner's thread\n");
		a->rc = -1;
		return -1;
	}
	return 0;
}

/* Stop the runner and wait until it has: every session has ended, its
 * memory is returned and the port is closed. */
static void
stop(struct appliance *a)
{
	mr_stop();
	pthread_join(a->thread, NULL);
}

static void
usage(void)
{
	fprintf(stderr, "usage: appliance [-H host] [-p port] [-n] token-file\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	struct appliance a;
	sigset_t sigs;
	uint8_t *token, *fresh;
	char *end;
	size_t len;
	int c, sig;

	memset(&a, 0, sizeof(a));
	mr_config_defaults(&a.cfg);
	a.cfg.verbose = 1;		/* each session's details: the box's log */
	/* Limits for a small board; see struct mr_config for the others. */
	a.cfg.max_sessions = 4;
	a.cfg.session_mem = (uint64_t)256 << 20;
	a.cfg.total_mem = (uint64_t)512 << 20;
	a.cfg.max_handles = 4096;
	a.cfg.idle_timeout = 600;
	a.cfg.kernel_timeout = 60;
	a.cfg.on_listen = on_listen;
	a.cfg.on_listen_arg = &a;
	while ((c = getopt(argc, argv, "H:p:n")) != -1) {
		switch (c) {
		case 'H':
			a.cfg.host = optarg;
			break;
		case 'p':
			a.cfg.port = (int)strtol(optarg, &end, 10);
			if (*optarg == '\0' || *end != '\0' || a.cfg.port < 0 ||
			    a.cfg.port > 65535)
				usage();
			break;
		case 'n':
			a.cfg.no_confine = 1;
			break;
		default:
			usage();
		}
	}
	if (optind != argc - 1)
		usage();
	if ((token = read_token(argv[optind], &a.cfg.tokenlen)) == NULL)
		return 1;
	a.cfg.token = token;

	/* Before any thread exists: see the comment at the top. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	a.main = pthread_self();
	if (start(&a) == -1)
		return 1;

	for (;;) {
		if (sigwait(&sigs, &sig) != 0)
			continue;
		if (sig == SIGUSR1) {
			pthread_join(a.thread, NULL);
			fprintf(stderr, "appliance: the runner stopped by itself\n");
			break;
		}
		if (sig == SIGHUP) {
			/* New connections must prove the new token; sessions
			 * already open carry on. A bad file keeps the old. */
			if ((fresh = read_token(argv[optind], &len)) == NULL)
				continue;
			if (mr_token_replace(fresh, len) == -1)
				fprintf(stderr, "appliance: SIGHUP: out of memory; "
				    "keeping the previous token\n");
			else
				fprintf(stderr, "appliance: SIGHUP: the token "
				    "file read again\n");
			free(fresh);
			continue;
		}
		fprintf(stderr, "appliance: %s: stopping the runner\n",
		    sig == SIGINT ? "SIGINT" : "SIGTERM");
		stop(&a);
		break;
	}
	free(token);
	fprintf(stderr, "appliance: stopped\n");
	return a.rc == 0 ? 0 : 1;
}
