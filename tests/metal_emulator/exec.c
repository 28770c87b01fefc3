/*
 * exec.c: running one dispatch of a compute kernel on the CPU.
 * TEST HARNESS ONLY (see README.md).
 *
 * Threadgroups run one after another. A kernel that never synchronizes
 * (no threadgroup_barrier, no simdgroup function) runs its threads one
 * after another on the calling thread: nothing can tell the difference.
 * One that does runs each thread of a threadgroup on its own OS thread of
 * a pool, so barriers and simdgroup exchanges block and wake as on a GPU.
 * Threads that return early stop counting towards barriers, so a kernel
 * whose threads leave before a barrier does not hang the emulator.
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
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"

#define EMU_MAX_THREADS 1024
#define SIMD_MAX_BYTES 256	/* per lane per simd_exchange */
#define POOL_STACK (512 * 1024)
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

/* The pool's view of the threadgroup being run (under team.mu). */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t go, done, bar;
	unsigned nworkers;
	unsigned gen;		/* bumped for each threadgroup */
	unsigned active;	/* threads in this threadgroup */
	unsigned finished;	/* returned (or faulted) */
	unsigned arrived;	/* waiting at the current barrier */
	unsigned bargen;
	int aborted;
	char fault[256];
	const struct emu_dispatch *d;
	void *const *ptrs;	/* the argument table as the thunk takes it */
	uint32_t group[3];
	uint8_t *scratch;	/* simd_exchange: SIMD_MAX_BYTES per thread */
} team = {
	PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
	PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
	0, 0, 0, 0, 0, 0, 0, "", NULL, NULL, { 0, 0, 0 }, NULL
};

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

/* ---- the pool: one OS thread per GPU thread of a threadgroup ---- */

static void
team_abort(const char *why)
{
	if (!team.aborted) {
		team.aborted = 1;
		snprintf(team.fault, sizeof(team.fault), "%s", why);
	}
	pthread_cond_broadcast(&team.bar);
}

/* A thread left the kernel: a barrier the others wait at may now be
 * complete without it. Under team.mu. */
static void
team_finish(void)
{
	team.finished++;
	if (team.arrived > 0 && team.arrived + team.finished == team.active) {
		team.arrived = 0;
		team.bargen++;
		pthread_cond_broadcast(&team.bar);
	}
	if (team.finished == team.active)
		pthread_cond_signal(&team.done);
}

static void
run_pooled(unsigned i)
{
	const struct emu_dispatch *d = team.d;
	struct gthread *t = cur;
	uint32_t lx, ly, lz;
	char err[256];

	lx = i % d->tg[0];
	ly = i / d->tg[0] % d->tg[1];
	lz = i / (d->tg[0] * d->tg[1]);
	set_ids(t, d, team.group, lx, ly, lz);
	if (sigsetjmp(t->jb, 1) == 0) {
		t->in_kernel = 1;
		d->k->thunk(team.ptrs, &t->ids);
		t->in_kernel = 0;
	} else if (t->fault_sig != 0) {
		describe_fault(err, sizeof(err), d, t);
		pthread_mutex_lock(&team.mu);
		team_abort(err);
		pthread_mutex_unlock(&team.mu);
	}
	/* else: left a barrier because another thread faulted */
}

static void *
worker(void *arg)
{
	unsigned i = (unsigned)(uintptr_t)arg, mygen = 0;
	struct gthread t;

	memset(&t, 0, sizeof(t));
	cur = &t;
	alt_stack();
	pthread_mutex_lock(&team.mu);
	for (;;) {
		while (team.gen == mygen)
			pthread_cond_wait(&team.go, &team.mu);
		mygen = team.gen;
		if (i >= team.active)
			continue;
		pthread_mutex_unlock(&team.mu);
		t.fault_sig = 0;
		run_pooled(i);
		pthread_mutex_lock(&team.mu);
		team_finish();
	}
	return NULL;
}

