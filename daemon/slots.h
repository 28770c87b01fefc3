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

struct slot {
	_Atomic uint64_t mem;	/* bytes reserved by the session */
	pid_t pid;		/* process isolation: the session's process */
	int fd;			/* thread isolation: the session's socket */
	uint32_t id;
	int busy;
};

/* The table mr_mem_init() mapped. */
uint32_t slot_count(void);
struct slot *slot_get(uint32_t i);
/* A free slot, marked busy, or -1 if all are busy. */
int slot_take(void);
/* Return a finished session's slot and whatever memory it still held. */
void slot_free(int i);
/* Unmap the table, if it is mapped. */
void slot_unmap(void);

#endif
