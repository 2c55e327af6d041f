/* The attempt supervisor of loomd: a pure decision over a snapshot.
 *
 * Each pass of the scheduler loop (daemon/cluster.c) copies what it knows of
 * one active attempt (the job's view, per-rank states and exit codes, node
 * states, progress and start times, the clock, the timeouts, the retry
 * budget) into a struct supervise_input and asks supervise_decide() what to
 * do: nothing, mark it running, or stop it for one stop_cause, and then
 * retry the job or fail it. The loop applies the answer; it decides nothing
 * itself. No locks, no I/O, no allocation: tests/unit/test_supervise.c runs it
 * as a table of cases (like sched.c and test_sched.c).
 *
 * Precedence, first match wins: the job no longer runs this attempt; cancel
 * requested; the placement write has not committed (wait); a rank exited
 * non-zero (the first to fail is the cause); a rank's node is lost; every
 * rank exited 0; the attempt ran past max_runtime_s (time limit); every rank
 * runs (started); no step progress for the hang timeout; not all ranks
 * running within the start timeout. */
#ifndef LOOM_DAEMON_SUPERVISE_H
#define LOOM_DAEMON_SUPERVISE_H

#include <stdint.h>

enum rank_state { RANK_PENDING = 0, RANK_RUNNING = 1, RANK_EXITED = 2 };

/* Why an attempt stops (kept on the attempt until its ranks are gone). */
enum stop_cause {
    STOP_NONE = 0,      /* keep it going */
    STOP_SUCCEEDED,     /* every rank exited 0 */
    STOP_RANK_FAILED,   /* a rank exited non-zero */
    STOP_NODE_LOST,     /* a rank's node stopped heartbeating */
    STOP_HANG,          /* no step progress for the hang timeout */
    STOP_START_TIMEOUT, /* not every rank started within the start timeout */
    STOP_CANCELLED,     /* the job is cancelling */
    STOP_SUPERSEDED,    /* the job ended, was retried or is gone: not ours to judge */
    STOP_NOT_RECORDED,  /* the placement's store write failed (set by the loop) */
    STOP_TIME_LIMIT,    /* the attempt ran past the job's max_runtime_s: failed, not retried */
    STOP_PREEMPTED,     /* stopped for a higher-priority job (set by the loop): requeued */
    STOP_BUDGET,        /* the tenant's gpu_hours_per_month is used up (set by the loop): failed */
};

/* The job as the store shows it, relative to this attempt. */
enum supervise_job {
    SUPERVISE_JOB_ACTIVE,     /* starting or running this attempt */
    SUPERVISE_JOB_QUEUED,     /* still queued: the placement write has not committed */
    SUPERVISE_JOB_CANCELLING, /* a cancel was requested */
    SUPERVISE_JOB_GONE,       /* missing, terminal, or on another attempt */
};

struct supervise_config {
    long node_timeout_s; /* --node-timeout (named in the reason) */
    long hang_timeout_s; /* --hang-timeout; the start timeout is max(this, 60 s) */
};

struct supervise_rank {
    int node; /* index into supervise_input.nodes */
    enum rank_state state;
    int exit_code;      /* when RANK_EXITED (api/exit_codes.h) */
    int64_t exited_at;  /* agent's wall clock of the exit, ms */
    const char *reason; /* the agent's exit reason; NULL or "" when none */
};

struct supervise_node {
    const char *name;
    int lost; /* missed heartbeats for the node timeout (supervise_node_expired) */
};

struct supervise_input {
    enum supervise_job job;
    int attempt;     /* this attempt's number (0: the first try) */
    int max_retries; /* the job's max_retries */
    int preemptions; /* attempts the job lost to preemption: they use no retry */
    int world;
    int running;        /* the job already moved to running */
    long max_runtime_s; /* the job's max_runtime_s, counted from placement; 0: no limit */
    int64_t started_ms, last_progress_ms, now_ms;
    const struct supervise_rank *ranks; /* world entries */
    const struct supervise_node *nodes;
    struct supervise_config cfg;
};

struct supervise_decision {
    enum stop_cause cause; /* STOP_NONE: keep the attempt */
    int started;           /* move the job starting -> running (start_reason) first */
    int retry;             /* failure causes: 1 requeue (attempt + 1), 0 fail the job */
    int rank;              /* the rank the cause names (-1: none) */
    int node;              /* that rank's node: avoided by the retry for STOP_RANK_FAILED */
    char why[300];         /* the attempt's stop reason */
    char start_reason[160];
    char reason[512];  /* event reason of the job's transition (failure or success) */
    char pending[300]; /* pending reason of the requeued job (retry only) */
};

/* Decides for one attempt. Pure; any thread. */
void supervise_decide(const struct supervise_input *in, struct supervise_decision *out);

/* A node whose last heartbeat is more than node_timeout_s old is lost. */
int supervise_node_expired(int64_t last_hb_ms, int64_t now_ms, long node_timeout_s);

/* Retries left for a job on `attempt` (0-based) with `max_retries`, of whose
 * attempts `preemptions` were preempted (those are no failures); <= 0: none. */
int supervise_retries_left(int attempt, int preemptions, int max_retries);

/* Is this cause a failure (retried or failed per the budget)? */
int supervise_is_failure(enum stop_cause cause);

/* The attempts row's end state once every rank is gone: "succeeded" when
 * every rank exited 0, else "cancelled", "preempted", "stopped" (superseded) or
 * "failed". */
const char *supervise_end_state(enum stop_cause cause, int all_exited_ok);

/* Who an attempt's end is attributed to, for billing: "user" (it succeeded,
 * failed by its own exit, was cancelled or hit its time limit), "preempted",
 * "node_lost", "hang" (no progress, or never started) or "infra" (loomd
 * stopped it: superseded, placement not recorded). */
const char *supervise_bill_cause(enum stop_cause cause);

/* Stable lower-case name of a cause ("rank_failed"), for logs and tests. */
const char *stop_cause_name(enum stop_cause cause);

#endif
