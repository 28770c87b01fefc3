/*
 * peer_route.c: each session's inbox, through which a peer connection
 * reaches the session whose grant it names (protocol.md, Copies between
 * runners; peer.c).
 *
 * An inbox is a unix socket pair per session: the runner's connection
 * process (or thread) that reads a Tpeer first passes its socket to the
 * owning session over the write end, with SCM_RIGHTS, and ends. The table
 * is this process's own memory, not the shared slot table (slots.c): a
 * session process gets a copy at fork whose descriptors are exactly the
 * ones it inherited, and gives them all up when its first frame is a
 * Thello (peer_forget()), so only a connection that is a peer holds the
 * other sessions' write ends, for the moment it takes to hand itself over.
 */
#include <sys/socket.h>
#include <sys/types.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "session.h"

struct route {
	uint32_t id;	/* the session in the slot */
	int w, r;	/* its inbox: the end peers write to, its own end */
};

/* Thread isolation: sessions take and hand over while the accept loop
 * opens and closes. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct route *routes;
static uint32_t nroutes;
static int in_session_process;

int
peer_routes_init(uint32_t nslots)
{
	uint32_t i;

	if ((routes = calloc(nslots, sizeof(*routes))) == NULL)
		return -1;
	nroutes = nslots;
	for (i = 0; i < nslots; i++)
		routes[i].w = routes[i].r = -1;
	return 0;
}

void
peer_routes_free(void)
{
	uint32_t i;

	for (i = 0; routes != NULL && i < nroutes; i++)
		peer_route_close((int)i);
	free(routes);
	routes = NULL;
	nroutes = 0;
}

/* A new connection in slot, as session id: its inbox. Without one (no
 * descriptors left) the session works, and peers cannot reach it. */
void
peer_route_open(int slot, uint32_t id)
{
	int sp[2];

	if (routes == NULL)
		return;
	pthread_mutex_lock(&lock);
	routes[slot].id = id;
	if (socketpair(AF_UNIX, PEER_SOCKTYPE, 0, sp) == -1)
		log_warn("session %u: no inbox for peers: %s", id,
		    strerror(errno));
	else {
		routes[slot].r = sp[0];
		routes[slot].w = sp[1];
	}
	pthread_mutex_unlock(&lock);
}

void
peer_route_close(int slot)
{
	if (routes == NULL)
		return;
	pthread_mutex_lock(&lock);
	if (routes[slot].w != -1)
		close(routes[slot].w);
	if (routes[slot].r != -1)
		close(routes[slot].r);
	routes[slot].w = routes[slot].r = -1;
	pthread_mutex_unlock(&lock);
}

/* The runner, after forking the session process: its end is the
 * session's own now. In the session process: remember that it is one. */
void
peer_route_forked(int slot, int child)
{
	if (child) {
		in_session_process = 1;
		return;
	}
	if (routes != NULL && routes[slot].r != -1) {
		close(routes[slot].r);
		routes[slot].r = -1;
	}
}

/* The session in slot takes its end of the inbox (and closes it). */
int
peer_inbox(int slot)
{
	int fd;

	if (routes == NULL || slot < 0)
		return -1;
	pthread_mutex_lock(&lock);
	fd = routes[slot].r;
	routes[slot].r = -1;
	pthread_mutex_unlock(&lock);
	return fd;
}

/* Pass fd and the Tpeer frame read from it (then the peer's host, for the
 * log) to session id's inbox. */
int
peer_handoff(uint32_t id, const uint8_t *frame, size_t len, int fd, char *err)
{
	uint32_t i;
	int rc = -1;

	if (routes == NULL) {
		snprintf(err, PROTO_ERRLEN, "this runner takes no peers");
		return -1;
	}
	pthread_mutex_lock(&lock);
	for (i = 0; i < nroutes; i++)
		if (routes[i].w != -1 && routes[i].id == id)
			break;
	if (i == nroutes)
		snprintf(err, PROTO_ERRLEN, "no session %u", id);
	else if ((rc = net_send_fd(routes[i].w, frame, len, fd)) == -1)
		snprintf(err, PROTO_ERRLEN, "session %u takes no peer now: %s",
		    id, strerror(errno));
	pthread_mutex_unlock(&lock);
	return rc;
}

/* A session process that is a client's: give up every inbox's write end. */
void
peer_forget(void)
{
	uint32_t i;

	if (!in_session_process || routes == NULL)
		return;
	for (i = 0; i < nroutes; i++) {
		if (routes[i].w != -1)
			close(routes[i].w);
		routes[i].w = -1;
	}
}

/* The runner, spawning slot's session process (isolate.c): slot's own end,
 * and every inbox's write end with its session, for a connection that
 * turns out to be a peer; at most max. Returns how many write ends. */
int
peer_route_fds(int slot, int *r, uint32_t *ids, int *w, int max)
{
	uint32_t i;
	int n = 0;

	*r = -1;
	if (routes == NULL)
		return 0;
	pthread_mutex_lock(&lock);
	*r = routes[slot].r;
	for (i = 0; i < nroutes && n < max; i++)
		if (routes[i].w != -1) {
			ids[n] = routes[i].id;
			w[n++] = routes[i].w;
		}
	pthread_mutex_unlock(&lock);
	return n;
}

/* In a spawned session process: what peer_route_fds() gave, as if forked.
 * Write ends go in any place: peer_handoff() finds them by session. */
int
peer_route_adopt(uint32_t nslots, int slot, int r, const uint32_t *ids,
    const int *w, int n)
{
	int i;

	if (peer_routes_init(nslots) == -1)
		return -1;
	in_session_process = 1;
	routes[slot].r = r;
	for (i = 0; i < n && (uint32_t)i < nslots; i++) {
		routes[i].id = ids[i];
		routes[i].w = w[i];
	}
	return 0;
}
