/*
 * confine.c: what a session process may do while it serves a client.
 *
 * A CPU kernel is arbitrary machine code from a client. Before a session
 * process reads its first request it switches to --user's account (a
 * runner started as root) and, on Linux, installs a seccomp-BPF filter
 * that allows only the system calls the session's own work makes: I/O on
 * the descriptors it already has, memory for buffers and programs, the
 * threads of its core pool, the signals of the crash handler and of the
 * kernel time limit, clocks, and exit. Any other call (open, execve,
 * socket, fork, kill, ptrace, ...) is never made: the kernel sends SIGSYS,
 * which the crash handler reports as ECRASH like any crashing kernel, and
 * only that session ends.
 *
 * Thread isolation has no session processes, so nothing is confined there
 * (the Metal backend); neither is anything on systems without seccomp.
 * confine_init() says so at start.
 */
#ifdef __linux__
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#endif
#include <sys/types.h>

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "confine.h"
#include "proto.h"


/* --user's account, looked up at start, before any session forks. */
static const char *run_name;
static uid_t run_uid;
static gid_t run_gid;

static int
lookup_user(const char *name, char *err)
{
	struct passwd *pw;

	errno = 0;
	if ((pw = getpwnam(name)) == NULL) {
		/* getpwnam(3): these errors, too, mean no such user. */
		snprintf(err, PROTO_ERRLEN, "--user %s: %s", name, errno == 0 ||
		    errno == ENOENT || errno == ESRCH || errno == EBADF ||
		    errno == EPERM ? "no such user" : strerror(errno));
		return -1;
	}
	run_name = name;
	run_uid = pw->pw_uid;
	run_gid = pw->pw_gid;
	return 0;
}

