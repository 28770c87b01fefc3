/*
 * profile.c: a session's profile: Tprofile, Tclock and the ring of records.
 *
 * While the client profiles (Tprofile mode ON), every kernel of a Tlaunch,
 * every entry of a Tgraphrun and every Twrite, Rread and Tcopy takes one
 * record in a ring of PROTO_PROFILE_RECORDS, in request order. The backend
 * fills in the device's start and end (struct be_span) when the work has
 * run, which on Metal is after the launch returned: so records are handed
 * out only after a wait for the session's work, and a record's place in the
 * ring never moves while the device may still write to it. When the ring is
 * full new records are not kept, only counted (Rprofile.lost); the client
 * drains it before that. With profiling off nothing here runs: the ring is
 * not allocated and sess_prof_add returns NULL at its first test.
 */
#include <stdlib.h>
#include <string.h>

#include "session.h"

struct prof_rec {
	struct be_span span;	/* filled in by the backend or the session */
	uint16_t kind;
	uint16_t entry;
	uint32_t tag;
	uint32_t handle;
	uint32_t aux;
	uint64_t count;
};

struct prof {
	struct prof_rec *r;	/* PROTO_PROFILE_RECORDS */
	uint32_t head;		/* oldest record */
	uint32_t count;		/* records held */
	uint32_t lost;		/* not kept since the last Rprofile: full */
};

struct be_span *
sess_prof_add(struct session *s, unsigned kind, uint32_t tag, uint32_t handle,
    uint32_t aux, unsigned entry, uint64_t count)
{
	struct prof *p = s->prof;
	struct prof_rec *r;

	if (p == NULL)
		return NULL;
	if (p->count == PROTO_PROFILE_RECORDS) {
		p->lost++;
		return NULL;
	}
	r = &p->r[(p->head + p->count++) % PROTO_PROFILE_RECORDS];
	r->span.start = r->span.end = 0;
	r->kind = (uint16_t)kind;
	r->entry = (uint16_t)entry;
	r->tag = tag;
	r->handle = handle;
	r->aux = aux;
	r->count = count;
	return &r->span;
}

/* The newest n records' work failed before it ran: they are not kept. */
void
sess_prof_drop(struct session *s, size_t n)
{
	if (s->prof != NULL)
		s->prof->count -= (uint32_t)min64(n, s->prof->count);
}

uint64_t
sess_prof_now(struct session *s)
{
	return s->be->clock();
}

void
sess_prof_free(struct session *s)
{
	if (s->prof == NULL)
		return;
	free(s->prof->r);
	free(s->prof);
	s->prof = NULL;
}

static int
prof_start(struct session *s, uint32_t tag)
{
	struct prof *p;

	if (s->prof != NULL)
		return 0;
	if ((p = calloc(1, sizeof(*p))) == NULL ||
	    (p->r = calloc(PROTO_PROFILE_RECORDS, sizeof(*p->r))) == NULL) {
		free(p);
		return sess_errorf(s, tag, PROTO_ENOMEM, "no memory for a "
		    "profile of %d records", PROTO_PROFILE_RECORDS);
	}
	s->prof = p;
	return 0;
}

int
sess_clock(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	union proto_msg r;

	(void)frame;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RCLOCK;
	r.h.tag = m->h.tag;
	r.rclock.clock = s->be->clock();
	return sess_reply(s, &r, NULL, 0);
}

/*
 * Tprofile: wait for the session's work (as Tsync), hand out the oldest
 * records, then apply the mode. The wait comes first so that every record
 * handed out is complete, and so that turning profiling off frees the ring
 * only when no device work can still write into it.
 */
int
sess_profile(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tprofile *t = &m->tprofile;
	struct prof *p;
	union proto_msg r;
	struct proto_prof rec;
	size_t fixed = sizeof(struct proto_rprofile), n, i;
	uint8_t *o;
	int synced;

	(void)frame;
	if (t->mode != PROTO_PROFILE_OFF && t->mode != PROTO_PROFILE_ON) {
		sess_errorf(s, t->h.tag, PROTO_EINVAL, "unknown profile mode %u",
		    t->mode);
		return sess_fail_reply(s);
	}
	if (t->mode == PROTO_PROFILE_ON && prof_start(s, t->h.tag) == -1)
		return sess_fail_reply(s);
	s->dirty = 0;
	synced = s->be->sync(s->bs, s->err);
	if (synced == -1)
		sess_errorf(s, t->h.tag, PROTO_EDEVICE, "%s", s->err);
	p = s->prof;
	n = synced == -1 || p == NULL ? 0 : min64(t->count, p->count);
	n = min64(n, (s->maxmsg - fixed) / sizeof(struct proto_prof));
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RPROFILE;
	r.h.tag = t->h.tag;
	r.h.size = (uint32_t)(fixed + n * sizeof(struct proto_prof));
	r.rprofile.count = (uint32_t)n;
	if (synced == 0 && p != NULL) {
		r.rprofile.lost = p->lost;
		p->lost = 0;
	}
	if (t->mode == PROTO_PROFILE_ON) {
		r.rprofile.left = p->count - (uint32_t)n;
		r.rprofile.cap = PROTO_PROFILE_RECORDS;
	}
	if (sess_drain_errors(s) == -1)
		return -2;
	if (synced == -1) {
		if (t->mode == PROTO_PROFILE_OFF)
			sess_prof_free(s);
		return -1;	/* the EDEVICE is the reply */
	}
	if (sess_grow(&s->out, &s->outcap, s->outlen + r.h.size) == -1)
		return -2;
	o = s->out + s->outlen;
	proto_put(o, fixed, &r);
	for (i = 0; i < n; i++) {
		struct prof_rec *q = &p->r[(p->head + i) %
		    PROTO_PROFILE_RECORDS];
		rec.kind = q->kind;
		rec.entry = q->entry;
		rec.tag = q->tag;
		rec.handle = q->handle;
		rec.aux = q->aux;
		rec.start = q->span.start;
		rec.end = q->span.end;
		rec.count = q->count;
		proto_put_prof(o + fixed + i * sizeof(rec), sizeof(rec), &rec);
	}
	s->outlen += r.h.size;
	if (p != NULL) {
		p->head = (uint32_t)((p->head + n) % PROTO_PROFILE_RECORDS);
		p->count -= (uint32_t)n;
	}
	if (t->mode == PROTO_PROFILE_OFF)
		sess_prof_free(s);
	return 0;
}
