/*
 * isolate.h: starting and ending sessions (isolate.c), for the accept loop
 * (server.c). Private to the daemon.
 */
#ifndef ISOLATE_H
#define ISOLATE_H

#include <sys/types.h>

#include <stdint.h>

#include "metal_runner.h"

/* At the start of a serve. */
void isolate_init(void);
/* The lock over the session table the accept loop and session threads
 * share (slot_take, slot_free, the resume control sockets). */
void isolate_lock(void);
void isolate_unlock(void);
/* Take a slot for connection id, -1: none (*full: the table is full, else
 * too many connections are in their handshake). */
int isolate_admit(const struct mr_config *cfg, uint32_t max_startups,
    uint32_t id, int *full);
/* Start the session of connection fd in slot, in iso (a thread, a forked
 * or a spawned process); on failure the connection is refused and the
 * slot freed. lfd is the listening socket, closed in a session process. */
void isolate_start(struct mr_server_ctx *ctx, enum be_isolation iso, int lfd,
    int fd, uint32_t id, int slot, const char *peer);
/* Sessions started and not yet ended. */
int isolate_active(void);
/* Wait for session processes that ended (block: for all of them). */
void isolate_reap(int block);
/* End every session (processes: session processes, else threads; lost:
 * the device was lost, and threads may still tell their clients). */
void isolate_stop(int processes, int lost);
/* Spawned sessions in a row whose process could not open the device, once
 * there are enough to take the device to be gone; else 0. */
int isolate_nodevice(void);

#endif
