/* common/clock: the clocks agree with clock_gettime read here, monotonic
 * readings do not go back, the units agree with each other, and sleeps
 * last at least what was asked (and end early on a caught signal). */
#include "common/clock.h"
#include "tests/check.h"

#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static double ref_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void on_alarm(int sig) {
    (void)sig;
}

int main(void) {
    /* Each reading against the reference taken around it (0.05 s slack for a loaded machine). */
    double r0 = ref_s(CLOCK_MONOTONIC);
    double m_s = clock_mono_s(), m_msf = clock_mono_msf() / 1e3;
    double m_ms = (double)clock_mono_ms() / 1e3, m_us = (double)clock_mono_us() / 1e6;
    double m_ns = (double)clock_mono_ns() / 1e9;
    double r1 = ref_s(CLOCK_MONOTONIC);
    const double mono[] = {m_s, m_msf, m_ms, m_us, m_ns};
    for (size_t i = 0; i < sizeof mono / sizeof *mono; i++)
        CHECK(mono[i] >= r0 - 0.002 && mono[i] <= r1 + 0.05,
              "monotonic reading %zu: %.6f not in "
              "[%.6f, %.6f]",
              i, mono[i], r0, r1);
    double w0 = ref_s(CLOCK_REALTIME);
    double w_ms = (double)clock_wall_ms() / 1e3, w_s = clock_wall_s();
    double w1 = ref_s(CLOCK_REALTIME);
    CHECK(w_ms >= w0 - 0.002 && w_ms <= w1 + 0.05, "wall ms %.3f vs [%.3f, %.3f]", w_ms, w0, w1);
    CHECK(w_s >= w0 - 0.002 && w_s <= w1 + 0.05, "wall s %.3f vs [%.3f, %.3f]", w_s, w0, w1);
    CHECK(w_s > 1.6e9); /* after 2020: the epoch, not boot time */

    int64_t prev = clock_mono_ns(), back = 0;
    for (int i = 0; i < 100000; i++) {
        int64_t t = clock_mono_ns();
        back += t < prev;
        prev = t;
    }
    CHECK_EQ_INT(back, 0);

    static const long sleeps_ms[] = {0, 1, 20, 60};
    for (size_t i = 0; i < sizeof sleeps_ms / sizeof *sleeps_ms; i++) {
        double t0 = ref_s(CLOCK_MONOTONIC);
        CHECK_EQ_INT(clock_sleep_ms(sleeps_ms[i]), 0);
        double dt = ref_s(CLOCK_MONOTONIC) - t0;
        CHECK(dt >= sleeps_ms[i] / 1e3 && dt < sleeps_ms[i] / 1e3 + 0.5, "sleep %ld ms took %.4f s",
              sleeps_ms[i], dt);
    }
    double t0 = ref_s(CLOCK_MONOTONIC);
    CHECK_EQ_INT(clock_sleep_us(3000), 0);
    CHECK(ref_s(CLOCK_MONOTONIC) - t0 >= 0.003);
    CHECK_EQ_INT(clock_sleep_ms(-5), 0);

    /* A caught signal (SIGALRM after 50 ms) ends clock_sleep_ms early; the _full form sleeps on. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 0}, {0, 50000}};
    setitimer(ITIMER_REAL, &it, NULL);
    t0 = ref_s(CLOCK_MONOTONIC);
    CHECK_EQ_INT(clock_sleep_ms(2000), -1);
    double dt = ref_s(CLOCK_MONOTONIC) - t0;
    CHECK(dt >= 0.04 && dt < 1.5, "interrupted sleep took %.3f s", dt);
    setitimer(ITIMER_REAL, &it, NULL);
    t0 = ref_s(CLOCK_MONOTONIC);
    clock_sleep_ms_full(200);
    dt = ref_s(CLOCK_MONOTONIC) - t0;
    CHECK(dt >= 0.2, "full sleep took %.3f s", dt);
    return check_summary("test_common_clock");
}
