/* A standalone driver for fuzz_scan.c where libFuzzer (clang) is missing: mutates the seed files given on
 * the command line (bit flips, interesting 32-bit values at record-field offsets, copied and zeroed runs,
 * truncation, header changes) for a number of seconds and calls LLVMFuzzerTestOneInput on each input.
 * Not coverage-guided; ASan/UBSan abort on the first bad read. Writes the failing input to crash-input.
 *   usage: driver SECONDS SEED_FILE...
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t length);

static uint64_t state = 0x9E3779B97F4A7C15u;
static uint64_t next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static uint8_t *read_file(const char *path, size_t *length) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc((size_t)size + 1);
    *length = fread(data, 1, (size_t)size, f);
    fclose(f);
    return data;
}

static const uint32_t INTERESTING[] = {0, 1, 7, 8, 91, 92, 0x7FFFFFFF, 0x80000000u, 0xFFFFFFFFu, 0xDAA320A7u,
                                       0xDAA320ABu, 0xCBD43194u, 0x10000, 0x7FFF, 0x8000, 0xFFFF, 20, 88};

static uint8_t *current;
static size_t current_length;

static void save_crash(void) {  /* the input being run when a sanitizer or a check stopped the process */
    if (current == NULL) return;
    FILE *f = fopen("crash-input", "wb");
    if (f) {
        fwrite(current, 1, current_length, f);
        fclose(f);
    }
    current = NULL;
}

static void on_signal(int number) {
    save_crash();
    signal(number, SIG_DFL);
    raise(number);
}

void __sanitizer_set_death_callback(void (*callback)(void));

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SECONDS SEED_FILE...\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    int seeds = argc - 2;
    uint8_t **seed = calloc((size_t)seeds, sizeof *seed);
    size_t *seed_length = calloc((size_t)seeds, sizeof *seed_length);
    for (int i = 0; i < seeds; i++) {
        seed[i] = read_file(argv[i + 2], &seed_length[i]);
        if (!seed[i]) {
            fprintf(stderr, "cannot read %s\n", argv[i + 2]);
            return 2;
        }
        LLVMFuzzerTestOneInput(seed[i], seed_length[i]);
    }
    __sanitizer_set_death_callback(save_crash);
    signal(SIGABRT, on_signal);
    signal(SIGSEGV, on_signal);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    state ^= (uint64_t)t0.tv_nsec;
    long runs = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= seconds) break;
        int s = (int)(next() % (uint64_t)seeds);
        size_t length = seed_length[s];
        uint8_t *data = malloc(length + 1);
        memcpy(data, seed[s], length);
        int mutations = 1 + (int)(next() % 8);
        for (int m = 0; m < mutations && length > 16; m++) {
            size_t at = 16 + (size_t)(next() % (length - 16));
            switch (next() % 7) {
            case 0: data[at] ^= (uint8_t)(1u << (next() % 8)); break;
            case 1: {  /* an interesting value at a 4-aligned position near a record field */
                uint32_t v = INTERESTING[next() % (sizeof INTERESTING / sizeof *INTERESTING)];
                if (at + 4 <= length) {
                    data[at] = (uint8_t)(v >> 24); data[at + 1] = (uint8_t)(v >> 16);
                    data[at + 2] = (uint8_t)(v >> 8); data[at + 3] = (uint8_t)v;
                }
                break;
            }
            case 2: {  /* copy a run from elsewhere (record headers inside bodies) */
                size_t from = 16 + (size_t)(next() % (length - 16));
                size_t n = (size_t)(next() % 256);
                if (from + n <= length && at + n <= length) memmove(data + at, data + from, n);
                break;
            }
            case 3: {  /* zero a run (torn pages) */
                size_t n = (size_t)(next() % 4096);
                if (at + n > length) n = length - at;
                memset(data + at, 0, n);
                break;
            }
            case 4: length = at; break;  /* truncate */
            case 5: data[8 + next() % 8] = (uint8_t)next(); break;  /* flags, records_max, start */
            default: data[at] = (uint8_t)next(); break;
            }
        }
        current = data;
        current_length = length;
        LLVMFuzzerTestOneInput(data, length);
        free(data);
        runs++;
    }
    current = NULL;
    for (int i = 0; i < seeds; i++) free(seed[i]);
    free(seed);
    free(seed_length);
    printf("fuzz-scan: %ld inputs from %d seeds in %.0f s, no error\n", runs, seeds, seconds);
    return 0;
}
