/*
 * proto.c: parsing and building metal_runner frames, with no I/O.
 *
 * Each message type has one table of its fields: where the field lies on
 * the wire, how wide it is, and where it goes in the C struct. proto_get and
 * proto_put walk that table with little-endian getters and putters, so wire
 * bytes are never cast to a struct and the code does not depend on the
 * host's byte order or struct layout. Every length a peer sends is checked
 * against the bytes actually present, in 64-bit arithmetic or by
 * subtraction, so no sum of counts can wrap around.
 */

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "proto.h"

#define nitems(a)	(sizeof(a) / sizeof((a)[0]))

#define LAUNCH_SIZE	32	/* fixed part of a launch record */
#define ARG_SIZE	16
#define VAL_SIZE	8
#define PATCH_SIZE	24
#define PROF_SIZE	40	/* a profile record */

struct field {
	uint16_t	off;	/* on the wire, from the start of frame or record */
	uint16_t	width;	/* bytes on the wire and in the struct */
	uint16_t	moff;	/* offset of the member in the C struct */
	uint8_t		isint;	/* little-endian integer; else bytes copied */
};

/* The wire offset is spelled out (it is the spec); the member offset and
 * width come from the struct, so the two may differ on an odd ABI. */
#define FI(s, m, o)	{ o, sizeof(((struct s *)0)->m), offsetof(struct s, m), 1 }
#define FB(s, m, o)	{ o, sizeof(((struct s *)0)->m), offsetof(struct s, m), 0 }

/* The header, common to every message, is coded apart from these tables. */
static const struct field f_rerror[] = {
	FI(proto_rerror, code, 12), FI(proto_rerror, count, 16)
};
static const struct field f_thello[] = {
	FI(proto_thello, magic, 12), FI(proto_thello, version, 16),
	FI(proto_thello, maxmsg, 20)
};
static const struct field f_rhello[] = {
	FI(proto_rhello, magic, 12), FI(proto_rhello, version, 16),
	FI(proto_rhello, maxmsg, 20), FI(proto_rhello, backend, 24),
	FI(proto_rhello, caps, 26), FI(proto_rhello, ncores, 28),
	FI(proto_rhello, memory, 32), FI(proto_rhello, maxbuf, 40),
	FI(proto_rhello, maxhandles, 48), FI(proto_rhello, session, 52),
	FB(proto_rhello, nonce, 56), FB(proto_rhello, name, 88),
	FB(proto_rhello, arch, 152), FB(proto_rhello, cpu, 168),
	FB(proto_rhello, features, 200)
};
static const struct field f_tauth[] = {
	FB(proto_tauth, cnonce, 12), FB(proto_tauth, mac, 44)
};
static const struct field f_rauth[] = {
	FB(proto_rauth, mac, 12)
};
static const struct field f_ping[] = {
	FI(proto_ping, count, 12)
};
static const struct field f_talloc[] = {
	FI(proto_talloc, handle, 12), FI(proto_talloc, size, 16)
};
static const struct field f_tfree[] = {
	FI(proto_tfree, handle, 12)
};
static const struct field f_twrite[] = {
	FI(proto_twrite, handle, 12), FI(proto_twrite, offset, 16),
	FI(proto_twrite, count, 24)
};
static const struct field f_tread[] = {
	FI(proto_tread, handle, 12), FI(proto_tread, offset, 16),
	FI(proto_tread, count, 24)
};
static const struct field f_rread[] = {
	FI(proto_rread, count, 12)
};
static const struct field f_tcopy[] = {
	FI(proto_tcopy, dst, 12), FI(proto_tcopy, src, 16),
	FI(proto_tcopy, dstoff, 24), FI(proto_tcopy, srcoff, 32),
	FI(proto_tcopy, count, 40)
};
static const struct field f_tload[] = {
	FI(proto_tload, prog, 12), FI(proto_tload, kind, 16),
	FI(proto_tload, arch, 18), FI(proto_tload, nbufs, 20),
	FI(proto_tload, nvals, 22), FI(proto_tload, corearg, 24),
	FI(proto_tload, entry, 28), FI(proto_tload, crc, 32),
	FI(proto_tload, namelen, 36), FI(proto_tload, datalen, 40)
};
static const struct field f_tunload[] = {
	FI(proto_tunload, prog, 12)
};
static const struct field f_tlaunch[] = {
	FI(proto_tlaunch, l.prog, 16), FI(proto_tlaunch, l.nbufs, 20),
	FI(proto_tlaunch, l.nvals, 22), FI(proto_tlaunch, l.global[0], 24),
	FI(proto_tlaunch, l.global[1], 28), FI(proto_tlaunch, l.global[2], 32),
	FI(proto_tlaunch, l.local[0], 36), FI(proto_tlaunch, l.local[1], 40),
	FI(proto_tlaunch, l.local[2], 44)
};
static const struct field f_rtime[] = {
	FI(proto_rtime, ns, 16)
};
static const struct field f_tgraph[] = {
	FI(proto_tgraph, graph, 12), FI(proto_tgraph, count, 16)
};
static const struct field f_tgraphrun[] = {
	FI(proto_tgraphrun, graph, 12), FI(proto_tgraphrun, count, 16)
};
static const struct field f_tgraphfree[] = {
	FI(proto_tgraphfree, graph, 12)
};

