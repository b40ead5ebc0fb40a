/*
 * LD_PRELOAD shim that shifts the wall clock of one process (like
 * libfaketime): CLOCK_REALTIME readings (clock_gettime, gettimeofday, time)
 * get an offset added, from either or both of:
 *
 * - MONGO_LEASE_CLOCK_OFFSET_SECS: whole seconds, read once;
 * - MONGO_LEASE_CLOCK_OFFSET_FILE: the path of a file holding milliseconds
 *   (decimal text, may be negative), read again at most once a millisecond
 *   of CLOCK_MONOTONIC, so that the clock steps while the process runs.
 *   Replace the file atomically (write another, then rename it over): a
 *   reading never sees half a write. Until the file can be read, the offset
 *   is 0; a file that cannot be read later keeps the last offset.
 *
 * CLOCK_MONOTONIC and every other clock are left alone. Built by the tests
 * at run time with the system C compiler (tests/common/clock.rs).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime(void) {
    static clock_gettime_fn real = NULL;
    clock_gettime_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    return f;
}

static long offset_secs(void) {
    static int loaded = 0;
    static long offset = 0;
    if (!__atomic_load_n(&loaded, __ATOMIC_ACQUIRE)) {
        const char *s = getenv("MONGO_LEASE_CLOCK_OFFSET_SECS");
        __atomic_store_n(&offset, s ? strtol(s, NULL, 10) : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&offset, __ATOMIC_RELAXED);
}

/* The path of the offset file, or NULL (looked up once). */
static const char *offset_file(void) {
    static int looked = 0;
    static const char *path = NULL;
    if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
        const char *p = getenv("MONGO_LEASE_CLOCK_OFFSET_FILE");
        __atomic_store_n(&path, (p && *p) ? p : NULL, __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&path, __ATOMIC_RELAXED);
}

/* The offset file's milliseconds, read again when a millisecond has
 * passed since the last reading (by one thread at a time; the others use
 * the last value meanwhile). */
static long long offset_file_ms(void) {
    static long long offset_ms = 0;
    static long long next_read_ns = 0;
    const char *path = offset_file();
    if (!path) return 0;
    struct timespec mono;
    if (real_clock_gettime()(CLOCK_MONOTONIC, &mono) != 0) {
        return __atomic_load_n(&offset_ms, __ATOMIC_ACQUIRE);
    }
    long long now_ns = (long long)mono.tv_sec * 1000000000LL + mono.tv_nsec;
    long long next = __atomic_load_n(&next_read_ns, __ATOMIC_ACQUIRE);
    if (now_ns >= next &&
        __atomic_compare_exchange_n(&next_read_ns, &next, now_ns + 1000000LL, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char buf[64];
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (n > 0) {
                buf[n] = 0;
                char *end = NULL;
                long long ms = strtoll(buf, &end, 10);
                if (end != buf) __atomic_store_n(&offset_ms, ms, __ATOMIC_RELEASE);
            }
        }
    }
    return __atomic_load_n(&offset_ms, __ATOMIC_ACQUIRE);
}

/* The whole offset in nanoseconds. */
static long long offset_ns(void) {
    return (long long)offset_secs() * 1000000000LL + offset_file_ms() * 1000000LL;
}

static int is_wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real_clock_gettime()(id, ts);
    if (rc == 0 && ts && is_wall(id)) {
        long long ns = (long long)ts->tv_nsec + offset_ns();
        long long secs = ns / 1000000000LL;
        ns %= 1000000000LL;
        if (ns < 0) {
            ns += 1000000000LL;
            secs -= 1;
        }
        ts->tv_sec += secs;
        ts->tv_nsec = ns;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *) = NULL;
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int rc = real(tv, tz);
    if (rc == 0 && tv) {
        long long us = (long long)tv->tv_usec + offset_ns() / 1000LL;
        long long secs = us / 1000000LL;
        us %= 1000000LL;
        if (us < 0) {
            us += 1000000LL;
            secs -= 1;
        }
        tv->tv_sec += secs;
        tv->tv_usec = us;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
