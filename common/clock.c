/* Clocks and sleeps (see clock.h). */
#include "common/clock.h"

#include <errno.h>
#include <time.h>

static int64_t read_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t clock_mono_ns(void) {
    return read_ns(CLOCK_MONOTONIC);
}

int64_t clock_mono_us(void) {
    return read_ns(CLOCK_MONOTONIC) / 1000;
}

int64_t clock_mono_ms(void) {
    return read_ns(CLOCK_MONOTONIC) / 1000000;
}

double clock_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double clock_mono_msf(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int64_t clock_wall_ms(void) {
    return read_ns(CLOCK_REALTIME) / 1000000;
}

double clock_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int clock_sleep_ms(long ms) {
    if (ms <= 0) return 0;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    return nanosleep(&ts, NULL) == 0 ? 0 : -1;
}

int clock_sleep_us(long us) {
    if (us <= 0) return 0;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    return nanosleep(&ts, NULL) == 0 ? 0 : -1;
}

void clock_sleep_ms_full(long ms) {
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}
