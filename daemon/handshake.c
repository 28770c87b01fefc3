/*
 * handshake.c: the first exchanges of a session, Thello and Tauth.
 *
 * Thello fixes the version and the frame size and tells the client what
 * the runner offers; with a token configured it carries the server's
 * nonce, and Tauth must follow: an HMAC-SHA256 of both nonces under the
 * token, each way. A wrong MAC ends the session after the penalty wait
 * shared by all sessions (mr_auth_penalty, slots.c).
 *
 * Until the handshake is done the connection counts against the runner's
 * startup limit, not its session limit (server.c); completing it takes a
 * session place, or ends the connection with ELIMIT if there is none.
 *
 * The token can be replaced while the runner serves (SIGHUP, main.c):
 * mr_token_replace() swaps it under a lock, and Tauth takes the lock only
 * to compute its two MACs, so a session authenticates with one token,
 * old or new, never a mix. A session that is already authenticated is not
 * affected. Session processes are forked from the runner: the fork
 * handlers keep a child from inheriting the lock held by the thread that
 * swaps, and a child sees the token of the moment it was forked, which is
 * the newest for every connection accepted after the swap. Whether a
 * token is needed at all (cfg->token != NULL) never changes.
 */
#include <pthread.h>
#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "session.h"

/* The handshake is done: become a session, if the runner has room. */
static int
admit(struct session *s, uint32_t tag)
{
	if (mr_session_admit(s->slot) == 0)
		return 0;
	mr_log_handshake("refusing %s: %u sessions is the limit", s->peer,
	    s->ctx->cfg->max_sessions);
	return sess_fatal(s, tag, PROTO_ELIMIT, "the runner is serving as "
	    "many sessions as it allows; try again later");
}

int
sess_hello(struct session *s, const union proto_msg *m)
{
	const struct be_info *info = s->ctx->info;
	const struct mr_config *cfg = s->ctx->cfg;
	const struct proto_thello *t = &m->thello;
	union proto_msg r;
	char text[128];

	if (m->h.type != PROTO_THELLO) {
		snprintf(text, sizeof(text), "the first request must be "
		    "Thello, not %s", proto_type_name(m->h.type));
		return sess_fatal(s, m->h.tag, PROTO_ESTATE, text);
	}
	if (t->magic != PROTO_MAGIC)
		return sess_fatal(s, m->h.tag, PROTO_EVERSION,
		    "bad magic: not a metal_runner client");
	if (t->version != PROTO_VERSION) {
		snprintf(text, sizeof(text), "protocol version %u not "
		    "supported; this runner speaks version %u", t->version,
		    PROTO_VERSION);
		return sess_fatal(s, m->h.tag, PROTO_EVERSION, text);
	}
	if (t->maxmsg < PROTO_MIN_MAXMSG) {
		snprintf(text, sizeof(text), "maxmsg %u is below the minimum "
		    "%u", t->maxmsg, PROTO_MIN_MAXMSG);
		return sess_fatal(s, m->h.tag, PROTO_EINVAL, text);
	}
	if (cfg->token == NULL && admit(s, m->h.tag) == -1)
		return -1;
	s->maxmsg = t->maxmsg < cfg->maxmsg ? t->maxmsg : cfg->maxmsg;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RHELLO;
	r.h.tag = m->h.tag;
	r.rhello.magic = PROTO_MAGIC;
	r.rhello.version = PROTO_VERSION;
	r.rhello.maxmsg = s->maxmsg;
	r.rhello.backend = info->backend;
	/* Tclock and Tprofile, peers and links are the session's, on every
	 * backend. */
	r.rhello.caps = info->caps | PROTO_CAP_PROFILE | PROTO_CAP_PEER |
	    PROTO_CAP_LINK |
	    (cfg->token != NULL ? PROTO_CAP_AUTH : 0) |
	    (s->cache != NULL ? PROTO_CAP_CACHE : 0) |
	    (resume_offered(s) ? PROTO_CAP_RESUME | PROTO_CAP_ACK : 0);
	r.rhello.ncores = info->ncores;
	r.rhello.memory = cfg->total_mem ? min64(cfg->total_mem, info->memory) :
	    info->memory;
	if (cfg->session_mem)
		r.rhello.memory = min64(r.rhello.memory, cfg->session_mem);
	r.rhello.maxbuf = min64(info->maxbuf, r.rhello.memory);
	r.rhello.maxhandles = cfg->max_handles;
	r.rhello.session = s->id;
	/* Fresh for Tauth, and for Tresume's proof (resume.c). */
	if (cfg->token != NULL || resume_offered(s)) {
		random_bytes(s->snonce, sizeof(s->snonce));
		memcpy(r.rhello.nonce, s->snonce, sizeof(s->snonce));
	}
	memcpy(r.rhello.name, info->name, sizeof(r.rhello.name));
	memcpy(r.rhello.arch, info->arch, sizeof(r.rhello.arch));
	memcpy(r.rhello.cpu, info->cpu, sizeof(r.rhello.cpu));
	memcpy(r.rhello.features, info->features, sizeof(r.rhello.features));
	s->state = cfg->token != NULL ? S_AUTH : S_READY;
	return sess_reply(s, &r, NULL, 0);
}

