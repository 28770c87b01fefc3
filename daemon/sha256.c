/*
 * sha256.c: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and
 * dependency-free so the runner needs nothing beyond libc. Checked against
 * the FIPS and RFC 4231 test vectors in tests/test_auth.py. Whole blocks go
 * to the CPU's SHA instructions where it has them (sha256_hw.c): the cache
 * hashes everything a client sends for it.
 */
#include <pthread.h>
#include <string.h>

#include "metal_runner.h"
#include "sha256_k.h"

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void
block(uint32_t hh[8], const uint8_t *p)
{
	uint32_t w[64], a, b, d, e, f, g, h, cc, t1, t2;
	int i;

	for (i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		    (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (i = 16; i < 64; i++)
		w[i] = (ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10)) +
		    w[i - 7] + (ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^
		    (w[i - 15] >> 3)) + w[i - 16];
	a = hh[0]; b = hh[1]; cc = hh[2]; d = hh[3];
	e = hh[4]; f = hh[5]; g = hh[6]; h = hh[7];
	for (i = 0; i < 64; i++) {
		t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) +
		    ((e & f) ^ (~e & g)) + sha256_K[i] + w[i];
		t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) +
		    ((a & b) ^ (a & cc) ^ (b & cc));
		h = g; g = f; f = e; e = d + t1;
		d = cc; cc = b; b = a; a = t1 + t2;
	}
	hh[0] += a; hh[1] += b; hh[2] += cc; hh[3] += d;
	hh[4] += e; hh[5] += f; hh[6] += g; hh[7] += h;
}

static void
blocks_c(uint32_t h[8], const uint8_t *p, size_t n)
{
	for (; n > 0; n--, p += 64)
		block(h, p);
}

static sha256_blocks_fn blocks = blocks_c;
static pthread_once_t blocks_once = PTHREAD_ONCE_INIT;

static void
pick_blocks(void)
{
	sha256_blocks_fn f = sha256_hw_blocks();

	if (f != NULL)
		blocks = f;
}

const char *
sha256_impl(void)
{
	pthread_once(&blocks_once, pick_blocks);
	return blocks == blocks_c ? "portable C" : "CPU SHA instructions";
}

void
sha256_init(struct sha256_ctx *c)
{
	static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372,
	    0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };

	pthread_once(&blocks_once, pick_blocks);
	memcpy(c->h, h0, sizeof(h0));
	c->len = 0;
	c->n = 0;
}

void
sha256_update(struct sha256_ctx *c, const void *vp, size_t n)
{
	const uint8_t *p = vp;

	c->len += n;
	while (n > 0) {
		size_t k;

		/* Whole blocks straight from p, without copying. */
		if (c->n == 0 && n >= 64) {
			blocks(c->h, p, n / 64);
			k = n / 64 * 64;
			p += k;
			n -= k;
			continue;
		}
		k = 64 - c->n < n ? 64 - c->n : n;
		memcpy(c->buf + c->n, p, k);
		c->n += k;
		p += k;
		n -= k;
		if (c->n == 64) {
			blocks(c->h, c->buf, 1);
			c->n = 0;
		}
	}
}

void
sha256_final(struct sha256_ctx *c, uint8_t out[32])
{
	uint64_t bits = c->len * 8;
	uint8_t pad = 0x80, zero = 0, len[8];
	int i;

	sha256_update(c, &pad, 1);
	while (c->n != 56)
		sha256_update(c, &zero, 1);
	for (i = 0; i < 8; i++)
		len[i] = (uint8_t)(bits >> (56 - 8 * i));
	sha256_update(c, len, 8);
	for (i = 0; i < 32; i++)
		out[i] = (uint8_t)(c->h[i / 4] >> (24 - 8 * (i % 4)));
}

void
sha256(const uint8_t *p, size_t n, uint8_t out[32])
{
	struct sha256_ctx c;

	sha256_init(&c);
	sha256_update(&c, p, n);
	sha256_final(&c, out);
}

void
hmac_sha256(const uint8_t *key, size_t keylen, const uint8_t *msg,
    size_t msglen, uint8_t out[32])
{
	struct sha256_ctx c;
	uint8_t k[64], pad[64], inner[32];
	int i;

	memset(k, 0, sizeof(k));
	if (keylen > 64)
		sha256(key, keylen, k);
	else
		memcpy(k, key, keylen);
	for (i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x36;
	sha256_init(&c);
	sha256_update(&c, pad, 64);
	sha256_update(&c, msg, msglen);
	sha256_final(&c, inner);
	for (i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x5c;
	sha256_init(&c);
	sha256_update(&c, pad, 64);
	sha256_update(&c, inner, 32);
	sha256_final(&c, out);
}
