/*
 * session.h: what the files of one session share, and nothing else.
 *
 * A session is split by concern, in layers: dispatch.c (the message table
 * and the serve loop) calls the request handlers, which answer through
 * session.c (frame input, replies, the error queue) below them; handshake.c
 * answers Thello and Tauth;
 * buffers.c and programs.c keep the handle tables; launch.c resolves and
 * runs kernels and graphs and reports a crashing one. They share struct
 * session and the helpers declared here, grouped by file. Private to the
 * daemon: the embedding API is metal_runner.h.
 *
 * A request handler sess_X answers TX: 0, -1 for a failed request (its
 * error is queued, or is the reply of a request that waits), -2 to end
 * the session. Every handler has the one shape, sess_handler: the decoded
 * fixed part and the whole frame (NULL for Twrite, whose handler takes its
 * payload from the socket); dispatch.c's table names each.
 */
#ifndef SESSION_H
#define SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "metal_runner.h"
#include "proto.h"

/* How a session process ends, for the runner's log (isolate.c, isolate_reap). */
enum {
	SESS_EXIT_CRASH = 3,	/* a kernel crashed (launch.c) */
	SESS_EXIT_TIMEOUT = 4,	/* a kernel ran past the time limit */
	SESS_EXIT_LOST = 5,	/* the device was lost to its process */
	SESS_EXIT_NODEVICE = 6	/* a spawned session opened no device */
};

struct buffer {
	struct be_buffer *b;
	uint64_t size;
};

struct program {
	struct be_program *p;	/* NULL for a link program (link.c) */
	uint16_t kind;		/* PROTO_PROG_* */
	uint32_t link;		/* a link program's link handle */
	uint16_t nbufs;
	uint16_t nvals;
	const uint32_t *align;	/* the backend's (backend.h), or NULL */
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

/* A grant this session issued (grant.c): one range of one buffer, once;
 * or (islink, Tlisten) the one peer that may connect to link handle. */
struct peer_grant {
	uint64_t id;		/* session id << 32 | sequence number */
	uint8_t secret[PROTO_SECRET_SIZE];
	int islink;
	uint32_t handle;
	uint64_t offset, count;
	int64_t expires;	/* ms, monotonic */
};

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
	uint32_t nbufs, nprogs, ngraphs;	/* handles held, per namespace */
	uint64_t mem;
	int dirty;		/* work launched since the last sync */
	time_t last_active;
	int64_t hs_deadline;	/* ms, monotonic: end of the handshake, 0: none */
	const char *peer;

	uint8_t *in;
	size_t incap, inlen, inoff;
	uint8_t *out;
	size_t outcap, outlen;
	uint8_t *errq;
	size_t errqcap, errqlen;
	uint32_t nqueued, dropped, dropped_tag;
	/* Totals for the closing log line: requests, those the runner
	 * answers (the client waits for each), bytes each way. */
	uint64_t nreq, nreply, bytes_in, bytes_out;

	/* Scratch for resolving launches: grown to the largest graph. */
	struct be_launch *launches;
	struct be_buffer **lbufs;
	uint64_t *loffs;
	size_t launchcap, argcap;

	struct prof *prof;	/* profile.c: NULL unless the client profiles */
	struct cache_link *cache;	/* cachelink.c: NULL without a cache */
	uint64_t cache_in, cache_stored;	/* bytes from and into it */

	struct resume *rs;	/* resume.c: NULL unless the session took a key */
	unsigned rread_refs;	/* Rreads it keeps by reference to a buffer */
	uint64_t nproc;		/* requests processed since the handshake */
	int linkdown;		/* the connection failed (resume.c may replace it) */
	int handed;		/* a Tresume passed this connection on */
	/* The session's closing line (sess_serve): when it began, whether
	 * its client was announced, and how it ended, as the first place
	 * that saw the end wrote it (sess_end). */
	int64_t started;	/* ms, monotonic */
	int announced;
	char end[128];
	/* peer.c: the runners that connected to copy or link into it, for
	 * one line each in the default log (the connections are -v's). */
	char peers_seen[8][64];
	unsigned npeers_seen;