static const char auth_client[] = "metal_runner-auth-v1 client";
static const char auth_server[] = "metal_runner-auth-v1 server";

/* The token that replaced cfg->token (owned), or NULL: none yet. */
static pthread_mutex_t token_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t token_once = PTHREAD_ONCE_INIT;
static uint8_t *token_new;
static size_t token_newlen;

static void token_lock_fork(void) { pthread_mutex_lock(&token_lock); }
static void token_unlock_fork(void) { pthread_mutex_unlock(&token_lock); }

static void
token_atfork(void)
{
	pthread_atfork(token_lock_fork, token_unlock_fork, token_unlock_fork);
}

/* The token in force and its length; token_lock held. */
static const uint8_t *
token_in_force(const struct mr_config *cfg, size_t *len)
{
	if (token_new != NULL) {
		*len = token_newlen;
		return token_new;
	}
	*len = cfg->tokenlen;
	return cfg->token;
}

int
mr_token_replace(const uint8_t *token, size_t len)
{
	uint8_t *p, *old;

	if (len == 0 || len > MR_TOKEN_MAX || (p = malloc(len)) == NULL)
		return -1;
	memcpy(p, token, len);
	pthread_once(&token_once, token_atfork);
	pthread_mutex_lock(&token_lock);
	old = token_new;
	token_new = p;
	token_newlen = len;
	pthread_mutex_unlock(&token_lock);
	free(old);
	return 0;
}

/* A spawned session process (isolate.c) is handed the token in force now:
 * written to fd (a pipe), which is closed. 0 or -1. */
int
mr_token_send(const struct mr_config *cfg, int fd)
{
	const uint8_t *token;
	size_t len;
	ssize_t n;

	pthread_mutex_lock(&token_lock);
	token = token_in_force(cfg, &len);
	n = write(fd, token, len);
	pthread_mutex_unlock(&token_lock);
	close(fd);
	return n == (ssize_t)len ? 0 : -1;
}

static void
auth_mac(const uint8_t *key, size_t keylen, const char *label,
    const uint8_t *a, const uint8_t *b, uint8_t out[32])
{
	uint8_t msg[sizeof(auth_client) + 2 * PROTO_NONCE_SIZE];
	size_t l = strlen(label);

	memcpy(msg, label, l);
	memcpy(msg + l, a, PROTO_NONCE_SIZE);
	memcpy(msg + l + PROTO_NONCE_SIZE, b, PROTO_NONCE_SIZE);
	hmac_sha256(key, keylen, msg, l + 2 * PROTO_NONCE_SIZE, out);
}

/* Both MACs of an exchange, under one token. */
static void
auth_macs(const struct mr_config *cfg, const uint8_t *snonce,
    const uint8_t *cnonce, uint8_t client[32], uint8_t server[32])
{
	const uint8_t *token;
	size_t len;

	pthread_mutex_lock(&token_lock);
	token = token_in_force(cfg, &len);
	auth_mac(token, len, auth_client, snonce, cnonce, client);
	auth_mac(token, len, auth_server, cnonce, snonce, server);
	pthread_mutex_unlock(&token_lock);
}

int
sess_auth(struct session *s, const union proto_msg *m, const char *peer)
{
	const struct mr_config *cfg = s->ctx->cfg;
	uint8_t want[32], smac[32], diff = 0;
	union proto_msg r;
	size_t i;

	if (m->h.type != PROTO_TAUTH)
		return sess_fatal(s, m->h.tag, PROTO_ESTATE, "this runner "
		    "requires authentication: Tauth must follow Rhello");
	auth_macs(cfg, s->snonce, m->tauth.cnonce, want, smac);
	for (i = 0; i < sizeof(want); i++)	/* constant time */
		diff |= want[i] ^ m->tauth.mac[i];
	if (diff != 0) {
		log_warn("session %u: authentication failed from %s", s->id,
		    peer);
		mr_auth_penalty();	/* rate-limits guessing */
		return sess_fatal(s, m->h.tag, PROTO_EAUTH, "authentication "
		    "failed: wrong token");
	}
	if (admit(s, m->h.tag) == -1)
		return -1;
	memset(&r, 0, sizeof(r));
	r.h.type = PROTO_RAUTH;
	r.h.tag = m->h.tag;
	memcpy(r.rauth.mac, smac, sizeof(smac));
	s->state = S_READY;
	log_notice("session %u: authenticated", s->id);
	return sess_reply(s, &r, NULL, 0);
}
