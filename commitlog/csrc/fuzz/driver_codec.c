/* A standalone driver for fuzz_codec.c where libFuzzer (clang) is missing: built with gcc's AddressSanitizer and
 * UndefinedBehaviorSanitizer, it runs every seed, then mutates random seeds (bit flips, random and boundary
 * values in length fields, cuts, inserted and deleted bytes, splices of two seeds) until the time is up.
 * Not coverage-guided: the seeds are real records, and the mutations aim at the fields the decoder reads.
 *
 *     driver_codec SECONDS SEED_DIR [RANDOM_SEED]     run for SECONDS (the input that crashed: ./crash-codec)
 *     driver_codec FILE...                            run the given inputs once (reproduce a crash)
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <sanitizer/common_interface_defs.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SEEDS_MAX 4096
#define INPUT_BYTES_MAX (1 << 16)

static uint8_t *seeds[SEEDS_MAX];
static size_t seed_sizes[SEEDS_MAX];
static size_t seed_count = 0;
static uint8_t current[INPUT_BYTES_MAX];
static size_t current_size = 0;

static void save_crash(void) {
    FILE *out = fopen("crash-codec", "wb");
    if (out != NULL) {
        fwrite(current, 1, current_size, out);
        fclose(out);
        fprintf(stderr, "driver_codec: the input is in ./crash-codec\n");
    }
}

static int read_file(const char *path, uint8_t **data, size_t *size) {
    FILE *in = fopen(path, "rb");
    if (in == NULL) return -1;
    uint8_t *buffer = malloc(INPUT_BYTES_MAX);
    size_t got = fread(buffer, 1, INPUT_BYTES_MAX, in);
    fclose(in);
    *data = buffer;
    *size = got;
    return 0;
}

static uint64_t state = 0x9E3779B97F4A7C15u;
static uint64_t next_random(void) {  /* xorshift64* */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Du;
}
static size_t below(size_t n) { return n ? (size_t)(next_random() % n) : 0; }

static const int32_t INTERESTING[] = {0, 1, -1, 2, 3, 8, 20, 88, 91, 92, 127, 128, 255, 256, 32767, 32768, 65535,
                                      65536, 0x7FFFFFFF, (int32_t)0x80000000};
/* where the length fields sit (after the flags byte, and for a large record after its 6-byte prefix too):
 * TOTALSIZE, BODYLENGTH, MAGICCODE, PHYSICALOFFSET, SYSFLAG */
static const size_t FIELD_AT[] = {0, 84, 4, 28, 36};
#define LARGE_FLAG 16
#define LARGE_PREFIX 6

static void put_i32(size_t at, int32_t v) {
    if (at + 4 <= current_size) {
        current[at] = (uint8_t)(v >> 24); current[at + 1] = (uint8_t)(v >> 16);
        current[at + 2] = (uint8_t)(v >> 8); current[at + 3] = (uint8_t)v;
    }
}

static int32_t get_i32(size_t at) {
    if (at + 4 > current_size) return 0;
    return (int32_t)(((uint32_t)current[at] << 24) | ((uint32_t)current[at + 1] << 16) |
                     ((uint32_t)current[at + 2] << 8) | current[at + 3]);
}

