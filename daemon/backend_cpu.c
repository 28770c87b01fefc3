/*
 * backend_cpu.c: runs tinygrad's clang-compiled CPU kernels.
 *
 * The client relocates clang's object file on the host (tinygrad's ELF
 * loader, base 0) and sends position-independent machine code. Here it is
 * mapped writable, filled, then made executable: never both at once (on
 * Apple silicon MAP_JIT with pthread_jit_write_protect_np flips the same
 * pages). A kernel is called the way tinygrad's CPUProgram calls it: every
 * argument a 64-bit word, buffer addresses then integer values. Passing all
 * PROTO_MAX_ARGS words to a function that takes fewer is safe on the SysV
 * x86-64, AAPCS64 and RISC-V LP64D ABIs, where the caller owns the stack
 * arguments; tinygrad's own CPU worker does the same.
 *
 * The CPU is reported as it is (Rhello cpu and features, in clang's
 * names), so the host compiles for what this machine has and never for an
 * instruction it lacks: x86-64 the psABI level plus the extensions beyond
 * it (cpuid), arm64 the kernel's HWCAP bits, riscv64 the ISA string.
 *
 * A kernel with a core_id argument is called global[0] times with core_id
 * 0..global[0]-1; the calls run on a per-session pool of threads.
 */
#include <sys/mman.h>
#include <sys/types.h>
#ifdef __APPLE__
#include <sys/sysctl.h>
#include <libkern/OSCacheControl.h>
#endif

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__) && (defined(__aarch64__) || defined(__riscv))
#include <sys/auxv.h>
#endif

#include "metal_runner.h"
#include "monotime.h"
#include "proto.h"

#if defined(__x86_64__)
#define CPU_ARCH PROTO_ARCH_X86_64
#define CPU_ARCH_NAME "x86_64"
#elif defined(__aarch64__)
#define CPU_ARCH PROTO_ARCH_ARM64
#define CPU_ARCH_NAME "arm64"
#elif defined(__riscv) && __riscv_xlen == 64
#define CPU_ARCH PROTO_ARCH_RISCV64
#define CPU_ARCH_NAME "riscv64"
#else
#define CPU_ARCH PROTO_ARCH_NONE
#define CPU_ARCH_NAME "unknown"
#endif

#define A(i) uint64_t a##i
typedef void (*kernel_fn)(A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7),
    A(8), A(9), A(10), A(11), A(12), A(13), A(14), A(15), A(16), A(17),
    A(18), A(19), A(20), A(21), A(22), A(23), A(24), A(25), A(26), A(27),
    A(28), A(29), A(30), A(31), A(32), A(33), A(34), A(35), A(36), A(37),
    A(38), A(39), A(40), A(41), A(42), A(43), A(44), A(45), A(46), A(47),
    A(48), A(49), A(50), A(51), A(52), A(53), A(54), A(55), A(56), A(57),
    A(58), A(59), A(60), A(61), A(62));
#undef A

struct be_buffer {
	void *mem;
	uint64_t size;
};

struct be_program {
	void *code;
	size_t maplen;
	kernel_fn fn;
	uint16_t corearg;
};

/* A launch being spread across the pool: workers take core ids in turn. */
struct pool_job {
	kernel_fn fn;
	uint64_t args[PROTO_MAX_ARGS];
	uint16_t corearg;
	uint32_t count;
	uint32_t next;		/* next core id to run */
	uint32_t done;		/* core ids finished */
};

struct be_session {
	pthread_t *threads;
	uint32_t nthreads;
	pthread_mutex_t lock;
	pthread_cond_t work;	/* a job was posted, or quit */
	pthread_cond_t idle;	/* the job finished */
	struct pool_job *job;
	uint64_t generation;
	int quit;
};

static struct be_info cpu_info;

static void
call(kernel_fn fn, const uint64_t *a)
{
	fn(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10],
	    a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19],
	    a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28],
	    a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37],
	    a[38], a[39], a[40], a[41], a[42], a[43], a[44], a[45], a[46],
	    a[47], a[48], a[49], a[50], a[51], a[52], a[53], a[54], a[55],
	    a[56], a[57], a[58], a[59], a[60], a[61], a[62]);
}

/* Where the extensions are read at run time (cpuid, HWCAP, the ISA string).
 * macOS arm64 reports none: its cpu name, apple-m1, implies what every
 * Apple-silicon Mac has. */