	/* peer.c: grants issued and not yet used or expired, and the inbox
	 * where server.c hands over peer connections for them (-1: none). */
	struct peer_grant *grants;
	uint32_t ngrants, grantseq;
	int inbox;
	/*
	 * peer.c's part of the wait between frames, which it installs
	 * (sess_peer_open). The wait is session.c's: its input waits for all
	 * of the session's sockets at once, the inbox among them, as an event
	 * loop does. What comes through the inbox is peer.c's to take, with
	 * the handlers' files above session.c (a buffer's range, a link), so
	 * the input calls up to it only through these: an inversion by
	 * design, not a call session.c makes. peer_tick, before each wait: in
	 * how many ms it wants its turn again (expired grants are dropped each
	 * second), -1: no need; peer_serve: the inbox is readable. Set
	 * before the session reads its first frame (sess_serve).
	 */
	int (*peer_tick)(struct session *s);
	void (*peer_serve)(struct session *s);

	/* link.c: links to and from sessions of other runners, by handle,
	 * and in a list (to flush what they still have to send). */
	struct htab links;
	uint32_t nlinks;
	struct link *linklist;
	uint64_t link_wait_ns;	/* waiting for links to receive (-vv log) */

	char err[PROTO_ERRLEN];
};

static inline uint64_t
min64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

typedef int sess_handler(struct session *s, const union proto_msg *m,
    const uint8_t *frame);

/* session.c: the output buffer, the error queue and frame input */
/* Make n bytes of the current frame available at s->in + s->inoff (boundary:
 * between frames, where peers and resumes are served and the idle limit
 * applies): 1, 0 at a clean end of stream between frames, -1 on error. */
