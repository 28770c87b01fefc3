/*
 * grant.c: the grants a session issues, for a copy (Tgrant, peer.c) or a
 * link (Tlisten, link.c) between runners.
 *
 * A grant is a random secret bound to this session and a deadline, good
 * once: for a copy, one range of one buffer; for a link, the one peer
 * that may connect to a link handle. The grant, not the runner's token,
 * authenticates a peer: only the destination session and its
 * authenticated client know the secret. Both kinds are kept, proved and
 * used up here, below peer.c and link.c, which both use it and neither
 * of which calls the other for it.
 */
#include <sys/types.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monotime.h"
#include "session.h"

/* memset that the compiler may not drop (explicit_bzero is not on macOS). */
void
grant_wipe(void *p, size_t n)
{
	volatile uint8_t *v = p;

	while (n-- > 0)
		*v++ = 0;
}

static void
drop_grant(struct session *s, uint32_t i)
{
	grant_wipe(s->grants[i].secret, PROTO_SECRET_SIZE);
	s->grants[i] = s->grants[--s->ngrants];
}

/* Forget the grants that have expired. */
void
grant_prune(struct session *s)
{
	int64_t now = mono_ms();
	uint32_t i = 0;

	while (i < s->ngrants)
		if (s->grants[i].expires <= now)
			drop_grant(s, i);
		else
			i++;
}

/*
 * A new grant of this session, its number and secret filled in, the rest
 * zero; NULL with the error queued (the reply of the request) when the
 * session holds PROTO_MAX_GRANTS or memory is short. Sess_grant() (peer.c)
 * and sess_listen() (link.c) fill in what it allows.
 */
struct peer_grant *
grant_new(struct session *s, uint32_t tag, uint32_t ttl)
{
	struct peer_grant *g;

	grant_prune(s);
	if (ttl == 0 || ttl > PROTO_MAX_GRANT_TTL) {
		sess_errorf(s, tag, PROTO_EINVAL, "a grant needs a ttl of 1 to "
		    "%d s (ttl %u)", PROTO_MAX_GRANT_TTL, ttl);
		return NULL;
	}
	if (s->ngrants >= PROTO_MAX_GRANTS) {
		sess_errorf(s, tag, PROTO_ELIMIT, "session holds %d unused "
		    "grants, the limit", PROTO_MAX_GRANTS);
		return NULL;
	}
	if (s->grants == NULL && (s->grants = calloc(PROTO_MAX_GRANTS,
	    sizeof(*s->grants))) == NULL) {
		sess_errorf(s, tag, PROTO_ENOMEM, "no memory for a grant");
		return NULL;
	}
	g = &s->grants[s->ngrants++];
	memset(g, 0, sizeof(*g));
	if (++s->grantseq == 0)
		s->grantseq = 1;
	g->id = (uint64_t)s->id << 32 | s->grantseq;
	random_bytes(g->secret, sizeof(g->secret));
	g->expires = mono_ms() + (int64_t)ttl * 1000;
	return g;
}

/* Forget the unused grant of link handle, if any (Tunlink). */
void
grant_drop_link(struct session *s, uint32_t handle)
{
	uint32_t i;

	for (i = 0; i < s->ngrants; i++)
		if (s->grants[i].islink && s->grants[i].handle == handle) {
			drop_grant(s, i);
			return;
		}
}

/* Rgrant, or Rlisten: the grant's number and secret. */
int
grant_reply(struct session *s, unsigned type, uint32_t tag,
    const struct peer_grant *g)
{
	union proto_msg r;

	memset(&r, 0, sizeof(r));
	r.h.type = (uint16_t)type;
	r.h.tag = tag;
	r.rgrant.grant = g->id;
	memcpy(r.rgrant.secret, g->secret, sizeof(g->secret));
	return sess_reply(s, &r, NULL, 0);
}

void
grant_refuse(struct session *s, int fd, uint32_t tag, uint32_t code,
    const char *text)
{
	log_info("session %u: refusing a peer: %s: %s", s->id,
	    proto_error_name(code), text);
	net_refuse(fd, tag, code, text);
}

/*
 * The grant a peer's Tpeer names, proved: 0 with it in *g and used up
 * (never again, whatever follows); -1 when the peer was refused (fd is
 * closed). A wrong proof does not use the grant up: whoever knows only
 * its number could otherwise spoil it for the client that holds it.
 */
int
grant_take(struct session *s, int fd, const struct proto_tpeer *p,
    struct peer_grant *g)
{
	uint8_t mac[PROTO_MAC_SIZE];
	uint32_t i;

	for (i = 0; i < s->ngrants && s->grants[i].id != p->grant; i++)
		;
	if (i == s->ngrants) {
		grant_refuse(s, fd, p->h.tag, PROTO_EGRANT, "no such grant in "
		    "this session: never issued, already used or expired");
		return -1;
	}
	if (s->grants[i].expires <= mono_ms()) {
		drop_grant(s, i);
		grant_refuse(s, fd, p->h.tag, PROTO_EGRANT, "the grant "
		    "expired");
		return -1;
	}
	peer_mac(s->grants[i].secret, s->grants[i].islink ?
	    "metal_runner link src" : "metal_runner peer src", p->grant,
	    p->count, p->cnonce, mac);
	if (!peer_mac_equal(mac, p->mac)) {
		grant_refuse(s, fd, p->h.tag, PROTO_EGRANT, "the grant's "
		    "proof is wrong");
		return -1;
	}
	*g = s->grants[i];
	drop_grant(s, i);
	return 0;
}

void
grant_free(struct session *s)
{
	if (s->grants != NULL)
		grant_wipe(s->grants, PROTO_MAX_GRANTS * sizeof(*s->grants));
	free(s->grants);
	s->grants = NULL;
	s->ngrants = 0;
}
