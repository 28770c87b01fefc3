/*
 * session.c: one client connection: its handle tables and its requests.
 *
 * A session reads frames from a blocking socket through an input buffer
 * that grows only as bytes arrive (never to a size a client merely
 * declares), validates each header and fixed part whole, then acts. Bulk
 * Twrite data is received straight into the checked destination; Rread
 * data is sent straight from the buffer. Replies collect in an output
 * buffer that is flushed whenever the session would block reading, so a
 * pipelined burst costs one send.
 *
 * Requests without a reply that fail queue their Rerror; queued errors go
 * out ahead of the next reply, so none is lost and order is kept.
 */
#include <sys/types.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "metal_runner.h"
#include "proto.h"

#define IN_MIN 65536		/* input buffer kept between frames */
#define MAX_QUEUED_ERRORS 64

struct buffer {
	struct be_buffer *b;
	uint64_t size;
};

struct program {
	struct be_program *p;
	uint16_t nbufs;
	uint16_t nvals;
	char name[PROTO_MAX_NAME + 1];
};

struct graph_entry {
	struct proto_launch l;
	struct proto_arg *args;
	int64_t *vals;
};

struct graph {
	uint32_t count;
	struct graph_entry *e;
};

enum sess_state { S_HELLO, S_AUTH, S_READY };

struct session {
	const struct mr_server_ctx *ctx;
	const struct backend *be;
	struct be_session *bs;
	int fd;
	uint32_t id;
	int slot;
	enum sess_state state;
	uint32_t maxmsg;
	uint8_t snonce[PROTO_NONCE_SIZE];
	struct htab bufs, progs, graphs;
	uint32_t nhandles;
	uint64_t mem;
	int dirty;		/* work launched since the last sync */
	time_t last_active;

	uint8_t *in;
	size_t incap, inlen, inoff;
	uint8_t *out;
	size_t outcap, outlen;
	uint8_t *errq;
	size_t errqcap, errqlen;
	uint32_t nqueued, dropped, dropped_tag;

	/* Scratch for resolving launches: grown to the largest graph. */
	struct be_launch *launches;
	struct be_buffer **lbufs;
	uint64_t *loffs;
	size_t launchcap, argcap;

	char err[PROTO_ERRLEN];
};

/* Process isolation: a kernel that crashes or overruns its time ends its
 * session's process; the handler tells the client why first. */
static volatile sig_atomic_t crash_armed;
static int crash_fd = -1;
static uint32_t crash_tag;
static const char *crash_name;	/* the running kernel's, valid while armed */
int sess_crash_handlers;	/* set by server.c in session processes */

static int
errorf(struct session *s, uint32_t tag, uint32_t code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static uint64_t
min64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

static int
grow(uint8_t **p, size_t *cap, size_t need)
{
	size_t n = *cap ? *cap : 4096;
	uint8_t *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	if ((q = realloc(*p, n)) == NULL)
		return -1;
	*p = q;
	*cap = n;
	return 0;
}

static int
flush(struct session *s)
{
	if (s->outlen == 0)
		return 0;
	if (net_send_all(s->fd, s->out, s->outlen) == -1) {
		log_info("session %u: send failed: %s", s->id, strerror(errno));
		return -1;
	}
	s->outlen = 0;
	return 0;
}

/* Move queued errors into the output, ahead of the reply that follows. */
static int
drain_errors(struct session *s)
{
	if (s->errqlen > 0) {
		if (grow(&s->out, &s->outcap, s->outlen + s->errqlen) == -1)
			return -1;
		memcpy(s->out + s->outlen, s->errq, s->errqlen);
		s->outlen += s->errqlen;
		s->errqlen = 0;
		s->nqueued = 0;
	}
	if (s->dropped > 0) {
		char text[64];
		uint8_t frame[128];
		size_t n;

		snprintf(text, sizeof(text), "%u more errors not shown",
		    s->dropped);
		n = proto_put_rerror(frame, sizeof(frame), s->dropped_tag,
		    PROTO_EMORE, text);
		if (grow(&s->out, &s->outcap, s->outlen + n) == -1)
			return -1;
		memcpy(s->out + s->outlen, frame, n);
		s->outlen += n;
		s->dropped = 0;
	}
	return 0;
}

/* Queue an Rerror for tag. Returns -1 so handlers can "return errorf()";
 * a failed request is never fatal to the session by itself. */
static int
errorf(struct session *s, uint32_t tag, uint32_t code, const char *fmt, ...)
{
	char text[PROTO_MAX_ERRTEXT + 1];
	size_t n, need = PROTO_HDR_SIZE + 8 + PROTO_MAX_ERRTEXT;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	log_info("session %u: tag %u: %s: %s", s->id, tag,
	    proto_error_name(code), text);
	if (s->nqueued >= MAX_QUEUED_ERRORS ||
	    grow(&s->errq, &s->errqcap, s->errqlen + need) == -1) {
		s->dropped++;
		s->dropped_tag = tag;
		return -1;
	}
	n = proto_put_rerror(s->errq + s->errqlen, need, tag, code, text);
	s->errqlen += n;
	s->nqueued++;
	return -1;
}

/* Append a reply (fixed part and optional small data) after queued errors. */
static int
reply(struct session *s, union proto_msg *m, const void *data, size_t len)
{
	size_t fixed = proto_fixed_size(m->h.type);

	m->h.size = (uint32_t)(fixed + len);
	m->h.flags = 0;
	if (drain_errors(s) == -1 ||
	    grow(&s->out, &s->outcap, s->outlen + fixed + len) == -1)
		return -1;
	proto_put(s->out + s->outlen, fixed, m);
	if (len > 0)
		memcpy(s->out + s->outlen + fixed, data, len);
	s->outlen += fixed + len;
	return 0;
}

/* A request that waits failed: its error is its reply. */
static int
fail_reply(struct session *s)
{
	return drain_errors(s);
}

/* A framing or state error: tell the client, then end the session. */
static int
fatal(struct session *s, uint32_t tag, uint32_t code, const char *text)
{
	errorf(s, tag, code, "%s", text);
	drain_errors(s);
	flush(s);
	return -1;
}

/* Wait at most seconds for fd to have something for recv() to return
 * (data, end of stream or an error): 1 if it has, 0 on timeout. */
static int
wait_readable(int fd, int seconds)
{
	struct pollfd pfd = { fd, POLLIN, 0 };
	int n;

	do
		n = poll(&pfd, 1, seconds > INT_MAX / 1000 ? INT_MAX :
		    seconds * 1000);
	while (n == -1 && errno == EINTR);
	return n != 0;
}

/*
 * Make n bytes of the current frame available at s->in + s->inoff.
 * Returns 1, 0 at a clean end of stream between frames, -1 on error.
 */
static int
need(struct session *s, size_t n, int boundary)
{
	const struct mr_config *cfg = s->ctx->cfg;
	ssize_t r;

	while (s->inlen - s->inoff < n) {
		/* Make room only when the buffer is full, and then by at most
		 * doubling: memory follows the bytes that arrived, never the
		 * size a header declares. */
		if (s->inlen == s->incap && s->inoff > 0) {
			memmove(s->in, s->in + s->inoff, s->inlen - s->inoff);
			s->inlen -= s->inoff;
			s->inoff = 0;
		} else if (s->inlen == s->incap && grow(&s->in, &s->incap,
		    min64(n, s->incap * 2)) == -1) {
			log_warn("session %u: out of memory", s->id);
			return -1;
		}
		if (flush(s) == -1)
			return -1;
		/* Between frames the idle limit applies; the socket's receive
		 * timeout is the frame timeout, which may be longer. */
		if (boundary && s->inlen == s->inoff && cfg->idle_timeout > 0 &&
		    !wait_readable(s->fd, cfg->idle_timeout)) {
			log_warn("session %u: client stalled between frames "
			    "for %d s; ending the session", s->id,
			    cfg->idle_timeout);
			return -1;
		}
		r = net_recv(s->fd, s->in + s->inlen, s->incap - s->inlen);
		if (r == 0) {
			if (boundary && s->inlen == s->inoff)
				return 0;
			log_info("session %u: connection closed mid-frame",
			    s->id);
			return -1;
		}
		if (r < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				log_info("session %u: recv: %s", s->id,
				    strerror(errno));
				return -1;
			}
			if (boundary && s->inlen == s->inoff &&
			    (cfg->idle_timeout == 0 || time(NULL) -
			    s->last_active < cfg->idle_timeout))
				continue;
			log_warn("session %u: client stalled %s for %d s; "
			    "ending the session", s->id, boundary &&
			    s->inlen == s->inoff ? "between frames" :
			    "mid-frame", boundary && s->inlen == s->inoff ?
			    cfg->idle_timeout : cfg->frame_timeout);
			return -1;
		}
		s->inlen += (size_t)r;
	}
	return 1;
}

