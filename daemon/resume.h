/*
 * resume.h: sessions that survive a dropped link: the part the accept loop
 * (server.c, isolate.c) calls (resume_route.c), and what resume's own files
 * share. The session's part is in session.h.
 *
 * Private to the daemon. Everything here is a no-op unless the runner
 * resumes sessions (cfg->resume_grace > 0).
 */
#ifndef RESUME_H
#define RESUME_H

#include <poll.h>
#include <unistd.h>

#include "metal_runner.h"
#include "proto.h"

/* Give slot its control socket pair (before the session starts): 0, or -1
 * if there is none (the session then cannot be resumed, nor resume). */
int resume_open(const struct mr_config *cfg, int slot);
/* In a forked session process: close the accept loop's ends of every
 * slot's control socket. */
void resume_child(void);
/* In the accept loop, after forking slot's session process: close the
 * session's end, which only the child uses. */
void resume_forked(int slot);
/* Close the accept loop's ends of slots that are free again. */
void resume_sweep(void);
/* Route what is left in slot's control socket and close it (the slot is
 * taken again). */
void resume_reclaim(int slot);
/* Fill p with the accept loop's ends to watch, slots[i] the slot of p[i];
 * returns how many (at most max). */
int resume_pollfds(struct pollfd *p, int *slots, int max);
/* A session of slot sent up a Tresume with its connection: pass it to the
 * session it names, or refuse it with ERESUME. */
void resume_route(int slot);
/* Wake every session waiting for a resume so that it ends (stopping). */
void resume_stop(void);
/* Close the accept loop's ends of all control sockets (it has stopped). */
void resume_close(void);

/*
 * Between resume's own files: resume_route.c (the accept loop's part,
 * above), resume_ring.c (what a session keeps of the replies it sent, to
 * send them again) and resume.c (the resume handshake, the session's
 * part, and Tresumekey, Tresume and Tack).
 */
struct session;

/* The data of an Rread sent straight from a buffer: read from there again
 * on a resume, or from own once a request may have changed the buffer. */
struct rref {
	uint64_t at;		/* stream offset of its first byte */
	uint64_t len;
	const uint8_t *src;
	uint8_t *own;
};

struct resume {
	uint8_t secret[PROTO_MAC_SIZE];
	uint64_t total;		/* bytes of the stream sent since the key */
	uint8_t *ring;		/* the last cap bytes that were copied */
	size_t cap;
	uint64_t copied;	/* stream bytes copied into the ring, in all */
	uint64_t frame;		/* the oldest frame whose header the ring */
	uint64_t fcopied;	/* holds: its stream offset and its copied count */
	uint64_t acked;		/* the client received this many (Tack) */
	struct rref refs[PROTO_RESUME_REFS];	/* in stream order */
	unsigned nrefs;
	uint64_t owned;		/* bytes of copies in refs */
	size_t skip;		/* bytes of the output buffer that precede the
				 * key (handshake replies): not the session's */
	int switched;		/* a resume replaced the link while it served */
	int lost;		/* a proven resume could not be honoured */
	uint32_t resumes;
};

/* What a connection's Tresume sends up to the accept loop and down to the
 * session it names, with the connection's socket. */
struct resume_handover {
	uint32_t target;
	uint32_t tag;
	uint8_t snonce[PROTO_NONCE_SIZE];
	uint64_t sent, received;
	uint8_t cnonce[PROTO_NONCE_SIZE];
	uint8_t mac[PROTO_MAC_SIZE];
	uint32_t maxmsg;	/* the new connection's, from its Thello */
	char peer[64];
};

static inline int
resume_handover_send(int ctl, const struct resume_handover *h, int fd)
{
	return net_send_fd(ctl, h, sizeof(*h), fd);
}

/* One handover and its socket: 0, or -1 (nothing, or no socket came). */
static inline int
resume_handover_recv(int ctl, struct resume_handover *h, int *fd)
{
	if (net_recv_fd(ctl, h, sizeof(*h), fd) != (ssize_t)sizeof(*h) ||
	    *fd == -1) {
		if (*fd != -1)
			close(*fd);
		*fd = -1;
		return -1;
	}
	h->peer[sizeof(h->peer) - 1] = '\0';
	return 0;
}

/* resume_ring.c */
/*
 * The frames of the stream from byte from on, which the client missed.
 * With fd -1, check that the runner can send them again: from is a frame
 * boundary it still knows, every frame fits maxmsg (the new connection's)
 * and every Rread's data is held; 0, or -1 with the reason in text. With
 * an fd, send them.
 */
int resume_missed(const struct resume *rs, uint64_t from, uint32_t maxmsg,
    int fd, char *text, size_t len);
/* Let go of the Rread data the client acknowledged (rs->acked). */
void resume_ring_acked(struct session *s);

#endif
