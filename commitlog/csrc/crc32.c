/* CRC-32 with zlib's polynomial (the same values as zlib.crc32), by one of three paths chosen at run time.
 *
 *   vpclmul  AVX-512 VPCLMULQDQ: 64 bytes (4 x 128-bit lanes) per carry-less multiply, 256 bytes a loop step
 *            (x86-64 CPUs with AVX-512F/VL and VPCLMULQDQ: Ice Lake, Zen 4 and later)
 *   pclmul   PCLMULQDQ on 128-bit registers, 64 bytes a loop step (x86-64 CPUs since 2010)
 *   zlib     the zlib the build links (any CPU)
 *
 * Both folding paths follow "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Gopal
 * et al., Intel, 2009): the bit-reflected constants k = (x^(D+32) mod P)' << 1 and (x^(D-32) mod P)' << 1 fold a
 * 128-bit lane D bits forward, and its appendix's Barrett reduction ends the CRC. An input of n >= 16 bytes with
 * r = n mod 16 != 0 is taken as if it began with 16 - r zero bytes: its first r bytes (with the CRC register
 * XORed into its first four) are shifted into the top of one 128-bit block, and every later load is a whole
 * 16 bytes inside the input. So no byte outside [data, data + n) is read and no input goes through zlib for its
 * last (n mod 16) bytes. Inputs under 16 bytes go through zlib on every path.
 *
 * The path is the fastest the CPU has (cpuid, through __builtin_cpu_supports); each folding function is compiled
 * with __attribute__((target(...))), so the build needs no -m flag and runs on a CPU without those instructions.
 * mq_crc32_use() forces a path (the tests compare each with zlib; bench/crc32.py times each).
 * docs/decisions/0023-vpclmul-crc-and-walk.md has the measurements that chose this.
 */
#include <limits.h>
#include <zlib.h>

#include "mq_format.h"

#define MQ_CRC_FOLD_BYTES_MIN 16  /* shorter inputs go to zlib: no whole 128-bit block to fold */

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

static const char *const PATH_NAMES[MQ_CRC_PATHS] = {"zlib", "pclmul", "vpclmul"};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define MQ_HAVE_FOLD 1
#define FOLD_TARGET "pclmul,ssse3,sse4.1"
#define WIDE_TARGET "pclmul,ssse3,sse4.1,avx2,avx512f,avx512vl,vpclmulqdq"
/* Fewer whole bytes fold on 128-bit registers. From 64 bytes the 512-bit registers take longer for one call
 * (64 bytes: 15.5 against 10.8 ns) but twice as many calls overlap (5.0 against 8.6 ns; 100 bytes: 7.2 against
 * 11.3), as ISA-L's do: a scan's and a batch's CRCs do not wait on each other. */
#define WIDE_BYTES_MIN 64

/* The constant pair that folds a 128-bit lane `bits` forward: (x^(bits-32) mod P)' << 1 in the high
 * quadword, (x^(bits+32) mod P)' << 1 in the low one (computed by docs/decisions/0023's script). */
#define K128_LO 0x01751997d0LL
#define K128_HI 0x00ccaa009eLL
#define K256_LO 0x00f1da05aaLL
#define K256_HI 0x015a546366LL
#define K384_LO 0x003db1ecdcLL
#define K384_HI 0x0174359406LL
#define K512_LO 0x0154442bd4LL
#define K512_HI 0x01c6e41596LL
#define K1024_LO 0x01e88ef372LL
#define K1024_HI 0x014a7fe880LL
#define K1536_LO 0x01821d8bc0LL
#define K1536_HI 0x012e958ac4LL
#define K2048_LO 0x011542778aLL
#define K2048_HI 0x01322d1430LL
#define K5 0x0163cd6124LL        /* (x^64 mod P)' << 1: 64 bits to 32 */
#define POLY_MU 0x01f7011641LL   /* Barrett's mu' (high) and P' (low) */
#define POLY_P 0x01db710641LL

/* pshufb masks: 16 bytes from SHIFT_TABLE + 16 - s shift a block s bytes up (towards the end of the stream),
 * from SHIFT_TABLE + 16 + s s bytes down; the bytes shifted in are zero. */
