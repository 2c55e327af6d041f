/* Table-driven tests of fair share: the decay of usage (daemon/fairshare.c,
 * against closed forms written out here: 2^-k for k half-lives) and the
 * scheduler's order of equal-priority jobs of several tenants by their
 * decayed usage (daemon/sched.c). */
#include "daemon/fairshare.h"
#include "daemon/sched.h"

#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define H 3600000LL /* ms in an hour */

struct tweight {
    int64_t age_ms;
    long half_s;
    double want;
};

static const struct tweight weights[] = {
    {0, 3600, 1.0},
    {H, 3600, 0.5},
    {2 * H, 3600, 0.25},
    {10 * H, 3600, 1.0 / 1024},
    {H / 2, 3600, 0.70710678118654752},
    {-5000, 3600, 1.0},
    {H, 0, 0.0},
    {0, 0, 0.0},
    {7 * 24 * H, 604800, 0.5},
};

struct tusage {
    const char *name;
    int n;
    struct fairshare_row rows[4];
    int64_t now;
    long half_s;
    double want;
};

static const struct tusage usages[] = {
    {"no rows", 0, {{0, 0}}, 10 * H, 3600, 0.0},
    {"one fresh row counts fully", 1, {{8.0, 10 * H}}, 10 * H, 3600, 8.0},
    {"rows of different ages",
     3,
     {{8.0, 9 * H}, {8.0, 8 * H}, {4.0, 10 * H}},
     10 * H,
     3600,
     8.0 * 0.5 + 8.0 * 0.25 + 4.0},
    {"fair share off", 2, {{8.0, 9 * H}, {1.0, 10 * H}}, 10 * H, 0, 0.0},
};

/* Ordering: two GPUs free, three tenants' jobs of one GPU each at one priority
 * except where noted. Expect which two are placed. */
struct torder {
    const char *name;
    int prio[3];
    int64_t submit[3];
    double usage[3]; /* tenant of job i: t<i> */
    int placed[3];
};

static const struct torder orders[] = {
    {"no usage: submit order", {50, 50, 50}, {1, 2, 3}, {0, 0, 0}, {1, 1, 0}},
    {"the heaviest tenant waits although it submitted first",
     {50, 50, 50},
     {1, 2, 3},
     {100.0, 5.0, 1.0},
     {0, 1, 1}},
    {"least usage first, then the next", {50, 50, 50}, {1, 2, 3}, {3.0, 9.0, 1.0}, {1, 0, 1}},
    {"priority still comes first", {90, 50, 50}, {3, 1, 2}, {1000.0, 0.5, 0.0}, {1, 0, 1}},
    {"equal usage: submit order", {50, 50, 50}, {3, 1, 2}, {2.0, 2.0, 2.0}, {0, 1, 1}},
};

int main(void) {
    size_t nw = sizeof weights / sizeof weights[0];
    for (size_t i = 0; i < nw; i++) {
        double w = fairshare_weight(weights[i].age_ms, weights[i].half_s);
        CHECK(fabs(w - weights[i].want) < 1e-12, "weight age %lld half-life %ld: %.15g, want %.15g",
              (long long)weights[i].age_ms, weights[i].half_s, w, weights[i].want);
    }
    size_t nu = sizeof usages / sizeof usages[0];
    for (size_t i = 0; i < nu; i++) {
        const struct tusage *u = &usages[i];
        double got = fairshare_usage(u->rows, u->n, u->now, u->half_s);
        CHECK(fabs(got - u->want) < 1e-9, "[%s] usage %.12g, want %.12g", u->name, got, u->want);
    }
    size_t no = sizeof orders / sizeof orders[0];
    for (size_t i = 0; i < no; i++) {
        const struct torder *o = &orders[i];
        struct sched_node node = {"a",  "cuda", 2, 0, SCHED_NODE_READY, NULL, NULL, 0, NULL,
                                  NULL, NULL,   0, 0};
        static const char *const ids[3] = {"j0", "j1", "j2"}, *const tenants[3] = {"t0", "t1",
                                                                                   "t2"};
        struct sched_job jobs[3];
        for (int j = 0; j < 3; j++)
            jobs[j] = (struct sched_job){
                ids[j], tenants[j], "cuda", o->prio[j],  o->submit[j], 1,    1,    0, -1,
                NULL,   0,          0,      o->usage[j], NULL,         NULL, NULL, 0, 0};
        struct sched_cluster cl = {&node, 1, NULL, 0};
        struct sched_decision d[3];
        int placed = sched_place(&cl, jobs, 3, d);
        CHECK(placed == 2, "[%s] placed %d, want 2", o->name, placed);
        for (int j = 0; j < 3 && placed >= 0; j++)
            CHECK(d[j].placed == o->placed[j], "[%s] job %s placed %d, want %d (reason '%s')",
                  o->name, ids[j], d[j].placed, o->placed[j], d[j].reason);
        if (placed >= 0) sched_decisions_free(d, 3);
    }
    printf("test_fairshare: %zu weights, %zu usages, %zu orders\n", nw, nu, no);
    return check_summary("test_fairshare");
}
