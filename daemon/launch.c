/*
 * launch.c: running kernels: Tlaunch, Tgraph, Tgraphrun, Tgraphfree, and
 * arming the report of a kernel that crashes or runs too long (crash.c).
 *
 * Each launch record's handles are resolved and checked afresh at every
 * launch, so a graph never holds a pointer to a buffer freed since it was
 * made. A record may name a link program (link.c): the kernels before it
 * are run and waited for, then it sends or receives, then the kernels
 * after it run, so a graph runs in parts split at its link entries. In a
 * session process the launch is armed: a signal while the kernel runs
 * sends the client an Rerror and ends the process.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monotime.h"
#include "session.h"

/* A crash ends the session: whatever is queued must already be out, so
 * the handler's frame is the last and no error is lost (crash.c). */
static void
arm_crash(struct session *s, uint32_t tag, const char *name)
{
	if (!sess_crash_handlers)
		return;
	if (s->errqlen > 0 || s->dropped > 0 || s->outlen > 0) {
		sess_drain_errors(s);
		sess_flush(s);
	}
	sess_crash_arm(s->fd, tag, name, s->ctx->cfg->kernel_timeout);
}

static void
disarm_crash(struct session *s)
{
	sess_crash_disarm(s->ctx->cfg->kernel_timeout);
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

static int
zero_dim(const struct proto_launch *pl)
{
	unsigned i;

	for (i = 0; i < 3; i++)
		if (pl->global[i] == 0 || pl->local[i] == 0)
			return 1;
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
		return sess_errorf(s, tag, PROTO_EHANDLE,
		    "no program with handle %u", pl->prog);
	*name = p->name;
	if (pl->nbufs != p->nbufs || pl->nvals != p->nvals)
		return sess_errorf(s, tag, PROTO_EINVAL, "kernel %s takes %u "
		    "buffers and %u values; the launch passed %u and %u",
		    p->name, p->nbufs, p->nvals, pl->nbufs, pl->nvals);
	if (zero_dim(pl))
		return sess_errorf(s, tag, PROTO_EINVAL, "kernel %s: "
		    "launch size has a zero dimension", p->name);
	if (p->p == NULL) {	/* a link program: l->prog NULL marks it */
		memset(l, 0, sizeof(*l));
		return link_check(s, tag, p, args, vals);
	}
	for (i = 0; i < pl->nbufs; i++) {
		struct buffer *b = htab_get(&s->bufs, args[i].handle);
		if (b == NULL)
			return sess_errorf(s, tag, PROTO_EHANDLE, "kernel %s "
			    "argument %u: no buffer with handle %u", p->name,
			    i, args[i].handle);
		if (args[i].offset > b->size)
			return sess_errorf(s, tag, PROTO_ERANGE, "kernel %s "
			    "argument %u: offset %llu is past the end of "
			    "buffer %u (%llu bytes)", p->name, i,
			    (unsigned long long)args[i].offset, args[i].handle,
			    (unsigned long long)b->size);
		/* Metal: a misaligned offset is undefined behaviour, and
		 * its validation layer stops the whole process on it. */
		if (p->align != NULL && args[i].offset % p->align[i] != 0)
			return sess_errorf(s, tag, PROTO_EINVAL, "kernel %s "
			    "argument %u: offset %llu is not a multiple of %u, "
			    "the size of the data type the kernel reads there",
			    p->name, i, (unsigned long long)args[i].offset,
			    p->align[i]);
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
	l->span = NULL;
	return 0;
}

/* A link entry, once the session's earlier work has completed; span (the
 * profile's record, or NULL) gets its start and, done, its end. */
static int
run_link(struct session *s, uint32_t tag, uint32_t prog,
    const struct proto_arg *args, const int64_t *vals, struct be_span *span)
{
	if (s->dirty) {
		s->dirty = 0;
		if (s->be->sync(s->bs, s->err) == -1)
			return sess_errorf(s, tag, PROTO_EDEVICE, "%s", s->err);
	}
	if (span != NULL)
		span->start = sess_prof_now(s);
	if (link_run(s, tag, htab_get(&s->progs, prog), args, vals) == -1)
		return -1;
	if (span != NULL)
		span->end = sess_prof_now(s);
	return 0;
}

int
sess_launch(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	struct proto_launch pl;
	struct proto_arg args[PROTO_MAX_ARGS];
	int64_t vals[PROTO_MAX_ARGS];
	struct be_buffer *bufs[PROTO_MAX_ARGS];
	uint64_t offs[PROTO_MAX_ARGS], ns = 0;
	struct be_launch l;
	const char *name = "?";
	size_t off = sizeof(struct proto_tlaunch) - sizeof(struct proto_launch);
	int wait = (m->h.flags & PROTO_FWAIT) != 0;

	if (proto_get_launch(frame, m->h.size, &off, &pl, args, vals,
	    s->err) == -1 || off != m->h.size) {
		sess_fatal(s, m->h.tag, PROTO_EPROTO, s->err);
		return -2;	/* a framing error ends the session */
	}
	if (resolve(s, m->h.tag, &pl, args, vals, &l, bufs, offs,
	    &name) == -1)
		return wait ? sess_fail_reply(s) : -1;
	if (l.prog == NULL) {
		int64_t t0 = mono_ns();
		l.span = sess_prof_add(s, PROTO_PROF_LAUNCH, m->h.tag, pl.prog,
		    0, 0, (uint64_t)vals[0]);
		/* One entry: a failed one leaves no bytes of this request kept
		 * (link.c), so there is nothing to drain. */
		if (run_link(s, m->h.tag, pl.prog, args, vals, l.span) == -1 ||
		    link_flush(s, m->h.tag) == -1) {
			sess_prof_drop(s, l.span != NULL);
			return wait ? sess_fail_reply(s) : -1;
		}
		if (l.span != NULL)	/* a send's: until the link took it */
			l.span->end = sess_prof_now(s);
		ns = (uint64_t)(mono_ns() - t0);
		goto done;
	}
	/* Only FWAIT waits: the log level never changes what runs when,
	 * nor which request a device error is reported to. */
	l.span = sess_prof_add(s, PROTO_PROF_LAUNCH, m->h.tag, pl.prog, 0, 0, 0);
	arm_crash(s, m->h.tag, name);
	if (s->be->launch(s->bs, &l, 1, wait, &ns, s->err) == -1) {
		disarm_crash(s);
		s->dirty = 1;	/* see sess_graphrun */
		sess_prof_drop(s, l.span != NULL);
		sess_errorf(s, m->h.tag, PROTO_EDEVICE, "kernel %s: %s", name,
		    s->err);
		return wait ? sess_fail_reply(s) : -1;
	}
	disarm_crash(s);
	s->dirty = !wait;
	if (wait)
		log_debug("session %u: %-24s global (%u,%u,%u) local (%u,%u,%u) "
		    "%10.2f us", s->id, name, pl.global[0], pl.global[1],
		    pl.global[2], pl.local[0], pl.local[1], pl.local[2],
		    (double)ns / 1e3);
	else
		log_debug("session %u: %-24s global (%u,%u,%u) local (%u,%u,%u) "
		    "not timed (no FWAIT)", s->id, name, pl.global[0],
		    pl.global[1], pl.global[2], pl.local[0], pl.local[1],
		    pl.local[2]);
done:
	if (!wait)
		return 0;
	return sess_reply_ns(s, PROTO_RLAUNCH, m->h.tag, ns);
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

int
sess_graph(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tgraph *t = &m->tgraph;
	struct proto_launch pl;
	struct proto_arg args[PROTO_MAX_ARGS];
	int64_t vals[PROTO_MAX_ARGS];
	size_t off = sizeof(*t), i;
	struct graph *g;
	struct program *p;

	/* Check the records' framing before anything else. */
	for (i = 0; i < t->count; i++)
		if (proto_get_launch(frame, t->h.size, &off, &pl, args, vals,
		    s->err) == -1) {
			sess_fatal(s, t->h.tag, PROTO_EPROTO, s->err);
			return -2;
		}
	if (off != t->h.size) {
		sess_fatal(s, t->h.tag, PROTO_EPROTO, "Tgraph records do not "
		    "fill the frame");
		return -2;
	}
	if (htab_get(&s->graphs, t->graph) != NULL)
		return sess_errorf(s, t->h.tag, PROTO_EEXIST,
		    "graph handle %u is already in use", t->graph);
	if (t->count == 0)
		return sess_errorf(s, t->h.tag, PROTO_EINVAL,
		    "graph has no kernels");
	if (sess_count_handle(s, t->h.tag, &s->ngraphs, "graphs") == -1)
		return -1;
	if ((g = calloc(1, sizeof(*g))) == NULL ||
	    (g->e = calloc(t->count, sizeof(*g->e))) == NULL) {
		free(g);
		s->ngraphs--;
		return sess_errorf(s, t->h.tag, PROTO_ENOMEM,
		    "out of host memory");
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
			sess_errorf(s, t->h.tag, PROTO_ENOMEM,
			    "out of host memory");
			goto fail;
		}
		memcpy(e->args, args, e->l.nbufs * sizeof(*args));
		memcpy(e->vals, vals, e->l.nvals * sizeof(*vals));
		if ((p = htab_get(&s->progs, e->l.prog)) == NULL) {
			sess_errorf(s, t->h.tag, PROTO_EHANDLE, "graph entry "
			    "%zu: no program with handle %u", i, e->l.prog);
			goto fail;
		}
		if (p->nbufs != e->l.nbufs || p->nvals != e->l.nvals) {
			sess_errorf(s, t->h.tag, PROTO_EINVAL, "graph entry "
			    "%zu: kernel %s takes %u buffers and %u values, "
			    "the entry passes %u and %u", i, p->name, p->nbufs,
			    p->nvals, e->l.nbufs, e->l.nvals);
			goto fail;
		}
		if (zero_dim(&e->l)) {
			sess_errorf(s, t->h.tag, PROTO_EINVAL, "graph entry "
			    "%zu: kernel %s: launch size has a zero dimension",
			    i, p->name);
			goto fail;
		}
	}
	if (htab_put(&s->graphs, t->graph, g) == -1) {
		sess_errorf(s, t->h.tag, PROTO_ENOMEM, "out of host memory");
		goto fail;
	}
	return 0;
fail:
	free_graph(g, NULL);
	s->ngraphs--;
	return -1;
}

static int
check_patch(struct session *s, uint32_t tag, const struct graph *g,
    const struct proto_patch *p)
{
	const struct graph_entry *e;

	if (p->entry >= g->count)
		return sess_errorf(s, tag, PROTO_EINVAL, "patch names entry %u "
		    "of a %u-entry graph", p->entry, g->count);
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
			return sess_errorf(s, tag, PROTO_EINVAL, "launch "
			    "dimension %llu out of range",
			    (unsigned long long)p->value);
		return 0;
	default:
		return sess_errorf(s, tag, PROTO_EINVAL,
		    "unknown patch kind %u", p->kind);
	}
	return sess_errorf(s, tag, PROTO_EINVAL, "patch index %u out of range "
	    "for entry %u", p->index, p->entry);
}

/* Tgraphrun's patches into graph g, all checked before any is applied:
 * 0, -1 a failed request (its error queued), -2 a framing error. */
static int
apply_patches(struct session *s, const struct proto_tgraphrun *t,
    struct graph *g, const uint8_t *frame)
{
	const uint8_t *body = frame + sizeof(*t);
	size_t blen = t->h.size - sizeof(*t), i;
	struct proto_patch p;

	for (i = 0; i < t->count; i++)
		if (proto_get_patch(body, blen, i, &p, s->err) == -1) {
			sess_fatal(s, t->h.tag, PROTO_EPROTO, s->err);
			return -2;
		} else if (check_patch(s, t->h.tag, g, &p) == -1)
			return -1;
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
	return 0;
}

int
sess_graphrun(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	const struct proto_tgraphrun *t = &m->tgraphrun;
	struct graph *g = htab_get(&s->graphs, t->graph);
	size_t nargs = 0, i, a, nprof = 0;
	size_t start, nlinks = 0;
	int wait = (t->h.flags & PROTO_FWAIT) != 0, last, rc;
	int64_t t0;
	const char *name = "?";
	char gname[32];
	uint64_t ns = 0, part;

	if (g == NULL) {
		sess_errorf(s, t->h.tag, PROTO_EHANDLE,
		    "no graph with handle %u", t->graph);
		return wait ? sess_fail_reply(s) : -1;
	}
	if ((rc = apply_patches(s, t, g, frame)) == -2)
		return -2;
	if (rc == -1)
		return wait ? sess_fail_reply(s) : -1;
	for (i = 0; i < g->count; i++)
		nargs += g->e[i].l.nbufs;
	if (scratch(s, g->count, nargs) == -1) {
		sess_errorf(s, t->h.tag, PROTO_ENOMEM, "out of host memory");
		return wait ? sess_fail_reply(s) : -1;
	}
	/* Buffers are looked up at every run: one freed since the graph
	 * was made is an error here, never a dangling pointer. */
	for (i = a = 0; i < g->count; i++) {
		struct graph_entry *e = &g->e[i];
		if (resolve(s, t->h.tag, &e->l, e->args, e->vals,
		    &s->launches[i], s->lbufs + a, s->loffs + a, &name) == -1)
			return wait ? sess_fail_reply(s) : -1;
		a += e->l.nbufs;
	}
	for (i = 0; s->prof != NULL && i < g->count; i++)
		if ((s->launches[i].span = sess_prof_add(s, PROTO_PROF_GRAPH,
		    t->h.tag, g->e[i].l.prog, t->graph, (unsigned)i,
		    s->launches[i].prog != NULL ? 0 :
		    (uint64_t)g->e[i].vals[0])) != NULL)
			nprof++;
	snprintf(gname, sizeof(gname), "in graph %u", t->graph);
	/* The kernels between two link entries go to the backend as one
	 * launch; with no link entry (the usual graph), the whole graph. */
	t0 = mono_ns();
	for (i = start = 0; i <= g->count; i++) {
		if (i < g->count && s->launches[i].prog != NULL)
			continue;
		if (i > start) {
			last = i == g->count;
			arm_crash(s, t->h.tag, gname);
			rc = s->be->launch(s->bs, s->launches + start,
			    i - start, last && wait, &part, s->err);
			disarm_crash(s);
			/* On failure the backend may have submitted some of
			 * the kernels (backend.h): host access waits for
			 * them. */
			s->dirty = rc == -1 || !(last && wait);
			if (rc == -1) {
				sess_prof_drop(s, nprof);
				sess_errorf(s, t->h.tag, PROTO_EDEVICE,
				    "graph %u: %s", t->graph, s->err);
				if (nlinks > 0)
					link_drain(s);
				return wait ? sess_fail_reply(s) : -1;
			}
			ns += part;
		}
		if (i == g->count)
			break;
		if (run_link(s, t->h.tag, g->e[i].l.prog, g->e[i].args,
		    g->e[i].vals, s->launches[i].span) == -1) {
			/* The sends before it still end as in a good run. */
			sess_prof_drop(s, nprof);
			link_drain(s);
			return wait ? sess_fail_reply(s) : -1;
		}
		nlinks++;
		start = i + 1;
	}
	if (nlinks > 0) {
		if (link_flush(s, t->h.tag) == -1) {
			sess_prof_drop(s, nprof);
			return wait ? sess_fail_reply(s) : -1;
		}
		if (wait) {	/* the device time and the links' */
			s->dirty = 0;
			if (s->be->sync(s->bs, s->err) == -1) {
				sess_errorf(s, t->h.tag, PROTO_EDEVICE,
				    "graph %u: %s", t->graph, s->err);
				return sess_fail_reply(s);
			}
			ns = (uint64_t)(mono_ns() - t0);
		}
	}
	if (wait)
		log_debug("session %u: graph %u, %u kernels %10.2f us", s->id,
		    t->graph, g->count, (double)ns / 1e3);
	else
		log_debug("session %u: graph %u, %u kernels not timed (no "
		    "FWAIT)", s->id, t->graph, g->count);
	if (nlinks > 0) {
		log_debug("session %u: graph %u: %zu link entries, %.2f us "
		    "waiting to receive, %.2f us in all", s->id, t->graph,
		    nlinks, (double)s->link_wait_ns / 1e3,
		    (double)(mono_ns() - t0) / 1e3);
		s->link_wait_ns = 0;
	}
	if (!wait)
		return 0;
	return sess_reply_ns(s, PROTO_RGRAPHRUN, t->h.tag, ns);
}

int
sess_graphfree(struct session *s, const union proto_msg *m,
    const uint8_t *frame)
{
	const struct proto_tgraphfree *t = &m->tgraphfree;
	struct graph *g = htab_del(&s->graphs, t->graph);

	(void)frame;
	if (g == NULL)
		return sess_errorf(s, t->h.tag, PROTO_EHANDLE,
		    "no graph with handle %u", t->graph);
	free_graph(g, NULL);
	s->ngraphs--;
	return 0;
}

void
sess_release_graph(void *v, void *arg)
{
	free_graph(v, arg);
}
