/*
 * resume.h: sessions that survive a dropped link (resume.c), the part the
 * accept loop (server.c) calls. The session's part is in session.h.
 *
 * Private to the daemon. Everything here is a no-op unless the runner
 * resumes sessions (cfg->resume_grace > 0).
 */
#ifndef RESUME_H
#define RESUME_H

#include <poll.h>

#include "metal_runner.h"

/* Give slot its control socket pair (before the session starts): 0, or -1
 * if there is none (the session then cannot be resumed, nor resume). */
int resume_open(const struct mr_config *cfg, int slot);
/* In a forked session process: close the accept loop's ends of every
 * slot's control socket. */
void resume_child(void);
/* In the accept loop, after forking slot's session process: close the
 * session's end, which only the child uses. */
void resume_forked(int slot);
/* Close the accept loop's ends of slots that are free again. */
void resume_sweep(void);
/* Route what is left in slot's control socket and close it (the slot is
 * taken again). */
void resume_reclaim(int slot);
/* Fill p with the accept loop's ends to watch, slots[i] the slot of p[i];
 * returns how many (at most max). */
int resume_pollfds(struct pollfd *p, int *slots, int max);
/* A session of slot sent up a Tresume with its connection: pass it to the
 * session it names, or refuse it with ERESUME. */
void resume_route(int slot);
/* Wake every session waiting for a resume so that it ends (stopping). */
void resume_stop(void);
/* Close the accept loop's ends of all control sockets (it has stopped). */
void resume_close(void);

#endif
