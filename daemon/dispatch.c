/*
 * dispatch.c: the message table and a session's serve loop, at the top of
 * the session's files.
 *
 * In the manner of redis's command table: one row per request type holds
 * its handler and what the loop needs to know of it (whether it may change
 * a buffer's contents, whether the runner answers it, whether its handler
 * takes its payload from the socket itself). The loop reads the row and
 * calls the handler; the handlers (handshake.c, buffers.c, programs.c,
 * launch.c, profile.c, cachereq.c, resume.c, peer.c, link.c) answer through
 * session.c below them, which calls none of them. The wire layout of each
 * type, its fixed size and its size rule, is proto.c's table. Adding a
 * request is a row there, a row here and a handler.
 */
#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "monotime.h"
#include "session.h"
#include "slots.h"

#define nitems(a)	(sizeof(a) / sizeof((a)[0]))

enum {
	MSG_RDONLY = 1,		/* changes no buffer's contents */
	MSG_ANSWERED = 2,	/* the runner answers it (its client waits) */
	MSG_FWAIT = 4,		/* answered only with PROTO_FWAIT */
	MSG_STREAM = 8		/* its handler takes the payload (Twrite) */
};

struct msg {
	sess_handler	*fn;	/* in a ready session */
	unsigned	 flags;
	/* A handshake request in a ready session: an ESTATE ending it. */
	const char	*late;
};

static int do_ping(struct session *, const union proto_msg *,
    const uint8_t *);
static int do_sync(struct session *, const union proto_msg *,
    const uint8_t *);

static const struct msg msgs[] = {
	[PROTO_THELLO] = { NULL, MSG_ANSWERED,
	    "Thello was already exchanged" },
	[PROTO_TAUTH] = { NULL, MSG_ANSWERED, "Tauth is not expected: this "
	    "session is already authenticated or needs none" },
	[PROTO_TPING] = { do_ping, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TSYNC] = { do_sync, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TALLOC] = { sess_alloc, MSG_RDONLY, NULL },
	[PROTO_TFREE] = { sess_free, 0, NULL },
	[PROTO_TWRITE] = { sess_write, MSG_STREAM, NULL },
	[PROTO_TREAD] = { sess_read, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TCOPY] = { sess_copy, 0, NULL },
	[PROTO_TLOAD] = { sess_load, MSG_RDONLY, NULL },
	[PROTO_TUNLOAD] = { sess_unload, MSG_RDONLY, NULL },
	[PROTO_TLAUNCH] = { sess_launch, MSG_FWAIT, NULL },
	[PROTO_TGRAPH] = { sess_graph, MSG_RDONLY, NULL },
	[PROTO_TGRAPHRUN] = { sess_graphrun, MSG_FWAIT, NULL },
	[PROTO_TGRAPHFREE] = { sess_graphfree, MSG_RDONLY, NULL },
	[PROTO_TCLOCK] = { sess_clock, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TPROFILE] = { sess_profile, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_THAVE] = { sess_have, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TWRITEHASH] = { sess_writehash, 0, NULL },
	[PROTO_TGRANT] = { sess_grant, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TPEERSEND] = { sess_peersend, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TPEER] = { NULL, 0, "Tpeer is only the first frame of a peer "
	    "connection" },
	[PROTO_TRESUMEKEY] = { resume_key, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TRESUME] = { resume_request, MSG_ANSWERED, NULL },
	[PROTO_TACK] = { resume_ack, MSG_RDONLY, NULL },
	[PROTO_TLISTEN] = { sess_listen, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TDIAL] = { sess_dial, MSG_RDONLY | MSG_ANSWERED, NULL },
	[PROTO_TUNLINK] = { sess_unlink, MSG_RDONLY, NULL }
};

static const struct msg msg_none = { NULL, 0, NULL };

#define IN_MIN 65536		/* input buffer kept between frames */

/* The row of a type; proto_check_hdr admits only requests proto.c knows. */
static const struct msg *
msg_row(unsigned type)
{
	return type < nitems(msgs) ? &msgs[type] : &msg_none;
}

/* Does the runner answer this request (so its client waits for it)? */
static int
answered(const struct msg *row, const struct proto_hdr *h)
{
	if (row->flags & MSG_FWAIT)
		return (h->flags & PROTO_FWAIT) != 0;
	return (row->flags & MSG_ANSWERED) != 0;
}