static const struct field f_rclock[] = {
	FI(proto_rclock, clock, 16)
};
static const struct field f_tprofile[] = {
	FI(proto_tprofile, mode, 12), FI(proto_tprofile, count, 16)
};
static const struct field f_rprofile[] = {
	FI(proto_rprofile, count, 12), FI(proto_rprofile, left, 16),
	FI(proto_rprofile, lost, 20), FI(proto_rprofile, cap, 24)
};
static const struct field f_tresumekey[] = {
	FI(proto_tresumekey, mode, 12)
};
static const struct field f_rresumekey[] = {
	FI(proto_rresumekey, grace, 12), FI(proto_rresumekey, log, 16),
	FB(proto_rresumekey, secret, 24)
};
static const struct field f_tresume[] = {
	FI(proto_tresume, session, 12), FI(proto_tresume, sent, 16),
	FI(proto_tresume, received, 24), FB(proto_tresume, cnonce, 32),
	FB(proto_tresume, mac, 64)
};
static const struct field f_rresume[] = {
	FI(proto_rresume, processed, 16), FB(proto_rresume, mac, 24)
};
static const struct field f_tack[] = {
	FI(proto_tack, received, 16)
};

static const struct field f_have[] = {
	FI(proto_have, count, 12)
};
static const struct field f_twritehash[] = {
	FI(proto_twritehash, handle, 12), FI(proto_twritehash, offset, 16),
	FI(proto_twritehash, count, 24), FB(proto_twritehash, hash, 32)
};

static const struct field f_tgrant[] = {
	FI(proto_tgrant, handle, 12), FI(proto_tgrant, offset, 16),
	FI(proto_tgrant, count, 24), FI(proto_tgrant, ttl, 32)
};
static const struct field f_rgrant[] = {
	FI(proto_rgrant, grant, 16), FB(proto_rgrant, secret, 24)
};
static const struct field f_tpeersend[] = {
	FI(proto_tpeersend, handle, 12), FI(proto_tpeersend, offset, 16),
	FI(proto_tpeersend, count, 24), FI(proto_tpeersend, grant, 32),
	FB(proto_tpeersend, secret, 40), FI(proto_tpeersend, port, 72),
	FI(proto_tpeersend, hostlen, 74)
};
static const struct field f_tpeer[] = {
	FI(proto_tpeer, magic, 12), FI(proto_tpeer, grant, 16),
	FI(proto_tpeer, count, 24), FB(proto_tpeer, cnonce, 32),
	FB(proto_tpeer, mac, 64)
};
static const struct field f_rpeer[] = {
	FI(proto_rpeer, count, 16), FB(proto_rpeer, mac, 24)
};
static const struct field f_tlisten[] = {
	FI(proto_tlisten, link, 12), FI(proto_tlisten, ttl, 16)
};
static const struct field f_tdial[] = {
	FI(proto_tdial, link, 12), FI(proto_tdial, port, 16),
	FI(proto_tdial, hostlen, 18), FI(proto_tdial, grant, 24),
	FB(proto_tdial, secret, 32)
};
static const struct field f_tunlink[] = {
	FI(proto_tunlink, link, 12)
};

