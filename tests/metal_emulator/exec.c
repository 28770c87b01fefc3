/*
 * exec.c: running one dispatch of a compute kernel on the CPU.
 * TEST HARNESS ONLY (see README.md).
 *
 * Threadgroups run one after another, on the thread of the queue that
 * committed the work. A kernel that never synchronizes (no
 * threadgroup_barrier, no simdgroup function) runs its threads one after
 * another: nothing can tell the difference. One that does runs each thread
 * of a threadgroup as a fiber with its own stack, so barriers and
 * simdgroup exchanges wait for the others as on a GPU (see "fibers"
 * below). Threads that return early stop counting towards barriers, so a
 * kernel whose threads leave before a barrier does not hang the emulator.
 *
 * Dispatches of all queues are serialized by one lock: a threadgroup's
 * `threadgroup` memory is a function-local static of the kernel library
 * (see include/metal_stdlib), so two threadgroups of one kernel must never
 * run at once. A real GPU runs queues concurrently; the emulator's queues
 * still run asynchronously to the code that commits to them.
 *
 * A memory access outside any buffer hits a guard page (device.m) or
 * unmapped memory: the SIGSEGV/SIGBUS is caught on the thread that made
 * it and fails the dispatch, as an Apple GPU's page fault fails the
 * command buffer. Faults outside kernel code keep their default action.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* Fibers switch stacks with _longjmp, which fortified glibc refuses. */
#undef _FORTIFY_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include "exec.h"

#define EMU_MAX_THREADS 1024
#define SIMD_MAX_BYTES 256	/* per lane per simd_exchange */
#define FIBER_STACK (256 * 1024)
#define ALT_STACK (64 * 1024)

/* The GPU thread running on this OS thread. */
struct gthread {
	struct metal_emu_ids ids;
	unsigned linear;	/* thread_index_in_threadgroup */
	sigjmp_buf jb;
	volatile sig_atomic_t in_kernel;
	void *volatile fault_addr;
	volatile int fault_sig;
};

static __thread struct gthread *cur;
static pthread_mutex_t exec_lock = PTHREAD_MUTEX_INITIALIZER;

static void
set_ids(struct gthread *t, const struct emu_dispatch *d,
    const uint32_t g[3], uint32_t lx, uint32_t ly, uint32_t lz)
{
	uint32_t (*v)[3] = t->ids.v;
	int i;

	v[METAL_EMU_THREADGROUP_POSITION_IN_GRID][0] = g[0];
	v[METAL_EMU_THREADGROUP_POSITION_IN_GRID][1] = g[1];
	v[METAL_EMU_THREADGROUP_POSITION_IN_GRID][2] = g[2];
	v[METAL_EMU_THREAD_POSITION_IN_THREADGROUP][0] = lx;
	v[METAL_EMU_THREAD_POSITION_IN_THREADGROUP][1] = ly;
	v[METAL_EMU_THREAD_POSITION_IN_THREADGROUP][2] = lz;
	for (i = 0; i < 3; i++) {
		v[METAL_EMU_THREAD_POSITION_IN_GRID][i] = g[i] * d->tg[i] +
		    v[METAL_EMU_THREAD_POSITION_IN_THREADGROUP][i];
		v[METAL_EMU_THREADS_PER_THREADGROUP][i] = d->tg[i];
		v[METAL_EMU_THREADGROUPS_PER_GRID][i] = d->grid[i];
		v[METAL_EMU_THREADS_PER_GRID][i] = d->grid[i] * d->tg[i];
	}
	t->linear = lx + ly * d->tg[0] + lz * d->tg[0] * d->tg[1];
	v[METAL_EMU_THREAD_INDEX_IN_THREADGROUP][0] = t->linear;
	v[METAL_EMU_THREAD_INDEX_IN_SIMDGROUP][0] = t->linear %
	    METAL_EMU_SIMD_WIDTH;
	v[METAL_EMU_SIMDGROUP_INDEX_IN_THREADGROUP][0] = t->linear /
	    METAL_EMU_SIMD_WIDTH;
}