static int
do_sync(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	union proto_msg r;

	(void)frame;
	s->dirty = 0;
	if (s->be->sync(s->bs, s->err) == -1) {
		sess_errorf(s, m->h.tag, PROTO_EDEVICE, "%s", s->err);
		return sess_fail_reply(s);
	}
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RSYNC;
	r.h.tag = m->h.tag;
	return sess_reply(s, &r, NULL, 0);
}

static int
do_ping(struct session *s, const union proto_msg *m, const uint8_t *frame)
{
	union proto_msg r;

	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RPING;
	r.h.tag = m->h.tag;
	r.ping.count = m->ping.count;
	return sess_reply(s, &r, frame + proto_fixed_size(PROTO_TPING),
	    m->ping.count);
}

/*
 * Act on one request whose whole frame is at frame. Returns 0, -1 for a
 * failed request (its error is queued), -2 to end the session.
 */
static int
dispatch(struct session *s, const struct msg *row, const union proto_msg *m,
    const uint8_t *frame)
{
	/* A peer runner's connection (peer.c): it is handed to the session
	 * its grant names, and this one ends. Anything else is a client:
	 * it gives up the other sessions' inboxes (peer_route.c) first. */
	if (s->state == S_HELLO && m->h.type == PROTO_TPEER)
		return sess_peer_route(s, m, frame), -2;
	if (s->state == S_HELLO) {
		/* Announced at its first frame, not at accept: a peer's
		 * connection has its own line (peer.c), and one that never
		 * speaks is only a handshake timeout. */
		log_notice("session %u: client connected from %s", s->id,
		    s->peer);
		s->announced = 1;
		slot_get((uint32_t)s->slot)->announced = 1;
		peer_forget();
		return sess_hello(s, m) == -1 ? -2 : 0;
	}
	if (s->state == S_AUTH)
		return sess_auth(s, m, s->peer) == -1 ? -2 : 0;
	if (s->rread_refs > 0 && !(row->flags & MSG_RDONLY))
		resume_keep(s);
	if (row->fn != NULL)
		return row->fn(s, m, frame);
	return sess_fatal(s, m->h.tag, row->late != NULL ? PROTO_ESTATE :
	    PROTO_EPROTO, row->late != NULL ? row->late : "unexpected type") ==
	    -1 ? -2 : 0;
}

/*
 * The backend lost its device for good (backend.h, lost): a final Rerror
 * says why, after the replies and errors still queued. It goes straight
 * to the socket: the runner wakes an idle session by shutting the
 * socket's receiving side (isolate.c, isolate_stop), which the session takes for a
 * dropped link, while the sending side still works.
 */
static void
end_lost(struct session *s, const char *why)
{
	sess_errorf(s, 0, PROTO_EDEVICE, "%s", why);
	sess_drain_errors(s);
	if (s->fd != -1 && s->outlen > 0 &&
	    net_send_all(s->fd, s->out, s->outlen) == 0)
		s->bytes_out += s->outlen;
	s->outlen = 0;
}