static const struct field f_linkhdr[] = {
	FI(proto_linkhdr, magic, 0), FI(proto_linkhdr, seq, 8),
	FI(proto_linkhdr, channel, 16), FI(proto_linkhdr, count, 24)
};

/* Records inside a frame; offsets are from the start of the record. */
static const struct field f_launch[] = {
	FI(proto_launch, prog, 0), FI(proto_launch, nbufs, 4),
	FI(proto_launch, nvals, 6), FI(proto_launch, global[0], 8),
	FI(proto_launch, global[1], 12), FI(proto_launch, global[2], 16),
	FI(proto_launch, local[0], 20), FI(proto_launch, local[1], 24),
	FI(proto_launch, local[2], 28)
};
static const struct field f_arg[] = {
	FI(proto_arg, handle, 0), FI(proto_arg, offset, 8)
};
static const struct field f_patch[] = {
	FI(proto_patch, entry, 0), FI(proto_patch, kind, 4),
	FI(proto_patch, index, 6), FI(proto_patch, handle, 8),
	FI(proto_patch, value, 16)
};
static const struct field f_prof[] = {
	FI(proto_prof, kind, 0), FI(proto_prof, entry, 2),
	FI(proto_prof, tag, 4), FI(proto_prof, handle, 8),
	FI(proto_prof, aux, 12), FI(proto_prof, start, 16),
	FI(proto_prof, end, 24), FI(proto_prof, count, 32)
};

/*
 * A message's size rule: its frame is its fixed part and nothing more
 * (SIZE_FIXED), or the fixed part plus the sum of its terms, each a count
 * field times a unit (SIZE_PLUS; SIZE_ARGS: also at most PROTO_MAX_ARGS
 * buffers and values in all, as the receiver decodes into arrays of that
 * size), or at least the fixed part (SIZE_MIN: Tgraph, whose records are
 * checked one by one by proto_get_launch).
 */
enum { SIZE_FIXED, SIZE_PLUS, SIZE_ARGS, SIZE_MIN };

struct term {
	uint16_t	 unit;	/* bytes per count */
	uint16_t	 moff;	/* the count's member in the C struct */
	uint16_t	 width;
	const char	*name;
};

#define T(s, m, u, n)	{ u, offsetof(struct s, m), sizeof(((struct s *)0)->m), n }

static const struct term t_rerror[] = { T(proto_rerror, count, 1, "count") };
static const struct term t_ping[] = { T(proto_ping, count, 1, "count") };
static const struct term t_rread[] = { T(proto_rread, count, 1, "count") };
static const struct term t_rhave[] = { T(proto_have, count, 1, "count") };
static const struct term t_twrite[] = { T(proto_twrite, count, 1, "count") };
static const struct term t_tpeersend[] = {
	T(proto_tpeersend, hostlen, 1, "hostlen")
};
static const struct term t_tdial[] = { T(proto_tdial, hostlen, 1, "hostlen") };
static const struct term t_tload[] = {
	T(proto_tload, namelen, 1, "namelen"),
	T(proto_tload, datalen, 1, "datalen")
};
static const struct term t_tlaunch[] = {
	T(proto_tlaunch, l.nbufs, ARG_SIZE, "nbufs"),
	T(proto_tlaunch, l.nvals, VAL_SIZE, "nvals")
};
static const struct term t_tgraphrun[] = {
	T(proto_tgraphrun, count, PATCH_SIZE, "count")
};
static const struct term t_thave[] = {
	T(proto_have, count, PROTO_HASH_SIZE, "count")
};
static const struct term t_rprofile[] = {
	T(proto_rprofile, count, PROF_SIZE, "count")
};

struct msgdef {
	const char		*name;
	uint32_t		 size;	/* fixed part, header included */
	const struct field	*f;	/* fields after the header */
	size_t			 nf;
	int			 rule;	/* SIZE_* */
	const struct term	*t;	/* what follows the fixed part */
	size_t			 nt;
};

#define M(n, s, f)	{ n, s, f, nitems(f), SIZE_FIXED, NULL, 0 }
/* With a payload: rule r, terms t. */
#define MP(n, s, f, r, t)	{ n, s, f, nitems(f), r, t, nitems(t) }