/* Take count bytes of frame data into dst, or discard them if dst is NULL:
 * first what is buffered, then straight from the socket. */
static int
take(struct session *s, uint8_t *dst, uint64_t count)
{
	size_t n = (size_t)min64(s->inlen - s->inoff, count);
	ssize_t r;

	if (dst != NULL)
		memcpy(dst, s->in + s->inoff, n);
	s->inoff += n;
	count -= n;
	if (dst != NULL)
		dst += n;
	if (count > 0 && flush(s) == -1)
		return -1;
	while (count > 0) {
		if (dst != NULL)
			r = net_recv(s->fd, dst, (size_t)count);
		else {
			s->inoff = s->inlen = 0;
			r = net_recv(s->fd, s->in, (size_t)min64(count, s->incap));
		}
		if (r <= 0) {
			log_info("session %u: connection %s mid-frame", s->id,
			    r == 0 ? "closed" : "stalled");
			return -1;
		}
		count -= (uint64_t)r;
		if (dst != NULL)
			dst += r;
	}
	return 0;
}

/* Host access to buffer contents must wait for launched work. */
static int
settle(struct session *s, uint32_t tag)
{
	if (!s->dirty)
		return 0;
	s->dirty = 0;
	if (s->be->sync(s->bs, s->err) == -1)
		return errorf(s, tag, PROTO_EDEVICE, "%s", s->err);
	return 0;
}

static int
range_ok(uint64_t size, uint64_t offset, uint64_t count)
{
	/* Never offset + count, which can wrap. */
	return offset <= size && count <= size - offset;
}

static struct buffer *
get_buffer(struct session *s, uint32_t tag, uint32_t h)
{
	struct buffer *b = htab_get(&s->bufs, h);

	if (b == NULL)
		errorf(s, tag, PROTO_EHANDLE, "no buffer with handle %u", h);
	return b;
}

static int
count_handle(struct session *s, uint32_t tag)
{
	uint32_t max = s->ctx->cfg->max_handles;

	if (max != 0 && s->nhandles >= max)
		return errorf(s, tag, PROTO_ELIMIT,
		    "session has %u handles, the limit", max);
	s->nhandles++;
	return 0;
}

static void
random_bytes(uint8_t *p, size_t n)
{
#if defined(__APPLE__) || defined(__OpenBSD__)
	arc4random_buf(p, n);
#else
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	ssize_t r = 0;

	while (fd != -1 && n > 0 && (r = read(fd, p, n)) > 0) {
		p += r;
		n -= (size_t)r;
	}
	if (fd != -1)
		close(fd);
	if (n > 0)	/* unreachable on a working system; never a zero nonce */
		abort();
#endif
}