/* Read, check and act on requests until the session ends. */
static void
serve_loop(struct session *s)
{
	const struct msg *row;
	union proto_msg m;
	const char *why = NULL;
	size_t fixed;
	int rc;

	for (;;) {
		/* Nothing more can run: end, whatever the link's state. */
		if (s->be->lost != NULL && s->be->lost() != NULL)
			break;
		/* A link that failed (anywhere below) ends the session, unless
		 * the client resumes it: then the loop goes on from the first
		 * request it had not processed (resume.c). */
		if (s->linkdown && resume_wait(s) == -1)
			break;
		/* Keep an idle session small after a large frame. */
		if (s->inoff == s->inlen && s->incap > 4 * IN_MIN) {
			free(s->in);
			s->in = NULL;
			s->incap = s->inlen = s->inoff = 0;
			if (sess_grow(&s->in, &s->incap, IN_MIN) == -1)
				break;
		}
		if ((rc = sess_need(s, PROTO_HDR_SIZE, 1)) <= 0) {
			if (s->linkdown)
				continue;
			break;
		}
		s->last_active = time(NULL);
		proto_get_hdr(s->in + s->inoff, &m.h);
		if (proto_check_hdr(&m.h, s->maxmsg, s->err) == -1) {
			sess_fatal(s, m.h.tag, PROTO_EPROTO, s->err);
			break;
		}
		row = msg_row(m.h.type);
		s->nreq++;
		s->nreply += answered(row, &m.h);
		/* For the runner's line when it stops a session process. */
		atomic_store_explicit(&slot_get((uint32_t)s->slot)->nreq,
		    s->nreq, memory_order_relaxed);
		fixed = proto_fixed_size(m.h.type);
		if (sess_need(s, fixed, 0) <= 0) {
			if (s->linkdown)
				continue;
			break;
		}
		if (proto_get(s->in + s->inoff, fixed, &m, s->err) == -1 ||
		    proto_check_size(&m, s->err) == -1) {
			sess_fatal(s, m.h.tag, PROTO_EPROTO, s->err);
			break;
		}
		/* Before hello and auth only fixed-size requests are valid:
		 * answer without reading any payload. */
		if (s->state != S_READY) {
			if (dispatch(s, row, &m, s->in + s->inoff) == -2)
				break;
			s->inoff += fixed;
			continue;
		}
		if (row->flags & MSG_STREAM) {
			if (s->rread_refs > 0)
				resume_keep(s);
			s->inoff += fixed;
			if (row->fn(s, &m, NULL) == -2) {
				/* Cut off: it comes again whole. */
				if (s->linkdown)
					continue;
				break;
			}
			s->nproc++;
			continue;
		}
		if (sess_need(s, m.h.size, 0) <= 0) {
			if (s->linkdown)
				continue;
			break;
		}
		rc = dispatch(s, row, &m, s->in + s->inoff);
		s->inoff += m.h.size;
		if (rc == -2)
			break;
		s->nproc++;
	}
	/* However the loop ended (the runner's stop may end it first). */
	if (s->be->lost != NULL && (why = s->be->lost()) != NULL)
		end_lost(s, why);
	sess_drain_errors(s);
	sess_flush(s);
	/* What ended it all comes before what the session saw of it. */
	if (why != NULL)
		snprintf(s->end, sizeof(s->end), "the device was lost: %s", why);
	else if (mr_stopping())
		snprintf(s->end, sizeof(s->end), "the runner stopped");
}

/* The closing lines, then everything the session holds. */
static void
sess_close(struct session *s)
{
	uint32_t id = s->id;

	/* One line for a client that was announced: how it ended and what it
	 * used; the details are for -v. */
	(s->announced ? log_notice : log_info)("session %u: ended: %s; %.1f s, "
	    "%llu requests, %llu answered, %llu bytes in, %llu bytes out", id,
	    s->end[0] ? s->end : "the session could not go on",
	    (double)(mono_ms() - s->started) / 1000,
	    (unsigned long long)s->nreq, (unsigned long long)s->nreply,
	    (unsigned long long)s->bytes_in, (unsigned long long)s->bytes_out);
	if (s->cache != NULL)
		log_info("session %u: cache: %llu bytes written from it, %llu "
		    "bytes given to it", id, (unsigned long long)s->cache_in,
		    (unsigned long long)s->cache_stored);
	log_info("session %u: closing, freeing %u buffers (%llu bytes), %u "
	    "programs, %u graphs", id, s->bufs.count,
	    (unsigned long long)s->mem, s->progs.count, s->graphs.count);
	htab_clear(&s->graphs, sess_release_graph, s);
	if (s->bs != NULL)
		s->be->sync(s->bs, s->err);
	htab_clear(&s->bufs, sess_release_buffer, s);
	htab_clear(&s->progs, sess_release_program, s);
	if (s->bs != NULL)
		s->be->session_close(s->bs);
	sess_prof_free(s);
	cache_link_close(s->cache);
	sess_links_free(s);	/* before the grants its listening links hold */
	sess_peer_free(s);
	mr_session_leave(s->slot);
	resume_end(s);
	if (s->fd != -1)
		close(s->fd);
	free(s->in);
	free(s->out);
	free(s->errq);
	free(s->launches);
	free(s->lbufs);
	free(s->loffs);
	free(s);
}

void
sess_serve(const struct mr_server_ctx *ctx, int fd, uint32_t id, int slot,
    const char *peer)
{
	struct session *s;

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
	s->started = mono_ms();
	s->peer = peer;
	sess_peer_open(s);
	if (ctx->cfg->handshake_timeout > 0)
		s->hs_deadline = mono_ms() +
		    (int64_t)ctx->cfg->handshake_timeout * 1000;
	s->cache = cache_link_open();
	if (sess_grow(&s->in, &s->incap, IN_MIN) == -1 ||
	    (s->bs = s->be->session_open(s->err)) == NULL)
		log_warn("session %u: cannot start: %s", id, s->in ?
		    s->err : "out of memory");
	else
		serve_loop(s);
	sess_close(s);
}
