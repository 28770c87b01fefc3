/*
 * metal_runner.h: the daemon core as a library, prototypes grouped by file.
 *
 * An appliance embeds the runner by filling a struct mr_config and calling
 * mr_serve(); main.c is only argument parsing around that call.
 */
#ifndef METAL_RUNNER_H
#define METAL_RUNNER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "backend.h"

#define MR_VERSION "0.1.0"

struct mr_config {
	const char *host;		/* bind address, default 127.0.0.1 */
	int port;			/* 0: any free port */
	const char *backend;		/* "cpu", "metal"; NULL: the platform's best */
	const char *device;		/* backend device selector, may be NULL */
	int verbose;			/* -1: errors only; 0: a line
					 * per client; 1: session details; 2:
					 * every kernel and its time */
	enum be_isolation isolation;	/* 0: the backend's default */
	uint32_t maxmsg;		/* largest frame accepted */
	uint64_t session_mem;		/* bytes of buffers per session, 0: no limit */
	uint64_t total_mem;		/* bytes of buffers in all sessions, 0: device memory */
	uint32_t max_handles;		/* handles per session */
	uint32_t max_sessions;		/* sessions at once */
	uint32_t max_startups;		/* connections in their handshake at
					 * once, 0: max(10, max_sessions) */
	int handshake_timeout;		/* seconds to complete Thello (and
					 * Tauth), 0: forever */
	int frame_timeout;		/* seconds a half-received frame may stall */
	int idle_timeout;		/* seconds a session may be idle, 0: forever */
	int kernel_timeout;		/* seconds a CPU kernel may run, 0: forever */
	const char *user;		/* session processes switch to this user
					 * (a runner started as root), NULL: none */
	int no_confine;			/* 1: no system call filter in session
					 * processes (confine.c) */
	const char *cache_dir;		/* the content cache (cache.c), NULL: none */
	uint64_t cache_size;		/* bytes the cache may hold on disk */
	int resume_grace;		/* seconds a session waits for its client
					 * to resume after the link drops, 0: no
					 * resuming (resume.c) */
	uint64_t resume_log;		/* bytes of replies a session keeps to
					 * send again on a resume */
	const uint8_t *token;		/* shared secret for Tauth, NULL: none */
	size_t tokenlen;		/* 1 to MR_TOKEN_MAX bytes */
	int watch_stdin;		/* 1: stop when stdin reaches its end (the
					 * program that started the runner holds
					 * the pipe's other end) */
	/* The runner's command line, which a spawned session process
	 * (isolate.c) is started with to read the same configuration; NULL:
	 * no spawned sessions (an embedding program: use fork or threads). */
	char *const *argv;
	int argc;
	/* Called once the socket listens, with the bound port. */
	void (*on_listen)(const char *host, int port, void *arg);
	void *on_listen_arg;
	/* Called on the serving thread after SIGHUP, NULL: SIGHUP is left
	 * alone. mr_serve() then takes SIGHUP for the whole process. */
	void (*on_hup)(void *arg);
	void *on_hup_arg;
};

/* config.c: the defaults, the backends this build has (NULL: the first),
 * and the isolation cfg asks of be (spawn where be cannot fork). */
void mr_config_defaults(struct mr_config *cfg);
const struct backend *mr_find_backend(const char *name);
enum be_isolation mr_isolation(const struct mr_config *cfg,
    const struct backend *be);

/* server.c */
/* Serve until mr_stop() or SIGINT/SIGTERM; 0 on a clean stop, -1 on error,
 * which includes a device the backend lost for good (backend.h, lost: the
 * runner then ends every session, telling each client why).
 * It installs SIGINT and SIGTERM handlers that stop it and ignores SIGPIPE,
 * for the whole process (examples/embed/appliance.c shows a program that
 * takes the signals itself). It may be called again once it has returned. */
int mr_serve(const struct mr_config *cfg);
/* config.c: stop mr_serve(); from any thread or a signal handler. A stop that comes
 * before mr_serve() ends it as it starts. Sessions end at once, but
 * mr_serve() returns only when the last one has: a session process still
 * running a kernel 5 s later is killed, a session thread (which cannot be
 * interrupted) is waited for until its kernel returns. While it waits, a
 * second SIGINT or SIGTERM to the handlers mr_serve() installed ends the
 * program. */
void mr_stop(void);
/* Whether a stop was asked for: a session thread tells its client's end
 * from the runner's by it. */
int mr_stopping(void);

