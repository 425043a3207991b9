/* CRC-32 with zlib's polynomial (the same values as zlib.crc32).
 *
 * Inputs of 64 bytes and more are folded 64 and 16 bytes at a time with carry-less multiplication (PCLMULQDQ,
 * x86-64 CPUs since 2010), after "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction"
 * (Gopal et al., Intel, 2009): the bit-reflected constants k1..k5 and the Barrett reduction of its appendix.
 * The last (length mod 16) bytes, short inputs, and CPUs without PCLMULQDQ go through the zlib the build links.
 * docs/decisions/0010-compiled-core.md has the measurements that chose this over zlib alone and over ISA-L.
 */
#include <limits.h>
#include <zlib.h>

#include "mq_format.h"

#define MQ_CRC_FOLD_BYTES_MIN 64  /* shorter inputs go to zlib: the folding's setup costs more than it saves */

static uint32_t crc32_zlib(uint32_t crc, const uint8_t *data, size_t length) {
    uLong value = crc;
    while (length > 0) {  /* zlib takes a uInt length */
        uInt step = length > UINT_MAX ? UINT_MAX : (uInt)length;
        value = crc32(value, data, step);
        data += step;
        length -= step;
    }
    return (uint32_t)value;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define MQ_HAVE_FOLD 1

/* The CRC register (not inverted) of `length` bytes, a multiple of 16 and at least 64, folded into `crc`. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_fold(uint32_t crc, const uint8_t *data,
                                                                     size_t length) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(data + 0x00));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(data + 0x10));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(data + 0x20));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(data + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    data += 64;
    length -= 64;
    while (length >= 64) {  /* four lanes of 16 bytes, each folded 512 bits forward */
        __m128i x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00), x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        __m128i x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00), x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(data + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(data + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(data + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(data + 0x30)));
        data += 64;
        length -= 64;
    }
    /* the four lanes into one, 128 bits forward each time */
    __m128i x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), x5);
    while (length >= 16) {
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)data)), x5);
        data += 16;
        length -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5k0, 0x00), x2);
    /* Barrett reduction to 32 bits */
    x2 = _mm_and_si128(x1, mask32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

static int have_fold = -1;  /* whether the CPU has PCLMULQDQ and SSE4.1: found on first use */
#endif

uint32_t mq_crc32(uint32_t crc, const uint8_t *data, size_t length) {
#ifdef MQ_HAVE_FOLD
    if (length >= MQ_CRC_FOLD_BYTES_MIN) {
        if (have_fold < 0) {
            __builtin_cpu_init();
            have_fold = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        }
        if (have_fold) {
            size_t folded = length & ~(size_t)15;
            crc = ~crc32_fold(~crc, data, folded);
            data += folded;
            length -= folded;
        }
    }
#endif
    return crc32_zlib(crc, data, length);
}

/* zlib's CRC alone, for the comparison in bench/crc32.py and the tests. */
uint32_t mq_crc32_zlib(uint32_t crc, const uint8_t *data, size_t length) { return crc32_zlib(crc, data, length); }
