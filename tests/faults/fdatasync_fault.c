/* A test double of the disk's durability calls: preloaded (LD_PRELOAD) into a process whose fdatasync and fsync
 * of files whose path contains a pattern must fail, as a disk that refuses a writeback makes them fail.
 *
 * Linux reports a writeback error once per open file: the failing call returns -1 with EIO, and the next one on the
 * same file returns 0 although the pages it could not write may be gone. This double does the same: it fails
 * `count` calls on matching files (after letting `skip` of them through) and passes every other call to libc.
 *
 * Armed by the process itself, through ctypes (`mqfault_arm(pattern, skip, count, errno)`), or at start by the
 * environment (MQFAULT_PATTERN, MQFAULT_SKIP, MQFAULT_COUNT, MQFAULT_ERRNO): a child inherits the environment, so a
 * store's dispatch process can be armed where its parent is not. `mqfault_failed()` says how many calls it failed.
 *
 * It can also hold one call: `mqfault_hold(pattern)` makes the next fdatasync of a matching file wait, before it
 * reaches libc, until `mqfault_release()`; `mqfault_held()` says whether a call waits now, and
 * `mqfault_synced_path()` which file the held call's descriptor named when it went on to libc (a test closes the
 * file's descriptor meanwhile and opens another, to see whether the sync lands on the file it was meant for).
 * Built by tests/faults/conftest.py with the machine's C compiler; nothing of it is part of mqstore.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATTERN_LENGTH_MAX 511

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char pattern[PATTERN_LENGTH_MAX + 1];
static long skip_left, fail_left, failed_total;
static int fail_errno = EIO;
static pthread_cond_t hold_changed = PTHREAD_COND_INITIALIZER;
static char hold_pattern[PATTERN_LENGTH_MAX + 1];
static int holding, released;
static char synced_path[4096];

int mqfault_arm(const char *wanted, long skip, long count, int error) {
    pthread_mutex_lock(&lock);
    snprintf(pattern, sizeof pattern, "%s", wanted == NULL ? "" : wanted);
    skip_left = skip;
    fail_left = count;
    fail_errno = error ? error : EIO;
    pthread_mutex_unlock(&lock);
    return 0;
}

long mqfault_failed(void) {
    pthread_mutex_lock(&lock);
    long total = failed_total;
    pthread_mutex_unlock(&lock);
    return total;
}

__attribute__((constructor)) static void arm_from_environment(void) {
    const char *wanted = getenv("MQFAULT_PATTERN");
    if (wanted == NULL || !*wanted) return;
    const char *skip = getenv("MQFAULT_SKIP"), *count = getenv("MQFAULT_COUNT"), *error = getenv("MQFAULT_ERRNO");
    mqfault_arm(wanted, skip ? atol(skip) : 0, count ? atol(count) : 1, error ? atoi(error) : EIO);
}

/* The path `fd` names now into `path` (size 4096): 1, or 0 when it names none. */
static int path_of(int fd, char *path) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, path, 4095);
    if (length <= 0) return 0;
    path[length] = 0;
    return 1;
}

int mqfault_hold(const char *wanted) {
    pthread_mutex_lock(&lock);
    snprintf(hold_pattern, sizeof hold_pattern, "%s", wanted == NULL ? "" : wanted);
    holding = released = 0;
    synced_path[0] = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}

int mqfault_held(void) {
    pthread_mutex_lock(&lock);
    int value = holding;
    pthread_mutex_unlock(&lock);
    return value;
}

void mqfault_release(void) {
    pthread_mutex_lock(&lock);
    released = 1;
    pthread_cond_broadcast(&hold_changed);
    pthread_mutex_unlock(&lock);
}

const char *mqfault_synced_path(void) { return synced_path; }

/* A call on a file matching the hold pattern waits here for mqfault_release(), then notes what `fd` names. */
static void hold(int fd) {
    char path[4096];
    pthread_mutex_lock(&lock);
    if (hold_pattern[0] && path_of(fd, path) && strstr(path, hold_pattern) != NULL) {
        hold_pattern[0] = 0;  /* one call */
        holding = 1;
        while (!released) pthread_cond_wait(&hold_changed, &lock);
        holding = 0;
        if (!path_of(fd, synced_path)) snprintf(synced_path, sizeof synced_path, "(no file)");
    }
    pthread_mutex_unlock(&lock);
}

/* 1 when this call on `fd` is to fail (errno set then), else 0. */
static int fails(int fd) {
    char path[4096];
    pthread_mutex_lock(&lock);
    int fail = 0;
    if (fail_left > 0 && pattern[0]) {
        if (path_of(fd, path)) {
            if (strstr(path, pattern) != NULL) {
                if (skip_left > 0) {
                    skip_left--;
                } else {
                    fail_left--;
                    failed_total++;
                    fail = 1;
                }
            }
        }
    }
    int error = fail_errno;
    pthread_mutex_unlock(&lock);
    if (fail) errno = error;
    return fail;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    hold(fd);
    return fails(fd) ? -1 : real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return fails(fd) ? -1 : real(fd);
}
