/*
 * proto.h: parsing and building frames, with no I/O (proto.c).
 *
 * Every decode goes through bounds-checked little-endian getters driven by
 * one table of field offsets and widths per message type, so the code never
 * casts wire bytes to a struct and works on hosts of either byte order.
 * Errors return -1 (or 0 for sizes) and leave a message in err
 * (PROTO_ERRLEN bytes) naming what was wrong.
 */
#ifndef METAL_RUNNER_PROTO_H
#define METAL_RUNNER_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include "protocol.h"

#define PROTO_ERRLEN 512

union proto_msg {
	struct proto_hdr h;
	struct proto_rerror rerror;
	struct proto_thello thello;
	struct proto_rhello rhello;
	struct proto_tauth tauth;
	struct proto_rauth rauth;
	struct proto_ping ping;		/* Tping and Rping */
	struct proto_sync sync;		/* Tsync and Rsync */
	struct proto_talloc talloc;
	struct proto_tfree tfree;
	struct proto_twrite twrite;
	struct proto_tread tread;
	struct proto_rread rread;
	struct proto_tcopy tcopy;
	struct proto_tload tload;
	struct proto_tunload tunload;
	struct proto_tlaunch tlaunch;
	struct proto_rtime rtime;	/* Rlaunch and Rgraphrun */
	struct proto_tgraph tgraph;
	struct proto_tgraphrun tgraphrun;
	struct proto_tgraphfree tgraphfree;
	struct proto_rclock rclock;		/* Tclock is a proto_sync */
	struct proto_tprofile tprofile;
	struct proto_rprofile rprofile;
	struct proto_have have;			/* Thave and Rhave */
	struct proto_twritehash twritehash;
	struct proto_tresumekey tresumekey;
	struct proto_rresumekey rresumekey;
	struct proto_tresume tresume;
	struct proto_rresume rresume;
	struct proto_tack tack;
	struct proto_tgrant tgrant;
	struct proto_rgrant rgrant;
	struct proto_tpeersend tpeersend;	/* Rpeersend is a proto_rtime */
	struct proto_tpeer tpeer;
	struct proto_rpeer rpeer;
	struct proto_tlisten tlisten;		/* Rlisten is a proto_rgrant */
	struct proto_tdial tdial;		/* Rdial is a proto_rtime */
	struct proto_tunlink tunlink;
};

/* Size of the fixed part (header included) of a message type, 0 if the
 * type is unknown. */
size_t proto_fixed_size(unsigned type);
/* 1 if type is a request (T-message) a client may send. */
int proto_is_request(unsigned type);

/* Decode the 12-byte header. buf must hold PROTO_HDR_SIZE bytes. */
void proto_get_hdr(const uint8_t *buf, struct proto_hdr *h);
/* Check a request header before reading anything more: known request type,
 * fixed size <= size <= maxmsg. A failure is a framing error. */
int proto_check_hdr(const struct proto_hdr *h, uint32_t maxmsg, char *err);

/* Decode the fixed part of any message (by the header's type) from buf,
 * which holds len >= proto_fixed_size(type) bytes. */
int proto_get(const uint8_t *buf, size_t len, union proto_msg *m, char *err);
/* For a decoded request, check that h.size agrees with the counts in its
 * fixed fields (Twrite.count, Tping.count, Tload.namelen + datalen,
 * Tlaunch nbufs/nvals, Tgraphrun.count, Tdial.hostlen; Tgraph records are checked while
 * they are decoded). A failure is a framing error. */
int proto_check_size(const union proto_msg *m, char *err);

/* Encode the fixed part of m (of type m->h.type, size m->h.size as given)
 * into buf; return the bytes written (the fixed size) or 0 if cap is short
 * or the type unknown. */
size_t proto_put(uint8_t *buf, size_t cap, const union proto_msg *m);

/* Size on the wire of a launch record with nbufs buffers and nvals values. */
size_t proto_launch_size(unsigned nbufs, unsigned nvals);
/* Decode one launch record at buf[*off] (len bytes in all) and advance *off.
 * args and vals must have room for PROTO_MAX_ARGS entries. Fails if the
 * record does not fit in len or nbufs + nvals > PROTO_MAX_ARGS. */
int proto_get_launch(const uint8_t *buf, size_t len, size_t *off,
    struct proto_launch *l, struct proto_arg *args, int64_t *vals, char *err);
/* Encode a launch record; return bytes written or 0 if cap is short. */
size_t proto_put_launch(uint8_t *buf, size_t cap, const struct proto_launch *l,
    const struct proto_arg *args, const int64_t *vals);
/* Decode patch i of a Tgraphrun body (the bytes after its fixed part). */
int proto_get_patch(const uint8_t *buf, size_t len, size_t i,
    struct proto_patch *p, char *err);

/* Encode one profile record (40 bytes); return 40, or 0 if cap is short. */
size_t proto_put_prof(uint8_t *buf, size_t cap, const struct proto_prof *r);

/* Encode a complete Rerror frame (header, code, text truncated to
 * PROTO_MAX_ERRTEXT, or to maxtext bytes with _n, at a UTF-8 character
 * boundary); return its size, 0 if cap is short. */
size_t proto_put_rerror(uint8_t *buf, size_t cap, uint32_t tag, uint32_t code,
    const char *text);
size_t proto_put_rerror_n(uint8_t *buf, size_t cap, uint32_t tag,
    uint32_t code, const char *text, size_t maxtext);

/* A link message's 32-byte header (protocol.md, Links between runners). */
void proto_put_linkhdr(uint8_t *buf, uint64_t seq, uint64_t channel,
    uint64_t count);
void proto_get_linkhdr(const uint8_t *buf, struct proto_linkhdr *h);

/* CRC-32 (IEEE 802.3, as zlib's crc32): crc = proto_crc32(0, p, n). */
uint32_t proto_crc32(uint32_t crc, const uint8_t *p, size_t n);

/* "Tload", "Rerror", ... or "unknown"; "EHANDLE", ... or "unknown". */
const char *proto_type_name(unsigned type);
const char *proto_error_name(unsigned code);

#endif
