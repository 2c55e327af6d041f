/* Clocks: the one place that reads CLOCK_MONOTONIC / CLOCK_REALTIME and
 * sleeps. Monotonic time is for durations and deadlines (it never jumps);
 * wall time is for timestamps that are stored or shown. All functions are
 * thread-safe. */
#ifndef LOOM_COMMON_CLOCK_H
#define LOOM_COMMON_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic clock, from an arbitrary origin. */
int64_t clock_mono_ns(void);
int64_t clock_mono_us(void);
int64_t clock_mono_ms(void);
/* Monotonic seconds / milliseconds as a double (sub-unit precision). */
double clock_mono_s(void);
double clock_mono_msf(void);
/* Wall clock: milliseconds / seconds since the Unix epoch. */
int64_t clock_wall_ms(void);
double clock_wall_s(void);
/* Sleeps ms milliseconds (<= 0: returns at once). A caught signal ends the
 * sleep early (returns -1), so a loop that polls a flag set by a signal
 * handler wakes at once; 0 when the whole interval was slept. */
int clock_sleep_ms(long ms);
/* The same in microseconds, for short back-off loops. */
int clock_sleep_us(long us);
/* Sleeps the whole interval, whatever signals arrive. */
void clock_sleep_ms_full(long ms);

#ifdef __cplusplus
}
#endif

#endif
