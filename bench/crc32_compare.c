/* CRC-32 per call, in C (no interpreter in the loop): zlib's crc32 (the linked zlib), ISA-L's crc32_gzip_refl
 * (loaded from the `isal` Python package's extension module, the only ISA-L on a fresh machine), and each path of
 * mq_crc32 (commitlog/csrc/crc32.c) this CPU can run. Built and run by bench/crc32.py; prints one JSON object.
 *
 *     crc32_compare ISAL_SO ROUNDS_SCALE
 *
 * "chained": each call's initial value depends on the previous call's result (the latency of one CRC, as a
 * record CRC checked right before the next record is parsed); "independent": calls on the same input whose
 * results only add up (the throughput when calls overlap in the CPU).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <zlib.h>

#include "mq_format.h"

typedef uint32_t (*isal_crc_t)(uint32_t, const unsigned char *, uint64_t);

/* The process's CPU time, not the wall clock: on a shared machine the time other processes hold the core is
 * left out (what they do to the caches is not). */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* 100 and 1,024: bodies; 222 and 1,120: what the record CRC covers of bench/native_scan.py's 100 B messages
 * (242-byte records) and of bench/recovery.py's 1 KB ones (1,140-byte records). */
static const size_t SIZES[] = {16, 64, 100, 222, 1024, 1120, 4096, 65536, 1 << 20};

enum { F_ZLIB, F_ISAL, F_PATH0 };  /* then one per mq_crc32 path, in MQ_CRC_PATH_* order */
#define FUNCTIONS (F_PATH0 + MQ_CRC_PATHS)
_Static_assert(MQ_CRC_PATHS == 3, "NAMES below lists three paths");

static isal_crc_t isal_crc;

static uint32_t call(int function, uint32_t crc, const uint8_t *data, size_t size) {
    if (function == F_ZLIB) return (uint32_t)crc32(crc, data, (uInt)size);
    if (function == F_ISAL) return isal_crc(crc, data, size);
    return mq_crc32_with(function - F_PATH0, crc, data, size);
}

static int available(int function) {
    if (function == F_ISAL) return isal_crc != NULL;
    if (function >= F_PATH0) return mq_crc32_path_supported(function - F_PATH0);
    return 1;
}

static const char *const NAMES[FUNCTIONS] = {"zlib", "isal", "mq_zlib", "mq_pclmul", "mq_vpclmul"};

static const char *name(int function) { return NAMES[function]; }

/* Best of three: ns per call, chained or independent. */
static double time_calls(int function, const uint8_t *data, size_t size, long rounds, int chained,
                         uint32_t *sink) {
    double best = 1e30;
    for (int repeat = 0; repeat < 3; repeat++) {
        uint32_t value = *sink;
        double t = now();
        if (chained)
            for (long r = 0; r < rounds; r++) value = call(function, value & 1, data, size);
        else
            for (long r = 0; r < rounds; r++) value += call(function, (uint32_t)r & 1, data, size);
        double elapsed = now() - t;
        *sink += value;
        if (elapsed < best) best = elapsed;
    }
    return best / rounds * 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *isal = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
    if (!isal) fprintf(stderr, "%s\n", dlerror());
    isal_crc = isal ? (isal_crc_t)dlsym(isal, "crc32_gzip_refl") : NULL;
    double scale = atof(argv[2]);
    uint8_t *data = malloc(1 << 20);
    for (size_t i = 0; i < (1 << 20); i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t sink = 0;
    printf("{\"chosen\": \"%s\", \"functions\": [", mq_crc32_path_name(mq_crc32_path()));
    for (int f = 0, first = 1; f < FUNCTIONS; f++)
        if (available(f)) printf("%s\"%s\"", first ? "" : ", ", name(f)), first = 0;
    printf("], \"rows\": [");
    for (size_t s = 0; s < sizeof SIZES / sizeof SIZES[0]; s++) {
        size_t size = SIZES[s];
        long rounds = (long)(scale * 2e8 / (size + 64));
        if (rounds < 10) rounds = 10;
        printf("%s{\"bytes\": %zu", s ? ", " : "", size);
        for (int f = 0; f < FUNCTIONS; f++) {
            if (!available(f)) continue;
            if (call(f, 12345, data, size) != (uint32_t)crc32(12345, data, (uInt)size)) return 3;
            printf(", \"%s_ns\": %.1f, \"%s_independent_ns\": %.1f", name(f),
                   time_calls(f, data, size, rounds, 1, &sink), name(f), time_calls(f, data, size, rounds, 0, &sink));
        }
        printf("}");
    }
    printf("], \"sink\": %u}\n", sink);
    return 0;
}
