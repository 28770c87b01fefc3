/*
 * backend_null.c: a backend that only keeps books, for fuzzing the session.
 *
 * Buffers are plain zeroed heap memory (so AddressSanitizer checks every
 * byte the session reads or writes through contents()); programs are
 * validated the way the CPU backend validates them and never executed.
 * backend.h promises that the session checks every handle, offset and count
 * before it calls a backend, so each such check here is an assertion: a
 * violation aborts, and the fuzzer reports it as a crash. The session must
 * also return every buffer and program before session_close().
 *
 * Two launch dimensions inject device failures, so the EDEVICE paths run:
 * global[2] == NULL_FAIL_LAUNCH fails the launch, and
 * global[2] == NULL_FAIL_SYNC makes the next sync() report a deferred error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metal_runner.h"
#include "proto.h"
#include "backend_null.h"

#define BUF_MAGIC 0x62756666u
#define PROG_MAGIC 0x70726f67u
#define SESS_MAGIC 0x73657373u
#define DEAD 0xdeadbeefu

struct be_buffer {
	uint32_t magic;
	uint64_t size;
	uint8_t *mem;
};

struct be_program {
	uint32_t magic;
	uint16_t nbufs;
	uint16_t nvals;
	uint16_t corearg;
};

struct be_session {
	uint32_t magic;
	long nbufs;		/* live buffers */
	long nprogs;		/* live programs */
	int fail_sync;		/* a deferred device error is pending */
};

#define check(cond) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "backend_null: %s: assertion failed: %s\n", \
		    __func__, #cond);					\
		abort();						\
	}								\
} while (0)

static int
null_open(struct be_info *info, const char *device,
    const struct be_info *known, char *err)
{
	(void)device;
	(void)known;
	(void)err;
	memset(info, 0, sizeof(*info));
	info->backend = PROTO_BACKEND_CPU;
	info->caps = PROTO_CAP_CPU_IMAGE | PROTO_CAP_UNIFIED;
	info->ncores = 2;
	info->memory = NULL_MEMORY;
	info->maxbuf = NULL_MEMORY;
	snprintf(info->name, sizeof(info->name), "null (fuzzing)");
	snprintf(info->arch, sizeof(info->arch), "x86_64");
	snprintf(info->cpu, sizeof(info->cpu), "x86-64");
	return 0;
}

static void
null_close(void)
{
}

static struct be_session *
null_session_open(char *err)
{
	struct be_session *s = calloc(1, sizeof(*s));

	if (s == NULL) {
		snprintf(err, BE_ERR_MAX, "out of memory");
		return NULL;
	}
	s->magic = SESS_MAGIC;
	return s;
}

static void
null_session_close(struct be_session *s)
{
	check(s->magic == SESS_MAGIC);
	check(s->nbufs == 0);
	check(s->nprogs == 0);
	s->magic = DEAD;
	free(s);
}

static struct be_buffer *
null_alloc(struct be_session *s, uint64_t size, char *err)
{
	struct be_buffer *b;

	check(s->magic == SESS_MAGIC);
	check(size > 0);
	/* Larger buffers are legal but slow to zero: fail them as a device
	 * that is out of memory would, which exercises that path too. */
	if (size > NULL_MAXALLOC) {
		snprintf(err, BE_ERR_MAX, "null backend: %llu bytes is more "
		    "than it allocates", (unsigned long long)size);
		return NULL;
	}
	if ((b = calloc(1, sizeof(*b))) == NULL ||
	    (b->mem = calloc(1, (size_t)size)) == NULL) {
		free(b);
		snprintf(err, BE_ERR_MAX, "out of memory");
		return NULL;
	}
	b->magic = BUF_MAGIC;
	b->size = size;
	s->nbufs++;
	return b;
}

static void
null_free(struct be_session *s, struct be_buffer *b)
{
	check(s->magic == SESS_MAGIC);
	check(b->magic == BUF_MAGIC);
	b->magic = DEAD;
	free(b->mem);
	free(b);
	s->nbufs--;
}

static void *
null_contents(struct be_buffer *b)
{
	check(b->magic == BUF_MAGIC);
	return b->mem;
}

static int
null_copy(struct be_session *s, struct be_buffer *dst, uint64_t dstoff,
    struct be_buffer *src, uint64_t srcoff, uint64_t count,
    struct be_span *span, char *err)
{
	(void)err;
	check(s->magic == SESS_MAGIC);
	if (span != NULL)
		span->start = span->end = 1;
	check(dst->magic == BUF_MAGIC && src->magic == BUF_MAGIC);
	check(dstoff <= dst->size && count <= dst->size - dstoff);
	check(srcoff <= src->size && count <= src->size - srcoff);
	memmove(dst->mem + dstoff, src->mem + srcoff, (size_t)count);
	return 0;
}

