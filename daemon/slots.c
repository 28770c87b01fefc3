/*
 * slots.c: the session table and what is counted in it for all sessions:
 * buffer memory and the pace of failed authentications.
 *
 * The table is a shared anonymous mapping, one slot per session plus the
 * totals, so the limits hold across session processes (process
 * isolation) and a dead process's share is returned by the parent.
 * server.c takes and frees slots; the sessions reserve and release memory
 * and pay the authentication penalty here, and need nothing of server.c.
 */
#include <sys/mman.h>
#include <sys/types.h>

#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "metal_runner.h"
#include "proto.h"
#include "slots.h"

struct shared {
	_Atomic uint64_t total;
	_Atomic int64_t auth_next;	/* ms: when the next failed auth may answer */
	uint64_t limit;
	uint32_t nslots;
	struct slot slots[];
};

static struct shared *shared;
static size_t shared_len;

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

void
slot_free(int i)
{
	struct slot *sl = &shared->slots[i];
	uint64_t left = atomic_exchange(&sl->mem, 0);

	atomic_fetch_sub(&shared->total, left);
	sl->busy = 0;
	sl->pid = 0;
	sl->fd = -1;
}

int
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

uint32_t
slot_count(void)
{
	return shared->nslots;
}

struct slot *
slot_get(uint32_t i)
{
	return &shared->slots[i];
}

void
slot_unmap(void)
{
	if (shared != NULL) {
		munmap(shared, shared_len);
		shared = NULL;
	}
}