static int
do_hello(struct session *s, const union proto_msg *m)
{
	const struct be_info *info = s->ctx->info;
	const struct mr_config *cfg = s->ctx->cfg;
	const struct proto_thello *t = &m->thello;
	union proto_msg r;
	char text[128];

	if (m->h.type != PROTO_THELLO) {
		snprintf(text, sizeof(text), "the first request must be "
		    "Thello, not %s", proto_type_name(m->h.type));
		return fatal(s, m->h.tag, PROTO_ESTATE, text);
	}
	if (t->magic != PROTO_MAGIC)
		return fatal(s, m->h.tag, PROTO_EVERSION,
		    "bad magic: not a metal_runner client");
	if (t->version != PROTO_VERSION) {
		snprintf(text, sizeof(text), "protocol version %u not "
		    "supported; this runner speaks version %u", t->version,
		    PROTO_VERSION);
		return fatal(s, m->h.tag, PROTO_EVERSION, text);
	}
	if (t->maxmsg < PROTO_MIN_MAXMSG) {
		snprintf(text, sizeof(text), "maxmsg %u is below the minimum "
		    "%u", t->maxmsg, PROTO_MIN_MAXMSG);
		return fatal(s, m->h.tag, PROTO_EINVAL, text);
	}
	s->maxmsg = t->maxmsg < cfg->maxmsg ? t->maxmsg : cfg->maxmsg;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RHELLO;
	r.h.tag = m->h.tag;
	r.rhello.magic = PROTO_MAGIC;
	r.rhello.version = PROTO_VERSION;
	r.rhello.maxmsg = s->maxmsg;
	r.rhello.backend = info->backend;
	r.rhello.caps = info->caps | (cfg->token != NULL ? PROTO_CAP_AUTH : 0);
	r.rhello.ncores = info->ncores;
	r.rhello.memory = cfg->total_mem ? min64(cfg->total_mem, info->memory) :
	    info->memory;
	if (cfg->session_mem)
		r.rhello.memory = min64(r.rhello.memory, cfg->session_mem);
	r.rhello.maxbuf = min64(info->maxbuf, r.rhello.memory);
	r.rhello.maxhandles = cfg->max_handles;
	r.rhello.session = s->id;
	if (cfg->token != NULL) {
		random_bytes(s->snonce, sizeof(s->snonce));
		memcpy(r.rhello.nonce, s->snonce, sizeof(s->snonce));
	}
	memcpy(r.rhello.name, info->name, sizeof(r.rhello.name));
	memcpy(r.rhello.arch, info->arch, sizeof(r.rhello.arch));
	memcpy(r.rhello.cpu, info->cpu, sizeof(r.rhello.cpu));
	memcpy(r.rhello.features, info->features, sizeof(r.rhello.features));
	s->state = cfg->token != NULL ? S_AUTH : S_READY;
	return reply(s, &r, NULL, 0);
}

static const char auth_client[] = "metal_runner-auth-v1 client";
static const char auth_server[] = "metal_runner-auth-v1 server";

static void
auth_mac(const struct mr_config *cfg, const char *label, const uint8_t *a,
    const uint8_t *b, uint8_t out[32])
{
	uint8_t msg[sizeof(auth_client) + 2 * PROTO_NONCE_SIZE];
	size_t l = strlen(label);

	memcpy(msg, label, l);
	memcpy(msg + l, a, PROTO_NONCE_SIZE);
	memcpy(msg + l + PROTO_NONCE_SIZE, b, PROTO_NONCE_SIZE);
	hmac_sha256(cfg->token, cfg->tokenlen, msg, l + 2 * PROTO_NONCE_SIZE,
	    out);
}

static int
do_auth(struct session *s, const union proto_msg *m, const char *peer)
{
	const struct mr_config *cfg = s->ctx->cfg;
	uint8_t want[32], diff = 0;
	union proto_msg r;
	size_t i;

	if (m->h.type != PROTO_TAUTH)
		return fatal(s, m->h.tag, PROTO_ESTATE, "this runner requires "
		    "authentication: Tauth must follow Rhello");
	auth_mac(cfg, auth_client, s->snonce, m->tauth.cnonce, want);
	for (i = 0; i < sizeof(want); i++)	/* constant time */
		diff |= want[i] ^ m->tauth.mac[i];
	if (diff != 0) {
		log_warn("session %u: authentication failed from %s", s->id,
		    peer);
		mr_auth_penalty();	/* rate-limits guessing */
		return fatal(s, m->h.tag, PROTO_EAUTH, "authentication "
		    "failed: wrong token");
	}
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RAUTH;
	r.h.tag = m->h.tag;
	auth_mac(cfg, auth_server, m->tauth.cnonce, s->snonce, r.rauth.mac);
	s->state = S_READY;
	log_info("session %u: authenticated", s->id);
	return reply(s, &r, NULL, 0);
}

static int
do_alloc(struct session *s, const struct proto_talloc *t)
{
	uint32_t tag = t->h.tag;
	struct buffer *b;

	if (htab_get(&s->bufs, t->handle) != NULL)
		return errorf(s, tag, PROTO_EEXIST,
		    "buffer handle %u is already in use", t->handle);
	if (t->size == 0)
		return errorf(s, tag, PROTO_EINVAL, "buffer size is 0");
	if (t->size > s->ctx->info->maxbuf)
		return errorf(s, tag, PROTO_ELIMIT, "buffer of %llu bytes is "
		    "larger than the largest this runner allows, %llu",
		    (unsigned long long)t->size,
		    (unsigned long long)s->ctx->info->maxbuf);
	if (mr_mem_reserve(s->slot, t->size, s->ctx->cfg->session_mem,
	    s->err) == -1)
		return errorf(s, tag, PROTO_ELIMIT, "%s", s->err);
	if (count_handle(s, tag) == -1)
		goto fail;
	if ((b = calloc(1, sizeof(*b))) == NULL) {
		errorf(s, tag, PROTO_ENOMEM, "out of host memory");
		goto fail_handle;
	}
	if ((b->b = s->be->alloc(s->bs, t->size, s->err)) == NULL) {
		errorf(s, tag, PROTO_ENOMEM, "%s", s->err);
		free(b);
		goto fail_handle;
	}
	b->size = t->size;
	if (htab_put(&s->bufs, t->handle, b) == -1) {
		errorf(s, tag, PROTO_ENOMEM, "out of host memory");
		s->be->free(s->bs, b->b);
		free(b);
		goto fail_handle;
	}
	s->mem += t->size;
	return 0;
fail_handle:
	s->nhandles--;
fail:
	mr_mem_release(s->slot, t->size);
	return -1;
}

