/* The attempt supervisor's decision (see supervise.h): one function of a
 * snapshot, with the stages in their order of precedence as named statics.
 * Depends on nothing but libc and api/exit_codes.h, so its test compiles this
 * file alone. */
#include "daemon/supervise.h"

#include "api/exit_codes.h"

#include <stdio.h>
#include <string.h>

/* Agents see exits at their 50 ms polls; a rank killed by a signal counts as
 * this much earlier, so that its peers' "connection lost" exits a moment
 * later read as the consequence they are. */
#define SIGNAL_EARLIER_MS 250

/* Starting (fetching data, compiling, rendezvous) may take longer than a
 * short hang timeout allows for one step; never less than this. */
#define MIN_START_TIMEOUT_S 60

static const char *const cause_names[] = {
    [STOP_NONE] = "none",
    [STOP_SUCCEEDED] = "succeeded",
    [STOP_RANK_FAILED] = "rank_failed",
    [STOP_NODE_LOST] = "node_lost",
    [STOP_HANG] = "hang",
    [STOP_START_TIMEOUT] = "start_timeout",
    [STOP_CANCELLED] = "cancelled",
    [STOP_SUPERSEDED] = "superseded",
    [STOP_NOT_RECORDED] = "not_recorded",
    [STOP_TIME_LIMIT] = "time_limit",
    [STOP_PREEMPTED] = "preempted",
    [STOP_BUDGET] = "budget",
};

const char *stop_cause_name(enum stop_cause cause) {
    if ((unsigned)cause >= sizeof cause_names / sizeof cause_names[0]) return "?";
    return cause_names[cause];
}

const char *supervise_bill_cause(enum stop_cause cause) {
    switch (cause) {
    case STOP_PREEMPTED:
        return "preempted";
    case STOP_NODE_LOST:
        return "node_lost";
    case STOP_HANG:
    case STOP_START_TIMEOUT:
        return "hang";
    case STOP_SUPERSEDED:
    case STOP_NOT_RECORDED:
        return "infra";
    default:
        return "user";
    }
}

int supervise_node_expired(int64_t last_hb_ms, int64_t now_ms, long node_timeout_s) {
    return now_ms - last_hb_ms > (int64_t)node_timeout_s * 1000;
}

int supervise_retries_left(int attempt, int preemptions, int max_retries) {
    return max_retries - (attempt - preemptions);
}

int supervise_is_failure(enum stop_cause cause) {
    return cause == STOP_RANK_FAILED || cause == STOP_NODE_LOST || cause == STOP_HANG ||
           cause == STOP_START_TIMEOUT || cause == STOP_TIME_LIMIT;
}

const char *supervise_end_state(enum stop_cause cause, int all_exited_ok) {
    if (all_exited_ok) return "succeeded";
    if (cause == STOP_CANCELLED) return "cancelled";
    if (cause == STOP_PREEMPTED) return "preempted";
    if (cause == STOP_SUPERSEDED) return "stopped";
    return "failed";
}

/* The rank that failed first is the cause: ranks that exit a moment later
 * usually only noticed their peer was gone. -1 when none exited non-zero. */
static int first_failed_rank(const struct supervise_input *in) {
    int first = -1;
    int64_t first_key = 0;
    for (int r = 0; r < in->world; r++) {
        const struct supervise_rank *rk = &in->ranks[r];
        if (rk->state != RANK_EXITED || rk->exit_code == LOOM_EXIT_OK) continue;
        int64_t key =
            rk->exited_at - (rk->exit_code > LOOM_EXIT_SIGNAL_BASE ? SIGNAL_EARLIER_MS : 0);
        if (first < 0 || key < first_key) {
            first = r;
            first_key = key;
        }
    }
    return first;
}

static void stop(struct supervise_decision *d, enum stop_cause cause, int rank, int node) {
    d->cause = cause;
    d->rank = rank;
    d->node = node;
}

/* Failure causes: the event reason says whether the job is retried. */
static void retry_or_fail(const struct supervise_input *in, struct supervise_decision *d,
                          int no_retry) {
    if (no_retry) {
        snprintf(d->reason, sizeof d->reason, "attempt %d failed: %s; not retried", in->attempt,
                 d->why);
    } else if (supervise_retries_left(in->attempt, in->preemptions, in->max_retries) > 0) {
        d->retry = 1;
        snprintf(d->reason, sizeof d->reason, "attempt %d failed: %s; retrying (retry %d of %d)",
                 in->attempt, d->why, in->attempt - in->preemptions + 1, in->max_retries);
        snprintf(d->pending, sizeof d->pending, "retrying after: %.*s", 270, d->why);
    } else {
        snprintf(d->reason, sizeof d->reason,
                 "attempt %d failed: %s; no retries left (max_retries=%d)", in->attempt, d->why,
                 in->max_retries);
    }
}