static void
describe_fault(char *err, size_t errlen, const struct emu_dispatch *d,
    const struct gthread *t)
{
	const uint32_t *g = t->ids.v[METAL_EMU_THREADGROUP_POSITION_IN_GRID];
	const uint32_t *l = t->ids.v[METAL_EMU_THREAD_POSITION_IN_THREADGROUP];

	if (t->fault_sig == SIGFPE)
		snprintf(err, errlen, "kernel %s: integer division by zero in "
		    "threadgroup (%u,%u,%u) thread (%u,%u,%u) (a GPU gives an "
		    "undefined value here; the emulator's CPU traps)",
		    d->k->name, g[0], g[1], g[2], l[0], l[1], l[2]);
	else
		snprintf(err, errlen, "Execution of the command buffer was "
		    "aborted due to an error during execution. Caused GPU "
		    "Address Fault Error (0000000b:kIOGPUCommandBufferCallback"
		    "ErrorPageFault) [emulated: kernel %s, threadgroup "
		    "(%u,%u,%u) thread (%u,%u,%u) accessed %p, outside every "
		    "buffer bound to it]", d->k->name, g[0], g[1], g[2], l[0],
		    l[1], l[2], t->fault_addr);
}

static void
on_fault(int sig, siginfo_t *si, void *uc)
{
	struct gthread *t = cur;

	(void)uc;
	if (t == NULL || !t->in_kernel) {
		/* Not kernel code: the emulator's or the runner's own bug. */
		signal(sig, SIG_DFL);
		return;
	}
	t->in_kernel = 0;
	t->fault_addr = si->si_addr;
	t->fault_sig = sig;
	siglongjmp(t->jb, 1);
}

static void
alt_stack(void)
{
	stack_t ss;

	memset(&ss, 0, sizeof(ss));
	if ((ss.ss_sp = malloc(ALT_STACK)) == NULL)
		return;
	ss.ss_size = ALT_STACK;
	sigaltstack(&ss, NULL);
}

static void
install_handlers(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGFPE, &sa, NULL);
}

void
emu_exec_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, install_handlers);
}

/* ---- fibers: one context per GPU thread of a threadgroup ---- */

/*
 * Each GPU thread of a threadgroup that synchronizes gets its own stack
 * and registers (a ucontext fiber), and the scheduler, on the queue's OS
 * thread, resumes them in turn: a fiber runs until it reaches a barrier or
 * returns, so after one pass every live fiber waits at the same barrier,
 * and the next pass takes them all past it. Fibers rather than one OS
 * thread per GPU thread: the semantics are the same (a barrier returns
 * only when every thread still running has reached it), but a barrier
 * costs a context switch per thread instead of waking as many OS threads
 * on two cores; with OS threads a TinyJit MLP step took seconds.
 */

struct fiber {
	struct gthread t;
	ucontext_t ctx;		/* to start it */
	jmp_buf sw;		/* to resume it at a barrier */
	void *stack;
	int started, done;
};

static struct {
	struct fiber *f;	/* EMU_MAX_THREADS of them, made once */
	unsigned n;		/* fibers in the running threadgroup */
	ucontext_t sched_uc;	/* what starting a fiber leaves behind */
	jmp_buf sched;		/* the scheduler, between fibers */
	const struct emu_dispatch *d;
	void *const *ptrs;
	uint32_t group[3];
	int aborted;
	char fault[256];
	uint8_t *scratch;	/* simd_exchange: SIMD_MAX_BYTES per thread */
} team;

static void
fiber_main(unsigned i)
{
	struct fiber *f = &team.f[i];
	const struct emu_dispatch *d = team.d;
	char err[256];

	if (sigsetjmp(f->t.jb, 1) == 0) {
		f->t.in_kernel = 1;
		d->k->thunk(team.ptrs, &f->t.ids);
		f->t.in_kernel = 0;
	} else if (f->t.fault_sig != 0 && !team.aborted) {
		describe_fault(err, sizeof(err), d, &f->t);
		team.aborted = 1;
		snprintf(team.fault, sizeof(team.fault), "%s", err);
	}
	f->done = 1;
	_longjmp(team.sched, 1);
}

