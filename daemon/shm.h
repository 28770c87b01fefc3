/*
 * shm.h: anonymous shared memory that a spawned process can map too
 * (shm.c). Private to the daemon.
 */
#ifndef SHM_H
#define SHM_H

#include <stddef.h>

/* A descriptor (close-on-exec) of len zeroed bytes of shared memory that
 * no other process can open by name, or -1 with errno set. */
int shm_anon(size_t len);
/* Map fd, len bytes, shared and writable: the mapping, or NULL. */
void *shm_map(int fd, size_t len);

#endif