/* Start-up messages read like main.c's: the runner has not started yet. */
static void
say(const char *fmt, ...)
{
	va_list ap;

	fputs("metal_runner: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int
confine_init(const struct mr_config *cfg)
{
	const struct backend *be = mr_find_backend(cfg->backend);
	enum be_isolation iso;
	char err[PROTO_ERRLEN];

	if (be == NULL)
		return 0;	/* mr_serve() says there is no such backend */
	iso = mr_isolation(cfg, be);
	if (cfg->user != NULL) {
		if (iso != BE_ISOLATE_THREAD && be->no_fork) {
			say("--user is not supported for the %s backend: its "
			    "session processes run as the runner's user",
			    be->name);
			return -1;
		}
		if (iso == BE_ISOLATE_THREAD) {
			say("--user applies to session processes, and with "
			    "thread isolation (the %s backend) there are none",
			    be->name);
			return -1;
		}
		if (geteuid() != 0) {
			say("--user needs a runner started as root: only root "
			    "can switch its sessions to another user");
			return -1;
		}
		if (lookup_user(cfg->user, err) == -1) {
			say("%s", err);
			return -1;
		}
	} else if (iso != BE_ISOLATE_THREAD && !be->no_fork && geteuid() == 0)
		say("sessions run as root: start the runner with --user NAME "
		    "to run them as an unprivileged user");
	if (iso == BE_ISOLATE_THREAD && cfg->kernel_timeout > 0)
		say("--kernel-timeout has no effect with thread isolation (the "
		    "%s backend): a session thread cannot be stopped", be->name);
	if (iso == BE_ISOLATE_THREAD)
		say("sessions are not confined: with thread isolation (the %s "
		    "backend) every session runs in the runner's own process",
		    be->name);
	else if (be->no_fork)
		say("session processes are not confined: the %s backend's "
		    "driver needs more system calls than a filter would allow "
		    "(its kernels are GPU code, not code of this process)",
		    be->name);
	else if (cfg->no_confine)
		say("sessions are not confined (--no-confine): a kernel can "
		    "make any system call the runner can");
#ifndef __linux__
	else
		say("sessions are not confined on this system (seccomp is "
		    "Linux only)");
#endif
	return 0;
}

static int
switch_user(char *err)
{
	if (setgroups(1, &run_gid) == -1 || setgid(run_gid) == -1 ||
	    setuid(run_uid) == -1) {
		snprintf(err, PROTO_ERRLEN, "cannot switch to user %s: %s",
		    run_name, strerror(errno));
		return -1;
	}
	/* Root's saved IDs must be gone too, or a kernel could switch back. */
	if (getuid() != run_uid || geteuid() != run_uid ||
	    getgid() != run_gid || getegid() != run_gid ||
	    (run_uid != 0 && setuid(0) != -1)) {
		snprintf(err, PROTO_ERRLEN, "switching to user %s did not take",
		    run_name);
		return -1;
	}
#ifdef __linux__
	/* Changing credentials cleared the parent-death signal isolate.c set;
	 * the parent may have gone meanwhile. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 || getppid() == 1) {
		snprintf(err, PROTO_ERRLEN, "the runner has gone");
		return -1;
	}
#endif
	return 0;
}

#if defined(__linux__) && defined(__x86_64__)
#define CONFINE_ARCH AUDIT_ARCH_X86_64
#elif defined(__linux__) && defined(__aarch64__)
#define CONFINE_ARCH AUDIT_ARCH_AARCH64
#elif defined(__linux__) && defined(__riscv) && __riscv_xlen == 64
#define CONFINE_ARCH AUDIT_ARCH_RISCV64
#endif

#ifdef CONFINE_ARCH

/*
 * The system calls a session makes once confined, besides clone, clone3
 * and tgkill, which are checked further below. Arm64 and riscv64 lack
 * the old calls (poll, alarm, time): glibc uses the newer ones there.
 */
static const int allowed[] = {
	/* The client's socket, and log lines on stderr. */
	__NR_read, __NR_write, __NR_writev, __NR_recvfrom, __NR_recvmsg,
	__NR_sendto, __NR_sendmsg,
#ifdef __NR_poll
	__NR_poll,
#endif
	__NR_ppoll, __NR_shutdown, __NR_close,
	/* Buffers, programs (made executable), malloc, thread stacks. */
	__NR_mmap, __NR_munmap, __NR_mprotect, __NR_madvise, __NR_mremap,
	__NR_brk,
	/* The core pool's threads, their locks and their exit. */
	__NR_futex, __NR_set_robust_list,
#ifdef __NR_rseq
	__NR_rseq,
#endif
	__NR_sched_yield, __NR_sched_getaffinity, __NR_getpid, __NR_gettid,
	/* The crash handler and the kernel time limit. */
	__NR_rt_sigprocmask, __NR_rt_sigaction, __NR_rt_sigreturn,
	__NR_sigaltstack, __NR_restart_syscall,
#ifdef __NR_alarm
	__NR_alarm,
#endif
	__NR_setitimer, __NR_getitimer,
	/* Clocks (the vDSO's fallback), the authentication penalty's sleep. */
	__NR_clock_gettime, __NR_clock_getres, __NR_gettimeofday,
#ifdef __NR_time
	__NR_time,
#endif
	__NR_nanosleep, __NR_clock_nanosleep,
	/* The handshake's nonce. */
	__NR_getrandom,
#ifdef __NR_riscv_flush_icache
	/* __builtin___clear_cache after a program is loaded. */
	__NR_riscv_flush_icache,
#endif
	__NR_exit, __NR_exit_group,
};

/* A thread of this process, never a new process or namespace. */
#define THREAD_FLAGS (CLONE_VM | CLONE_SIGHAND | CLONE_THREAD)
#define NEW_NS (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | \
	CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)

#define MAXPROG 256
#define ARG0_LO offsetof(struct seccomp_data, args[0])	/* little-endian */

struct filter {
	struct sock_filter f[MAXPROG];
	unsigned n;
};

static void
emit(struct filter *p, uint16_t code, uint32_t k, uint8_t jt, uint8_t jf)
{
	struct sock_filter insn = BPF_JUMP(code, k, jt, jf);

	if (p->n < MAXPROG)
		p->f[p->n] = insn;
	p->n++;
}

#define LD(p, off)	emit(p, BPF_LD | BPF_W | BPF_ABS, off, 0, 0)
#define RET(p, v)	emit(p, BPF_RET | BPF_K, v, 0, 0)
#define JEQ(p, k, t, f)	emit(p, BPF_JMP | BPF_JEQ | BPF_K, k, t, f)

/* Async-signal-safe: name the call in the crash text, then report it as
 * any crash (launch.c). */
static void
on_sigsys(int sig, siginfo_t *si, void *uc)
{
	static const char pre[] = "crashed: SIGSYS (system call ";
	static const char post[] = " is not allowed: the session is confined)";
	static const char logpre[] = "warning: a confined session made system "
	    "call ";
	char num[16];
	unsigned nr = (unsigned)si->si_syscall;
	size_t i = sizeof(num), n;

	(void)uc;
	do
		num[--i] = (char)('0' + nr % 10);
	while ((nr /= 10) != 0 && i > 0);
	n = sizeof(pre) - 1;
	memcpy(sess_crash_sigsys, pre, n);
	memcpy(sess_crash_sigsys + n, num + i, sizeof(num) - i);
	n += sizeof(num) - i;
	memcpy(sess_crash_sigsys + n, post, sizeof(post));
	/* The log says which call, even when it was the runner's own. */
	(void)!write(STDERR_FILENO, logpre, sizeof(logpre) - 1);
	(void)!write(STDERR_FILENO, num + i, sizeof(num) - i);
	(void)!write(STDERR_FILENO, "\n", 1);
	sess_crash_signal(sig);
}

static int
install_filter(char *err)
{
	static struct filter p;
	struct sock_fprog fp;
	size_t i;

	p.n = 0;
	/* The numbers below are this ABI's: refuse another (i386's int 0x80,
	 * x32). A refused call traps like any other, so the client hears why. */
	LD(&p, offsetof(struct seccomp_data, arch));
	JEQ(&p, CONFINE_ARCH, 1, 0);
	RET(&p, SECCOMP_RET_TRAP);
	LD(&p, offsetof(struct seccomp_data, nr));
#ifdef __X32_SYSCALL_BIT
	emit(&p, BPF_JMP | BPF_JGE | BPF_K, __X32_SYSCALL_BIT, 0, 1);
	RET(&p, SECCOMP_RET_TRAP);
#endif
	for (i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++) {
		JEQ(&p, (uint32_t)allowed[i], 0, 1);
		RET(&p, SECCOMP_RET_ALLOW);
	}
	/* clone's flags are its first argument on all three ABIs; only the
	 * low 32 bits count (kernel_clone). */
	JEQ(&p, __NR_clone, 0, 5);
	LD(&p, ARG0_LO);
	emit(&p, BPF_ALU | BPF_AND | BPF_K, THREAD_FLAGS | NEW_NS, 0, 0);
	JEQ(&p, THREAD_FLAGS, 0, 1);
	RET(&p, SECCOMP_RET_ALLOW);
	RET(&p, SECCOMP_RET_TRAP);
#ifdef __NR_clone3
	/* clone3's flags are in memory, out of the filter's sight: ENOSYS
	 * makes glibc fall back to clone, checked above. */
	JEQ(&p, __NR_clone3, 0, 1);
	RET(&p, SECCOMP_RET_ERRNO | ENOSYS);
#endif
	/* raise() and abort(), for a fault of the runner's own: this process
	 * only. */
	JEQ(&p, __NR_tgkill, 0, 4);
	LD(&p, ARG0_LO);
	JEQ(&p, (uint32_t)getpid(), 0, 1);
	RET(&p, SECCOMP_RET_ALLOW);
	RET(&p, SECCOMP_RET_TRAP);
	RET(&p, SECCOMP_RET_TRAP);
	if (p.n > MAXPROG) {
		snprintf(err, PROTO_ERRLEN, "%s: the filter has %u instructions, "
		    "more than %d", __func__, p.n, MAXPROG);
		return -1;
	}
	fp.len = (unsigned short)p.n;
	fp.filter = p.f;
	/* No new privileges: required to install a filter unprivileged, and
	 * no set-user-ID program could undo the user switch anyway. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fp) == -1) {
		snprintf(err, PROTO_ERRLEN, "%s: cannot install the system call "
		    "filter: %s (start the runner with --no-confine to run "
		    "sessions unconfined)", __func__, strerror(errno));
		return -1;
	}
	return 0;
}

#endif /* CONFINE_ARCH */

/* The peer broker (peer_net.c) runs as --user's account too. It gets no
 * filter: making connections is its job, and the filter forbids them. */
int
confine_broker(const struct mr_config *cfg, char *err)
{
	if (cfg->user != NULL && run_name == NULL &&
	    lookup_user(cfg->user, err) == -1)
		return -1;
	if (cfg->user != NULL && switch_user(err) == -1)
		return -1;
	return 0;
}

int
confine_user(const struct mr_config *cfg, char *err)
{
	if (cfg->user != NULL && run_name == NULL &&
	    lookup_user(cfg->user, err) == -1)
		return -1;
	return cfg->user != NULL ? switch_user(err) : 0;
}

int
confine_session(const struct mr_config *cfg, char *err)
{
#ifdef CONFINE_ARCH
	struct sigaction sa;
#endif

	/* An embedder may not have called confine_init(). */
	if (cfg->user != NULL && run_name == NULL &&
	    lookup_user(cfg->user, err) == -1)
		return -1;
	if (cfg->user != NULL && switch_user(err) == -1)
		return -1;
	if (cfg->no_confine)
		return 0;
#ifdef CONFINE_ARCH
	/* log.c's localtime_r() would open /etc/localtime on first use. */
	tzset();
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigsys;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESETHAND;
	if (sigaction(SIGSYS, &sa, NULL) == -1) {
		snprintf(err, PROTO_ERRLEN, "%s: sigaction: %s", __func__,
		    strerror(errno));
		return -1;
	}
	return install_filter(err);
#elif defined(__linux__)
	snprintf(err, PROTO_ERRLEN, "%s: no system call filter for this "
	    "architecture (start the runner with --no-confine)", __func__);
	return -1;
#else
	return 0;	/* confine_init() said so at start */
#endif
}
