/*
 * cache.h: the content-addressed cache (cache.c, the store on disk;
 * cachelink.c, how a session reaches it). Private to the daemon.
 */
#ifndef CACHE_H
#define CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "metal_runner.h"
#include "protocol.h"

/* cache_get and cache_link_get: besides 0 */
#define CACHE_NOTHELD	-1	/* not pinned by this session: ENOTCACHED */
#define CACHE_BADLEN	-2	/* pinned, another length: EINVAL */
#define CACHE_BAD	-3	/* unreadable or corrupt, now dropped: ECACHE */

/* cache.c: the store. */
/* At start, before any session: use dir (created if missing) bounded to
 * limit bytes; -1 with a message if it cannot be written (no cache).
 * nsessions: how many sessions share this process's open files, and so
 * its pins (thread isolation: --max-sessions; process isolation: 1). */
int cache_open(const char *dir, uint64_t limit, uint32_t nsessions,
    char *err);
int cache_enabled(void);
/* Spawned session processes (isolate.c): the descriptor of the store's
 * shared byte count (-1: no cache), and the session's side, which opens
 * dir again and maps the count (approxfd is closed). */
int cache_approx_fd(void);
int cache_attach(const char *dir, uint64_t limit, int approxfd, char *err);
/* What one session was told it may rely on (Thave): open files. */
struct cache_pins *cache_pins_new(void);
void cache_pins_free(struct cache_pins *ps);
/* 1 if the store holds hash, which stays readable for ps from now on. */
int cache_pin(struct cache_pins *ps, const uint8_t hash[PROTO_HASH_SIZE]);
/* The pinned content of hash, len bytes, verified, in *out (malloc'd). */
int cache_get(struct cache_pins *ps, const uint8_t hash[PROTO_HASH_SIZE],
    uint64_t len, uint8_t **out, char *err);
/* Store len bytes under the SHA-256 this computes, in two steps: the
 * bytes written as they come (cache_put_write), then hashed as the file
 * holds them and named (cache_put_finish, which frees pp; a store cut
 * short is dropped). Failures are logged and only mean the content is not
 * cached. */
struct cache_put *cache_put_begin(uint64_t len);
void cache_put_write(struct cache_put *pp, const void *p, size_t n);
int cache_put_finish(struct cache_put *pp);

/* storeq.c: the second step of stores (cache_put_finish), off the
 * session's path, by a thread of their own; at most STOREQ_MAX bytes
 * wait (past it storeq_put finishes stores itself). */
#define STOREQ_MAX (128u << 20)
struct storeq *storeq_new(void);
void storeq_put(struct storeq *q, struct cache_put *pp, uint64_t len);
/* Finish all that was put (the caller helps), then return. */
void storeq_drain(struct storeq *q);
/* Drain, end the thread, free. */
void storeq_free(struct storeq *q);

/* cachelink.c: a session's way to the store. */
/* Process isolation, in the session process before it is confined: fork
 * the session's cache helper. Returns in the session (the child); the
 * helper serves it and exits as it exits. clientfd is closed in the
 * helper. -1: no helper (the session runs without the cache). */
int cache_helper_start(const struct mr_config *cfg, int clientfd, char *err);
/* The session's link: to its helper, or straight to the store (thread
 * isolation); NULL if the runner has no cache. */
struct cache_link *cache_link_open(void);
void cache_link_close(struct cache_link *l);
/* held[i] = 1 if hashes[i] (32 bytes each) is held and pinned. */
int cache_link_have(struct cache_link *l, const uint8_t *hashes, uint32_t n,
    uint8_t *held);
/* Put the pinned content of hash (len bytes) at dst: 0 or a CACHE_*; dst
 * is written only on success. */
int cache_link_get(struct cache_link *l, const uint8_t hash[PROTO_HASH_SIZE],
    uint64_t len, uint8_t *dst, char *err);
/* Store p in the cache; nothing to wait for, nothing to fail. */
void cache_link_put(struct cache_link *l, const void *p, uint64_t len);

#endif
