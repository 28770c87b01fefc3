/*
 * procspawn.h: sessions in processes of their own started with posix_spawn
 * (procspawn.c), and what they share with forked ones (server.c). Private to
 * the daemon.
 */
#ifndef SPAWN_H
#define SPAWN_H

#include <sys/types.h>

#include <stdint.h>

#include "metal_runner.h"

/* The runner: start slot's session process for connection fd; its pid, or
 * -1 with a message in err. fd and the descriptors are the caller's. */
pid_t spawn_session(const struct mr_config *cfg, const struct be_info *info,
    int fd, uint32_t id, int slot, const char *peer, char *err);
/* server.c: the rest of a session process, forked or spawned (open_be:
 * it opens the device itself, after its cache helper is forked, given
 * the runner's ctx->info as what the runner's own open found). Ends
 * the process: 0, 1 (could not start), 3 or 4 (a kernel crashed or ran
 * too long: launch.c), 5 (the device was lost to it). */
void server_session_run(struct mr_server_ctx *ctx, int fd, uint32_t id,
    int slot, const char *peer, int open_be) __attribute__((noreturn));

#endif