static int
team_init(void)
{
	unsigned i;

	if (team.f != NULL)
		return 0;
	if ((team.f = calloc(EMU_MAX_THREADS, sizeof(*team.f))) == NULL ||
	    (team.scratch = calloc(EMU_MAX_THREADS, SIMD_MAX_BYTES)) == NULL)
		return -1;
	for (i = 0; i < EMU_MAX_THREADS; i++) {
		/* Mapped, not touched: pages are taken only as used. */
		uint8_t *m = mmap(NULL, FIBER_STACK + 4096, PROT_READ |
		    PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		    -1, 0);
		if (m == MAP_FAILED)
			return -1;
		/* A guard page below: an overflowing kernel faults. */
		mprotect(m, 4096, PROT_NONE);
		team.f[i].stack = m + 4096;
	}
	return 0;
}

static void
rt_barrier(void)
{
	struct fiber *f = (struct fiber *)cur;

	/* Back to the scheduler; it resumes this fiber once every live
	 * fiber has arrived here. */
	cur->in_kernel = 0;
	if (_setjmp(f->sw) == 0)
		_longjmp(team.sched, 1);
	cur = &f->t;
	if (team.aborted)
		siglongjmp(f->t.jb, 2);	/* another thread faulted */
	cur->in_kernel = 1;
}

static void
rt_simd_exchange(const void *mine, void *all, size_t n)
{
	unsigned lane0, i;

	if (team.d == NULL || n > SIMD_MAX_BYTES) {
		/* library.c routes every kernel that mentions a simdgroup
		 * function to the fibers: this cannot happen */
		fprintf(stderr, "metal emulator: simd_exchange of %zu bytes "
		    "outside a threadgroup of fibers\n", n);
		abort();
	}
	memcpy(team.scratch + (size_t)cur->linear * n, mine, n);
	rt_barrier();
	lane0 = cur->linear / METAL_EMU_SIMD_WIDTH * METAL_EMU_SIMD_WIDTH;
	for (i = 0; i < METAL_EMU_SIMD_WIDTH; i++)
		if (lane0 + i < team.n)
			memcpy((uint8_t *)all + i * n, team.scratch +
			    (size_t)(lane0 + i) * n, n);
		else
			memset((uint8_t *)all + i * n, 0, n);
	rt_barrier();
}

static unsigned
rt_simd_lane(void)
{
	return cur->linear % METAL_EMU_SIMD_WIDTH;
}

const struct metal_emu_rt emu_rt = {
	rt_barrier, rt_simd_exchange, rt_simd_lane
};

/*
 * Run f until its next barrier or its end. A fiber is started with
 * swapcontext, and switched with _setjmp/_longjmp from then on: unlike
 * swapcontext they save no signal mask, so a switch makes no system call.
 */
static void
resume(struct fiber *f)
{
	cur = &f->t;
	if (_setjmp(team.sched) != 0)
		return;
	if (!f->started) {
		f->started = 1;
		swapcontext(&team.sched_uc, &f->ctx);
	} else
		_longjmp(f->sw, 1);
}

