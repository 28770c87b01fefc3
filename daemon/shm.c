/*
 * shm.c: the one place that picks how shared memory is made. The session
 * table (slots.c) and the cache's byte count (cache.c) are shared by every
 * session process; a forked process inherits a MAP_ANON mapping, but a
 * spawned one (isolate.c) starts with none, so the memory must be a
 * descriptor it can be handed: memfd_create on Linux, elsewhere a POSIX
 * shared memory object whose name is gone before anyone else could open
 * it.
 */
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "shm.h"

int
shm_anon(size_t len)
{
	int fd, saved;
#ifdef __linux__
	if ((fd = memfd_create("metal_runner", MFD_CLOEXEC)) == -1)
		return -1;
#else
	static atomic_uint seq;
	char name[64];

	/* The name only exists between these two calls (macOS: at most
	 * 31 bytes). */
	snprintf(name, sizeof(name), "/mr.%ld.%u", (long)getpid(),
	    atomic_fetch_add(&seq, 1));
	if ((fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600)) == -1)
		return -1;
	shm_unlink(name);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
#endif
	if (ftruncate(fd, (off_t)len) == -1) {
		saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

void *
shm_map(int fd, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	return p == MAP_FAILED ? NULL : p;
}