/* slots.c: the session table. */
/* Memory accounting shared by all sessions (and their processes). */
int mr_mem_init(uint32_t nslots, uint64_t limit);
int mr_mem_reserve(int slot, uint64_t n, uint64_t session_limit, char *err);
void mr_mem_release(int slot, uint64_t n);
/* Sleep so failed authentications of all sessions answer 1 s apart. */
void mr_auth_penalty(void);
/* Count the session in slot once its handshake is done; -1: at the limit. */
int mr_session_admit(int slot);
void mr_session_leave(int slot);
/* Log a refused or timed-out handshake, at most one line a second. */
void mr_log_handshake(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
void mr_log_handshake_flush(void);

/* handshake.c */
/* The longest token: a spawned session process reads it from a pipe into a
 * buffer of this size (isolate.c). */
#define MR_TOKEN_MAX 4096
/* Replace the token (a copy is kept) for every Tauth from now on, in this
 * process and in session processes forked later; cfg->token must be set.
 * 0, or -1 with nothing changed (no memory, len 0 or more than
 * MR_TOKEN_MAX). Thread-safe. */
int mr_token_replace(const uint8_t *token, size_t len);
/* Write the token in force to fd, and close it: 0 or -1 (isolate.c). */
int mr_token_send(const struct mr_config *cfg, int fd);

/* isolate.c: main() of a spawned session process, given the internal
 * options --session-spawn SPEC, --session-routes IDS and --session-peer
 * ADDR that the runner started it with; it does not return. */
void mr_spawned_session(struct mr_config *cfg, const char *spec,
    const char *routes, const char *peer);

/* session.c */
struct mr_server_ctx {
	const struct mr_config *cfg;
	const struct backend *be;
	const struct be_info *info;
};
/* Serve one connection until it ends; frees everything it created. */
void sess_serve(const struct mr_server_ctx *ctx, int fd, uint32_t id, int slot,
    const char *peer);

/* crash.c */
/* Process isolation: the handler for a crashing or overrunning kernel,
 * installed in a session process; the text it sends for SIGSYS (confine.c
 * names the denied call in it). */
extern int sess_crash_handlers;
extern char sess_crash_sigsys[128];
void sess_crash_signal(int sig);
void sess_crash_install(void);
/* Around a kernel run in a session process (no-ops elsewhere): the client's
 * socket, the request's tag and the kernel's name for the report, and the
 * kernel time limit (s, 0: none). */
void sess_crash_arm(int fd, uint32_t tag, const char *name, int timeout);
void sess_crash_disarm(int timeout);

/* net.c */
int net_listen(const char *host, int port, int *bound_port, char *err);
int net_accept(int lfd, char *peer, size_t peerlen);
int net_tune(int fd, int timeout_s);
ssize_t net_recv(int fd, void *buf, size_t len);
int net_send_all(int fd, const void *buf, size_t len);
int net_sendv_all(int fd, const void *a, size_t alen, const void *b, size_t blen);
int net_is_loopback(const char *host);
/* Refuse a connection: one Rerror (tag, code, text) on it, then close it. */
void net_refuse(int fd, uint32_t tag, uint32_t code, const char *text);
/* A message and a descriptor (or -1) over a unix socket, without waiting;
 * net_recv_fd returns the message's length, 0 at end of stream, -1. */
int net_send_fd(int sock, const void *msg, size_t len, int fd);
ssize_t net_recv_fd(int sock, void *msg, size_t len, int *fd);

/* htab.c: client-chosen u32 handle -> pointer */
struct htab {
	uint32_t *keys;
	void **vals;
	uint32_t cap;		/* power of two, or 0 */
	uint32_t count;
	uint32_t tombs;
};
void *htab_get(const struct htab *t, uint32_t key);
int htab_put(struct htab *t, uint32_t key, void *val);	/* -1: no memory */
void *htab_del(struct htab *t, uint32_t key);
/* Call fn on every value, then free the table. */
void htab_clear(struct htab *t, void (*fn)(void *val, void *arg), void *arg);

/* random.c: n random bytes from the system (it cannot fail: it aborts). */
void random_bytes(uint8_t *p, size_t n);

/* log.c */
extern int log_verbose;
void log_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* sha256.c */
struct sha256_ctx {
	uint32_t h[8];
	uint64_t len;
	uint8_t buf[64];
	size_t n;
};
void sha256_init(struct sha256_ctx *c);
void sha256_update(struct sha256_ctx *c, const void *p, size_t n);
void sha256_final(struct sha256_ctx *c, uint8_t out[32]);
/* "CPU SHA instructions" or "portable C": what sha256() runs on here. */
const char *sha256_impl(void);
void sha256(const uint8_t *p, size_t n, uint8_t out[32]);
void hmac_sha256(const uint8_t *key, size_t keylen, const uint8_t *msg,
    size_t msglen, uint8_t out[32]);

/* sha256_hw.c: the CPU's SHA-256 block function, NULL if it has none. */
typedef void (*sha256_blocks_fn)(uint32_t h[8], const uint8_t *p, size_t n);
sha256_blocks_fn sha256_hw_blocks(void);

#endif
