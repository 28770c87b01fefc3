/*
 * crash.c: the report of a kernel that crashes or runs too long, in a
 * session process.
 *
 * Process isolation: a kernel that crashes or overruns its time ends its
 * session's process. Launch.c arms the handler around each kernel it runs;
 * a signal then sends the client an Rerror naming the kernel and ends the
 * process with an exit status the runner logs (isolate.c, isolate_reap). A signal
 * with nothing armed is the runner's own fault: the process dies by it.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "metal_runner.h"
#include "proto.h"
#include "session.h"

/* Process isolation: a kernel that crashes or overruns its time ends its
 * session's process; the handler tells the client why first. */
static volatile sig_atomic_t crash_armed;
static int crash_fd = -1;
static uint32_t crash_tag;
static const char *crash_name;	/* the running kernel's, valid while armed */
int sess_crash_handlers;	/* set by sess_crash_install() */
/* The crash text for SIGSYS; with confinement on, confine.c names the
 * call in it before the handler runs. */
char sess_crash_sigsys[128] = "crashed: SIGSYS";

/* In a session process, before its first request: the handlers for the
 * signals a CPU kernel may raise, and the kernel time limit's alarm. */
void
sess_crash_install(void)
{
	int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS, SIGALRM };
	struct sigaction sa;
	size_t i;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = sess_crash_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_NODEFER | SA_RESETHAND;
	for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, NULL);
	sess_crash_handlers = 1;
}

void
sess_crash_arm(int fd, uint32_t tag, const char *name, int timeout)
{
	if (!sess_crash_handlers)
		return;
	crash_fd = fd;
	crash_tag = tag;
	crash_name = name;
	if (timeout > 0)
		alarm((unsigned)timeout);
	crash_armed = 1;
}

void
sess_crash_disarm(int timeout)
{
	if (!sess_crash_handlers)
		return;
	/* Cancel the alarm first: one that fires now is still the kernel's. */
	if (timeout > 0)
		alarm(0);
	crash_armed = 0;
}

static size_t
append(char *buf, size_t n, size_t cap, const char *s)
{
	while (*s != '\0' && n < cap)
		buf[n++] = *s++;
	return n;
}

/* Async-signal-safe: byte copies, proto_put_rerror (byte stores and
 * memcpy), write() and _exit(). */
void
sess_crash_signal(int sig)
{
	const char *what = sig == SIGSEGV ? "crashed: SIGSEGV" :
	    sig == SIGBUS ? "crashed: SIGBUS" : sig == SIGILL ?
	    "crashed: SIGILL" : sig == SIGFPE ? "crashed: SIGFPE" :
	    sig == SIGSYS ? sess_crash_sigsys :
	    sig == SIGALRM ? "ran past the runner's kernel time limit" :
	    "crashed";
	static char text[PROTO_MAX_ERRTEXT + 1];
	static uint8_t frame[sizeof(struct proto_rerror) + PROTO_MAX_ERRTEXT];
	size_t n;

	/* No kernel is running: the fault is the runner's own. SA_RESETHAND
	 * restored the default action, so die by the signal and let the
	 * parent log it as such, not as a kernel crash. */
	if (!crash_armed) {
		raise(sig);
		_exit(5);
	}
	if (crash_fd != -1) {
		n = append(text, 0, PROTO_MAX_ERRTEXT, "kernel ");
		n = append(text, n, PROTO_MAX_ERRTEXT, crash_name);
		n = append(text, n, PROTO_MAX_ERRTEXT, " ");
		n = append(text, n, PROTO_MAX_ERRTEXT, what);
		text[n] = '\0';
		n = proto_put_rerror(frame, sizeof(frame), crash_tag,
		    sig == SIGALRM ? PROTO_ETIMEOUT : PROTO_ECRASH, text);
		(void)!write(crash_fd, frame, n);
	}
	_exit(sig == SIGALRM ? SESS_EXIT_TIMEOUT : SESS_EXIT_CRASH);
}
