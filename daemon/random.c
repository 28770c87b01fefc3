/*
 * random.c: random bytes from the system, for the runner's secrets and
 * nonces: Rhello's nonce (handshake.c), a grant's secret (grant.c), a peer
 * connection's nonce (peer_net.c), a resume key (resume.c).
 *
 * At the bottom, beside net.c and log.c: it calls nothing of the runner.
 * (It was handshake.c's sess_random(), which made every file that needs a
 * secret use the handshake's file, and peer_net.c, below the handlers, call
 * up into one.)
 */
#ifdef __linux__
#include <sys/random.h>
#endif
#include <sys/types.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "metal_runner.h"

void
random_bytes(uint8_t *p, size_t n)
{
#if defined(__APPLE__) || defined(__OpenBSD__)
	arc4random_buf(p, n);
#elif defined(__linux__)
	/* No file to open: a confined session may not (confine.c). */
	ssize_t r;

	while (n > 0) {
		if ((r = getrandom(p, n, 0)) == -1 && errno == EINTR)
			continue;
		if (r <= 0)	/* unreachable on a working system */
			abort();
		p += r;
		n -= (size_t)r;
	}
#else
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	ssize_t r = 0;

	while (fd != -1 && n > 0 && (r = read(fd, p, n)) > 0) {
		p += r;
		n -= (size_t)r;
	}
	if (fd != -1)
		close(fd);
	if (n > 0)	/* unreachable on a working system; never a zero nonce */
		abort();
#endif
}