static void
free_buffer(struct session *s, struct buffer *b)
{
	s->be->free(s->bs, b->b);
	mr_mem_release(s->slot, b->size);
	s->mem -= b->size;
	s->nhandles--;
	free(b);
}

static int
do_free(struct session *s, const struct proto_tfree *t)
{
	struct buffer *b = htab_del(&s->bufs, t->handle);

	if (b == NULL)
		return errorf(s, t->h.tag, PROTO_EHANDLE,
		    "no buffer with handle %u (never allocated or already "
		    "freed)", t->handle);
	free_buffer(s, b);
	return 0;
}

/* Twrite: the data is still in the socket; it goes straight into the
 * buffer, or is discarded when the request fails. */
static int
do_write(struct session *s, const struct proto_twrite *t)
{
	struct buffer *b = get_buffer(s, t->h.tag, t->handle);
	uint8_t *dst = NULL;

	if (b != NULL && !range_ok(b->size, t->offset, t->count))
		errorf(s, t->h.tag, PROTO_ERANGE, "write of %llu bytes at "
		    "offset %llu is outside buffer %u of %llu bytes",
		    (unsigned long long)t->count,
		    (unsigned long long)t->offset, t->handle,
		    (unsigned long long)b->size);
	else if (b != NULL && settle(s, t->h.tag) == 0)
		dst = (uint8_t *)s->be->contents(b->b) + t->offset;
	return take(s, dst, t->count) == -1 ? -2 : 0;
}

static int
do_read(struct session *s, const struct proto_tread *t)
{
	struct buffer *b = get_buffer(s, t->h.tag, t->handle);
	union proto_msg r;
	uint8_t hdr[sizeof(struct proto_rread)];
	const uint8_t *src;

	if (b == NULL)
		return fail_reply(s);
	if (!range_ok(b->size, t->offset, t->count)) {
		errorf(s, t->h.tag, PROTO_ERANGE, "read of %llu bytes at "
		    "offset %llu is outside buffer %u of %llu bytes",
		    (unsigned long long)t->count,
		    (unsigned long long)t->offset, t->handle,
		    (unsigned long long)b->size);
		return fail_reply(s);
	}
	if (t->count > s->maxmsg - sizeof(struct proto_rread)) {
		errorf(s, t->h.tag, PROTO_ELIMIT, "read of %llu bytes does "
		    "not fit in one %u-byte frame; split it",
		    (unsigned long long)t->count, s->maxmsg);
		return fail_reply(s);
	}
	if (settle(s, t->h.tag) == -1)
		return fail_reply(s);
	src = (const uint8_t *)s->be->contents(b->b) + t->offset;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RREAD;
	r.h.tag = t->h.tag;
	r.h.size = (uint32_t)(sizeof(hdr) + t->count);
	r.rread.count = (uint32_t)t->count;
	proto_put(hdr, sizeof(hdr), &r);
	if (drain_errors(s) == -1 ||
	    grow(&s->out, &s->outcap, s->outlen + sizeof(hdr)) == -1)
		return -2;
	memcpy(s->out + s->outlen, hdr, sizeof(hdr));
	s->outlen += sizeof(hdr);
	/* Small reads ride in the output buffer; large ones go straight
	 * from the buffer's memory behind the pending bytes. */
	if (t->count <= 4096) {
		if (grow(&s->out, &s->outcap, s->outlen + t->count) == -1)
			return -2;
		memcpy(s->out + s->outlen, src, (size_t)t->count);
		s->outlen += (size_t)t->count;
		return 0;
	}
	if (net_sendv_all(s->fd, s->out, s->outlen, src, (size_t)t->count) ==
	    -1)
		return -2;
	s->outlen = 0;
	return 0;
}

static int
do_copy(struct session *s, const struct proto_tcopy *t)
{
	struct buffer *d, *src;

	if ((d = get_buffer(s, t->h.tag, t->dst)) == NULL ||
	    (src = get_buffer(s, t->h.tag, t->src)) == NULL)
		return -1;
	if (!range_ok(d->size, t->dstoff, t->count) ||
	    !range_ok(src->size, t->srcoff, t->count))
		return errorf(s, t->h.tag, PROTO_ERANGE, "copy of %llu bytes "
		    "from buffer %u offset %llu (%llu bytes) to buffer %u "
		    "offset %llu (%llu bytes) is out of range",
		    (unsigned long long)t->count, t->src,
		    (unsigned long long)t->srcoff,
		    (unsigned long long)src->size, t->dst,
		    (unsigned long long)t->dstoff,
		    (unsigned long long)d->size);
	if (s->be->copy(s->bs, d->b, t->dstoff, src->b, t->srcoff, t->count,
	    s->err) == -1)
		return errorf(s, t->h.tag, PROTO_EDEVICE, "%s", s->err);
	s->dirty = 1;
	return 0;
}

static const char *
kind_name(unsigned kind)
{
	switch (kind) {
	case PROTO_PROG_CPU_IMAGE:
		return "CPU image";
	case PROTO_PROG_METALLIB:
		return "metallib";
	case PROTO_PROG_METAL_SOURCE:
		return "Metal source";
	}
	return "unknown";
}