/* Pad fields are in no table: they are written as zero and never read. */
static const struct msgdef msgs[] = {
	[PROTO_RERROR] = MP("Rerror", 20, f_rerror, SIZE_PLUS, t_rerror),
	[PROTO_THELLO] = M("Thello", 24, f_thello),
	[PROTO_RHELLO] = M("Rhello", 328, f_rhello),
	[PROTO_TAUTH] = M("Tauth", 76, f_tauth),
	[PROTO_RAUTH] = M("Rauth", 44, f_rauth),
	[PROTO_TPING] = MP("Tping", 16, f_ping, SIZE_PLUS, t_ping),
	[PROTO_RPING] = MP("Rping", 16, f_ping, SIZE_PLUS, t_ping),
	[PROTO_TSYNC] = { "Tsync", 12, NULL, 0, SIZE_FIXED, NULL, 0 },
	[PROTO_RSYNC] = { "Rsync", 12, NULL, 0, SIZE_FIXED, NULL, 0 },
	[PROTO_TALLOC] = M("Talloc", 24, f_talloc),
	[PROTO_TFREE] = M("Tfree", 16, f_tfree),
	[PROTO_TWRITE] = MP("Twrite", 32, f_twrite, SIZE_PLUS, t_twrite),
	[PROTO_TREAD] = M("Tread", 32, f_tread),
	[PROTO_RREAD] = MP("Rread", 16, f_rread, SIZE_PLUS, t_rread),
	[PROTO_TCOPY] = M("Tcopy", 48, f_tcopy),
	[PROTO_TLOAD] = MP("Tload", 44, f_tload, SIZE_PLUS, t_tload),
	[PROTO_TUNLOAD] = M("Tunload", 16, f_tunload),
	[PROTO_TLAUNCH] = MP("Tlaunch", 48, f_tlaunch, SIZE_ARGS,
	    t_tlaunch),
	[PROTO_RLAUNCH] = M("Rlaunch", 24, f_rtime),
	[PROTO_TGRAPH] = { "Tgraph", 24, f_tgraph, nitems(f_tgraph),
	    SIZE_MIN, NULL, 0 },
	[PROTO_TGRAPHRUN] = MP("Tgraphrun", 24, f_tgraphrun, SIZE_PLUS,
	    t_tgraphrun),
	[PROTO_RGRAPHRUN] = M("Rgraphrun", 24, f_rtime),
	[PROTO_TGRAPHFREE] = M("Tgraphfree", 16, f_tgraphfree),
	[PROTO_TCLOCK] = { "Tclock", 12, NULL, 0, SIZE_FIXED, NULL, 0 },
	[PROTO_RCLOCK] = M("Rclock", 24, f_rclock),
	[PROTO_TPROFILE] = M("Tprofile", 20, f_tprofile),
	[PROTO_RPROFILE] = MP("Rprofile", 32, f_rprofile, SIZE_PLUS,
	    t_rprofile),
	[PROTO_THAVE] = MP("Thave", 16, f_have, SIZE_PLUS, t_thave),
	[PROTO_RHAVE] = MP("Rhave", 16, f_have, SIZE_PLUS, t_rhave),
	[PROTO_TWRITEHASH] = M("Twritehash", 64, f_twritehash),
	[PROTO_TRESUMEKEY] = M("Tresumekey", 16, f_tresumekey),
	[PROTO_RRESUMEKEY] = M("Rresumekey", 56, f_rresumekey),
	[PROTO_TRESUME] = M("Tresume", 96, f_tresume),
	[PROTO_RRESUME] = M("Rresume", 56, f_rresume),
	[PROTO_TACK] = M("Tack", 24, f_tack),
	[PROTO_TGRANT] = M("Tgrant", 40, f_tgrant),
	[PROTO_RGRANT] = M("Rgrant", 56, f_rgrant),
	[PROTO_TPEERSEND] = MP("Tpeersend", 80, f_tpeersend, SIZE_PLUS,
	    t_tpeersend),
	[PROTO_RPEERSEND] = M("Rpeersend", 24, f_rtime),
	[PROTO_TPEER] = M("Tpeer", 96, f_tpeer),
	[PROTO_RPEER] = M("Rpeer", 56, f_rpeer),
	[PROTO_TLISTEN] = M("Tlisten", 20, f_tlisten),
	[PROTO_RLISTEN] = M("Rlisten", 56, f_rgrant),
	[PROTO_TDIAL] = MP("Tdial", 64, f_tdial, SIZE_PLUS, t_tdial),
	[PROTO_RDIAL] = M("Rdial", 24, f_rtime),
	[PROTO_TUNLINK] = M("Tunlink", 16, f_tunlink)
};

