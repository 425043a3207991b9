/* CRC-32 per call, in C (no interpreter in the loop): zlib's crc32 (the linked zlib), ISA-L's crc32_gzip_refl
 * (loaded from the `isal` Python package's extension module, the only ISA-L on a fresh machine), and mq_crc32
 * (commitlog/csrc/crc32.c). Built and run by bench/crc32.py; prints one JSON object.
 *
 *     crc32_compare ISAL_SO ROUNDS_SCALE
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <zlib.h>

uint32_t mq_crc32(uint32_t crc, const uint8_t *data, size_t length);

typedef uint32_t (*isal_crc_t)(uint32_t, const unsigned char *, uint64_t);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static const size_t SIZES[] = {100, 128, 1024, 1132, 4096, 65536, 1 << 20};

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *isal = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
    if (!isal) fprintf(stderr, "%s\n", dlerror());
    isal_crc_t isal_crc = isal ? (isal_crc_t)dlsym(isal, "crc32_gzip_refl") : NULL;
    double scale = atof(argv[2]);
    uint8_t *data = malloc(1 << 20);
    for (size_t i = 0; i < (1 << 20); i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t sink = 0;
    printf("{\"isal_loaded\": %s, \"rows\": [", isal_crc ? "true" : "false");
    for (size_t s = 0; s < sizeof SIZES / sizeof SIZES[0]; s++) {
        size_t size = SIZES[s];
        long rounds = (long)(scale * 2e8 / (size + 64));
        if (rounds < 10) rounds = 10;
        if (isal_crc && isal_crc(0, data, size) != (uint32_t)crc32(0, data, size)) return 3;
        if (mq_crc32(0, data, size) != (uint32_t)crc32(0, data, size)) return 4;
        double best[3] = {1e9, 1e9, 1e9};
        for (int repeat = 0; repeat < 3; repeat++) {
            double t = now();
            for (long r = 0; r < rounds; r++) sink += (uint32_t)crc32(sink & 1, data, size);
            double zl = now() - t;
            t = now();
            for (long r = 0; r < rounds; r++) sink += mq_crc32(sink & 1, data, size);
            double mq = now() - t;
            double is = 0;
            if (isal_crc) {
                t = now();
                for (long r = 0; r < rounds; r++) sink += isal_crc(sink & 1, data, size);
                is = now() - t;
            }
            if (zl < best[0]) best[0] = zl;
            if (mq < best[1]) best[1] = mq;
            if (is < best[2]) best[2] = is;
        }
        printf("%s{\"bytes\": %zu, \"zlib_ns\": %.1f, \"mq_crc32_ns\": %.1f, \"isal_ns\": %.1f}", s ? ", " : "", size,
               best[0] / rounds * 1e9, best[1] / rounds * 1e9, isal_crc ? best[2] / rounds * 1e9 : -1.0);
    }
    printf("], \"sink\": %u}\n", sink);
    return 0;
}
