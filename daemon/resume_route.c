/*
 * resume_route.c: the accept loop's part of resuming a session (resume.c),
 * beside peer_route.c: each slot's control socket, and the routing of a
 * resuming connection to the session it names.
 *
 * A connection does its handshake in a session of its own, like any other,
 * whose Tresume sends it, with the socket (SCM_RIGHTS), up its control
 * socket; the accept loop passes it down the control socket of the session
 * the Tresume names, which checks the proof itself (resume.c). So the
 * accept loop reads nothing from a client and never sees a key.
 */
#include <sys/socket.h>
#include <sys/types.h>

#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "resume.h"
#include "slots.h"

/* Message boundaries, and an end that wakes the other side when closed. */
#ifdef __linux__
#define CTL_TYPE SOCK_SEQPACKET
#else
#define CTL_TYPE SOCK_STREAM	/* fixed-size messages; read whole */
#endif

/* The accept loop's ends of the control sockets, by slot, and the
 * sessions' ends until the session has them (a session process may end,
 * and clear its slot, before the accept loop closes its copy). */
static int *pctl, *sctl;
static uint32_t npctl;

static int route_one(int);

int
resume_open(const struct mr_config *cfg, int slot)
{
	struct slot *sl = slot_get((uint32_t)slot);
	int sv[2];
	uint32_t i;

	if (cfg->resume_grace <= 0)
		return 0;
	if (pctl == NULL) {
		pctl = calloc(slot_count(), sizeof(*pctl));
		sctl = calloc(slot_count(), sizeof(*sctl));
		if (pctl == NULL || sctl == NULL) {
			free(pctl);
			free(sctl);
			pctl = sctl = NULL;
			return -1;
		}
		npctl = slot_count();
		for (i = 0; i < npctl; i++)
			pctl[i] = sctl[i] = -1;
	}
	if (socketpair(AF_UNIX, CTL_TYPE, 0, sv) == -1)
		return -1;
	fcntl(sv[0], F_SETFD, FD_CLOEXEC);
	fcntl(sv[1], F_SETFD, FD_CLOEXEC);
	fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
	pctl[slot] = sv[0];
	sl->ctl = sctl[slot] = sv[1];
	return 0;
}

void
resume_child(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1) {
			close(pctl[i]);
			pctl[i] = -1;
		}
}

void
resume_forked(int slot)
{
	/* The number stays in the table: it is the child's. */
	if (sctl != NULL && sctl[slot] != -1) {
		close(sctl[slot]);
		sctl[slot] = -1;
	}
}

void
resume_reclaim(int slot)
{
	if (pctl == NULL || pctl[slot] == -1)
		return;
	/* A connection passed up just before its session ended is still in
	 * the socket: route it first. */
	while (route_one(slot) == 0)
		;
	close(pctl[slot]);
	pctl[slot] = -1;
}

void
resume_sweep(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1 && !slot_get(i)->busy)
			resume_reclaim((int)i);
}

int
resume_pollfds(struct pollfd *p, int *slots, int max)
{
	uint32_t i;
	int n = 0;

	for (i = 0; pctl != NULL && i < npctl && n < max; i++)
		if (pctl[i] != -1 && slot_get(i)->busy) {
			p[n].fd = pctl[i];
			p[n].events = POLLIN;
			p[n].revents = 0;
			slots[n++] = (int)i;
		}
	return n;
}

void
resume_route(int from)
{
	while (route_one(from) == 0)
		;
}

/* Route one handover waiting in from's control socket: 0, or -1 if there
 * was none. */
static int
route_one(int from)
{
	struct resume_handover h;
	uint32_t i;
	int fd;

	if (pctl == NULL || pctl[from] == -1 ||
	    resume_handover_recv(pctl[from], &h, &fd) == -1)
		return -1;
	for (i = 0; i < npctl; i++) {
		struct slot *sl = slot_get(i);
		int stage = atomic_load(&sl->stage);
		if ((int)i != from && sl->busy && sl->id == h.target &&
		    pctl[i] != -1 && (stage == SLOT_SESSION ||
		    stage == SLOT_WAITING))
			break;
	}
	if (i == npctl) {
		log_info("resume of session %u from %s: no such session",
		    h.target, h.peer);
		net_refuse(fd, h.tag, PROTO_ERESUME, "no session with that "
		    "number to resume: it never existed, ended, or was not "
		    "resumed within the runner's grace period");
		return 0;
	}
	if (resume_handover_send(pctl[i], &h, fd) == -1) {
		net_refuse(fd, h.tag, PROTO_ERESUME, "the session is busy "
		    "with another resume; try again");
		return 0;
	}
	close(fd);	/* the session has its own copy now */
	return 0;
}

void
resume_stop(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1)
			shutdown(pctl[i], SHUT_RDWR);
}

void
resume_close(void)
{
	uint32_t i;

	for (i = 0; pctl != NULL && i < npctl; i++)
		if (pctl[i] != -1)
			close(pctl[i]);
	free(pctl);
	free(sctl);
	pctl = sctl = NULL;
	npctl = 0;
}
