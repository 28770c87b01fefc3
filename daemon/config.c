/*
 * config.c: the runner's configuration, below everything that reads it:
 * the backends this build has (the platform's choice, made by the
 * Makefile's MR_BACKEND_METAL), the defaults of mr_config, the isolation a
 * backend's sessions get, and the flags that stop the runner.
 *
 * The stop flags are lock-free atomics: mr_stop() may be called from any
 * thread and the SIGINT and SIGTERM handler sets them too.
 */
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "backend.h"
#include "config.h"
#include "metal_runner.h"
#include "proto.h"

static const struct backend *backends[] = {
#ifdef MR_BACKEND_METAL
	&be_metal,
#endif
	&be_cpu,
};

/* Set by mr_stop(), from any thread, and by SIGINT and SIGTERM. */
static atomic_int stopping;
/* What stopped it, for its last line: the signal, or STOP_STDIN. */
static atomic_int stop_why;
/* Set while the runner waits for session threads that cannot be
 * interrupted (isolate.c, isolate_stop). */
static atomic_int stop_waiting;

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

void
mr_stop_for(int why)
{
	stop_why = why;
	stopping = 1;
}

int
mr_stop_why(void)
{
	return stop_why;
}

void
mr_stop_waiting(int on)
{
	stop_waiting = on;
}

void
mr_stop_reset(void)
{
	stopping = 0;
	stop_why = 0;
}

void
mr_stop_signal(int sig)
{
	/* A second one while the runner waits for session threads ends the
	 * program at once, as a user who presses ^C twice expects. */
	if (stop_waiting) {
		signal(sig, SIG_DFL);
		raise(sig);
	}
	stop_why = sig;
	stopping = 1;
}
