/* Table-driven tests of the running-job budget decision (daemon/budget.c):
 * month starts from calendar dates written out here (computed with Python's
 * calendar.timegm), each tenant's total (finished usage plus live attempts'
 * hours this month, by hand) and the action per attempt. */
#include "daemon/budget.h"

#include "tests/check.h"

#include <stdio.h>

#define H         3600000LL
#define DEC1_2026 1796083200000LL /* 2026-12-01T00:00:00Z */
#define NOV30_23  1796079600000LL /* 2026-11-30T23:00:00Z */
#define DEC15_12  1797336000000LL /* 2026-12-15T12:00:00Z */
#define JAN1_2027 1798761600000LL /* 2027-01-01T00:00:00Z */
#define FEB1_2024 1706745600000LL /* 2024-02-01T00:00:00Z */
#define FEB29_12  1709208000000LL /* 2024-02-29T12:00:00Z (leap day) */

static const struct {
    int64_t now, want;
} months[] = {
    {DEC1_2026, DEC1_2026}, {DEC1_2026 + 1, DEC1_2026}, {DEC1_2026 - 1, DEC1_2026 - 30 * 24 * H},
    {DEC15_12, DEC1_2026},  {JAN1_2027 - 1, DEC1_2026}, {JAN1_2027, JAN1_2027},
    {FEB29_12, FEB1_2024},
};

#define MAXT 3
#define MAXA 4

struct tcase {
    const char *name;
    int64_t now;
    int cluster_warn;
    int nt;
    struct budget_tenant t[MAXT];
    int na;
    struct budget_attempt a[MAXA];
    enum budget_action want[MAXA];
    double want_total[MAXT];
    int want_stops;
};

static const struct tcase cases[] = {
    {"under the budget: nothing",
     DEC15_12,
     0,
     1,
     {{"acme", 10, 5, 0, 0}},
     1,
     {{"acme", 2, DEC15_12 - 2 * H, 0}},
     {BUDGET_OK},
     {9},
     0},
    {"live hours push it over: every live attempt of the tenant stops",
     DEC15_12,
     0,
     2,
     {{"acme", 10, 5, 0, 0}, {"beta", 10, 0, 0, 0}},
     3,
     {{"acme", 2, DEC15_12 - 2 * H, 0}, {"beta", 4, DEC15_12 - H, 0}, {"acme", 1, DEC15_12 - H, 0}},
     {BUDGET_STOP, BUDGET_OK, BUDGET_STOP},
     {10, 4},
     2},
    {"exactly at the budget counts as used up",
     DEC15_12,
     0,
     1,
     {{"acme", 4, 4, 0, 0}},
     1,
     {{"acme", 1, DEC15_12, 0}},
     {BUDGET_STOP},
     {4},
     1},
    {"no limit (0): never stopped",
     DEC15_12,
     0,
     1,
     {{"acme", 0, 500, 0, 0}},
     1,
     {{"acme", 8, DEC15_12 - 100 * H, 0}},
     {BUDGET_OK},
     {1300},
     0},
    {"a tenant without a budget row: untouched",
     DEC15_12,
     0,
     1,
     {{"acme", 1, 5, 0, 0}},
     1,
     {{"beta", 8, DEC15_12 - 100 * H, 0}},
     {BUDGET_OK},
     {5},
     0},
    {"warn-only tenant: a warning, once",
     DEC15_12,
     0,
     1,
     {{"acme", 1, 2, 1, 0}},
     2,
     {{"acme", 1, DEC15_12 - H, 0}, {"acme", 1, DEC15_12 - H, 1}},
     {BUDGET_WARN, BUDGET_OK},
     {4},
     0},
    {"warn-only cluster: every tenant warns",
     DEC15_12,
     1,
     2,
     {{"acme", 1, 2, 0, 0}, {"beta", 1, 0, 0, 0}},
     2,
     {{"acme", 1, DEC15_12 - H, 0}, {"beta", 2, DEC15_12 - H, 0}},
     {BUDGET_WARN, BUDGET_WARN},
     {3, 2},
     0},
    {"an attempt from last month counts from the month's start only",
     DEC1_2026 + H,
     0,
     1,
     {{"acme", 1.5, 0, 0, 0}},
     1,
     {{"acme", 1, NOV30_23, 0}},
     {BUDGET_OK},
     {1},
     0},
    {"the same attempt an hour later is over",
     DEC1_2026 + 2 * H,
     0,
     1,
     {{"acme", 1.5, 0, 0, 0}},
     1,
     {{"acme", 1, NOV30_23, 0}},
     {BUDGET_STOP},
     {2},
     1},
    {"an attempt placed in the future (clock skew) adds nothing",
     DEC15_12,
     0,
     1,
     {{"acme", 1, 0.5, 0, 0}},
     1,
     {{"acme", 4, DEC15_12 + H, 0}},
     {BUDGET_OK},
     {0.5},
     0},
};

int main(void) {
    for (size_t i = 0; i < sizeof months / sizeof *months; i++)
        CHECK(budget_month_start_ms(months[i].now) == months[i].want, "month of %lld: %lld",
              (long long)months[i].now, (long long)budget_month_start_ms(months[i].now));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct tcase *tc = &cases[i];
        struct budget_tenant t[MAXT];
        enum budget_action out[MAXA];
        for (int k = 0; k < tc->nt; k++)
            t[k] = tc->t[k];
        int stops = budget_decide(t, tc->nt, tc->a, tc->na, tc->now, tc->cluster_warn, out);
        CHECK(stops == tc->want_stops, "%s: %d stops", tc->name, stops);
        for (int k = 0; k < tc->na; k++)
            CHECK(out[k] == tc->want[k], "%s: attempt %d action %d, want %d", tc->name, k, out[k],
                  tc->want[k]);
        for (int k = 0; k < tc->nt; k++)
            CHECK(fabs(t[k].total_hours - tc->want_total[k]) < 1e-9, "%s: tenant %d total %.6f",
                  tc->name, k, t[k].total_hours);
    }
    return check_summary("test_budget");
}