static int
run_group_fibers(const struct emu_dispatch *d, void *const *ptrs,
    const uint32_t g[3], unsigned n, char *err, size_t errlen)
{
	struct gthread *volatile saved = cur;
	unsigned i, live;

	team.d = d;
	team.ptrs = ptrs;
	memcpy(team.group, g, sizeof(team.group));
	team.n = n;
	team.aborted = 0;
	team.fault[0] = '\0';
	for (i = 0; i < n; i++) {
		struct fiber *f = &team.f[i];
		memset(&f->t, 0, sizeof(f->t));
		set_ids(&f->t, d, g, i % d->tg[0], i / d->tg[0] % d->tg[1],
		    i / (d->tg[0] * d->tg[1]));
		f->done = f->started = 0;
		getcontext(&f->ctx);
		f->ctx.uc_stack.ss_sp = f->stack;
		f->ctx.uc_stack.ss_size = FIBER_STACK;
		f->ctx.uc_link = NULL;	/* fiber_main never returns */
		makecontext(&f->ctx, (void (*)(void))fiber_main, 1, i);
	}
	do {
		/* One pass: each live fiber runs to its next barrier or end. */
		for (i = live = 0; i < n && !team.aborted; i++) {
			if (team.f[i].done)
				continue;
			resume(&team.f[i]);
			live += !team.f[i].done;
		}
	} while (live > 0 && !team.aborted);
	cur = saved;
	team.d = NULL;
	if (team.aborted) {
		/* The fibers left at a barrier are abandoned: their stacks are
		 * made anew for the next threadgroup. */
		snprintf(err, errlen, "%s", team.fault);
		return -1;
	}
	return 0;
}

/* ---- sequential: threads one after another on this OS thread ---- */

static int
run_sequential(const struct emu_dispatch *d, void *const *ptrs, char *err,
    size_t errlen)
{
	struct gthread t, *volatile saved = cur;
	volatile uint32_t gx = 0, gy = 0, gz = 0;
	uint32_t g[3], lx, ly, lz;

	memset(&t, 0, sizeof(t));
	cur = &t;
	if (sigsetjmp(t.jb, 1) != 0) {
		describe_fault(err, errlen, d, &t);
		cur = saved;
		return -1;
	}
	for (; gz < d->grid[2]; gz++, gy = 0)
		for (; gy < d->grid[1]; gy++, gx = 0)
			for (; gx < d->grid[0]; gx++) {
				g[0] = gx;
				g[1] = gy;
				g[2] = gz;
				for (lz = 0; lz < d->tg[2]; lz++)
					for (ly = 0; ly < d->tg[1]; ly++)
						for (lx = 0; lx < d->tg[0];
						    lx++) {
							set_ids(&t, d, g, lx,
							    ly, lz);
							t.in_kernel = 1;
							d->k->thunk(ptrs,
							    &t.ids);
							t.in_kernel = 0;
						}
			}
	cur = saved;
	return 0;
}

int
emu_exec(const struct emu_dispatch *d, char *err, size_t errlen)
{
	void *ptrs[METAL_EMU_MAX_PARAMS];
	uint32_t g[3];
	unsigned n = d->tg[0] * d->tg[1] * d->tg[2], i;
	int rc = 0;

	/* An index left unbound (a parameter the kernel does not use: the
	 * validation skips it) reads zeros, not NULL, as its thunk still
	 * fetches every parameter. */
	static uint64_t unbound[512];

	for (i = 0; i < METAL_EMU_MAX_PARAMS; i++)
		ptrs[i] = d->args[i].ptr != NULL ? d->args[i].ptr : unbound;
	emu_exec_init();
	pthread_mutex_lock(&exec_lock);
	if (!d->threaded) {
		rc = run_sequential(d, ptrs, err, errlen);
		pthread_mutex_unlock(&exec_lock);
		return rc;
	}
	if (team_init() == -1) {
		pthread_mutex_unlock(&exec_lock);
		snprintf(err, errlen, "the Metal emulator has no memory for "
		    "%u thread stacks", EMU_MAX_THREADS);
		return -1;
	}
	for (g[2] = 0; g[2] < d->grid[2] && rc == 0; g[2]++)
		for (g[1] = 0; g[1] < d->grid[1] && rc == 0; g[1]++)
			for (g[0] = 0; g[0] < d->grid[0] && rc == 0; g[0]++)
				rc = run_group_fibers(d, ptrs, g, n, err,
				    errlen);
	pthread_mutex_unlock(&exec_lock);
	return rc;
}

void
emu_exec_thread_init(void)
{
	alt_stack();
}