static int
team_grow(unsigned n)
{
	pthread_attr_t attr;
	pthread_t th;

	if (team.scratch == NULL && (team.scratch = calloc(EMU_MAX_THREADS,
	    SIMD_MAX_BYTES)) == NULL)
		return -1;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, POOL_STACK);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	while (team.nworkers < n) {
		if (pthread_create(&th, &attr, worker,
		    (void *)(uintptr_t)team.nworkers) != 0) {
			pthread_attr_destroy(&attr);
			return -1;
		}
		team.nworkers++;
	}
	pthread_attr_destroy(&attr);
	return 0;
}

static void
rt_barrier(void)
{
	unsigned g;

	pthread_mutex_lock(&team.mu);
	if (!team.aborted) {
		if (++team.arrived + team.finished == team.active) {
			team.arrived = 0;
			team.bargen++;
			pthread_cond_broadcast(&team.bar);
		} else {
			g = team.bargen;
			while (team.bargen == g && !team.aborted)
				pthread_cond_wait(&team.bar, &team.mu);
		}
	}
	if (team.aborted) {
		pthread_mutex_unlock(&team.mu);
		cur->in_kernel = 0;
		siglongjmp(cur->jb, 2);
	}
	pthread_mutex_unlock(&team.mu);
}

static void
rt_simd_exchange(const void *mine, void *all, size_t n)
{
	unsigned lane0, i;

	if (team.d == NULL || n > SIMD_MAX_BYTES) {
		/* a simdgroup function in a kernel the emulator runs
		 * sequentially cannot happen: library.m routes every kernel
		 * that mentions one to the pool */
		fprintf(stderr, "metal emulator: simd_exchange of %zu bytes "
		    "outside a pooled threadgroup\n", n);
		abort();
	}
	memcpy(team.scratch + (size_t)cur->linear * n, mine, n);
	rt_barrier();
	lane0 = cur->linear / METAL_EMU_SIMD_WIDTH * METAL_EMU_SIMD_WIDTH;
	for (i = 0; i < METAL_EMU_SIMD_WIDTH; i++)
		if (lane0 + i < team.active)
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

static int
run_group_pooled(const struct emu_dispatch *d, void *const *ptrs,
    const uint32_t g[3], unsigned n, char *err, size_t errlen)
{
	pthread_mutex_lock(&team.mu);
	if (team_grow(n) == -1) {
		pthread_mutex_unlock(&team.mu);
		snprintf(err, errlen, "the emulator could not start %u "
		    "threads: %s", n, strerror(errno));
		return -1;
	}
	team.d = d;
	team.ptrs = ptrs;
	memcpy(team.group, g, sizeof(team.group));
	team.active = n;
	team.finished = team.arrived = 0;
	team.aborted = 0;
	team.fault[0] = '\0';
	team.gen++;
	pthread_cond_broadcast(&team.go);
	while (team.finished < team.active)
		pthread_cond_wait(&team.done, &team.mu);
	team.active = 0;
	team.d = NULL;
	pthread_mutex_unlock(&team.mu);
	if (team.aborted) {
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

	for (i = 0; i < METAL_EMU_MAX_PARAMS; i++)
		ptrs[i] = d->args[i].ptr;
	emu_exec_init();
	pthread_mutex_lock(&exec_lock);
	if (!d->threaded) {
		rc = run_sequential(d, ptrs, err, errlen);
		pthread_mutex_unlock(&exec_lock);
		return rc;
	}
	for (g[2] = 0; g[2] < d->grid[2] && rc == 0; g[2]++)
		for (g[1] = 0; g[1] < d->grid[1] && rc == 0; g[1]++)
			for (g[0] = 0; g[0] < d->grid[0] && rc == 0; g[0]++)
				rc = run_group_pooled(d, ptrs, g, n, err,
				    errlen);
	pthread_mutex_unlock(&exec_lock);
	return rc;
}

void
emu_exec_thread_init(void)
{
	alt_stack();
}