static void mutate(void) {
    int rounds = 1 + (int)below(6);
    uint8_t large = current_size ? (uint8_t)(current[0] & LARGE_FLAG) : 0;
    size_t record_at = 1 + (large ? LARGE_PREFIX : 0);
    for (int round = 0; round < rounds; round++) {
        switch (below(10)) {
        case 8:  /* BODYLENGTH a few bytes short of what TOTALSIZE leaves: the tail's fields at TOTALSIZE's end */
            put_i32(record_at + 84, (int32_t)(uint32_t)((int64_t)get_i32(record_at) - 88 - (int64_t)below(300)));
            break;
        case 9:  /* a large record's readable length (EXTRA) around its TOTALSIZE */
            if (large) {
                int64_t extra = (int64_t)get_i32(record_at) - (int64_t)(current_size - record_at) +
                                (int64_t)below(9000) - 4500;
                put_i32(1, (int32_t)(uint32_t)(extra < 0 ? 0 : extra));
            }
            break;
        case 0:  /* flip a bit */
            if (current_size) current[below(current_size)] ^= (uint8_t)(1u << below(8));
            break;
        case 1:  /* a random byte */
            if (current_size) current[below(current_size)] = (uint8_t)next_random();
            break;
        case 2: {  /* a boundary value in a field the decoder reads first */
            size_t at = record_at + FIELD_AT[below(sizeof FIELD_AT / sizeof FIELD_AT[0])];
            put_i32(at, INTERESTING[below(sizeof INTERESTING / sizeof INTERESTING[0])]);
            break;
        }
        case 3:  /* a boundary value anywhere (1 or 2 bytes: TOPICLENGTH, PROPERTIESLENGTH) */
            if (current_size >= 2) {
                size_t at = below(current_size - 1);
                int32_t v = INTERESTING[below(sizeof INTERESTING / sizeof INTERESTING[0])];
                current[at] = (uint8_t)(v >> 8);
                current[at + 1] = (uint8_t)v;
            }
            break;
        case 4:  /* cut the end */
            current_size = below(current_size + 1);
            break;
        case 5:  /* delete bytes */
            if (current_size > 2) {
                size_t at = below(current_size), n = 1 + below(8);
                if (at + n > current_size) n = current_size - at;
                memmove(current + at, current + at + n, current_size - at - n);
                current_size -= n;
            }
            break;
        case 6:  /* insert bytes */
            if (current_size + 8 < INPUT_BYTES_MAX) {
                size_t at = below(current_size + 1), n = 1 + below(8);
                memmove(current + at + n, current + at, current_size - at);
                for (size_t i = 0; i < n; i++) current[at + i] = (uint8_t)next_random();
                current_size += n;
            }
            break;
        default: {  /* splice: the tail of another seed */
            size_t other = below(seed_count);
            size_t at = below(current_size + 1), from = below(seed_sizes[other] + 1);
            size_t n = seed_sizes[other] - from;
            if (at + n > INPUT_BYTES_MAX) n = INPUT_BYTES_MAX - at;
            memcpy(current + at, seeds[other] + from, n);
            current_size = at + n;
            break;
        }
        }
    }
    if (current_size) current[0] = (uint8_t)((next_random() & ~LARGE_FLAG) | large);  /* flags; large stays */
}

int main(int argc, char **argv) {
    __sanitizer_set_death_callback(save_crash);
    char *end;
    double seconds = argc >= 3 ? strtod(argv[1], &end) : -1;
    if (argc < 3 || *end != '\0') {  /* reproduce: run the given files once */
        for (int i = 1; i < argc; i++) {
            uint8_t *data;
            size_t size;
            if (read_file(argv[i], &data, &size) < 0) { perror(argv[i]); return 2; }
            LLVMFuzzerTestOneInput(data, size);
            free(data);
        }
        return 0;
    }
    if (argc >= 4) state = strtoull(argv[3], NULL, 10) | 1;
    DIR *dir = opendir(argv[2]);
    if (dir == NULL) { perror(argv[2]); return 2; }
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL && seed_count < SEEDS_MAX) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[2], entry->d_name);
        struct stat info;
        if (stat(path, &info) != 0 || !S_ISREG(info.st_mode)) continue;
        if (read_file(path, &seeds[seed_count], &seed_sizes[seed_count]) == 0) seed_count++;
    }
    closedir(dir);
    if (seed_count == 0) { fprintf(stderr, "driver_codec: no seed in %s\n", argv[2]); return 2; }
    unsigned long long runs = 0;
    for (size_t i = 0; i < seed_count; i++, runs++) {
        memcpy(current, seeds[i], seed_sizes[i]);
        current_size = seed_sizes[i];
        LLVMFuzzerTestOneInput(current, current_size);
    }
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;; runs++) {
        if ((runs & 1023) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 >= seconds) break;
        }
        size_t pick = below(seed_count);
        memcpy(current, seeds[pick], seed_sizes[pick]);
        current_size = seed_sizes[pick];
        mutate();
        LLVMFuzzerTestOneInput(current, current_size);
    }
    printf("driver_codec: %llu inputs from %zu seeds, no error\n", runs, seed_count);
    return 0;
}
