/*
 * slots.c: the session table and what is counted in it for all sessions:
 * buffer memory, the number of established sessions, the pace of failed
 * authentications and of log lines about refused handshakes.
 *
 * The table is shared memory (shm.c), one slot per connection plus the
 * totals, so the limits hold across session processes (process
 * isolation: forked, or spawned and handed its descriptor, slot_fd) and a
 * dead process's share is returned by the parent.
 * server.c takes a slot for each connection it accepts and frees it; the
 * session moves its slot from its handshake to the session count
 * (mr_session_admit), reserves and releases memory and pays the
 * authentication penalty here, and needs nothing of server.c.
 */
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "metal_runner.h"
#include "monotime.h"
#include "proto.h"
#include "shm.h"
#include "slots.h"

struct shared {
	_Atomic uint64_t total;
	_Atomic int64_t auth_next;	/* ms: when the next failed auth may answer */
	_Atomic int64_t log_next;	/* ms: when the next handshake line may go out */
	_Atomic uint32_t log_dropped;	/* handshake lines left out since */
	_Atomic uint32_t nsessions;	/* slots in SLOT_SESSION */
	uint64_t limit;
	uint32_t max_sessions;
	uint32_t nslots;
	struct slot slots[];
};

static struct shared *shared;
static size_t shared_len;
static int shared_fd = -1;

/* Every connection has a slot from accept to close, so the table holds
 * the sessions and the handshakes; which of them a slot is, is its stage. */
int
slot_init(uint32_t nsessions, uint32_t nstartups, uint64_t limit)
{
	uint32_t nslots = nsessions + nstartups;
	size_t len = sizeof(*shared) + nslots * sizeof(struct slot);
	struct shared *sh;
	uint32_t i;
	int fd;

	if ((fd = shm_anon(len)) == -1)
		return -1;
	if ((sh = shm_map(fd, len)) == NULL) {
		close(fd);
		return -1;
	}
	sh->limit = limit;
	sh->max_sessions = nsessions;
	sh->nslots = nslots;
	for (i = 0; i < nslots; i++)
		sh->slots[i].fd = sh->slots[i].ctl = -1;
	shared = sh;
	shared_len = len;
	shared_fd = fd;
	return 0;
}

int
slot_fd(void)
{
	return shared_fd;
}

int
slot_attach(int fd)
{
	struct stat st;
	struct shared *sh;

	if (fstat(fd, &st) == -1 || (size_t)st.st_size < sizeof(*sh) ||
	    (sh = shm_map(fd, (size_t)st.st_size)) == NULL)
		return -1;
	if (sizeof(*sh) + sh->nslots * sizeof(struct slot) >
	    (size_t)st.st_size) {
		munmap(sh, (size_t)st.st_size);
		errno = EINVAL;
		return -1;
	}
	close(fd);	/* the mapping stays */
	shared = sh;
	shared_len = (size_t)st.st_size;
	return 0;
}

/* Map the session table: nslots sessions and a limit of limit bytes for
 * all of them together. A harness that drives sess_serve() directly
 * (tests/fuzz) calls it once itself; mr_serve() calls slot_init(). */
int
mr_mem_init(uint32_t nslots, uint64_t limit)
{
	return slot_init(nslots, 0, limit);
}

/* The handshake of the connection in slot is complete: count it as a
 * session, if the session limit has room. */
int
mr_session_admit(int slot)
{
	uint32_t cur = atomic_load(&shared->nsessions);

	do
		if (cur >= shared->max_sessions)
			return -1;
	while (!atomic_compare_exchange_weak(&shared->nsessions, &cur,
	    cur + 1));
	atomic_store(&shared->slots[slot].stage, SLOT_SESSION);
	return 0;
}

/* The session has ended: its place counts no more. The session calls it
 * as it closes and the parent when it frees the slot, whichever is first
 * (a killed session process never gets to). */
static void
leave(int slot, int stage)
{
	if (atomic_exchange(&shared->slots[slot].stage, stage) == SLOT_SESSION)
		atomic_fetch_sub(&shared->nsessions, 1);
}

void
mr_session_leave(int slot)
{
	leave(slot, SLOT_ENDED);
}

void
slot_wait(int slot)
{
	leave(slot, SLOT_WAITING);
}

void
slot_resumed(int slot)
{
	if (atomic_exchange(&shared->slots[slot].stage, SLOT_SESSION) !=
	    SLOT_SESSION)
		atomic_fetch_add(&shared->nsessions, 1);
}

uint32_t
slot_sessions(void)
{
	return atomic_load(&shared->nsessions);
}

uint32_t
slot_starting(void)
{
	uint32_t i, n = 0;

	for (i = 0; i < shared->nslots; i++)
		if (shared->slots[i].busy &&
		    atomic_load(&shared->slots[i].stage) == SLOT_STARTING)
			n++;
	return n;
}

/*
 * Anyone who can reach the port can open connections that never finish
 * their handshake, so the lines about them are rationed: at most one a
 * second for all sessions and the accept loop, the others counted, and
 * the count told in the next line or by mr_log_handshake_flush().
 */
static int
log_turn(void)
{
	int64_t now = mono_ms(), next = atomic_load(&shared->log_next);

	return now >= next && atomic_compare_exchange_strong(&shared->log_next,
	    &next, now + 1000);
}

void
mr_log_handshake(const char *fmt, ...)
{
	char line[512];
	uint32_t n;
	va_list ap;

	if (!log_turn()) {
		atomic_fetch_add(&shared->log_dropped, 1);
		return;
	}
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if ((n = atomic_exchange(&shared->log_dropped, 0)) > 0)
		log_warn("%s (and %u more refused or timed-out handshakes "
		    "not logged)", line, n);
	else
		log_warn("%s", line);
}

void
mr_log_handshake_flush(void)
{
	uint32_t n;

	if (atomic_load(&shared->log_dropped) == 0 || !log_turn())
		return;
	if ((n = atomic_exchange(&shared->log_dropped, 0)) > 0)
		log_warn("%u more refused or timed-out handshakes not logged",
		    n);
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
	int64_t now = mono_ms(), cur, start, wait;

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
	leave(i, SLOT_STARTING);	/* ready for the next connection */
	sl->busy = 0;
	sl->pid = 0;
	sl->fd = sl->ctl = -1;
}

int
slot_take(void)
{
	uint32_t i;

	for (i = 0; i < shared->nslots; i++)
		if (!shared->slots[i].busy) {
			shared->slots[i].busy = 1;
			shared->slots[i].started = mono_ms();
			shared->slots[i].nreq = 0;
			shared->slots[i].announced = 0;
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
	if (shared_fd != -1) {
		close(shared_fd);
		shared_fd = -1;
	}
}