/* Rank exits and node loss; 1 when the attempt failed. */
static int judge_failures(const struct supervise_input *in, struct supervise_decision *d) {
    int r = first_failed_rank(in);
    if (r >= 0) {
        const struct supervise_rank *rk = &in->ranks[r];
        stop(d, STOP_RANK_FAILED, r, rk->node);
        snprintf(d->why, sizeof d->why, "rank %d on node %s %s", r, in->nodes[rk->node].name,
                 rk->reason && rk->reason[0] ? rk->reason : "exited non-zero");
        retry_or_fail(in, d, rk->exit_code == LOOM_EXIT_BAD_SPEC);
        return 1;
    }
    for (r = 0; r < in->world; r++) {
        const struct supervise_rank *rk = &in->ranks[r];
        if (rk->state == RANK_EXITED || !in->nodes[rk->node].lost) continue;
        stop(d, STOP_NODE_LOST, r, rk->node);
        snprintf(d->why, sizeof d->why, "node %s lost (no heartbeat for %ld s); rank %d was on it",
                 in->nodes[rk->node].name, in->cfg.node_timeout_s, r);
        retry_or_fail(in, d, 0);
        return 1;
    }
    return 0;
}

/* Success, start and the two timeouts, for an attempt with no failed rank. */
static void judge_progress(const struct supervise_input *in, struct supervise_decision *d) {
    int exited = 0, running = 0;
    for (int r = 0; r < in->world; r++) {
        if (in->ranks[r].state == RANK_EXITED) exited++;
        if (in->ranks[r].state == RANK_RUNNING) running++;
    }
    int64_t hang_ms = (int64_t)in->cfg.hang_timeout_s * 1000;
    long start_s =
        in->cfg.hang_timeout_s > MIN_START_TIMEOUT_S ? in->cfg.hang_timeout_s : MIN_START_TIMEOUT_S;
    if (exited == in->world) {
        stop(d, STOP_SUCCEEDED, -1, -1);
        snprintf(d->why, sizeof d->why, "all %d ranks exited 0", in->world);
        snprintf(d->reason, sizeof d->reason, "%s", d->why);
        if (!in->running) {
            d->started = 1;
            snprintf(d->start_reason, sizeof d->start_reason, "all ranks started");
        }
    } else if (in->max_runtime_s > 0 && in->now_ms - in->started_ms > in->max_runtime_s * 1000) {
        /* Not retried: another attempt would hit the same limit. The stop
         * path sends SIGTERM, so the worker writes its final checkpoint. */
        stop(d, STOP_TIME_LIMIT, -1, -1);
        snprintf(d->why, sizeof d->why, "ran %lld s, over max_runtime_s=%ld",
                 (long long)((in->now_ms - in->started_ms) / 1000), in->max_runtime_s);
        snprintf(d->reason, sizeof d->reason, "TIME_LIMIT attempt %d %s; not retried", in->attempt,
                 d->why);
    } else if (!in->running && running + exited == in->world) {
        d->started = 1;
        snprintf(d->start_reason, sizeof d->start_reason,
                 "all %d ranks started (%.0f ms after placement)", in->world,
                 (double)(in->now_ms - in->started_ms));
    } else if (in->running && in->now_ms - in->last_progress_ms > hang_ms) {
        stop(d, STOP_HANG, -1, -1);
        snprintf(d->why, sizeof d->why, "no step progress for %ld s (hang timeout)",
                 (long)((in->now_ms - in->last_progress_ms) / 1000));
        retry_or_fail(in, d, 0);
    } else if (!in->running && in->now_ms - in->started_ms > (int64_t)start_s * 1000) {
        stop(d, STOP_START_TIMEOUT, -1, -1);
        snprintf(d->why, sizeof d->why, "ranks did not all start within %ld s", start_s);
        retry_or_fail(in, d, 0);
    }
}

void supervise_decide(const struct supervise_input *in, struct supervise_decision *d) {
    memset(d, 0, sizeof *d);
    d->rank = d->node = -1;
    switch (in->job) {
    case SUPERVISE_JOB_GONE:
        stop(d, STOP_SUPERSEDED, -1, -1);
        snprintf(d->why, sizeof d->why, "job is no longer running this attempt");
        return;
    case SUPERVISE_JOB_CANCELLING:
        stop(d, STOP_CANCELLED, -1, -1);
        snprintf(d->why, sizeof d->why, "cancelled");
        return;
    case SUPERVISE_JOB_QUEUED:
        return; /* the placement write is still pending */
    case SUPERVISE_JOB_ACTIVE:
        break;
    }
    if (!judge_failures(in, d)) judge_progress(in, d);
}
