/*
 * LD_PRELOAD shim that shifts the wall clock of one process (like
 * libfaketime): CLOCK_REALTIME readings (clock_gettime, gettimeofday, time)
 * get MONGO_LEASE_CLOCK_OFFSET_SECS added. CLOCK_MONOTONIC and every other
 * clock are left alone. Built by tests/faults at run time with the system C
 * compiler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long offset_secs(void) {
    static int loaded = 0;
    static long offset = 0;
    if (!loaded) {
        const char *s = getenv("MONGO_LEASE_CLOCK_OFFSET_SECS");
        offset = s ? strtol(s, NULL, 10) : 0;
        loaded = 1;
    }
    return offset;
}

static int is_wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = NULL;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && ts && is_wall(id)) ts->tv_sec += offset_secs();
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *) = NULL;
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int rc = real(tv, tz);
    if (rc == 0 && tv) tv->tv_sec += offset_secs();
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
