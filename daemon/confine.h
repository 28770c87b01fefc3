/*
 * confine.h: confining session processes (confine.c). Private to the
 * daemon: mr_serve() checks the options at start and isolate.c confines
 * each session process; crash.c names a denied system call in ECRASH.
 */
#ifndef CONFINE_H
#define CONFINE_H

#include "metal_runner.h"

/* At start: check --user and say how sessions are confined; -1 (with a
 * message on stderr) if the runner must not start. */
int confine_init(const struct mr_config *cfg);
/* Only the first half of that: the cache helper (cachelink.c) runs as the
 * session's user, but unfiltered. */
int confine_user(const struct mr_config *cfg, char *err);
/* In a session process, before its first request: switch to --user's
 * account, then allow only the system calls a session makes. */
int confine_session(const struct mr_config *cfg, char *err);
/* In the peer broker (peer_net.c): --user's account, no filter. */
int confine_broker(const struct mr_config *cfg, char *err);

#endif