#if defined(__x86_64__) || \
    (defined(__linux__) && (defined(__aarch64__) || defined(__riscv)))

/* Appends "+name" to the comma-separated list f (size len), if it fits:
 * Rhello has 128 bytes, and a feature left out only means code that does
 * not use it. */
static void
feat_add(char *f, size_t len, const char *name)
{
	size_t n = strlen(f);

	if (n + strlen(name) + 3 <= len)
		snprintf(f + n, len - n, "%s+%s", n ? "," : "", name);
}
#endif

#if defined(__x86_64__)
/* CPU features clang knows that the x86-64 levels leave out (or that a CPU
 * of a lower level may still have), with the level that implies each. The
 * AVX and AVX-512 ones also need the OS to save their registers (XCR0). */
struct x86_feat {
	unsigned leaf, sub, reg, bit;	/* reg: 0 eax, 1 ebx, 2 ecx, 3 edx */
	int level;			/* implied at x86-64-v<level>; 9: never */
	uint64_t xcr0;
	const char *name;
};

static const struct x86_feat x86_feats[] = {
	{ 1, 0, 2, 28, 3, 0x06, "avx" },
	{ 1, 0, 2, 29, 3, 0x06, "f16c" },
	{ 1, 0, 2, 12, 3, 0x06, "fma" },
	{ 7, 0, 1, 5, 3, 0x06, "avx2" },
	{ 7, 0, 1, 16, 4, 0xe6, "avx512f" },
	{ 7, 1, 0, 5, 9, 0xe6, "avx512bf16" },
	{ 7, 0, 3, 23, 9, 0xe6, "avx512fp16" },
	{ 7, 0, 2, 11, 9, 0xe6, "avx512vnni" },
	{ 7, 1, 0, 4, 9, 0x06, "avxvnni" },
	{ 7, 0, 1, 21, 9, 0xe6, "avx512ifma" },
	{ 7, 0, 2, 1, 9, 0xe6, "avx512vbmi" },
	{ 7, 0, 2, 6, 9, 0xe6, "avx512vbmi2" },
	{ 7, 0, 2, 12, 9, 0xe6, "avx512bitalg" },
	{ 7, 0, 2, 14, 9, 0xe6, "avx512vpopcntdq" },
	{ 7, 0, 2, 8, 9, 0x00, "gfni" },
};

/* The x86-64 microarchitecture level (psABI v2/v3/v4) this CPU and OS
 * support, so the host compiles with -march=x86-64-vN and never for
 * features the runner lacks; features gets what the CPU has beyond it. */
static const char *
x86_level(char *features, size_t flen)
{
	unsigned a, b, c, d, c1, b7 = 0, ce = 0, r[4];
	uint64_t xcr0 = 0;
	int v2, v3, v4, level;
	size_t i;

	if (!__get_cpuid(1, &a, &b, &c1, &d))
		return "x86-64";
	__get_cpuid_count(7, 0, &a, &b7, &c, &d);
	if (__get_cpuid(0x80000001, &a, &b, &ce, &d) == 0)
		ce = 0;
	if (c1 & (1u << 27)) {	/* OSXSAVE: the OS saves AVX state */
		unsigned lo, hi;
		__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
		xcr0 = ((uint64_t)hi << 32) | lo;
	}
	v2 = (c1 & (1u << 0)) && (c1 & (1u << 9)) && (c1 & (1u << 13)) &&
	    (c1 & (1u << 19)) && (c1 & (1u << 20)) && (c1 & (1u << 23)) &&
	    (ce & 1u);
	v3 = v2 && (c1 & (1u << 12)) && (c1 & (1u << 22)) &&
	    (c1 & (1u << 28)) && (c1 & (1u << 29)) && (b7 & (1u << 3)) &&
	    (b7 & (1u << 5)) && (b7 & (1u << 8)) && (ce & (1u << 5)) &&
	    (xcr0 & 6) == 6;
	v4 = v3 && (b7 & (1u << 16)) && (b7 & (1u << 17)) &&
	    (b7 & (1u << 28)) && (b7 & (1u << 30)) && (b7 & (1u << 31)) &&
	    (xcr0 & 0xe6) == 0xe6;
	level = v4 ? 4 : v3 ? 3 : v2 ? 2 : 1;
	for (i = 0; i < sizeof(x86_feats) / sizeof(x86_feats[0]); i++) {
		const struct x86_feat *f = &x86_feats[i];
		if (f->level <= level || (xcr0 & f->xcr0) != f->xcr0 ||
		    !__get_cpuid_count(f->leaf, f->sub, &r[0], &r[1], &r[2],
		    &r[3]) || !(r[f->reg] & (1u << f->bit)))
			continue;
		feat_add(features, flen, f->name);
	}
	return level == 4 ? "x86-64-v4" : level == 3 ? "x86-64-v3" :
	    level == 2 ? "x86-64-v2" : "x86-64";
}
#endif