static const uint8_t SHIFT_TABLE[48] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
};

__attribute__((target(FOLD_TARGET))) static inline __m128i fold128(__m128i x, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* What to XOR into the first whole block at data + (length mod 16), for an input of at least 16 bytes whose
 * register (not inverted) is `crc`: the register itself when the length is a multiple of 16, else the first
 * (length mod 16) bytes as a zero-led block folded 128 bits forward (see the top of this file). */
__attribute__((target(FOLD_TARGET))) static inline __m128i fold_head(uint32_t crc, const uint8_t *data,
                                                                    size_t rest) {
    __m128i crc_block = _mm_cvtsi32_si128((int)crc);
    if (rest == 0) return crc_block;
    __m128i first = _mm_xor_si128(_mm_loadu_si128((const __m128i *)data), crc_block);
    __m128i up = _mm_loadu_si128((const __m128i *)(SHIFT_TABLE + 16 - (16 - rest)));
    __m128i down = _mm_loadu_si128((const __m128i *)(SHIFT_TABLE + 16 + rest));
    /* the register's bytes past the first `rest` fall into the next block, shifted down by `rest` */
    return _mm_xor_si128(fold128(_mm_shuffle_epi8(first, up), _mm_set_epi64x(K128_HI, K128_LO)),
                         _mm_shuffle_epi8(crc_block, down));
}

/* 128 bits to the 32-bit register: Gopal et al.'s last steps. */
__attribute__((target(FOLD_TARGET))) static inline uint32_t fold_reduce(__m128i x1) {
    const __m128i k128 = _mm_set_epi64x(K128_HI, K128_LO);
    const __m128i k5 = _mm_set_epi64x(0, K5);
    const __m128i poly = _mm_set_epi64x(POLY_MU, POLY_P);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x2 = _mm_clmulepi64_si128(x1, k128, 0x10);  /* 128 bits to 64 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5, 0x00), x2);
    x2 = _mm_and_si128(x1, mask32);  /* Barrett reduction to 32 bits */
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* Fold the 16-byte blocks [data, data + length) (length a multiple of 16, at least 16) with `head` XORed into
 * the first, and finish: four 128-bit lanes 512 bits forward while 64 bytes are left, then one. Inlined, so
 * that the vpclmul path runs it with VEX-encoded instructions. */
__attribute__((target(FOLD_TARGET), always_inline)) static inline uint32_t fold_blocks(__m128i head,
                                                                                     const uint8_t *data,
                                                                                     size_t length) {
    const __m128i k512 = _mm_set_epi64x(K512_HI, K512_LO);
    const __m128i k128 = _mm_set_epi64x(K128_HI, K128_LO);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)data), head);
    data += 16;
    length -= 16;
    if (length >= 48) {
        __m128i x2 = _mm_loadu_si128((const __m128i *)(data + 0x00));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(data + 0x10));
        __m128i x4 = _mm_loadu_si128((const __m128i *)(data + 0x20));
        data += 48;
        length -= 48;
        while (length >= 64) {
            x1 = _mm_xor_si128(fold128(x1, k512), _mm_loadu_si128((const __m128i *)(data + 0x00)));
            x2 = _mm_xor_si128(fold128(x2, k512), _mm_loadu_si128((const __m128i *)(data + 0x10)));
            x3 = _mm_xor_si128(fold128(x3, k512), _mm_loadu_si128((const __m128i *)(data + 0x20)));
            x4 = _mm_xor_si128(fold128(x4, k512), _mm_loadu_si128((const __m128i *)(data + 0x30)));
            data += 64;
            length -= 64;
        }
        /* the four lanes into one: each folded as far forward as the lanes after it are long */
        x1 = _mm_xor_si128(_mm_xor_si128(fold128(x1, _mm_set_epi64x(K384_HI, K384_LO)),
                                         fold128(x2, _mm_set_epi64x(K256_HI, K256_LO))),
                           _mm_xor_si128(fold128(x3, k128), x4));
    }
    while (length >= 16) {
        x1 = _mm_xor_si128(fold128(x1, k128), _mm_loadu_si128((const __m128i *)data));
        data += 16;
        length -= 16;
    }
    return fold_reduce(x1);
}