static int
do_load(struct session *s, const struct proto_tload *t, const uint8_t *body)
{
	struct be_program_desc d;
	struct program *p;
	uint32_t tag = t->h.tag;
	uint16_t cap;
	size_t nargs = (size_t)t->nbufs + t->nvals;

	if (htab_get(&s->progs, t->prog) != NULL)
		return errorf(s, tag, PROTO_EEXIST,
		    "program handle %u is already in use", t->prog);
	cap = t->kind == PROTO_PROG_CPU_IMAGE ? PROTO_CAP_CPU_IMAGE :
	    t->kind == PROTO_PROG_METALLIB ? PROTO_CAP_METALLIB :
	    t->kind == PROTO_PROG_METAL_SOURCE ? PROTO_CAP_METAL_SOURCE : 0;
	if (cap == 0)
		return errorf(s, tag, PROTO_EINVAL, "unknown program kind %u",
		    t->kind);
	if ((s->ctx->info->caps & cap) == 0)
		return errorf(s, tag, PROTO_EKIND, "backend %s does not "
		    "accept %s programs", s->be->name, kind_name(t->kind));
	if (t->namelen == 0 || t->namelen > PROTO_MAX_NAME ||
	    memchr(body, '\0', t->namelen) != NULL)
		return errorf(s, tag, PROTO_EINVAL, "kernel name must be 1 to "
		    "%u bytes with no NUL", PROTO_MAX_NAME);
	if (t->datalen == 0)
		return errorf(s, tag, PROTO_EINVAL, "program data is empty");
	if (nargs > PROTO_MAX_ARGS)
		return errorf(s, tag, PROTO_EINVAL, "kernel takes %zu "
		    "arguments, more than %u", nargs, PROTO_MAX_ARGS);
	if (t->corearg != PROTO_NO_CORE && t->corearg >= nargs)
		return errorf(s, tag, PROTO_EINVAL, "core_id argument %u is "
		    "past the kernel's %zu arguments", t->corearg, nargs);
	if (proto_crc32(0, body + t->namelen, t->datalen) != t->crc)
		return errorf(s, tag, PROTO_EPROGRAM, "program data is "
		    "corrupt: CRC-32 mismatch");
	if (count_handle(s, tag) == -1)
		return -1;
	if ((p = calloc(1, sizeof(*p))) == NULL) {
		s->nhandles--;
		return errorf(s, tag, PROTO_ENOMEM, "out of host memory");
	}
	memcpy(p->name, body, t->namelen);
	p->nbufs = t->nbufs;
	p->nvals = t->nvals;
	memset(&d, 0, sizeof(d));
	d.kind = t->kind;
	d.arch = t->arch;
	d.nbufs = t->nbufs;
	d.nvals = t->nvals;
	d.corearg = t->corearg;
	d.entry = t->entry;
	d.name = p->name;
	d.data = body + t->namelen;
	d.datalen = t->datalen;
	if ((p->p = s->be->load(s->bs, &d, s->err)) == NULL) {
		errorf(s, tag, PROTO_EPROGRAM, "cannot load %s: %s", p->name,
		    s->err);
		goto fail;
	}
	if (htab_put(&s->progs, t->prog, p) == -1) {
		errorf(s, tag, PROTO_ENOMEM, "out of host memory");
		s->be->unload(s->bs, p->p);
		goto fail;
	}
	log_debug("session %u: loaded %s (%s, %u bytes)", s->id, p->name,
	    kind_name(t->kind), t->datalen);
	return 0;
fail:
	s->nhandles--;
	free(p);
	return -1;
}

static void
free_program(struct session *s, struct program *p)
{
	s->be->unload(s->bs, p->p);
	s->nhandles--;
	free(p);
}

static int
do_unload(struct session *s, const struct proto_tunload *t)
{
	struct program *p = htab_del(&s->progs, t->prog);

	if (p == NULL)
		return errorf(s, t->h.tag, PROTO_EHANDLE,
		    "no program with handle %u", t->prog);
	free_program(s, p);
	return 0;
}

static int
scratch(struct session *s, size_t nlaunch, size_t nargs)
{
	if (nlaunch > s->launchcap) {
		void *p = realloc(s->launches, nlaunch * sizeof(*s->launches));
		if (p == NULL)
			return -1;
		s->launches = p;
		s->launchcap = nlaunch;
	}
	if (nargs > s->argcap) {
		void *b = realloc(s->lbufs, nargs * sizeof(*s->lbufs));
		void *o;
		if (b == NULL)
			return -1;
		s->lbufs = b;
		if ((o = realloc(s->loffs, nargs * sizeof(*s->loffs))) == NULL)
			return -1;
		s->loffs = o;
		s->argcap = nargs;
	}
	return 0;
}

/* Resolve one launch record's handles into l, checking everything the
 * backend will trust. bufs/offs have room for l->nbufs entries. */
static int
resolve(struct session *s, uint32_t tag, const struct proto_launch *pl,
    const struct proto_arg *args, const int64_t *vals, struct be_launch *l,
    struct be_buffer **bufs, uint64_t *offs, const char **name)
{
	struct program *p = htab_get(&s->progs, pl->prog);
	unsigned i;

	if (p == NULL)
		return errorf(s, tag, PROTO_EHANDLE,
		    "no program with handle %u", pl->prog);
	*name = p->name;
	if (pl->nbufs != p->nbufs || pl->nvals != p->nvals)
		return errorf(s, tag, PROTO_EINVAL, "kernel %s takes %u "
		    "buffers and %u values; the launch passed %u and %u",
		    p->name, p->nbufs, p->nvals, pl->nbufs, pl->nvals);
	for (i = 0; i < 3; i++)
		if (pl->global[i] == 0 || pl->local[i] == 0)
			return errorf(s, tag, PROTO_EINVAL, "kernel %s: launch "
			    "size has a zero dimension", p->name);
	for (i = 0; i < pl->nbufs; i++) {
		struct buffer *b = htab_get(&s->bufs, args[i].handle);
		if (b == NULL)
			return errorf(s, tag, PROTO_EHANDLE, "kernel %s "
			    "argument %u: no buffer with handle %u", p->name,
			    i, args[i].handle);
		if (args[i].offset > b->size)
			return errorf(s, tag, PROTO_ERANGE, "kernel %s argument "
			    "%u: offset %llu is past the end of buffer %u "
			    "(%llu bytes)", p->name, i,
			    (unsigned long long)args[i].offset, args[i].handle,
			    (unsigned long long)b->size);
		bufs[i] = b->b;
		offs[i] = args[i].offset;
	}
	l->prog = p->p;
	l->nbufs = pl->nbufs;
	l->nvals = pl->nvals;
	l->bufs = bufs;
	l->offsets = offs;
	l->vals = vals;
	memcpy(l->global, pl->global, sizeof(l->global));
	memcpy(l->local, pl->local, sizeof(l->local));
	return 0;
}

