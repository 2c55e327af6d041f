/* Monthly GPU-hour budgets of running jobs: which attempts to stop (or warn
 * about) once a tenant's gpu_hours_per_month is used up.
 *
 * A tenant's use this month is its billed usage rows that start in the
 * calendar month (UTC), as the submit check counts them, plus what its live
 * attempts used so far this month (devices x time since the later of their
 * start and the month's start): a running attempt's hours are only written
 * as usage rows when it ends, and a budget that waited for that would let one
 * long job run past it indefinitely. When the sum reaches the budget each live
 * attempt of the tenant is stopped (BUDGET_STOP: SIGTERM with the preemption
 * grace, a final checkpoint, the job fails with BUDGET_EXHAUSTED, no retry),
 * or, when the tenant or the cluster is warn-only, reported once
 * (BUDGET_WARN) and left running.
 *
 * Pure: no I/O, no clock, no shared state; tests/unit/test_budget.c runs it
 * as a table. The loop (daemon/cluster.c) gathers the inputs and applies the
 * answer. */
#ifndef LOOM_DAEMON_BUDGET_H
#define LOOM_DAEMON_BUDGET_H

#include <stdint.h>

struct budget_tenant {
    const char *tenant; /* borrowed */
    double limit_hours; /* gpu_hours_per_month; <= 0: no limit */
    double used_hours;  /* billed usage rows of this month (ended attempts) */
    int warn_only;      /* the tenant's budget_warn_only */
    double total_hours; /* out: used_hours plus the live attempts' hours this month */
};

struct budget_attempt {
    const char *tenant; /* borrowed */
    int gpus;           /* devices it holds */
    int64_t started_ms; /* placement */
    int warned;         /* a BUDGET_WARN was already reported for it */
};

enum budget_action {
    BUDGET_OK = 0, /* keep going, nothing to say */
    BUDGET_WARN,   /* over the budget, warn-only: report once, keep running */
    BUDGET_STOP,   /* over the budget: checkpoint and stop, the job fails */
};

/* The first millisecond of the calendar month (UTC) that holds now_ms. */
int64_t budget_month_start_ms(int64_t now_ms);

/* Decides for every attempt (out: na entries). Fills each tenant's
 * total_hours. An attempt whose tenant is not in t, or has no limit, is
 * BUDGET_OK; so is an already warned one under warn-only. cluster_warn_only
 * (--budget-warn-only) makes every tenant warn-only. Returns how many
 * attempts are BUDGET_STOP. */
int budget_decide(struct budget_tenant *t, int nt, const struct budget_attempt *a, int na,
                  int64_t now_ms, int cluster_warn_only, enum budget_action *out);

#endif
