/*
 * sha256_hw.c: SHA-256 compression with the CPU's own instructions.
 *
 * The cache (cache.c) hashes every byte a client sends for it, so hashing
 * must keep up with the network: the portable code in sha256.c does about
 * 240 MB/s, the SHA extensions (x86-64 SHA-NI, ARMv8 SHA2) several GB/s.
 * Each is compiled for its instructions alone (a target attribute, not a
 * build flag) and chosen at run time only when the CPU reports it, so one
 * binary runs on every CPU of its architecture. The round structure follows
 * Intel's and ARM's published SHA-256 sequences.
 */
#include <stddef.h>
#include <stdint.h>

#include "metal_runner.h"
#include "sha256_k.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>

#define HW_X86

/* Sixteen groups of four rounds; the message schedule runs three groups
 * ahead in m[g % 4] (sha256msg1 then sha256msg2). */
__attribute__((target("sha,sse4.1,ssse3")))
static void
blocks_shani(uint32_t h[8], const uint8_t *p, size_t n)
{
	const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL,
	    0x0405060700010203ULL);
	__m128i s0, s1, t, msg, abef, cdgh, m[4];
	int g;

	/* h is A..H; the instructions want ABEF and CDGH. */
	t = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xb1);
	s1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1b);
	s0 = _mm_alignr_epi8(t, s1, 8);
	s1 = _mm_blend_epi16(s1, t, 0xf0);
	for (; n > 0; n--, p += 64) {
		abef = s0;
		cdgh = s1;
		/* Unrolled, m[] stays in registers. */
#pragma GCC unroll 16
		for (g = 0; g < 16; g++) {
			if (g < 4)
				m[g] = _mm_shuffle_epi8(_mm_loadu_si128(
				    (const __m128i *)(p + 16 * g)), mask);
			msg = _mm_add_epi32(m[g % 4],
			    _mm_loadu_si128((const __m128i *)&sha256_K[4 * g]));
			s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
			if (g >= 3 && g <= 14) {
				t = _mm_alignr_epi8(m[g % 4], m[(g + 3) % 4], 4);
				m[(g + 1) % 4] = _mm_sha256msg2_epu32(
				    _mm_add_epi32(m[(g + 1) % 4], t), m[g % 4]);
			}
			msg = _mm_shuffle_epi32(msg, 0x0e);
			s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
			if (g >= 1 && g <= 12)
				m[(g + 3) % 4] = _mm_sha256msg1_epu32(
				    m[(g + 3) % 4], m[g % 4]);
		}
		s0 = _mm_add_epi32(s0, abef);
		s1 = _mm_add_epi32(s1, cdgh);
	}
	t = _mm_shuffle_epi32(s0, 0x1b);
	s1 = _mm_shuffle_epi32(s1, 0xb1);
	_mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(t, s1, 0xf0));
	_mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(s1, t, 8));
}
#endif

/* GCC's arm_neon.h declares the SHA intrinsics for a function with the
 * target attribute; clang's (before 16) only when the whole file is built
 * for them (__ARM_FEATURE_SHA2, as on every arm64 Mac): otherwise clang
 * builds use the portable code. */
#if defined(__aarch64__) && (defined(__linux__) || defined(__APPLE__)) && \
    (defined(__ARM_FEATURE_SHA2) || defined(__ARM_FEATURE_CRYPTO) || \
    (defined(__GNUC__) && !defined(__clang__)))
#if defined(__ARM_FEATURE_SHA2) || defined(__ARM_FEATURE_CRYPTO)
#define ARM_SHA_TARGET
#else
#define ARM_SHA_TARGET __attribute__((target("+crypto")))
#endif
#include <arm_neon.h>
#ifdef __linux__
#include <sys/auxv.h>
#endif

#define HW_ARM

/* Sixteen groups of four rounds; the schedule is updated in place in
 * m[g % 4] for the twelve groups that still need new words. */
ARM_SHA_TARGET
static void
blocks_armv8(uint32_t h[8], const uint8_t *p, size_t n)
{
	uint32x4_t s0, s1, save0, save1, s0old, tmp, m[4];
	int g;

	s0 = vld1q_u32(&h[0]);
	s1 = vld1q_u32(&h[4]);
	for (; n > 0; n--, p += 64) {
		save0 = s0;
		save1 = s1;
		for (g = 0; g < 4; g++)
			m[g] = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p +
			    16 * g)));
#pragma GCC unroll 16
		for (g = 0; g < 16; g++) {
			tmp = vaddq_u32(m[g % 4], vld1q_u32(&sha256_K[4 * g]));
			if (g < 12)
				m[g % 4] = vsha256su0q_u32(m[g % 4],
				    m[(g + 1) % 4]);
			s0old = s0;
			s0 = vsha256hq_u32(s0, s1, tmp);
			s1 = vsha256h2q_u32(s1, s0old, tmp);
			if (g < 12)
				m[g % 4] = vsha256su1q_u32(m[g % 4],
				    m[(g + 2) % 4], m[(g + 3) % 4]);
		}
		s0 = vaddq_u32(s0, save0);
		s1 = vaddq_u32(s1, save1);
	}
	vst1q_u32(&h[0], s0);
	vst1q_u32(&h[4], s1);
}
#endif

sha256_blocks_fn
sha256_hw_blocks(void)
{
#ifdef HW_X86
	unsigned a, b, c, d;

	/* CPUID leaf 1: SSSE3 (ecx 9), SSE4.1 (ecx 19); leaf 7: SHA (ebx 29).
	 * (GCC 12's __builtin_cpu_supports does not know "sha".) */
	if (__get_cpuid(1, &a, &b, &c, &d) && (c & 1u << 9) &&
	    (c & 1u << 19) && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
	    (b & 1u << 29))
		return blocks_shani;
#endif
#if defined(HW_ARM) && defined(__APPLE__)
	/* Every arm64 Mac has the SHA2 instructions (not run here: the path
	 * is tested on Linux arm64 under qemu). */
	return blocks_armv8;
#elif defined(HW_ARM)
#ifndef HWCAP_SHA2
#define HWCAP_SHA2 (1 << 6)
#endif
	if (getauxval(AT_HWCAP) & HWCAP_SHA2)
		return blocks_armv8;
#endif
	return NULL;
}