static void
arm_crash(struct session *s, uint32_t tag, const char *name)
{
	if (!sess_crash_handlers)
		return;
	/* A crash ends the session: whatever is queued must already be out,
	 * so the handler's frame is the last and no error is lost. */
	if (s->errqlen > 0 || s->dropped > 0 || s->outlen > 0) {
		drain_errors(s);
		flush(s);
	}
	crash_fd = s->fd;
	crash_tag = tag;
	crash_name = name;
	if (s->ctx->cfg->kernel_timeout > 0)
		alarm((unsigned)s->ctx->cfg->kernel_timeout);
	crash_armed = 1;
}

static void
disarm_crash(struct session *s)
{
	if (!sess_crash_handlers)
		return;
	/* Cancel the alarm first: one that fires now is still the kernel's. */
	if (s->ctx->cfg->kernel_timeout > 0)
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
	_exit(sig == SIGALRM ? 4 : 3);
}

static int
do_launch(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	struct proto_launch pl;
	struct proto_arg args[PROTO_MAX_ARGS];
	int64_t vals[PROTO_MAX_ARGS];
	struct be_buffer *bufs[PROTO_MAX_ARGS];
	uint64_t offs[PROTO_MAX_ARGS], ns = 0;
	struct be_launch l;
	const char *name = "?";
	size_t off = sizeof(struct proto_tlaunch) - sizeof(struct proto_launch);
	int wait = (m->h.flags & PROTO_FWAIT) != 0, timed;
	union proto_msg r;

	if (proto_get_launch(frame, m->h.size, &off, &pl, args, vals,
	    s->err) == -1 || off != m->h.size)
		return fatal(s, m->h.tag, PROTO_EPROTO, s->err);
	if (resolve(s, m->h.tag, &pl, args, vals, &l, bufs, offs,
	    &name) == -1)
		return wait ? fail_reply(s) : -1;
	timed = wait || log_verbose >= 2;
	arm_crash(s, m->h.tag, name);
	if (s->be->launch(s->bs, &l, 1, timed, &ns, s->err) == -1) {
		disarm_crash(s);
		errorf(s, m->h.tag, PROTO_EDEVICE, "kernel %s: %s", name,
		    s->err);
		return wait ? fail_reply(s) : -1;
	}
	disarm_crash(s);
	s->dirty = !timed;
	log_debug("session %u: %-24s global (%u,%u,%u) local (%u,%u,%u) "
	    "%10.2f us", s->id, name, pl.global[0], pl.global[1],
	    pl.global[2], pl.local[0], pl.local[1], pl.local[2],
	    (double)ns / 1e3);
	if (!wait)
		return 0;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RLAUNCH;
	r.h.tag = m->h.tag;
	r.rtime.ns = ns;
	return reply(s, &r, NULL, 0);
}

static void
free_graph(void *v, void *arg)
{
	struct graph *g = v;
	uint32_t i;

	(void)arg;
	for (i = 0; i < g->count; i++) {
		free(g->e[i].args);
		free(g->e[i].vals);
	}
	free(g->e);
	free(g);
}

static int
do_graph(struct session *s, const struct proto_tgraph *t, const uint8_t *frame)
{
	struct proto_launch pl;
	struct proto_arg args[PROTO_MAX_ARGS];
	int64_t vals[PROTO_MAX_ARGS];
	size_t off = sizeof(*t), i;
	struct graph *g;
	struct program *p;

	/* Check the records' framing before anything else. */
	for (i = 0; i < t->count; i++)
		if (proto_get_launch(frame, t->h.size, &off, &pl, args, vals,
		    s->err) == -1)
			return fatal(s, t->h.tag, PROTO_EPROTO, s->err);
	if (off != t->h.size)
		return fatal(s, t->h.tag, PROTO_EPROTO, "Tgraph records do not "
		    "fill the frame");
	if (htab_get(&s->graphs, t->graph) != NULL)
		return errorf(s, t->h.tag, PROTO_EEXIST,
		    "graph handle %u is already in use", t->graph);
	if (t->count == 0)
		return errorf(s, t->h.tag, PROTO_EINVAL, "graph has no kernels");
	if (count_handle(s, t->h.tag) == -1)
		return -1;
	if ((g = calloc(1, sizeof(*g))) == NULL ||
	    (g->e = calloc(t->count, sizeof(*g->e))) == NULL) {
		free(g);
		s->nhandles--;
		return errorf(s, t->h.tag, PROTO_ENOMEM, "out of host memory");
	}
	off = sizeof(*t);
	for (i = 0; i < t->count; i++) {
		struct graph_entry *e = &g->e[i];
		proto_get_launch(frame, t->h.size, &off, &e->l, args, vals,
		    s->err);
		g->count++;
		e->args = calloc(e->l.nbufs + 1, sizeof(*e->args));
		e->vals = calloc(e->l.nvals + 1, sizeof(*e->vals));
		if (e->args == NULL || e->vals == NULL) {
			errorf(s, t->h.tag, PROTO_ENOMEM, "out of host memory");
			goto fail;
		}
		memcpy(e->args, args, e->l.nbufs * sizeof(*args));
		memcpy(e->vals, vals, e->l.nvals * sizeof(*vals));
		if ((p = htab_get(&s->progs, e->l.prog)) == NULL) {
			errorf(s, t->h.tag, PROTO_EHANDLE, "graph entry %zu: no "
			    "program with handle %u", i, e->l.prog);
			goto fail;
		}
		if (p->nbufs != e->l.nbufs || p->nvals != e->l.nvals) {
			errorf(s, t->h.tag, PROTO_EINVAL, "graph entry %zu: "
			    "kernel %s takes %u buffers and %u values, the "
			    "entry passes %u and %u", i, p->name, p->nbufs,
			    p->nvals, e->l.nbufs, e->l.nvals);
			goto fail;
		}
	}
	if (htab_put(&s->graphs, t->graph, g) == -1) {
		errorf(s, t->h.tag, PROTO_ENOMEM, "out of host memory");
		goto fail;
	}
	return 0;
fail:
	free_graph(g, NULL);
	s->nhandles--;
	return -1;
}