static const char *const errnames[] = {
	[PROTO_EPROTO] = "EPROTO",	[PROTO_EVERSION] = "EVERSION",
	[PROTO_EAUTH] = "EAUTH",	[PROTO_ESTATE] = "ESTATE",
	[PROTO_EHANDLE] = "EHANDLE",	[PROTO_EEXIST] = "EEXIST",
	[PROTO_ERANGE] = "ERANGE",	[PROTO_EINVAL] = "EINVAL",
	[PROTO_ENOMEM] = "ENOMEM",	[PROTO_ELIMIT] = "ELIMIT",
	[PROTO_EKIND] = "EKIND",	[PROTO_EPROGRAM] = "EPROGRAM",
	[PROTO_EDEVICE] = "EDEVICE",	[PROTO_EMORE] = "EMORE",
	[PROTO_ECRASH] = "ECRASH",	[PROTO_ETIMEOUT] = "ETIMEOUT",
	[PROTO_ENOTCACHED] = "ENOTCACHED", [PROTO_ECACHE] = "ECACHE",
	[PROTO_ERESUME] = "ERESUME",
	[PROTO_EGRANT] = "EGRANT",	[PROTO_EPEER] = "EPEER"
};

#if defined(__GNUC__) || defined(__clang__)
static int fail(char *, const char *, ...)
    __attribute__((format(printf, 2, 3)));
#endif

/* Leave a message for the caller; err may be NULL if it does not care. */
static int
fail(char *err, const char *fmt, ...)
{
	va_list ap;

	if (err != NULL) {
		va_start(ap, fmt);
		vsnprintf(err, PROTO_ERRLEN, fmt, ap);
		va_end(ap);
	}
	return -1;
}

static uint16_t
get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t
get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	    (uint32_t)p[3] << 24;
}