#if defined(__linux__) && defined(__aarch64__)
/* The kernel's HWCAP bits (<asm/hwcap.h>) and clang's -mcpu modifier for
 * each. "generic" already assumes FP and Advanced SIMD (simd), which every
 * Linux arm64 board has. */
static const struct {
	int word;			/* 1: AT_HWCAP, 2: AT_HWCAP2 */
	unsigned long bit;
	const char *name;
} arm_feats[] = {
	{ 1, 1ul << 7, "crc" },		/* HWCAP_CRC32 */
	{ 1, 1ul << 8, "lse" },		/* HWCAP_ATOMICS */
	{ 1, 1ul << 12, "rdm" },	/* HWCAP_ASIMDRDM */
	{ 1, 1ul << 20, "dotprod" },	/* HWCAP_ASIMDDP */
	{ 1, 1ul << 23, "fp16fml" },	/* HWCAP_ASIMDFHM */
	{ 1, 1ul << 22, "sve" },	/* HWCAP_SVE */
	{ 2, 1ul << 1, "sve2" },	/* HWCAP2_SVE2 */
	{ 2, 1ul << 13, "i8mm" },	/* HWCAP2_I8MM */
	{ 2, 1ul << 14, "bf16" },	/* HWCAP2_BF16 */
};

static void
arm_features(char *features, size_t flen)
{
	unsigned long hw[3] = { 0, getauxval(AT_HWCAP), getauxval(AT_HWCAP2) };
	size_t i;

	/* Half precision arithmetic: scalar (FPHP) and vector (ASIMDHP). */
	if ((hw[1] & (1ul << 9)) && (hw[1] & (1ul << 10)))
		feat_add(features, flen, "fp16");
	for (i = 0; i < sizeof(arm_feats) / sizeof(arm_feats[0]); i++)
		if (hw[arm_feats[i].word] & arm_feats[i].bit)
			feat_add(features, flen, arm_feats[i].name);
}
#endif

#if defined(__linux__) && defined(__riscv)
static char *cpuinfo(const char *, char *, size_t);

/* The ISA as clang's -march wants it: "rv64" and the single-letter
 * extensions in canonical order as cpu, the multi-letter ones clang knows
 * as features. From /proc/cpuinfo's isa line (first hart) when the kernel
 * gives one ("rv64imafdcv_zicsr_zfh"), else from AT_HWCAP's letter bits. */
static void
rv_isa(char *cpu, size_t clen, char *features, size_t flen)
{
	static const char *const multi[] = { "zba", "zbb", "zbc", "zbs", "zfh",
	    "zfhmin" };
	unsigned long hw = getauxval(AT_HWCAP);
	char line[1024], *isa, *tok, *save;
	const char *l;
	size_t i, n;

	if ((isa = cpuinfo("isa", line, sizeof(line))) != NULL &&
	    strncmp(isa, "rv64", 4) == 0) {
		hw = 0;
		for (i = 4; isa[i] != '\0' && isa[i] != '_'; i++)
			if (isa[i] >= 'a' && isa[i] <= 'z')
				hw |= 1ul << (isa[i] - 'a');
		if (hw & (1ul << ('g' - 'a')))	/* g: imafd */
			hw |= 1ul << ('i' - 'a') | 1ul << ('m' - 'a') |
			    1ul << ('a' - 'a') | 1ul << ('f' - 'a') |
			    1ul << ('d' - 'a');
		for (tok = strtok_r(isa + i, "_", &save); tok != NULL;
		    tok = strtok_r(NULL, "_", &save))
			for (n = 0; n < sizeof(multi) / sizeof(multi[0]); n++)
				if (strcmp(tok, multi[n]) == 0)
					feat_add(features, flen, multi[n]);
	}
	n = (size_t)snprintf(cpu, clen, "rv64");
	for (l = "imafdcv"; *l != '\0' && n + 1 < clen; l++)
		if (hw & (1ul << (*l - 'a')))
			cpu[n++] = *l, cpu[n] = '\0';
}
#endif

