/*
 * slots.h: the session table, between server.c, which hands a slot to
 * each session and takes it back, and slots.c, which keeps it.
 *
 * Private to the daemon. The accounting in the same table (mr_mem_*,
 * mr_auth_penalty) is declared in metal_runner.h.
 */
#ifndef SLOTS_H
#define SLOTS_H

#include <sys/types.h>

#include <stdatomic.h>
#include <stdint.h>

/* Where a connection is: its handshake, its session, ended; or a session
 * whose link dropped, waiting for its client to resume it (resume.c). */
enum slot_stage { SLOT_STARTING, SLOT_SESSION, SLOT_ENDED, SLOT_WAITING };

struct slot {
	_Atomic uint64_t mem;	/* bytes reserved by the session */
	_Atomic int stage;	/* enum slot_stage, set by the session */
	pid_t pid;		/* process isolation: the session's process */
	int fd;			/* thread isolation: the session's socket */
	int ctl;		/* the session's end of its control socket
				 * (resume.c), or -1 */
	uint32_t id;
	int busy;
	/* For the line the runner logs for a session process it stopped:
	 * set by the session, read by server.c. */
	int64_t started;	/* ms, monotonic: when it was accepted */
	_Atomic uint64_t nreq;	/* requests it received */
	_Atomic int announced;	/* it logged its client's arrival */
};

/* Map the table: nsessions sessions and nstartups connections in their
 * handshake, limit bytes of buffers for all. */
int slot_init(uint32_t nsessions, uint32_t nstartups, uint64_t limit);
/* Spawned session processes (isolate.c): the table's descriptor, and the
 * table mapped from it in the session (fd is closed). */
int slot_fd(void);
int slot_attach(int fd);
uint32_t slot_count(void);
struct slot *slot_get(uint32_t i);
/* The session's end of slot's control socket, where a resume naming it
 * arrives (resume.c); -1: none. */
static inline int
slot_ctl(int slot)
{
	return slot >= 0 ? slot_get((uint32_t)slot)->ctl : -1;
}
/* Established sessions; connections still in their handshake. */
uint32_t slot_sessions(void);
uint32_t slot_starting(void);
/* A free slot, marked busy, or -1 if all are busy. */
int slot_take(void);
/* A session whose link dropped gives up its session place while it waits
 * (its memory stays reserved), so its client can come back to a full
 * runner; it takes one again when resumed, even past the limit for the
 * moment the connection that resumed it still holds its own. */
void slot_wait(int i);
void slot_resumed(int i);
/* Return a finished session's slot and whatever memory it still held. */
void slot_free(int i);
/* Unmap the table, if it is mapped. */
void slot_unmap(void);

#endif
