/* Preemption: which running jobs to stop so that a waiting job can start.
 *
 * preempt_choose() is a pure function like sched_place(), whose placement
 * rules it reuses: given the cluster as the scheduler sees it, the waiting job
 * (the head: the highest-priority queued job that would fit on the idle
 * cluster) and the running attempts, it picks the fewest, cheapest victims
 * whose devices, once free, let the head be placed now.
 *
 * Rules (docs/operations.md "Preemption"):
 * - a victim is preemptible (its spec, or priority below the cluster
 *   threshold, decided at submit), has a strictly lower priority than the head,
 *   and has been running for at least the anti-thrash minimum (the caller
 *   clears `eligible` otherwise);
 * - candidates are taken lowest priority first, then the most recently started
 *   (the least work since start is at stake, and older jobs finish sooner),
 *   then by id, until the head fits;
 * - then any chosen victim whose devices turn out not to be needed is given
 *   back (latest taken first), so no job is stopped for nothing;
 * - devices a victim holds count against its tenant's quota, so stopping it
 *   frees the quota too; the head's own quota must allow it as sched_place
 *   checks it.
 * No I/O, no shared state. */
#ifndef LOOM_DAEMON_PREEMPT_H
#define LOOM_DAEMON_PREEMPT_H

#include "daemon/sched.h"

#include <stddef.h>
#include <stdint.h>

struct preempt_victim {
    const char *job_id;             /* borrowed */
    const char *tenant;             /* borrowed; its quota's used_gpus/running drop when chosen */
    int priority;                   /* the running job's priority */
    int64_t running_since_ms;       /* when its attempt started running */
    int eligible;                   /* preemptible and past the anti-thrash minimum */
    const struct sched_rank *ranks; /* the devices it holds */
    int nranks;
};

/* chosen: nv entries, set to 1 for each victim to stop. Returns the number of
 * victims (> 0) when stopping them lets the head start, 0 when no set of
 * eligible victims does (why says so), -1 when out of memory. */
int preempt_choose(const struct sched_cluster *c, const struct sched_job *head,
                   const struct preempt_victim *v, int nv, int *chosen, char *why, size_t len);

#endif