/* The CRC register (not inverted) of `length` >= 16 bytes folded into `crc`, on 128-bit registers. */
__attribute__((target(FOLD_TARGET))) static uint32_t crc32_pclmul_register(uint32_t crc, const uint8_t *data,
                                                                          size_t length) {
    size_t rest = length & 15;
    return fold_blocks(fold_head(crc, data, rest), data + rest, length - rest);
}

__attribute__((target(WIDE_TARGET))) static inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11),
                                     next, 0x96);  /* a ^ b ^ c */
}

__attribute__((target(WIDE_TARGET))) static inline __m512i broadcast_pair(long long high, long long low) {
    return _mm512_set_epi64(high, low, high, low, high, low, high, low);
}

/* The same on 512-bit registers: four of them 2048 bits forward while 256 bytes are left, then one 512 bits
 * forward while 64 are, its four lanes into one, and the last 16-byte blocks on 128-bit registers. */
__attribute__((target(WIDE_TARGET))) static uint32_t crc32_vpclmul_register(uint32_t crc, const uint8_t *data,
                                                                           size_t length) {
    size_t rest = length & 15;
    __m128i head = fold_head(crc, data, rest);
    data += rest;
    length -= rest;
    if (length < WIDE_BYTES_MIN) return fold_blocks(head, data, length);
    const __m512i k512 = broadcast_pair(K512_HI, K512_LO);
    __m512i x1 = _mm512_xor_si512(_mm512_loadu_si512((const void *)data), _mm512_castsi128_si512(head));
    data += 64;
    length -= 64;
    if (length >= 192) {
        const __m512i k2048 = broadcast_pair(K2048_HI, K2048_LO);
        __m512i x2 = _mm512_loadu_si512((const void *)(data + 0x00));
        __m512i x3 = _mm512_loadu_si512((const void *)(data + 0x40));
        __m512i x4 = _mm512_loadu_si512((const void *)(data + 0x80));
        data += 192;
        length -= 192;
        while (length >= 256) {
            x1 = fold512(x1, k2048, _mm512_loadu_si512((const void *)(data + 0x00)));
            x2 = fold512(x2, k2048, _mm512_loadu_si512((const void *)(data + 0x40)));
            x3 = fold512(x3, k2048, _mm512_loadu_si512((const void *)(data + 0x80)));
            x4 = fold512(x4, k2048, _mm512_loadu_si512((const void *)(data + 0xC0)));
            data += 256;
            length -= 256;
        }
        x1 = fold512(x1, broadcast_pair(K1536_HI, K1536_LO),
                     fold512(x2, broadcast_pair(K1024_HI, K1024_LO), fold512(x3, k512, x4)));
    }
    while (length >= 64) {
        x1 = fold512(x1, k512, _mm512_loadu_si512((const void *)data));
        data += 64;
        length -= 64;
    }
    /* four lanes into one: lane i folded (3 - i) x 128 bits forward, the last lane kept as it is */
    const __m512i lanes = _mm512_set_epi64(0, 0, K128_HI, K128_LO, K256_HI, K256_LO, K384_HI, K384_LO);
    __m512i folded = _mm512_xor_si512(_mm512_clmulepi64_epi128(x1, lanes, 0x00),
                                      _mm512_clmulepi64_epi128(x1, lanes, 0x11));
    folded = _mm512_mask_mov_epi64(folded, 0xC0, x1);
    __m256i half = _mm256_xor_si256(_mm512_castsi512_si256(folded), _mm512_extracti64x4_epi64(folded, 1));
    __m128i x = _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
    if (length == 0) return fold_reduce(x);
    /* 16 to 48 bytes left: x is one block ahead of them */
    const __m128i k128 = _mm_set_epi64x(K128_HI, K128_LO);
    while (length >= 16) {
        x = _mm_xor_si128(fold128(x, k128), _mm_loadu_si128((const __m128i *)data));
        data += 16;
        length -= 16;
    }
    return fold_reduce(x);
}

/* 1 when the CPU has AVX: then the pclmul path, whose instructions are SSE's (no VEX prefix), first clears the
 * upper halves of the vector registers. Code that leaves them dirty (ISA-L's AVX-512 CRC, which the `isal`
 * package runs in the same process, ends without vzeroupper) otherwise makes every SSE instruction merge with
 * them: the pclmul path took 120 against 62 us for 1 MiB after ISA-L's CRC here. */