#ifndef __APPLE__
/* The value of the first "key : value" line of /proc/cpuinfo, in buf; NULL
 * if there is none. Under qemu-user this is the host's file. */
static char *
cpuinfo(const char *key, char *buf, size_t len)
{
	size_t klen = strlen(key);
	char *v = NULL;
	FILE *f = fopen("/proc/cpuinfo", "r");

	while (f != NULL && fgets(buf, (int)len, f) != NULL) {
		if (strncmp(buf, key, klen) != 0 ||
		    buf[klen + strspn(buf + klen, " \t")] != ':')
			continue;
		v = buf + klen + strspn(buf + klen, " \t") + 1;
		v += strspn(v, " \t");
		v[strcspn(v, "\n")] = '\0';
		break;
	}
	if (f != NULL)
		fclose(f);
	return v;
}
#endif

static void
cpu_model(char *name, size_t len)
{
#ifdef __APPLE__
	size_t n = len;
	if (sysctlbyname("machdep.cpu.brand_string", name, &n, NULL, 0) == 0)
		return;
#else
	char line[256], *v;

	if ((v = cpuinfo("model name", line, sizeof(line))) != NULL) {
		snprintf(name, len, "%s", v);
		return;
	}
#endif
	snprintf(name, len, "%s CPU", CPU_ARCH_NAME);
}

static int
cpu_open(struct be_info *info, const char *device,
    const struct be_info *known, char *err)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	char model[64];

	(void)device;
	(void)known;	/* nothing costly to find out again */
	if (CPU_ARCH == PROTO_ARCH_NONE) {
		snprintf(err, BE_ERR_MAX, "cpu backend: unsupported architecture");
		return -1;
	}
	memset(info, 0, sizeof(*info));
	info->backend = PROTO_BACKEND_CPU;
	info->caps = PROTO_CAP_CPU_IMAGE | PROTO_CAP_UNIFIED;
	info->ncores = ncpu > 0 ? (uint32_t)ncpu : 1;
#if defined(__linux__) && defined(CPU_COUNT)
	{
		/* A runner started on fewer CPUs (taskset, a cgroup's cpuset)
		 * runs a kernel on as many threads as it has CPUs, not more. */
		cpu_set_t set;
		if (sched_getaffinity(0, sizeof(set), &set) == 0 &&
		    CPU_COUNT(&set) > 0 && (uint32_t)CPU_COUNT(&set) < info->ncores)
			info->ncores = (uint32_t)CPU_COUNT(&set);
	}
#endif
	info->memory = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz :
	    (uint64_t)1 << 30;
	info->maxbuf = info->memory;
	cpu_model(model, sizeof(model));
	snprintf(info->name, sizeof(info->name), "%s", model);
	snprintf(info->arch, sizeof(info->arch), "%s", CPU_ARCH_NAME);
#if defined(__x86_64__)
	snprintf(info->cpu, sizeof(info->cpu), "%s",
	    x86_level(info->features, sizeof(info->features)));
#elif defined(__aarch64__) && defined(__APPLE__)
	snprintf(info->cpu, sizeof(info->cpu), "apple-m1");
#elif defined(__aarch64__) && defined(__linux__)
	snprintf(info->cpu, sizeof(info->cpu), "generic");
	arm_features(info->features, sizeof(info->features));
#elif defined(__aarch64__)
	snprintf(info->cpu, sizeof(info->cpu), "generic");
#elif defined(__riscv) && defined(__linux__)
	rv_isa(info->cpu, sizeof(info->cpu), info->features,
	    sizeof(info->features));
#else
	snprintf(info->cpu, sizeof(info->cpu), "rv64gc");
#endif
	cpu_info = *info;
	return 0;
}

static void
cpu_close(void)
{
}

/* Run core ids of job j until none is left; called and returns with the
 * lock held, by workers and by the launching thread alike. */
static void
work(struct be_session *s, struct pool_job *j)
{
	uint64_t args[PROTO_MAX_ARGS];

	while (j->next < j->count) {
		uint32_t id = j->next++;
		pthread_mutex_unlock(&s->lock);
		memcpy(args, j->args, sizeof(args));
		args[j->corearg] = id;
		call(j->fn, args);
		pthread_mutex_lock(&s->lock);
		if (++j->done == j->count)
			pthread_cond_signal(&s->idle);
	}
}