static int
check_patch(struct session *s, uint32_t tag, const struct graph *g,
    const struct proto_patch *p)
{
	const struct graph_entry *e;

	if (p->entry >= g->count)
		return errorf(s, tag, PROTO_EINVAL, "patch names entry %u of a "
		    "%u-entry graph", p->entry, g->count);
	e = &g->e[p->entry];
	switch (p->kind) {
	case PROTO_PATCH_BUF:
		if (p->index < e->l.nbufs)
			return 0;
		break;
	case PROTO_PATCH_VAL:
		if (p->index < e->l.nvals)
			return 0;
		break;
	case PROTO_PATCH_GLOBAL:
	case PROTO_PATCH_LOCAL:
		if (p->index >= 3)
			break;
		if (p->value == 0 || p->value > UINT32_MAX)
			return errorf(s, tag, PROTO_EINVAL, "launch dimension "
			    "%llu out of range", (unsigned long long)p->value);
		return 0;
	default:
		return errorf(s, tag, PROTO_EINVAL, "unknown patch kind %u",
		    p->kind);
	}
	return errorf(s, tag, PROTO_EINVAL, "patch index %u out of range for "
	    "entry %u", p->index, p->entry);
}

static int
do_graphrun(struct session *s, const struct proto_tgraphrun *t,
    const uint8_t *frame)
{
	struct graph *g = htab_get(&s->graphs, t->graph);
	const uint8_t *body = frame + sizeof(*t);
	size_t blen = t->h.size - sizeof(*t), nargs = 0, i, a;
	int wait = (t->h.flags & PROTO_FWAIT) != 0, timed;
	struct proto_patch p;
	const char *name = "?";
	char gname[32];
	uint64_t ns = 0;
	union proto_msg r;

	if (g == NULL) {
		errorf(s, t->h.tag, PROTO_EHANDLE, "no graph with handle %u",
		    t->graph);
		return wait ? fail_reply(s) : -1;
	}
	/* All patches are checked before any is applied. */
	for (i = 0; i < t->count; i++)
		if (proto_get_patch(body, blen, i, &p, s->err) == -1)
			return fatal(s, t->h.tag, PROTO_EPROTO, s->err);
		else if (check_patch(s, t->h.tag, g, &p) == -1)
			return wait ? fail_reply(s) : -1;
	for (i = 0; i < t->count; i++) {
		struct graph_entry *e;
		proto_get_patch(body, blen, i, &p, s->err);
		e = &g->e[p.entry];
		if (p.kind == PROTO_PATCH_BUF) {
			e->args[p.index].handle = p.handle;
			e->args[p.index].offset = p.value;
		} else if (p.kind == PROTO_PATCH_VAL)
			e->vals[p.index] = (int64_t)p.value;
		else if (p.kind == PROTO_PATCH_GLOBAL)
			e->l.global[p.index] = (uint32_t)p.value;
		else
			e->l.local[p.index] = (uint32_t)p.value;
	}
	for (i = 0; i < g->count; i++)
		nargs += g->e[i].l.nbufs;
	if (scratch(s, g->count, nargs) == -1) {
		errorf(s, t->h.tag, PROTO_ENOMEM, "out of host memory");
		return wait ? fail_reply(s) : -1;
	}
	/* Buffers are looked up at every run: one freed since the graph
	 * was made is an error here, never a dangling pointer. */
	for (i = a = 0; i < g->count; i++) {
		struct graph_entry *e = &g->e[i];
		if (resolve(s, t->h.tag, &e->l, e->args, e->vals,
		    &s->launches[i], s->lbufs + a, s->loffs + a, &name) == -1)
			return wait ? fail_reply(s) : -1;
		a += e->l.nbufs;
	}
	timed = wait || log_verbose >= 2;
	snprintf(gname, sizeof(gname), "in graph %u", t->graph);
	arm_crash(s, t->h.tag, gname);
	if (s->be->launch(s->bs, s->launches, g->count, timed, &ns,
	    s->err) == -1) {
		disarm_crash(s);
		errorf(s, t->h.tag, PROTO_EDEVICE, "graph %u: %s", t->graph,
		    s->err);
		return wait ? fail_reply(s) : -1;
	}
	disarm_crash(s);
	s->dirty = !timed;
	log_debug("session %u: graph %u, %u kernels %10.2f us", s->id,
	    t->graph, g->count, (double)ns / 1e3);
	if (!wait)
		return 0;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RGRAPHRUN;
	r.h.tag = t->h.tag;
	r.rtime.ns = ns;
	return reply(s, &r, NULL, 0);
}

static int
do_graphfree(struct session *s, const struct proto_tgraphfree *t)
{
	struct graph *g = htab_del(&s->graphs, t->graph);

	if (g == NULL)
		return errorf(s, t->h.tag, PROTO_EHANDLE,
		    "no graph with handle %u", t->graph);
	free_graph(g, NULL);
	s->nhandles--;
	return 0;
}

static int
do_sync(struct session *s, const union proto_msg *m)
{
	union proto_msg r;

	s->dirty = 0;
	if (s->be->sync(s->bs, s->err) == -1) {
		errorf(s, m->h.tag, PROTO_EDEVICE, "%s", s->err);
		return fail_reply(s);
	}
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RSYNC;
	r.h.tag = m->h.tag;
	return reply(s, &r, NULL, 0);
}

static int
do_ping(struct session *s, const union proto_msg *m, const uint8_t *data)
{
	union proto_msg r;

	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RPING;
	r.h.tag = m->h.tag;
	r.ping.count = m->ping.count;
	return reply(s, &r, data, m->ping.count);
}