static int have_avx = -1;

__attribute__((target("avx"))) static void clear_upper_halves(void) { _mm256_zeroupper(); }

static uint32_t crc32_pclmul(uint32_t crc, const uint8_t *data, size_t length) {
    if (length < MQ_CRC_FOLD_BYTES_MIN) return crc32_zlib(crc, data, length);
    int avx = __atomic_load_n(&have_avx, __ATOMIC_RELAXED);
    if (avx < 0) {
        __builtin_cpu_init();
        avx = __builtin_cpu_supports("avx") != 0;
        __atomic_store_n(&have_avx, avx, __ATOMIC_RELAXED);
    }
    if (avx) clear_upper_halves();
    return ~crc32_pclmul_register(~crc, data, length);
}

static uint32_t crc32_vpclmul(uint32_t crc, const uint8_t *data, size_t length) {
    if (length < MQ_CRC_FOLD_BYTES_MIN) return crc32_zlib(crc, data, length);
    return ~crc32_vpclmul_register(~crc, data, length);
}

static int path_supported(int path) {
    __builtin_cpu_init();
    int pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("ssse3") &&
                 __builtin_cpu_supports("sse4.1");
    if (path == MQ_CRC_PATH_PCLMUL) return pclmul;
    if (path == MQ_CRC_PATH_VPCLMUL)
        return pclmul && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
    return path == MQ_CRC_PATH_ZLIB;
}
#else
static int path_supported(int path) { return path == MQ_CRC_PATH_ZLIB; }
#endif

uint32_t mq_crc32_with(int path, uint32_t crc, const uint8_t *data, size_t length) {
#ifdef MQ_HAVE_FOLD
    if (path == MQ_CRC_PATH_VPCLMUL) return crc32_vpclmul(crc, data, length);
    if (path == MQ_CRC_PATH_PCLMUL) return crc32_pclmul(crc, data, length);
#endif
    return crc32_zlib(crc, data, length);
}

/* The path mq_crc32 takes: -1 until the first call (or mq_crc32_use) finds the CPU's best. Written once with
 * the same value by whichever thread comes first, or by mq_crc32_use (tests and benchmarks). */
static int chosen_path = -1;

static int best_path(void) {
    for (int path = MQ_CRC_PATHS - 1; path > MQ_CRC_PATH_ZLIB; path--)
        if (path_supported(path)) return path;
    return MQ_CRC_PATH_ZLIB;
}

int mq_crc32_path(void) {
    int path = __atomic_load_n(&chosen_path, __ATOMIC_RELAXED);
    if (path < 0) {
        path = best_path();
        __atomic_store_n(&chosen_path, path, __ATOMIC_RELAXED);
    }
    return path;
}

int mq_crc32_path_supported(int path) { return path >= 0 && path < MQ_CRC_PATHS && path_supported(path); }

const char *mq_crc32_path_name(int path) { return path >= 0 && path < MQ_CRC_PATHS ? PATH_NAMES[path] : NULL; }

int mq_crc32_use(int path) {
    if (path < 0) path = best_path();
    if (!mq_crc32_path_supported(path)) return -1;
    __atomic_store_n(&chosen_path, path, __ATOMIC_RELAXED);
    return 0;
}

uint32_t mq_crc32(uint32_t crc, const uint8_t *data, size_t length) {
    return mq_crc32_with(mq_crc32_path(), crc, data, length);
}

mq_crc32_fn mq_crc32_function(void) {
    int path = mq_crc32_path();
#ifdef MQ_HAVE_FOLD
    if (path == MQ_CRC_PATH_VPCLMUL) return crc32_vpclmul;
    if (path == MQ_CRC_PATH_PCLMUL) return crc32_pclmul;
#endif
    (void)path;
    return crc32_zlib;
}

/* zlib's CRC alone, for the comparison in bench/crc32.py and the tests. */
uint32_t mq_crc32_zlib(uint32_t crc, const uint8_t *data, size_t length) { return crc32_zlib(crc, data, length); }
