/*
 * programs.c: a session's programs: Tload and Tunload.
 *
 * A program is checked whole (kind against the backend's capabilities,
 * name, argument counts, CRC-32 of the data) before the backend compiles
 * or maps it; launch.c looks programs up by handle.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

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
	case PROTO_PROG_LINK_SEND:
		return "link send";
	case PROTO_PROG_LINK_RECV:
		return "link receive";
	}
	return "unknown";
}

/*
 * Strict UTF-8 (RFC 3629): the shortest form only, no surrogates
 * (U+D800..U+DFFF), nothing above U+10FFFF. A name goes into later error
 * texts, and every Rerror text must be UTF-8 (protocol.md, Encoding).
 */
static int
utf8_valid(const uint8_t *p, size_t n)
{
	size_t i = 0, len, k;
	uint32_t c, min;

	while (i < n) {
		c = p[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			len = 2;
			c &= 0x1f;
			min = 0x80;
		} else if (c >= 0xe0 && c <= 0xef) {
			len = 3;
			c &= 0x0f;
			min = 0x800;
		} else if (c >= 0xf0 && c <= 0xf4) {
			len = 4;
			c &= 0x07;
			min = 0x10000;
		} else
			return 0;	/* continuation, overlong lead, > 0xf4 */
		if (n - i < len)
			return 0;
		for (k = 1; k < len; k++) {
			if ((p[i + k] & 0xc0) != 0x80)
				return 0;
			c = c << 6 | (p[i + k] & 0x3f);
		}
		if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
			return 0;
		i += len;
	}
	return 1;
}

int
sess_load(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tload *t = &m->tload;
	const uint8_t *body = frame + proto_fixed_size(m->h.type);
	struct be_program_desc d;
	struct program *p;
	char *longerr = NULL, prefix[PROTO_MAX_NAME + 32];
	uint32_t tag = t->h.tag;
	uint16_t cap;
	size_t nargs = (size_t)t->nbufs + t->nvals;
	int islink = t->kind == PROTO_PROG_LINK_SEND ||
	    t->kind == PROTO_PROG_LINK_RECV;

	if (htab_get(&s->progs, t->prog) != NULL)
		return sess_errorf(s, tag, PROTO_EEXIST,
		    "program handle %u is already in use", t->prog);
	cap = t->kind == PROTO_PROG_CPU_IMAGE ? PROTO_CAP_CPU_IMAGE :
	    t->kind == PROTO_PROG_METALLIB ? PROTO_CAP_METALLIB :
	    t->kind == PROTO_PROG_METAL_SOURCE ? PROTO_CAP_METAL_SOURCE :
	    islink ? PROTO_CAP_LINK : 0;
	if (cap == 0)
		return sess_errorf(s, tag, PROTO_EINVAL,
		    "unknown program kind %u", t->kind);
	/* Every runner has links (handshake.c); the backend has the rest. */
	if (!islink && (s->ctx->info->caps & cap) == 0)
		return sess_errorf(s, tag, PROTO_EKIND, "backend %s does not "
		    "accept %s programs", s->be->name, kind_name(t->kind));
	if (t->namelen == 0 || t->namelen > PROTO_MAX_NAME ||
	    memchr(body, '\0', t->namelen) != NULL)
		return sess_errorf(s, tag, PROTO_EINVAL, "kernel name must be "
		    "1 to %u bytes with no NUL", PROTO_MAX_NAME);
	if (!utf8_valid(body, t->namelen))
		return sess_errorf(s, tag, PROTO_EINVAL, "kernel name is not "
		    "valid UTF-8");
	if (islink && link_check_load(s, t) == -1)
		return -1;
	if (t->datalen == 0 && !islink)
		return sess_errorf(s, tag, PROTO_EINVAL,
		    "program data is empty");
	if (nargs > PROTO_MAX_ARGS)
		return sess_errorf(s, tag, PROTO_EINVAL, "kernel takes %zu "
		    "arguments, more than %u", nargs, PROTO_MAX_ARGS);
	if (t->corearg != PROTO_NO_CORE && t->corearg >= nargs)
		return sess_errorf(s, tag, PROTO_EINVAL, "core_id argument %u "
		    "is past the kernel's %zu arguments", t->corearg, nargs);
	if (proto_crc32(0, body + t->namelen, t->datalen) != t->crc)
		return sess_errorf(s, tag, PROTO_EPROGRAM, "program data is "
		    "corrupt: CRC-32 mismatch");
	if (sess_count_handle(s, tag, &s->nprogs, "programs") == -1)
		return -1;
	if ((p = calloc(1, sizeof(*p))) == NULL) {
		s->nprogs--;
		return sess_errorf(s, tag, PROTO_ENOMEM, "out of host memory");
	}
	memcpy(p->name, body, t->namelen);
	p->kind = t->kind;
	p->link = t->entry;	/* a link program's link */
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
	/* A link program is run by link.c: nothing for the backend. */
	if (!islink && (p->p = s->be->load(s->bs, &d, s->err,
	    &longerr)) == NULL) {
		if (longerr != NULL) {
			snprintf(prefix, sizeof(prefix), "cannot load %s: ",
			    p->name);
			sess_error_long(s, tag, PROTO_EPROGRAM, prefix, longerr);
		} else
			sess_errorf(s, tag, PROTO_EPROGRAM, "cannot load %s: %s",
			    p->name, s->err);
		free(longerr);
		goto fail;
	}
	if (p->p != NULL && s->be->align != NULL)
		p->align = s->be->align(p->p);
	if (htab_put(&s->progs, t->prog, p) == -1) {
		sess_errorf(s, tag, PROTO_ENOMEM, "out of host memory");
		if (p->p != NULL)
			s->be->unload(s->bs, p->p);
		goto fail;
	}
	log_debug("session %u: loaded %s (%s, %u bytes)", s->id, p->name,
	    kind_name(t->kind), t->datalen);
	return 0;
fail:
	s->nprogs--;
	free(p);
	return -1;
}

static void
free_program(struct session *s, struct program *p)
{
	if (p->p != NULL)
		s->be->unload(s->bs, p->p);
	s->nprogs--;
	free(p);
}

int
sess_unload(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tunload *t = &m->tunload;
	struct program *p = htab_del(&s->progs, t->prog);

	(void)frame;
	if (p == NULL)
		return sess_errorf(s, t->h.tag, PROTO_EHANDLE,
		    "no program with handle %u", t->prog);
	free_program(s, p);
	return 0;
}

void
sess_release_program(void *v, void *arg)
{
	free_program(arg, v);
}