int sess_need(struct session *s, size_t n, int boundary);
int sess_grow(uint8_t **p, size_t *cap, size_t need);
int sess_flush(struct session *s);
int sess_drain_errors(struct session *s);
int sess_errorf(struct session *s, uint32_t tag, uint32_t code,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int sess_error_long(struct session *s, uint32_t tag, uint32_t code,
    const char *prefix, const char *text);
int sess_reply(struct session *s, union proto_msg *m, const void *data,
    size_t len);
int sess_reply_ns(struct session *s, unsigned type, uint32_t tag, uint64_t ns);
int sess_fail_reply(struct session *s);
int sess_fatal(struct session *s, uint32_t tag, uint32_t code,
    const char *text);
int sess_take(struct session *s, uint8_t *dst, uint64_t count);
int sess_count_handle(struct session *s, uint32_t tag, uint32_t *n,
    const char *what);
/* Say how the session ends, unless something already did. */
void sess_end(struct session *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* handshake.c */
int sess_hello(struct session *s, const union proto_msg *m);
int sess_auth(struct session *s, const union proto_msg *m, const char *peer);

/* buffers.c */
/* Where count bytes at offset of buffer handle go, after launched work
 * settled, with the buffer in *bp (for sess_host_wrote); NULL after
 * queueing the request's error. */
uint8_t *sess_write_dst(struct session *s, uint32_t tag, uint32_t handle,
    uint64_t offset, uint64_t count, struct buffer **bp);
int sess_host_read(struct session *s, struct buffer *b);
int sess_host_writes(struct session *s, struct buffer *b, uint64_t count);
void sess_host_wrote(struct session *s, struct buffer *b, uint64_t offset,
    uint64_t count);
sess_handler sess_alloc;
sess_handler sess_free;
sess_handler sess_write;
sess_handler sess_read;
sess_handler sess_copy;
void sess_release_buffer(void *v, void *arg);	/* htab_clear callback */

/* programs.c */
sess_handler sess_load;
sess_handler sess_unload;
void sess_release_program(void *v, void *arg);	/* htab_clear callback */

/* launch.c */
sess_handler sess_launch;
sess_handler sess_graph;
sess_handler sess_graphrun;
sess_handler sess_graphfree;
void sess_release_graph(void *v, void *arg);	/* htab_clear callback */

/* cachereq.c */
sess_handler sess_have;
sess_handler sess_writehash;

/* profile.c */
/* A record for work of request tag; returns where its times go, or NULL
 * when the client does not profile (or the ring is full). */
struct be_span *sess_prof_add(struct session *s, unsigned kind, uint32_t tag,
    uint32_t handle, uint32_t aux, unsigned entry, uint64_t count);
void sess_prof_drop(struct session *s, size_t n);
uint64_t sess_prof_now(struct session *s);
void sess_prof_free(struct session *s);
sess_handler sess_clock;
sess_handler sess_profile;

/* resume.c: Tresumekey, Tresume, Tack and the wait after a dropped link;
 * resume_conn.c: a resume arriving (below session.c, whose input takes
 * one); resume_ring.c: resume_send, resume_keep and resume_free, what the
 * session keeps of its replies */
int resume_offered(const struct session *s);	/* CAP_RESUME */
/* Take one resume from the session's control socket (slot_ctl, slots.h)
 * and answer it. 1: the session now serves the new connection (and has
 * sent it Rresume and the replies it missed); 0: refused, nothing changed;
 * -1: the session is lost, or the runner is stopping. A session without a
 * key refuses every resume. */
int resume_take(struct session *s);
/* The same while the link stands (the session's input noticed it): 0
 * refused, the link stands; -1 the link is gone, replaced by the resume's
 * (resume_wait() goes on on it) or lost; s->linkdown is set. */
int resume_switch(struct session *s);
sess_handler resume_key;
sess_handler resume_request;
/* Tack: the client received the stream up to t->received. */
sess_handler resume_ack;
/* A request may change buffers: copy the Rread data the session still keeps
 * by reference (s->rread_refs), since the client may yet miss it. */
void resume_keep(struct session *s);
/* Send a then b (the output buffer, then the data of an Rread of more than
 * PROTO_RREAD_INLINE bytes, straight from its buffer), logging them for a
 * resume; a failed send marks the link down and, in a session that may be
 * resumed, is not an error. */
int resume_send(struct session *s, const void *a, size_t alen, const void *b,
    size_t blen);
/* The link is down: wait for a resume. 0: resumed on a new connection,
 * with the input buffer empty; -1: the session ends. */
int resume_wait(struct session *s);
void resume_free(struct session *s);
void resume_end(struct session *s);

/* peer.c: copies between runners */
sess_handler sess_grant;
sess_handler sess_peersend;
/* A connection whose first frame is a Tpeer: hand it to its session. */
int sess_peer_route(struct session *s, const union proto_msg *m,
    const uint8_t *frame);
/* Open the session's inbox (peer_route.c) and install peer.c's part of
 * the wait between frames (s->peer_tick, s->peer_serve). */
void sess_peer_open(struct session *s);
/* Take one peer connection waiting in the inbox (s->inbox readable): the
 * wait between frames (s->peer_serve) and resume_wait() call it. */
void sess_peer_take(struct session *s);
void sess_peer_free(struct session *s);

/* grant.c: the grants a session issues (Tgrant, Tlisten), for peer.c and
 * link.c: a new one (NULL: error queued), dropping a link's unused one,
 * the Rgrant-shaped reply (Rgrant or Rlisten), and taking the one a peer's
 * Tpeer proves (-1: the peer was refused, fd closed). */
struct peer_grant *grant_new(struct session *s, uint32_t tag, uint32_t ttl);
void grant_prune(struct session *s);
void grant_drop_link(struct session *s, uint32_t handle);
int grant_reply(struct session *s, unsigned type, uint32_t tag,
    const struct peer_grant *g);
int grant_take(struct session *s, int fd, const struct proto_tpeer *p,
    struct peer_grant *g);
/* Refuse a peer: log it, one Rerror on its connection, then close it. */
void grant_refuse(struct session *s, int fd, uint32_t tag, uint32_t code,
    const char *text);
void grant_wipe(void *p, size_t n);
void grant_free(struct session *s);

/* link.c: links between runners (protocol.md, Links between runners) */
sess_handler sess_listen;
sess_handler sess_dial;
sess_handler sess_unlink;
/* A peer connection that proved link grant g (peer.c): it becomes the
 * link's stream. */
void link_accept(struct session *s, int fd, const struct peer_grant *g,
    const struct proto_tpeer *p);
/* Tload of a link program: its shape (nothing for the backend to load). */
int link_check_load(struct session *s, const struct proto_tload *t);
/* Resolve a link program's launch record as launch.c resolves a kernel's. */
int link_check(struct session *s, uint32_t tag, const struct program *p,
    const struct proto_arg *args, const int64_t *vals);
/* Run it: send the range, or receive the link's next message into it. The
 * session's earlier work has completed. 0, or -1 with the error queued. */
int link_run(struct session *s, uint32_t tag, const struct program *p,
    const struct proto_arg *args, const int64_t *vals);
/* After a run that sent on links: wait until they took every byte; -1
 * (EPEER queued for tag) if a link broke holding some of them. */
int link_flush(struct session *s, uint32_t tag);
/* The same after a run that already failed: wait, report nothing. */
void link_drain(struct session *s);
void sess_links_free(struct session *s);

/* peer_net.c: the connection from a source runner to a destination */
/* The unix sockets that carry peer sockets and broker requests keep
 * message boundaries. macOS has no SOCK_SEQPACKET for unix sockets:
 * datagrams there, which never report the other end closing (the broker
 * is then stopped by a signal). Not run on macOS. */
#ifdef __APPLE__
#define PEER_SOCKTYPE SOCK_DGRAM
#else
#define PEER_SOCKTYPE SOCK_SEQPACKET
#endif
void peer_mac(const uint8_t *secret, const char *label, uint64_t grant,
    uint64_t count, const uint8_t *cnonce, uint8_t out[32]);
/* link: prove a link grant (its own labels; count is 0) instead of a copy's */
int peer_dial(const char *host, unsigned port, uint64_t grant,
    const uint8_t *secret, uint64_t count, int link, int timeout_s,
    uint8_t *cnonce, uint32_t *code, char *err);
int peer_connect(const char *host, unsigned port, uint64_t grant,
    const uint8_t *secret, uint64_t count, int link, int timeout_s,
    uint8_t *cnonce, uint32_t *code, char *err);
int peer_finish(int fd, uint64_t grant, const uint8_t *secret,
    const uint8_t *cnonce, uint64_t count, uint32_t *code, char *err);
int peer_mac_equal(const uint8_t *a, const uint8_t *b);
/* The host of a Tpeersend or Tdial, checked, as a C string; -1: not valid. */
int peer_host(char host[PROTO_MAX_PEER_HOST + 1], const uint8_t *body,
    uint16_t hostlen, uint16_t port);
int peer_send_rpeer(int fd, uint32_t tag, uint64_t count, const uint8_t *mac);
int peer_recv_all(int fd, void *buf, size_t n);
int peer_broker_start(const struct mr_config *cfg, char *err);
void peer_broker_stop(void);
int peer_broker_attach(char *err);
/* Spawned session processes (isolate.c): the broker's socket to hand down,
 * or -1; and the session's side, which takes it. */
int peer_broker_fd(void);
void peer_broker_adopt(int fd);

/* peer_route.c: the inboxes of this runner's sessions */
int peer_routes_init(uint32_t nslots);
void peer_routes_free(void);
void peer_route_open(int slot, uint32_t id);
void peer_route_close(int slot);
void peer_route_forked(int slot, int child);
int peer_route_fds(int slot, int *r, uint32_t *ids, int *w, int max);
int peer_route_adopt(uint32_t nslots, int slot, int r, const uint32_t *ids,
    const int *w, int n);
int peer_inbox(int slot);
int peer_handoff(uint32_t session, const uint8_t *frame, size_t len, int fd,
    char *err);
void peer_forget(void);

#endif