static void *
pool_worker(void *arg)
{
	struct be_session *s = arg;
	uint64_t seen = 0;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (!s->quit && (s->job == NULL || s->generation == seen))
			pthread_cond_wait(&s->work, &s->lock);
		if (s->quit)
			break;
		seen = s->generation;
		work(s, s->job);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

static struct be_session *
cpu_session_open(char *err)
{
	struct be_session *s = calloc(1, sizeof(*s));

	if (s == NULL) {
		snprintf(err, BE_ERR_MAX, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->idle, NULL);
	return s;
}

/* Workers start on the first threaded launch, so a session that never
 * runs one costs no threads. */
static int
pool_start(struct be_session *s, char *err)
{
	uint32_t i, n = cpu_info.ncores > 1 ? cpu_info.ncores - 1 : 0;

	if (s->threads != NULL || n == 0)
		return 0;
	if ((s->threads = calloc(n, sizeof(*s->threads))) == NULL) {
		snprintf(err, BE_ERR_MAX, "out of memory");
		return -1;
	}
	for (i = 0; i < n; i++) {
		if (pthread_create(&s->threads[i], NULL, pool_worker, s) != 0)
			break;
		s->nthreads++;
	}
	return 0;
}

static void
cpu_session_close(struct be_session *s)
{
	uint32_t i;

	pthread_mutex_lock(&s->lock);
	s->quit = 1;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->lock);
	for (i = 0; i < s->nthreads; i++)
		pthread_join(s->threads[i], NULL);
	free(s->threads);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->idle);
	free(s);
}

static struct be_buffer *
cpu_alloc(struct be_session *s, uint64_t size, char *err)
{
	struct be_buffer *b;

	(void)s;
	if ((b = malloc(sizeof(*b))) == NULL) {
		snprintf(err, BE_ERR_MAX, "out of memory");
		return NULL;
	}
	/* Anonymous mappings are zeroed and page aligned, as tinygrad's
	 * CPU allocator's are. */
	b->mem = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANON, -1, 0);
	if (size > SIZE_MAX || b->mem == MAP_FAILED) {
		snprintf(err, BE_ERR_MAX, "cannot allocate %llu bytes: %s",
		    (unsigned long long)size, strerror(errno));
		free(b);
		return NULL;
	}
	b->size = size;
	return b;
}

static void
cpu_free(struct be_session *s, struct be_buffer *b)
{
	(void)s;
	munmap(b->mem, (size_t)b->size);
	free(b);
}

static void *
cpu_contents(struct be_buffer *b)
{
	return b->mem;
}

static uint64_t now_ns(void);

static int
cpu_copy(struct be_session *s, struct be_buffer *dst, uint64_t dstoff,
    struct be_buffer *src, uint64_t srcoff, uint64_t count,
    struct be_span *span, char *err)
{
	(void)s;
	(void)err;
	if (span != NULL)
		span->start = now_ns();
	memmove((char *)dst->mem + dstoff, (char *)src->mem + srcoff,
	    (size_t)count);
	if (span != NULL)
		span->end = now_ns();
	return 0;
}

static const char *
arch_name(unsigned arch)
{
	switch (arch) {
	case PROTO_ARCH_X86_64:
		return "x86_64";
	case PROTO_ARCH_ARM64:
		return "arm64";
	case PROTO_ARCH_RISCV64:
		return "riscv64";
	}
	return "an unknown architecture";
}

