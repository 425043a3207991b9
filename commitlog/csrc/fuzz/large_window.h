/* A large window of zero bytes for the fuzz targets, so that a few KiB of fuzz input can stand for a record or a
 * segment of up to 4 GiB and more: the lengths and positions past 2^31 and 2^32 that real segments allow
 * (segment_size_bytes goes to 1 TiB) and that a 64 KiB input buffer never reaches.
 *
 * One reservation of GUARD + WINDOW_MAX + GUARD bytes is made once, all PROT_NONE. large_window_open(length)
 * maps the last `length` bytes before the upper guard as readable and writable zero pages (anonymous,
 * MAP_NORESERVE: only the pages touched cost memory; a read of an untouched page maps the shared zero page),
 * and returns a pointer to them: their end is page-aligned and followed by the guard, so a read past the
 * end faults at once, and a read more than a page before the start (an offset gone negative, 2^31 or 2^32
 * wrong) lands in the lower guard. The fuzz target copies its input's pieces into the window, runs the code
 * under test, then calls large_window_close(), which maps the window back to PROT_NONE (dropping its pages).
 * A fault in a guard ends the process with SIGSEGV, which libFuzzer and the gcc drivers report as a crash.
 */
#ifndef MQ_FUZZ_LARGE_WINDOW_H
#define MQ_FUZZ_LARGE_WINDOW_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define LARGE_WINDOW_GUARD_BYTES ((int64_t)8 << 30)               /* more than any 32-bit mistake */
#define LARGE_WINDOW_MAX_BYTES (((int64_t)4 << 30) + ((int64_t)1 << 22))  /* 4 GiB + 4 MiB */

static uint8_t *large_window_reserved = NULL;
static uint8_t *large_window_start = NULL;
static size_t large_window_length = 0;

static uint8_t *large_window_end(void) {
    return large_window_reserved + LARGE_WINDOW_GUARD_BYTES + LARGE_WINDOW_MAX_BYTES;
}

/* `length` (<= LARGE_WINDOW_MAX_BYTES) zero bytes ending at a page boundary before a guard; aborts if the
 * address space cannot be had (the fuzz run is then broken, not the code under test). */
static uint8_t *large_window_open(int64_t length) {
    if (length < 0 || length > LARGE_WINDOW_MAX_BYTES) abort();
    if (large_window_reserved == NULL) {
        size_t total = (size_t)(2 * LARGE_WINDOW_GUARD_BYTES + LARGE_WINDOW_MAX_BYTES);
        void *at = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (at == MAP_FAILED) {
            perror("large_window: reserving the address space");
            abort();
        }
        large_window_reserved = at;
    }
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uint8_t *end = large_window_end();
    uint8_t *start = (uint8_t *)(((uintptr_t)(end - length)) & ~(page - 1));
    large_window_length = (size_t)(end - start);
    if (large_window_length == 0) large_window_length = page;  /* an empty window: one page, never read */
    large_window_start = end - large_window_length;
    if (mmap(large_window_start, large_window_length, PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
        perror("large_window: mapping the window");
        abort();
    }
    return end - length;
}

static void large_window_close(void) {
    if (large_window_start == NULL) return;
    if (mmap(large_window_start, large_window_length, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS |
             MAP_NORESERVE, -1, 0) == MAP_FAILED)
        abort();
    large_window_start = NULL;
}

#endif
