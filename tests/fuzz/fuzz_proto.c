/*
 * fuzz_proto.c: libFuzzer target for the frame codec in proto.c, with no
 * I/O. The input is taken as one frame (as the daemon would hold it once
 * it has size bytes), as a run of launch records, and as an error text.
 *
 * Oracles besides the sanitizers: decoding what was encoded gives the same
 * message back; a decoded launch record re-encodes to the input bytes
 * (padding aside); proto_get_patch succeeds exactly for the patches that
 * fit; every failure leaves a message; Rerror frames built from any text
 * parse back; proto_crc32 agrees with a bit-at-a-time CRC-32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define check(cond) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "fuzz_proto: %s: assertion failed: %s\n", \
		    __func__, #cond);					\
		abort();						\
	}								\
} while (0)

#define LAUNCH_HDR 16	/* Tlaunch: the launch record starts here */
#define FIXED_GRAPH 24	/* Tgraph and Tgraphrun fixed parts */

static void
failed_with_message(int rc, const char *err)
{
	check(rc == -1);
	check(err[0] != '\0' && strlen(err) < PROTO_ERRLEN);
}

/* Decode up to max launch records from off on, re-encoding each and
 * comparing; return the offset after the last one decoded. */
static size_t
launches(const uint8_t *buf, size_t len, size_t off, size_t max)
{
	struct proto_launch l;
	struct proto_arg args[PROTO_MAX_ARGS];
	int64_t vals[PROTO_MAX_ARGS];
	uint8_t out[32 + 16 * PROTO_MAX_ARGS], in[sizeof(out)];
	char err[PROTO_ERRLEN];
	size_t start, n, i;

	while (max-- > 0) {
		start = off;
		err[0] = '\0';
		if (proto_get_launch(buf, len, &off, &l, args, vals,
		    err) != 0) {
			failed_with_message(-1, err);
			check(off == start);
			return off;
		}
		n = off - start;
		check(off <= len && n == proto_launch_size(l.nbufs, l.nvals));
		check((unsigned)l.nbufs + l.nvals <= PROTO_MAX_ARGS);
		check(proto_put_launch(out, sizeof(out), &l, args, vals) == n);
		check(proto_put_launch(out, n - 1, &l, args, vals) == 0);
		memcpy(in, buf + start, n);
		for (i = 0; i < l.nbufs; i++)	/* arg pads are not kept */
			memset(in + 32 + 16 * i + 4, 0, 4);
		check(memcmp(in, out, n) == 0);
	}
	return off;
}

static void
frame(const uint8_t *buf, size_t len)
{
	struct proto_hdr h;
	union proto_msg m, m2;
	struct proto_patch p;
	uint8_t out[512];
	char err[PROTO_ERRLEN];
	size_t fixed, n, i;
	int rc;

	if (len < PROTO_HDR_SIZE)
		return;
	proto_get_hdr(buf, &h);
	err[0] = '\0';
	rc = proto_check_hdr(&h, PROTO_DEFAULT_MAXMSG, err);
	if (rc != 0)
		failed_with_message(rc, err);
	else {
		check(proto_is_request(h.type));
		check(h.size >= proto_fixed_size(h.type));
		check(h.size <= PROTO_DEFAULT_MAXMSG);
	}
	fixed = proto_fixed_size(h.type);
	err[0] = '\0';
	if ((rc = proto_get(buf, len, &m, err)) != 0) {
		failed_with_message(rc, err);
		check(fixed == 0 || len < fixed);
		return;
	}
	check(fixed != 0 && len >= fixed);
	check(m.h.size == h.size && m.h.type == h.type &&
	    m.h.flags == h.flags && m.h.tag == h.tag);
	if (fixed > PROTO_HDR_SIZE) {
		check(proto_get(buf, fixed - 1, &m2, err) == -1);
		check(proto_put(out, fixed - 1, &m) == 0);
	}

	/* Encode and decode again: the same message. */
	n = proto_put(out, sizeof(out), &m);
	check(n == fixed);
	check(proto_get(out, n, &m2, err) == 0);
	check(memcmp(&m, &m2, sizeof(m)) == 0);

	err[0] = '\0';
	if ((rc = proto_check_size(&m, err)) != 0) {
		failed_with_message(rc, err);
		return;
	}
	/* The daemon holds exactly h.size bytes of a frame. */
	if (h.size > len)
		return;
	switch (h.type) {
	case PROTO_TLAUNCH:
		/* check_size passed: the record fills the frame exactly. */
		check(launches(buf, h.size, LAUNCH_HDR, 1) == h.size);
		break;
	case PROTO_TGRAPH:
		launches(buf, h.size, FIXED_GRAPH, m.tgraph.count < 4096 ?
		    m.tgraph.count : 4096);
		break;
	case PROTO_TGRAPHRUN:
		/* check_size passed: exactly count patches follow. */
		for (i = 0; i < m.tgraphrun.count && i < 4096; i++)
			check(proto_get_patch(buf + FIXED_GRAPH,
			    h.size - FIXED_GRAPH, i, &p, err) == 0);
		err[0] = '\0';
		check(proto_get_patch(buf + FIXED_GRAPH, h.size - FIXED_GRAPH,
		    m.tgraphrun.count, &p, err) == -1 && err[0] != '\0');
		break;
	}
}

static void
patches(const uint8_t *buf, size_t len)
{
	struct proto_patch p;
	char err[PROTO_ERRLEN];
	size_t i;

	for (i = 0; i <= len / 24 + 1; i++)
		check((proto_get_patch(buf, len, i, &p, err) == 0) ==
		    (i < len / 24));
	check(proto_get_patch(buf, len, (size_t)-1, &p, err) == -1);
}

static void
rerror(const uint8_t *buf, size_t len)
{
	char text[2 * PROTO_MAX_ERRTEXT];
	uint8_t out[20 + PROTO_MAX_ERRTEXT];
	union proto_msg m;
	char err[PROTO_ERRLEN];
	size_t n, tl;

	tl = len < sizeof(text) - 1 ? len : sizeof(text) - 1;
	memcpy(text, buf, tl);
	text[tl] = '\0';
	tl = strlen(text);
	n = proto_put_rerror(out, sizeof(out), 7, PROTO_EINVAL, text);
	check(n == 20 + (tl < PROTO_MAX_ERRTEXT ? tl : PROTO_MAX_ERRTEXT));
	check(proto_get(out, n, &m, err) == 0);
	check(proto_check_size(&m, err) == 0);
	check(m.h.type == PROTO_RERROR && m.h.tag == 7 && m.h.size == n);
	check(memcmp(out + 20, text, n - 20) == 0);
	check(proto_put_rerror(out, n - 1, 7, PROTO_EINVAL, text) == 0);
}

static uint32_t
crc32_bitwise(const uint8_t *p, size_t n)
{
	uint32_t crc = 0xffffffff;
	int k;

	while (n-- > 0) {
		crc ^= *p++;
		for (k = 0; k < 8; k++)
			crc = crc & 1 ? (crc >> 1) ^ 0xedb88320 : crc >> 1;
	}
	return ~crc;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t half = size / 2;

	frame(data, size);
	launches(data, size, 0, 64);
	patches(data, size);
	rerror(data, size);
	check(proto_crc32(0, data, size) == crc32_bitwise(data, size));
	check(proto_crc32(proto_crc32(0, data, half), data + half,
	    size - half) == proto_crc32(0, data, size));
	if (size >= 2) {
		check(proto_type_name(data[0] | data[1] << 8)[0] != '\0');
		check(proto_error_name(data[0] | data[1] << 8)[0] != '\0');
	}
	return 0;
}