static struct be_program *
cpu_load(struct be_session *s, const struct be_program_desc *d, char *err,
    char **longerr)
{
	struct be_program *p;
	long psz = sysconf(_SC_PAGESIZE);
	size_t len;
	int flags = MAP_PRIVATE | MAP_ANON;

	(void)s;
	(void)longerr;	/* every message fits err */
	if (d->kind != PROTO_PROG_CPU_IMAGE) {
		snprintf(err, BE_ERR_MAX,
		    "backend cpu does not accept %s programs",
		    d->kind == PROTO_PROG_METALLIB ? "metallib" : "Metal source");
		return NULL;
	}
	if (d->arch != CPU_ARCH) {
		snprintf(err, BE_ERR_MAX, "image is for %s, this runner is %s",
		    arch_name(d->arch), CPU_ARCH_NAME);
		return NULL;
	}
	if (d->entry >= d->datalen) {
		snprintf(err, BE_ERR_MAX,
		    "entry offset %u is outside the %zu-byte image", d->entry,
		    d->datalen);
		return NULL;
	}
	if ((p = calloc(1, sizeof(*p))) == NULL) {
		snprintf(err, BE_ERR_MAX, "out of memory");
		return NULL;
	}
	len = (d->datalen + (size_t)psz - 1) & ~((size_t)psz - 1);
#if defined(__APPLE__) && defined(__aarch64__)
	flags |= MAP_JIT;
	p->code = mmap(NULL, len, PROT_READ | PROT_WRITE | PROT_EXEC, flags, -1,
	    0);
#else
	p->code = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
#endif
	if (p->code == MAP_FAILED) {
		snprintf(err, BE_ERR_MAX, "cannot map %zu bytes of code: %s",
		    len, strerror(errno));
		free(p);
		return NULL;
	}
#if defined(__APPLE__) && defined(__aarch64__)
	pthread_jit_write_protect_np(0);
	memcpy(p->code, d->data, d->datalen);
	pthread_jit_write_protect_np(1);
	sys_icache_invalidate(p->code, d->datalen);
#else
	memcpy(p->code, d->data, d->datalen);
	if (mprotect(p->code, len, PROT_READ | PROT_EXEC) == -1) {
		snprintf(err, BE_ERR_MAX, "cannot make code executable: %s",
		    strerror(errno));
		munmap(p->code, len);
		free(p);
		return NULL;
	}
	__builtin___clear_cache((char *)p->code, (char *)p->code + d->datalen);
#endif
	p->maplen = len;
	p->fn = (kernel_fn)(void *)((char *)p->code + d->entry);
	p->corearg = d->corearg;
	return p;
}

static void
cpu_unload(struct be_session *s, struct be_program *p)
{
	(void)s;
	munmap(p->code, p->maplen);
	free(p);
}

static uint64_t
now_ns(void)
{
	return (uint64_t)mono_ns();
}

static int
run_one(struct be_session *s, const struct be_launch *l, char *err)
{
	struct pool_job job;
	uint32_t i, count = l->global[0];

	memset(job.args, 0, sizeof(job.args));
	for (i = 0; i < l->nbufs; i++)
		job.args[i] = (uint64_t)(uintptr_t)l->bufs[i]->mem + l->offsets[i];
	for (i = 0; i < l->nvals; i++)
		job.args[l->nbufs + i] = (uint64_t)l->vals[i];
	job.fn = l->prog->fn;
	job.corearg = l->prog->corearg;
	if (job.corearg == PROTO_NO_CORE || count == 1) {
		/* tinygrad's CPUProgram also runs global[0] calls in turn. */
		for (i = 0; i < count; i++) {
			if (job.corearg != PROTO_NO_CORE)
				job.args[job.corearg] = i;
			call(job.fn, job.args);
		}
		return 0;
	}
	if (pool_start(s, err) == -1)
		return -1;
	job.count = count;
	job.next = job.done = 0;
	pthread_mutex_lock(&s->lock);
	s->job = &job;
	s->generation++;
	pthread_cond_broadcast(&s->work);
	/* The launching thread works too, then waits for the stragglers. */
	work(s, &job);
	while (job.done < job.count)
		pthread_cond_wait(&s->idle, &s->lock);
	s->job = NULL;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static int
cpu_launch(struct be_session *s, const struct be_launch *l, size_t n,
    int wait, uint64_t *ns, char *err)
{
	uint64_t t0 = wait ? now_ns() : 0;
	size_t i;

	for (i = 0; i < n; i++) {
		/* Profiling: the same wall time as Rlaunch.ns, per kernel. */
		if (l[i].span != NULL)
			l[i].span->start = now_ns();
		if (run_one(s, &l[i], err) == -1)
			return -1;
		if (l[i].span != NULL)
			l[i].span->end = now_ns();
	}
	if (wait)
		*ns = now_ns() - t0;
	return 0;
}

static int
cpu_sync(struct be_session *s, char *err)
{
	/* Launches run to completion before launch() returns. */
	(void)s;
	(void)err;
	return 0;
}

const struct backend be_cpu = {
	.name = "cpu",
	.isolation = BE_ISOLATE_PROCESS,
	.open = cpu_open,
	.close = cpu_close,
	.session_open = cpu_session_open,
	.session_close = cpu_session_close,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.contents = cpu_contents,
	.copy = cpu_copy,
	.load = cpu_load,
	.unload = cpu_unload,
	.launch = cpu_launch,
	.sync = cpu_sync,
	.clock = now_ns,
};
