/*
 * advertise_avahi.c: DNS-SD on Linux through Avahi's client library,
 * which asks avahi-daemon over D-Bus to publish the service. Built when
 * pkg-config finds avahi-client (Makefile, CMakeLists.txt).
 *
 * The registration lives in a process of its own, forked when the socket
 * listens, so the D-Bus connection never reaches a session process, where
 * a client's kernel could use it. The advertiser tells the runner through
 * a pipe once the name is registered (or why not), and dies with the
 * runner (PR_SET_PDEATHSIG); avahi-daemon withdraws the service when its
 * client goes away. A name taken by another service is replaced by
 * Avahi's alternative ("name #2").
 *
 * avahi-daemon publishes on the interfaces it uses (by default every
 * multicast interface, not loopback): a runner that listens on one
 * address is advertised with all of the host's addresses, and a client
 * tries them in turn.
 */
#include <sys/prctl.h>
#include <sys/types.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <avahi-client/client.h>
#include <avahi-client/publish.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/simple-watch.h>

#include "advertise.h"

const int adv_available = 1;
const char *const adv_missing = NULL;

struct adv {
	AvahiSimplePoll *poll;
	AvahiEntryGroup *group;
	char *name;
	const char *backend;
	int port, auth, fd;	/* fd: the pipe to the runner, -1 once told */
};

/* Tell the runner: "0name" registered, "1why" failed. */
static void
tell(struct adv *a, int ok, const char *text)
{
	char msg[300];
	int n = snprintf(msg, sizeof(msg), "%c%s", ok ? '0' : '1', text);

	if (a->fd == -1) {
		if (!ok)
			fprintf(stderr, "metal_runner: DNS-SD: %s; no longer "
			    "advertised\n", text);
		return;
	}
	(void)!write(a->fd, msg, (size_t)n);
	close(a->fd);
	a->fd = -1;
}

static void register_service(struct adv *a, AvahiClient *c);

static void
group_cb(AvahiEntryGroup *g, AvahiEntryGroupState state, void *arg)
{
	struct adv *a = arg;
	char *alt;

	switch (state) {
	case AVAHI_ENTRY_GROUP_ESTABLISHED:
		tell(a, 1, a->name);
		break;
	case AVAHI_ENTRY_GROUP_COLLISION:
		alt = avahi_alternative_service_name(a->name);
		avahi_free(a->name);
		a->name = alt;
		avahi_entry_group_reset(g);
		register_service(a, avahi_entry_group_get_client(g));
		break;
	case AVAHI_ENTRY_GROUP_FAILURE:
		tell(a, 0, avahi_strerror(avahi_client_errno(
		    avahi_entry_group_get_client(g))));
		avahi_simple_poll_quit(a->poll);
		break;
	default:
		break;
	}
}

static void
register_service(struct adv *a, AvahiClient *c)
{
	char backend[32];
	int e;

	if (a->group == NULL &&
	    (a->group = avahi_entry_group_new(c, group_cb, a)) == NULL)
		goto fail;
	snprintf(backend, sizeof(backend), "backend=%s", a->backend);
	e = avahi_entry_group_add_service(a->group, AVAHI_IF_UNSPEC,
	    AVAHI_PROTO_UNSPEC, 0, a->name, ADV_TYPE, NULL, NULL,
	    (uint16_t)a->port, "txtvers=1", "proto=1", backend,
	    a->auth ? "auth=1" : "auth=0", NULL);
	if (e == AVAHI_ERR_COLLISION) {
		char *alt = avahi_alternative_service_name(a->name);
		avahi_free(a->name);
		a->name = alt;
		register_service(a, c);
		return;
	}
	if (e < 0 || avahi_entry_group_commit(a->group) < 0)
		goto fail;
	return;
fail:
	tell(a, 0, avahi_strerror(avahi_client_errno(c)));
	avahi_simple_poll_quit(a->poll);
}

static void
client_cb(AvahiClient *c, AvahiClientState state, void *arg)
{
	struct adv *a = arg;

	if (state == AVAHI_CLIENT_S_RUNNING && a->group == NULL) {
		if (a->name[0] == '\0') {
			avahi_free(a->name);
			a->name = avahi_strdup(avahi_client_get_host_name(c));
		}
		register_service(a, c);
	} else if (state == AVAHI_CLIENT_FAILURE) {
		tell(a, 0, avahi_strerror(avahi_client_errno(c)));
		avahi_simple_poll_quit(a->poll);
	}
}

/* The advertiser process: register, then serve Avahi until the runner
 * (and so this process) goes, or avahi-daemon does. */
static void
advertiser(struct adv *a, pid_t runner)
{
	struct sigaction sa;
	AvahiClient *c;
	int e, fd;

	if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() != runner)
		_exit(1);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	/* Nothing of the runner's (its listening socket) stays open here. */
	for (fd = 3; fd < 1024; fd++)
		if (fd != a->fd)
			close(fd);
	if ((a->poll = avahi_simple_poll_new()) == NULL) {
		tell(a, 0, "out of memory");
		_exit(1);
	}
	c = avahi_client_new(avahi_simple_poll_get(a->poll), 0, client_cb, a,
	    &e);
	if (c == NULL) {
		tell(a, 0, e == AVAHI_ERR_NO_DAEMON ? "avahi-daemon is not "
		    "running (or D-Bus is not)" : avahi_strerror(e));
		_exit(1);
	}
	avahi_simple_poll_loop(a->poll);
	_exit(1);
}

int
adv_start(const char *name, const char *host, int port, const char *backend,
    int auth, char *err, size_t errlen)
{
	struct adv a;
	struct pollfd pfd;
	char msg[300];
	int p[2];
	ssize_t n;
	pid_t pid, self = getpid();

	(void)host;
	if (pipe(p) == -1) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		return -1;
	}
	if ((pid = fork()) == -1) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		memset(&a, 0, sizeof(a));
		a.name = avahi_strdup(name);
		a.backend = backend;
		a.port = port;
		a.auth = auth;
		a.fd = p[1];
		close(p[0]);
		advertiser(&a, self);
	}
	close(p[1]);
	/* avahi-daemon probes the name first (about a second). */
	pfd.fd = p[0];
	pfd.events = POLLIN;
	n = poll(&pfd, 1, 10000) == 1 ? read(p[0], msg, sizeof(msg) - 1) : -1;
	close(p[0]);
	if (n <= 0) {
		snprintf(err, errlen, "no answer from the Avahi advertiser");
		kill(pid, SIGKILL);
		return -1;
	}
	msg[n] = '\0';
	if (msg[0] != '0') {
		snprintf(err, errlen, "cannot advertise with Avahi: %s",
		    msg + 1);
		return -1;
	}
	fprintf(stderr, "metal_runner: advertising \"%s\" (%s) on port %d "
	    "with DNS-SD (Avahi)\n", msg + 1, ADV_TYPE, port);
	return 0;
}
