/* Fair share: each tenant's GPU-hours, decayed by age, that the scheduler
 * uses to order jobs of equal priority (less recent use runs first).
 *
 * A GPU-hour used `age` ago counts 0.5^(age / half_life): with the default
 * half-life of 7 days (loomd --fair-share-half-life, seconds; 0 turns fair
 * share off) last week's hour weighs one half, last month's about 1/20.
 * Usage rows are the finished attempts' (the usage table); what running
 * attempts use counts once they end. Pure; tests/unit/test_fairshare.c runs
 * it as a table. */
#ifndef LOOM_DAEMON_FAIRSHARE_H
#define LOOM_DAEMON_FAIRSHARE_H

#include <stdint.h>

struct fairshare_row {
    double gpu_hours;
    int64_t at_ms; /* when the usage happened */
};

/* The weight of usage `age_ms` old: 0.5^(age/half_life), 1 for usage in the
 * future (clock skew), 0 when half_life_s <= 0 (fair share off). */
double fairshare_weight(int64_t age_ms, long half_life_s);

/* Sum of the rows' GPU-hours, each decayed by its age at now_ms. */
double fairshare_usage(const struct fairshare_row *rows, int n, int64_t now_ms, long half_life_s);

/* Rows older than this many half-lives weigh under 1/1000 and may be skipped. */
#define FAIRSHARE_HORIZON_HALF_LIVES 10

#endif