static struct be_program *
null_load(struct be_session *s, const struct be_program_desc *d, char *err,
    char **longerr)
{
	struct be_program *p;
	size_t namelen;

	(void)longerr;	/* every message fits err */
	check(s->magic == SESS_MAGIC);
	check(d->name != NULL && d->data != NULL && d->datalen > 0);
	namelen = strlen(d->name);
	check(namelen >= 1 && namelen <= PROTO_MAX_NAME);
	check((unsigned)d->nbufs + d->nvals <= PROTO_MAX_ARGS);
	check(d->corearg == PROTO_NO_CORE ||
	    d->corearg < (unsigned)d->nbufs + d->nvals);
	/* Touch both ends of the image: it must all be readable. */
	check(d->data[0] == d->data[0] &&
	    d->data[d->datalen - 1] == d->data[d->datalen - 1]);
	/* The CPU backend's checks, with its messages. */
	if (d->kind != PROTO_PROG_CPU_IMAGE) {
		snprintf(err, BE_ERR_MAX, "backend cpu does not accept %s "
		    "programs", d->kind == PROTO_PROG_METALLIB ? "metallib" :
		    "Metal source");
		return NULL;
	}
	if (d->arch != PROTO_ARCH_X86_64) {
		snprintf(err, BE_ERR_MAX, "image is for another arch, this "
		    "runner is x86_64");
		return NULL;
	}
	if (d->entry >= d->datalen) {
		snprintf(err, BE_ERR_MAX, "entry offset %u is outside the "
		    "%zu-byte image", d->entry, d->datalen);
		return NULL;
	}
	if ((p = calloc(1, sizeof(*p))) == NULL) {
		snprintf(err, BE_ERR_MAX, "out of memory");
		return NULL;
	}
	p->magic = PROG_MAGIC;
	p->nbufs = d->nbufs;
	p->nvals = d->nvals;
	p->corearg = d->corearg;
	s->nprogs++;
	return p;
}

static void
null_unload(struct be_session *s, struct be_program *p)
{
	check(s->magic == SESS_MAGIC);
	check(p->magic == PROG_MAGIC);
	p->magic = DEAD;
	free(p);
	s->nprogs--;
}

static int
null_launch(struct be_session *s, const struct be_launch *l, size_t n,
    int wait, uint64_t *ns, char *err)
{
	size_t i, j;
	uint64_t sum = 0;

	check(s->magic == SESS_MAGIC);
	check(n >= 1);
	for (i = 0; i < n; i++) {
		const struct be_launch *e = &l[i];
		check(e->prog != NULL && e->prog->magic == PROG_MAGIC);
		check(e->nbufs == e->prog->nbufs && e->nvals == e->prog->nvals);
		for (j = 0; j < 3; j++)
			check(e->global[j] > 0 && e->local[j] > 0);
		for (j = 0; j < e->nbufs; j++) {
			const struct be_buffer *b = e->bufs[j];
			check(b != NULL && b->magic == BUF_MAGIC);
			check(e->offsets[j] <= b->size);
			/* A kernel may touch the byte before its offset. */
			if (e->offsets[j] > 0)
				sum += b->mem[e->offsets[j] - 1];
		}
		for (j = 0; j < e->nvals; j++)
			sum += (uint64_t)e->vals[j];
		if (e->global[2] == NULL_FAIL_LAUNCH) {
			snprintf(err, BE_ERR_MAX, "injected device failure "
			    "(%llu)", (unsigned long long)sum);
			return -1;
		}
		if (e->global[2] == NULL_FAIL_SYNC)
			s->fail_sync = 1;
		/* A span points into the session's profile: write it all,
		 * so AddressSanitizer sees a stale one. */
		if (e->span != NULL)
			e->span->start = e->span->end = 1;
	}
	if (wait)
		*ns = 1000 * n;
	return 0;
}

static int
null_sync(struct be_session *s, char *err)
{
	check(s->magic == SESS_MAGIC);
	if (s->fail_sync) {
		s->fail_sync = 0;
		snprintf(err, BE_ERR_MAX, "injected deferred device failure");
		return -1;
	}
	return 0;
}

/* A clock that only moves forward, so profile records are well-formed. */
static uint64_t
null_clock(void)
{
	static uint64_t t;

	return ++t;
}

const struct backend be_null = {
	.name = "null",
	.isolation = BE_ISOLATE_THREAD,
	.open = null_open,
	.close = null_close,
	.session_open = null_session_open,
	.session_close = null_session_close,
	.alloc = null_alloc,
	.free = null_free,
	.contents = null_contents,
	.copy = null_copy,
	.load = null_load,
	.unload = null_unload,
	.launch = null_launch,
	.sync = null_sync,
	.clock = null_clock,
};