/*
 * Act on one request whose whole frame is at frame. Returns 0, -1 for a
 * failed request (its error is queued), -2 to end the session.
 */
static int
dispatch(struct session *s, const union proto_msg *m, const uint8_t *frame,
    const char *peer)
{
	const uint8_t *body = frame + proto_fixed_size(m->h.type);
	int rc;

	if (s->state == S_HELLO)
		return do_hello(s, m) == -1 ? -2 : 0;
	if (s->state == S_AUTH)
		return do_auth(s, m, peer) == -1 ? -2 : 0;
	switch (m->h.type) {
	case PROTO_THELLO:
		return fatal(s, m->h.tag, PROTO_ESTATE, "Thello was already "
		    "exchanged") == -1 ? -2 : 0;
	case PROTO_TAUTH:
		return fatal(s, m->h.tag, PROTO_ESTATE, "Tauth is not expected: "
		    "this session is already authenticated or needs none") ==
		    -1 ? -2 : 0;
	case PROTO_TPING:
		rc = do_ping(s, m, body);
		break;
	case PROTO_TSYNC:
		rc = do_sync(s, m);
		break;
	case PROTO_TALLOC:
		rc = do_alloc(s, &m->talloc);
		break;
	case PROTO_TFREE:
		rc = do_free(s, &m->tfree);
		break;
	case PROTO_TREAD:
		rc = do_read(s, &m->tread);
		break;
	case PROTO_TCOPY:
		rc = do_copy(s, &m->tcopy);
		break;
	case PROTO_TLOAD:
		rc = do_load(s, &m->tload, body);
		break;
	case PROTO_TUNLOAD:
		rc = do_unload(s, &m->tunload);
		break;
	case PROTO_TLAUNCH:
		rc = do_launch(s, m, frame);
		break;
	case PROTO_TGRAPH:
		rc = do_graph(s, &m->tgraph, frame);
		break;
	case PROTO_TGRAPHRUN:
		rc = do_graphrun(s, &m->tgraphrun, frame);
		break;
	case PROTO_TGRAPHFREE:
		rc = do_graphfree(s, &m->tgraphfree);
		break;
	default:	/* proto_check_hdr admits only the types above */
		return fatal(s, m->h.tag, PROTO_EPROTO, "unexpected type") ==
		    -1 ? -2 : 0;
	}
	return rc;
}

static void
release_buffer(void *v, void *arg)
{
	free_buffer(arg, v);
}

static void
release_program(void *v, void *arg)
{
	free_program(arg, v);
}

static void
release_graph(void *v, void *arg)
{
	free_graph(v, arg);
}

void
sess_serve(const struct mr_server_ctx *ctx, int fd, uint32_t id, int slot,
    const char *peer)
{
	struct session *s;
	union proto_msg m;
	size_t fixed;
	int rc;

	if ((s = calloc(1, sizeof(*s))) == NULL) {
		log_warn("session %u: out of memory", id);
		close(fd);
		return;
	}
	s->ctx = ctx;
	s->be = ctx->be;
	s->fd = fd;
	s->id = id;
	s->slot = slot;
	s->maxmsg = ctx->cfg->maxmsg;
	s->last_active = time(NULL);
	if (grow(&s->in, &s->incap, IN_MIN) == -1 ||
	    (s->bs = s->be->session_open(s->err)) == NULL) {
		log_warn("session %u: cannot start: %s", id, s->in ?
		    s->err : "out of memory");
		goto done;
	}
	for (;;) {
		/* Keep an idle session small after a large frame. */
		if (s->inoff == s->inlen && s->incap > 4 * IN_MIN) {
			free(s->in);
			s->in = NULL;
			s->incap = s->inlen = s->inoff = 0;
			if (grow(&s->in, &s->incap, IN_MIN) == -1)
				break;
		}
		if ((rc = need(s, PROTO_HDR_SIZE, 1)) <= 0)
			break;
		s->last_active = time(NULL);
		proto_get_hdr(s->in + s->inoff, &m.h);
		if (proto_check_hdr(&m.h, s->maxmsg, s->err) == -1) {
			fatal(s, m.h.tag, PROTO_EPROTO, s->err);
			break;
		}
		fixed = proto_fixed_size(m.h.type);
		if (need(s, fixed, 0) <= 0)
			break;
		if (proto_get(s->in + s->inoff, fixed, &m, s->err) == -1 ||
		    proto_check_size(&m, s->err) == -1) {
			fatal(s, m.h.tag, PROTO_EPROTO, s->err);
			break;
		}
		/* Before hello and auth only fixed-size requests are valid:
		 * answer without reading any payload. */
		if (s->state != S_READY) {
			if (dispatch(s, &m, s->in + s->inoff, peer) == -2)
				break;
			s->inoff += fixed;
			continue;
		}
		if (m.h.type == PROTO_TWRITE) {
			s->inoff += fixed;
			if (do_write(s, &m.twrite) == -2)
				break;
			continue;
		}
		if (need(s, m.h.size, 0) <= 0)
			break;
		rc = dispatch(s, &m, s->in + s->inoff, peer);
		s->inoff += m.h.size;
		if (rc == -2)
			break;
	}
	drain_errors(s);
	flush(s);
done:
	log_info("session %u: closing, freeing %u buffers (%llu bytes), %u "
	    "programs, %u graphs", id, s->bufs.count,
	    (unsigned long long)s->mem, s->progs.count, s->graphs.count);
	htab_clear(&s->graphs, release_graph, s);
	if (s->bs != NULL)
		s->be->sync(s->bs, s->err);
	htab_clear(&s->bufs, release_buffer, s);
	htab_clear(&s->progs, release_program, s);
	if (s->bs != NULL)
		s->be->session_close(s->bs);
	close(fd);
	free(s->in);
	free(s->out);
	free(s->errq);
	free(s->launches);
	free(s->lbufs);
	free(s->loffs);
	free(s);
}