static uint64_t
get_u64(const uint8_t *p)
{
	return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static void
put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void
put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void
put_u64(uint8_t *p, uint64_t v)
{
	put_u32(p, (uint32_t)v);
	put_u32(p + 4, (uint32_t)(v >> 32));
}

/* Members are reached through memcpy, so no pointer is ever misaligned. */
static void
get_fields(const uint8_t *p, const struct field *f, size_t n, void *dst)
{
	uint8_t		*d;
	uint16_t	 v16;
	uint32_t	 v32;
	uint64_t	 v64;

	for (; n > 0; n--, f++) {
		d = (uint8_t *)dst + f->moff;
		if (!f->isint)
			memcpy(d, p + f->off, f->width);
		else if (f->width == 2) {
			v16 = get_u16(p + f->off);
			memcpy(d, &v16, 2);
		} else if (f->width == 4) {
			v32 = get_u32(p + f->off);
			memcpy(d, &v32, 4);
		} else {
			v64 = get_u64(p + f->off);
			memcpy(d, &v64, 8);
		}
	}
}

static void
put_fields(uint8_t *p, const struct field *f, size_t n, const void *src)
{
	const uint8_t	*s;
	uint16_t	 v16;
	uint32_t	 v32;
	uint64_t	 v64;

	for (; n > 0; n--, f++) {
		s = (const uint8_t *)src + f->moff;
		if (!f->isint)
			memcpy(p + f->off, s, f->width);
		else if (f->width == 2) {
			memcpy(&v16, s, 2);
			put_u16(p + f->off, v16);
		} else if (f->width == 4) {
			memcpy(&v32, s, 4);
			put_u32(p + f->off, v32);
		} else {
			memcpy(&v64, s, 8);
			put_u64(p + f->off, v64);
		}
	}
}

static const struct msgdef *
msgdef(unsigned type)
{
	if (type >= nitems(msgs) || msgs[type].name == NULL)
		return NULL;
	return &msgs[type];
}

size_t
proto_fixed_size(unsigned type)
{
	const struct msgdef *d = msgdef(type);

	return d == NULL ? 0 : d->size;
}

/* Requests are the even types; Rerror and the replies are odd. */
int
proto_is_request(unsigned type)
{
	return msgdef(type) != NULL && type % 2 == 0;
}

void
proto_get_hdr(const uint8_t *buf, struct proto_hdr *h)
{
	h->size = get_u32(buf);
	h->type = get_u16(buf + 4);
	h->flags = get_u16(buf + 6);
	h->tag = get_u32(buf + 8);
}

static void
put_hdr(uint8_t *buf, const struct proto_hdr *h)
{
	put_u32(buf, h->size);
	put_u16(buf + 4, h->type);
	put_u16(buf + 6, h->flags);
	put_u32(buf + 8, h->tag);
}

int
proto_check_hdr(const struct proto_hdr *h, uint32_t maxmsg, char *err)
{
	const struct msgdef *d;

	if (h->size < PROTO_HDR_SIZE)
		return fail(err, "frame size %" PRIu32 " is smaller than the "
		    "%d-byte header", h->size, PROTO_HDR_SIZE);
	if ((d = msgdef(h->type)) == NULL)
		return fail(err, "unknown message type %u", (unsigned)h->type);
	if (!proto_is_request(h->type))
		return fail(err, "%s (type %u) is a reply; a client may only "
		    "send requests", d->name, (unsigned)h->type);
	if (h->size < d->size)
		return fail(err, "%s frame size %" PRIu32 " is smaller than its "
		    "%" PRIu32 "-byte fixed part", d->name, h->size, d->size);
	if (h->size > maxmsg)
		return fail(err, "%s frame size %" PRIu32 " exceeds maxmsg %"
		    PRIu32, d->name, h->size, maxmsg);
	return 0;
}

int
proto_get(const uint8_t *buf, size_t len, union proto_msg *m, char *err)
{
	const struct msgdef	*d;
	struct proto_hdr	 h;

	if (len < PROTO_HDR_SIZE)
		return fail(err, "%zu bytes is shorter than the %d-byte header",
		    len, PROTO_HDR_SIZE);
	proto_get_hdr(buf, &h);
	if ((d = msgdef(h.type)) == NULL)
		return fail(err, "unknown message type %u", (unsigned)h.type);
	if (len < d->size)
		return fail(err, "%s needs its %" PRIu32 "-byte fixed part, "
		    "only %zu bytes given", d->name, d->size, len);
	memset(m, 0, sizeof(*m));
	m->h = h;
	get_fields(buf, d->f, d->nf, m);
	return 0;
}

/* size == fixed + extra, tested without adding so nothing can wrap. */
static int
size_is(uint32_t size, uint32_t fixed, uint64_t extra)
{
	return size >= fixed && size - fixed == extra;
}

/* The value of a count member of m (2, 4 or 8 bytes wide). */
static uint64_t
term_value(const union proto_msg *m, const struct term *t)
{
	const uint8_t	*p = (const uint8_t *)m + t->moff;
	uint16_t	 v16;
	uint32_t	 v32;
	uint64_t	 v64;

	if (t->width == 2) {
		memcpy(&v16, p, 2);
		return v16;
	}
	if (t->width == 4) {
		memcpy(&v32, p, 4);
		return v32;
	}
	memcpy(&v64, p, 8);
	return v64;
}

int
proto_check_size(const union proto_msg *m, char *err)
{
	const struct msgdef	*d;
	uint32_t		 size = m->h.size;
	uint64_t		 v[2] = { 0, 0 }, extra = 0;
	char			 what[128];
	size_t			 i, n = 0;

	if ((d = msgdef(m->h.type)) == NULL)
		return fail(err, "unknown message type %u", (unsigned)m->h.type);
	if (d->rule == SIZE_FIXED) {
		if (size != d->size)
			return fail(err, "%s frame size %" PRIu32 " is not its "
			    "fixed size %" PRIu32, d->name, size, d->size);
		return 0;
	}
	if (d->rule == SIZE_MIN) {
		if (size < d->size)
			return fail(err, "%s frame size %" PRIu32 " is "
			    "smaller than its %" PRIu32 "-byte fixed part",
			    d->name, size, d->size);
		return 0;
	}
	/* Each term fits in 64 bits: a count wider than 32 bits has unit 1,
	 * and no sum can match a 32-bit size once a term passes it. */
	for (i = 0; i < d->nt; i++) {
		v[i % 2] = term_value(m, &d->t[i]);
		if (v[i % 2] > UINT32_MAX)
			extra = UINT64_MAX;
		else if (extra != UINT64_MAX)
			extra += d->t[i].unit * v[i % 2];
	}
	if (d->rule == SIZE_ARGS && v[0] + v[1] > PROTO_MAX_ARGS)
		return fail(err, "%s has %u buffers + %u values, more than the "
		    "%d arguments a kernel may take", d->name, (unsigned)v[0],
		    (unsigned)v[1], PROTO_MAX_ARGS);
	if (size_is(size, d->size, extra))
		return 0;
	what[0] = '\0';
	for (i = 0; i < d->nt; i++) {
		if (d->t[i].unit > 1)
			n += (size_t)snprintf(what + n, sizeof(what) - n,
			    " + %u * %s %" PRIu64, d->t[i].unit, d->t[i].name,
			    term_value(m, &d->t[i]));
		else
			n += (size_t)snprintf(what + n, sizeof(what) - n,
			    " + %s %" PRIu64, d->t[i].name,
			    term_value(m, &d->t[i]));
		if (n >= sizeof(what))
			break;
	}
	return fail(err, "%s frame size %" PRIu32 " is not its %" PRIu32
	    "-byte fixed part%s", d->name, size, d->size, what);
}

size_t
proto_put(uint8_t *buf, size_t cap, const union proto_msg *m)
{
	const struct msgdef *d;

	if ((d = msgdef(m->h.type)) == NULL || cap < d->size)
		return 0;
	memset(buf, 0, d->size);
	put_hdr(buf, &m->h);
	put_fields(buf, d->f, d->nf, m);
	return d->size;
}

size_t
proto_launch_size(unsigned nbufs, unsigned nvals)
{
	return LAUNCH_SIZE + (size_t)ARG_SIZE * nbufs + (size_t)VAL_SIZE * nvals;
}

int
proto_get_launch(const uint8_t *buf, size_t len, size_t *off,
    struct proto_launch *l, struct proto_arg *args, int64_t *vals, char *err)
{
	const uint8_t	*p;
	size_t		 need, i;
	uint64_t	 v;

	if (*off > len || len - *off < LAUNCH_SIZE)
		return fail(err, "launch record at offset %zu runs past the end "
		    "of the %zu-byte frame", *off, len);
	p = buf + *off;
	memset(l, 0, sizeof(*l));
	get_fields(p, f_launch, nitems(f_launch), l);
	if ((unsigned)l->nbufs + l->nvals > PROTO_MAX_ARGS)
		return fail(err, "launch record at offset %zu has %u buffers + "
		    "%u values, more than the %d arguments a kernel may take",
		    *off, (unsigned)l->nbufs, (unsigned)l->nvals,
		    PROTO_MAX_ARGS);
	need = proto_launch_size(l->nbufs, l->nvals);
	if (len - *off < need)
		return fail(err, "launch record at offset %zu with %u buffers "
		    "and %u values needs %zu bytes; only %zu remain in the "
		    "frame", *off, (unsigned)l->nbufs, (unsigned)l->nvals,
		    need, len - *off);
	for (i = 0; i < l->nbufs; i++) {
		memset(&args[i], 0, sizeof(args[i]));
		get_fields(p + LAUNCH_SIZE + ARG_SIZE * i, f_arg,
		    nitems(f_arg), &args[i]);
	}
	for (i = 0; i < l->nvals; i++) {
		v = get_u64(p + LAUNCH_SIZE + ARG_SIZE * l->nbufs +
		    VAL_SIZE * i);
		memcpy(&vals[i], &v, 8);	/* two's complement, any host */
	}
	*off += need;
	return 0;
}

size_t
proto_put_launch(uint8_t *buf, size_t cap, const struct proto_launch *l,
    const struct proto_arg *args, const int64_t *vals)
{
	size_t		 need, i;
	uint64_t	 v;

	need = proto_launch_size(l->nbufs, l->nvals);
	if (cap < need)
		return 0;
	memset(buf, 0, need);
	put_fields(buf, f_launch, nitems(f_launch), l);
	for (i = 0; i < l->nbufs; i++)
		put_fields(buf + LAUNCH_SIZE + ARG_SIZE * i, f_arg,
		    nitems(f_arg), &args[i]);
	for (i = 0; i < l->nvals; i++) {
		memcpy(&v, &vals[i], 8);
		put_u64(buf + LAUNCH_SIZE + ARG_SIZE * l->nbufs + VAL_SIZE * i,
		    v);
	}
	return need;
}

int
proto_get_patch(const uint8_t *buf, size_t len, size_t i,
    struct proto_patch *p, char *err)
{
	/* Divide rather than multiply: i comes from a loop over a count the
	 * peer sent, and i * 24 could wrap. */
	if (i >= len / PATCH_SIZE)
		return fail(err, "patch %zu is past the end of the %zu-byte "
		    "patch list (%zu patches)", i, len, len / PATCH_SIZE);
	memset(p, 0, sizeof(*p));
	get_fields(buf + PATCH_SIZE * i, f_patch, nitems(f_patch), p);
	return 0;
}

size_t
proto_put_prof(uint8_t *buf, size_t cap, const struct proto_prof *r)
{
	if (cap < PROF_SIZE)
		return 0;
	memset(buf, 0, PROF_SIZE);
	put_fields(buf, f_prof, nitems(f_prof), r);
	return PROF_SIZE;
}

size_t
proto_put_rerror(uint8_t *buf, size_t cap, uint32_t tag, uint32_t code,
    const char *text)
{
	return proto_put_rerror_n(buf, cap, tag, code, text,
	    PROTO_MAX_ERRTEXT);
}

size_t
proto_put_rerror_n(uint8_t *buf, size_t cap, uint32_t tag, uint32_t code,
    const char *text, size_t maxtext)
{
	struct proto_hdr	h;
	size_t			n = 0;

	if (text == NULL)
		text = "";
	while (n < maxtext && text[n] != '\0')
		n++;
	/* A cut text must stay UTF-8: never end inside a character. */
	if (text[n] != '\0')
		while (n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80)
			n--;
	if (cap < 20 + n)
		return 0;
	h.size = (uint32_t)(20 + n);
	h.type = PROTO_RERROR;
	h.flags = 0;
	h.tag = tag;
	put_hdr(buf, &h);
	put_u32(buf + 12, code);
	put_u32(buf + 16, (uint32_t)n);
	memcpy(buf + 20, text, n);
	return 20 + n;
}

/* Reflected polynomial 0xedb88320, four bits at a time: the table is small
 * enough to write out, and program images are small. */
static const uint32_t crctab[16] = {
	0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac,
	0x76dc4190, 0x6b6b51f4, 0x4db26158, 0x5005713c,
	0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c,
	0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c
};

uint32_t
proto_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
	crc = ~crc;
	while (n-- > 0) {
		crc ^= *p++;
		crc = (crc >> 4) ^ crctab[crc & 15];
		crc = (crc >> 4) ^ crctab[crc & 15];
	}
	return ~crc;
}

const char *
proto_type_name(unsigned type)
{
	const struct msgdef *d = msgdef(type);

	return d == NULL ? "unknown" : d->name;
}

const char *
proto_error_name(unsigned code)
{
	if (code >= nitems(errnames) || errnames[code] == NULL)
		return "unknown";
	return errnames[code];
}

void
proto_put_linkhdr(uint8_t *buf, uint64_t seq, uint64_t channel,
    uint64_t count)
{
	struct proto_linkhdr h;

	memset(&h, 0, sizeof(h));
	memset(buf, 0, PROTO_LINK_HDR_SIZE);
	h.magic = PROTO_LINK_MAGIC;
	h.seq = seq;
	h.channel = channel;
	h.count = count;
	put_fields(buf, f_linkhdr, nitems(f_linkhdr), &h);
}

void
proto_get_linkhdr(const uint8_t *buf, struct proto_linkhdr *h)
{
	memset(h, 0, sizeof(*h));
	get_fields(buf, f_linkhdr, nitems(f_linkhdr), h);
}
