/*
 * embed_api.c: what a program embedding libmetal_runner.a relies on, for
 * tests/test_embed.py (it prints one line per check, "ok ..." or
 * "FAIL ...", and exits 1 if any failed):
 *   - the runner, with process isolation, does not take the exit status
 *     of a child the program started itself;
 *   - mr_stop() from another thread stops mr_serve(), which returns 0;
 *   - mr_serve() may be called again after it has returned;
 *   - a mr_stop() that comes before mr_serve() ends that serve at once;
 *   - a token longer than MR_TOKEN_MAX is refused, by mr_serve() and by
 *     mr_token_replace() (a spawned session would read only its start).
 */
#include <sys/wait.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "metal_runner.h"

static struct mr_config cfg;
static atomic_int listening, returned;
static int serve_rc;
static int failed;

static void
on_listen(const char *host, int port, void *arg)
{
	(void)host;
	(void)arg;
	atomic_store(&listening, port);
}

static void *
serve(void *arg)
{
	(void)arg;
	serve_rc = mr_serve(&cfg);
	atomic_store(&returned, 1);
	return NULL;
}

static void
check(int ok, const char *what)
{
	printf("%s %s\n", ok ? "ok" : "FAIL", what);
	fflush(stdout);
	failed |= !ok;
}

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Start mr_serve() on a thread and wait until it listens; then it must
 * still be serving a second later, past two turns of its accept loop. */
static int
start(pthread_t *t)
{
	int i;

	atomic_store(&listening, 0);
	atomic_store(&returned, 0);
	if (pthread_create(t, NULL, serve, NULL) != 0)
		return -1;
	for (i = 0; i < 1000 && atomic_load(&listening) == 0; i++)
		usleep(10000);
	if (atomic_load(&listening) == 0)
		return -1;
	usleep(1000000);
	return atomic_load(&returned) ? -1 : 0;
}

int
main(void)
{
	pthread_t t;
	pid_t child, got;
	int status = 0;
	double t0;

	mr_config_defaults(&cfg);
	cfg.port = 0;
	cfg.backend = "cpu";	/* the one that forks a process per session */
	cfg.isolation = BE_ISOLATE_PROCESS;
	cfg.on_listen = on_listen;

	check(start(&t) == 0, "mr_serve serves");
	if ((child = fork()) == 0)
		_exit(7);
	/* The accept loop reaps every half second: give it two turns. */
	usleep(1000000);
	got = waitpid(child, &status, 0);
	check(got == child && WIFEXITED(status) && WEXITSTATUS(status) == 7,
	    "the program's own child is left to the program");
	t0 = now();
	mr_stop();
	pthread_join(t, NULL);
	check(serve_rc == 0 && now() - t0 < 2, "mr_stop from another thread");

	check(start(&t) == 0, "mr_serve serves again");
	mr_stop();
	pthread_join(t, NULL);
	check(serve_rc == 0, "the second serve stops");

	mr_stop();
	t0 = now();
	check(mr_serve(&cfg) == 0 && now() - t0 < 2,
	    "a stop before mr_serve ends it as it starts");

	{
		static uint8_t big[MR_TOKEN_MAX + 1];

		memset(big, 'k', sizeof(big));
		cfg.token = big;
		cfg.tokenlen = sizeof(big);
		check(mr_serve(&cfg) == -1, "mr_serve refuses a token longer "
		    "than MR_TOKEN_MAX");
		cfg.tokenlen = MR_TOKEN_MAX;
		check(mr_token_replace(big, sizeof(big)) == -1 &&
		    mr_token_replace(big, MR_TOKEN_MAX) == 0,
		    "mr_token_replace takes up to MR_TOKEN_MAX bytes");
	}
	return failed;
}
