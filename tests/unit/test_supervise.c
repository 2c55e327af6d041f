/* Table-driven tests of the attempt supervisor (daemon/supervise.c): each
 * case is one attempt's snapshot (the job's view, ranks with their states,
 * exit codes and exit times, lost nodes, clock, timeouts, retry budget) and
 * the decision expected: the stop cause, whether the job starts running,
 * retry or fail, the rank and node named, and the reason texts (exact stop
 * reason, a fragment of the event reason). Then the small policy helpers
 * (node expiry, end state, retries left) at their boundaries. */
#include "daemon/supervise.h"

#include "api/exit_codes.h"
#include "tests/check.h"

#include <stdio.h>
#include <string.h>

#define MAXR     4
#define NO_RETRY 0
#define RETRY    1

/* Nodes of every case: a, b, c (indices 0, 1, 2). */
static const char *const node_names[3] = {"a", "b", "c"};
#define LOST_A 1
#define LOST_B 2
#define LOST_C 4

struct trank {
    int node;
    enum rank_state state;
    int code;
    int64_t at;
    const char *reason;
};

#define PEND(n)                                                                                    \
    { n, RANK_PENDING, 0, 0, NULL }
#define RUN(n)                                                                                     \
    { n, RANK_RUNNING, 0, 0, NULL }
#define OK(n, at)                                                                                  \
    { n, RANK_EXITED, LOOM_EXIT_OK, at, NULL }
#define EXIT(n, code, at)                                                                          \
    { n, RANK_EXITED, code, at, NULL }
#define EXITR(n, code, at, why)                                                                    \
    { n, RANK_EXITED, code, at, why }

/* The snapshot of one case. */
struct tin {
    enum supervise_job job;
    int attempt, max_retries, running;
    int64_t started, progress, now; /* ms */
    long hang_s;                    /* --hang-timeout; --node-timeout is 15 */
    int lost;                       /* LOST_* mask */
    int world;
    struct trank ranks[MAXR];
};

/* The decision expected. */
struct tout {
    enum stop_cause cause;
    int started; /* d.started */
    int retry;   /* failure causes only */
    int rank, node;
    const char *why;    /* exact stop reason ("" for STOP_NONE) */
    const char *reason; /* fragment of the event reason / start reason ("" : not checked) */
};

struct tcase {
    const char *name;
    struct tin in;
    struct tout out;
};

/* IN(job, attempt, max_retries, running, started, progress, now, hang_s, lost, world, ranks...)
 * OUT(cause, started, retry, rank, node, why, reason) */
#define IN(job, att, maxr, run, t_start, t_prog, t_now, hang, lost, world, ...)                    \
    {                                                                                              \
        job, att, maxr, run, t_start, t_prog, t_now, hang, lost, world, {                          \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    }
#define OUT(cause, started, retry, rank, node, why, reason)                                        \
    { cause, started, retry, rank, node, why, reason }

/* Placed at 10 s; now 11.5 s unless a case says otherwise. */
#define T0     10000
#define ACTIVE SUPERVISE_JOB_ACTIVE

static const struct tcase cases[] = {
    /* start and success */
    {"every rank running: the job starts",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 1500, 600, 0, 2, RUN(0), RUN(1)),
     OUT(STOP_NONE, 1, 0, -1, -1, "", "all 2 ranks started (1500 ms after placement)")},
    {"a rank still pending: keep waiting",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 1500, 600, 0, 2, RUN(0), PEND(1)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
    {"running with fresh progress: nothing to do",
     IN(ACTIVE, 0, 3, 1, T0, T0 + 900, T0 + 1500, 600, 0, 2, RUN(0), RUN(1)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
    {"one rank done, the other running: the job starts",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 1500, 600, 0, 2, OK(0, T0 + 1000), RUN(1)),
     OUT(STOP_NONE, 1, 0, -1, -1, "", "all 2 ranks started")},
    {"every rank exited 0 while running: succeeded",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 2, OK(0, T0 + 1000), OK(1, T0 + 1100)),
     OUT(STOP_SUCCEEDED, 0, 0, -1, -1, "all 2 ranks exited 0", "all 2 ranks exited 0")},
    {"every rank exited 0 before it was seen running: started, then succeeded",
     IN(ACTIVE, 1, 3, 0, T0, T0, T0 + 1500, 600, 0, 3, OK(0, T0 + 1000), OK(1, T0 + 1000),
        OK(2, T0 + 1000)),
     OUT(STOP_SUCCEEDED, 1, 0, -1, -1, "all 3 ranks exited 0", "all ranks started")},
    /* rank failures: which rank, retry or fail */
    {"rank exits non-zero, retries left: retry",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 2, RUN(0),
        EXITR(1, LOOM_EXIT_FAILED, T0 + 1000, "exited with code 1")),
     OUT(STOP_RANK_FAILED, 0, RETRY, 1, 1, "rank 1 on node b exited with code 1",
         "attempt 0 failed: rank 1 on node b exited with code 1; retrying (retry 1 of 3)")},
    {"rank exits non-zero without a reason text",
     IN(ACTIVE, 2, 3, 1, T0, T0, T0 + 1500, 600, 0, 1, EXIT(2, LOOM_EXIT_FAILED, T0 + 1000)),
     OUT(STOP_RANK_FAILED, 0, RETRY, 0, 2, "rank 0 on node c exited non-zero",
         "retrying (retry 3 of 3)")},
    {"rank exits non-zero on the last attempt: fail",
     IN(ACTIVE, 3, 3, 1, T0, T0, T0 + 1500, 600, 0, 2, RUN(0),
        EXIT(1, LOOM_EXIT_FAILED, T0 + 1000)),
     OUT(STOP_RANK_FAILED, 0, NO_RETRY, 1, 1, "rank 1 on node b exited non-zero",
         "; no retries left (max_retries=3)")},
    {"max_retries 0: the first failure fails the job",
     IN(ACTIVE, 0, 0, 1, T0, T0, T0 + 1500, 600, 0, 1, EXIT(0, LOOM_EXIT_FAILED, T0 + 1000)),
     OUT(STOP_RANK_FAILED, 0, NO_RETRY, 0, 0, "rank 0 on node a exited non-zero",
         "no retries left (max_retries=0)")},
    {"bad spec exit is never retried",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 1500, 600, 0, 2,
        EXITR(0, LOOM_EXIT_BAD_SPEC, T0 + 1000, "exited with code 2"), RUN(1)),
     OUT(STOP_RANK_FAILED, 0, NO_RETRY, 0, 0, "rank 0 on node a exited with code 2",
         "attempt 0 failed: rank 0 on node a exited with code 2; not retried")},
    {"agent could not start the worker (unknown status) is a failure",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 1500, 600, 0, 2,
        EXITR(1, LOOM_EXIT_UNKNOWN, T0 + 10, "agent could not start"), PEND(0)),
     OUT(STOP_RANK_FAILED, 0, RETRY, 0, 1, "rank 0 on node b agent could not start", "")},
    {"the earliest exit is the cause, not the lowest rank",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 3, EXIT(0, LOOM_EXIT_FAILED, T0 + 1100), RUN(1),
        EXITR(2, LOOM_EXIT_FAILED, T0 + 1000, "boom")),
     OUT(STOP_RANK_FAILED, 0, RETRY, 2, 2, "rank 2 on node c boom", "")},
    {"a rank killed by a signal 200 ms later still came first",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 2, EXIT(0, LOOM_EXIT_FAILED, T0 + 1000),
        EXITR(1, 137, T0 + 1200, "killed by 9")),
     OUT(STOP_RANK_FAILED, 0, RETRY, 1, 1, "rank 1 on node b killed by 9", "")},
    {"a signal exactly 250 ms later ties: the lower rank wins",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 2, EXIT(0, LOOM_EXIT_FAILED, T0 + 1000),
        EXIT(1, 137, T0 + 1250)),
     OUT(STOP_RANK_FAILED, 0, RETRY, 0, 0, "rank 0 on node a exited non-zero", "")},
    {"a signal 251 ms later is a consequence",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 2, EXIT(1, 143, T0 + 1251),
        EXIT(0, LOOM_EXIT_FAILED, T0 + 1000)),
     OUT(STOP_RANK_FAILED, 0, RETRY, 1, 0, "rank 1 on node a exited non-zero", "")},
    {"exit code 128 is not a signal",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 2, EXIT(0, LOOM_EXIT_FAILED, T0 + 1000),
        EXIT(1, LOOM_EXIT_SIGNAL_BASE, T0 + 1100)),
     OUT(STOP_RANK_FAILED, 0, RETRY, 0, 0, "rank 0 on node a exited non-zero", "")},
    /* node loss, and its order against rank failures */
    {"a running rank's node is lost: retry",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, LOST_B, 2, RUN(0), RUN(1)),
     OUT(STOP_NODE_LOST, 0, RETRY, 1, 1, "node b lost (no heartbeat for 15 s); rank 1 was on it",
         "retrying (retry 1 of 3)")},
    {"a pending rank's node is lost while starting",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 1500, 600, LOST_A, 2, PEND(0), RUN(1)),
     OUT(STOP_NODE_LOST, 0, RETRY, 0, 0, "node a lost (no heartbeat for 15 s); rank 0 was on it",
         "")},
    {"two lost nodes: the lowest rank on one names it",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, LOST_A | LOST_C, 3, RUN(1), RUN(2), RUN(0)),
     OUT(STOP_NODE_LOST, 0, RETRY, 1, 2, "node c lost (no heartbeat for 15 s); rank 1 was on it",
         "")},
    {"a rank failure comes before a node loss",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, LOST_A, 2, RUN(0),
        EXIT(1, LOOM_EXIT_FAILED, T0 + 1000)),
     OUT(STOP_RANK_FAILED, 0, RETRY, 1, 1, "rank 1 on node b exited non-zero", "")},
    {"a failed rank on the lost node is still the rank failure",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, LOST_A, 2, EXIT(0, LOOM_EXIT_BAD_SPEC, T0 + 1000),
        RUN(1)),
     OUT(STOP_RANK_FAILED, 0, NO_RETRY, 0, 0, "rank 0 on node a exited non-zero", "not retried")},
    {"a rank that exited 0 on a lost node is no loss",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 1500, 600, LOST_A, 2, OK(0, T0 + 1000), RUN(1)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
    {"node lost on the last attempt: fail",
     IN(ACTIVE, 2, 2, 1, T0, T0, T0 + 1500, 600, LOST_B, 2, RUN(0), RUN(1)),
     OUT(STOP_NODE_LOST, 0, NO_RETRY, 1, 1, "node b lost (no heartbeat for 15 s); rank 1 was on it",
         "no retries left (max_retries=2)")},
    /* hang timeout, at its boundary */
    {"no progress for exactly the hang timeout: not yet",
     IN(ACTIVE, 0, 3, 1, T0, T0 + 1000, T0 + 1000 + 600000, 600, 0, 2, RUN(0), RUN(1)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
    {"no progress for the hang timeout + 1 ms: hang",
     IN(ACTIVE, 0, 3, 1, T0, T0 + 1000, T0 + 1000 + 600001, 600, 0, 2, RUN(0), RUN(1)),
     OUT(STOP_HANG, 0, RETRY, -1, -1, "no step progress for 600 s (hang timeout)",
         "retrying (retry 1 of 3)")},
    {"a hang on the last attempt fails", IN(ACTIVE, 1, 1, 1, T0, T0, T0 + 30000, 20, 0, 1, RUN(0)),
     OUT(STOP_HANG, 0, NO_RETRY, -1, -1, "no step progress for 30 s (hang timeout)",
         "no retries left (max_retries=1)")},
    {"a hang needs a rank failure and node loss to be absent",
     IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 30000, 20, LOST_A, 1, RUN(0)),
     OUT(STOP_NODE_LOST, 0, RETRY, 0, 0, "node a lost (no heartbeat for 15 s); rank 0 was on it",
         "")},
    {"the hang clock does not run while starting",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 30000, 20, 0, 2, RUN(0), PEND(1)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
    /* start timeout: max(hang timeout, 60 s), at its boundary */
    {"starting for exactly the start timeout: not yet",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 600000, 600, 0, 2, RUN(0), PEND(1)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
    {"starting for the start timeout + 1 ms: start timeout",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 600001, 600, 0, 2, RUN(0), PEND(1)),
     OUT(STOP_START_TIMEOUT, 0, RETRY, -1, -1, "ranks did not all start within 600 s",
         "retrying (retry 1 of 3)")},
    {"a short hang timeout still allows 60 s to start",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 60000, 10, 0, 1, PEND(0)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
    {"past 60 s with a short hang timeout: start timeout",
     IN(ACTIVE, 3, 3, 0, T0, T0, T0 + 60001, 10, 0, 1, PEND(0)),
     OUT(STOP_START_TIMEOUT, 0, NO_RETRY, -1, -1, "ranks did not all start within 60 s",
         "no retries left (max_retries=3)")},
    {"all ranks running at the start timeout: started, not timed out",
     IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 700000, 600, 0, 2, RUN(0), RUN(1)),
     OUT(STOP_NONE, 1, 0, -1, -1, "", "all 2 ranks started")},
    /* the job's own state comes first */
    {"cancel during start",
     IN(SUPERVISE_JOB_CANCELLING, 0, 3, 0, T0, T0, T0 + 1500, 600, 0, 2, PEND(0), PEND(1)),
     OUT(STOP_CANCELLED, 0, 0, -1, -1, "cancelled", "")},
    {"cancel wins over a rank failure and a lost node",
     IN(SUPERVISE_JOB_CANCELLING, 0, 3, 1, T0, T0, T0 + 1500, 600, LOST_B, 2,
        EXIT(0, LOOM_EXIT_FAILED, T0 + 1000), RUN(1)),
     OUT(STOP_CANCELLED, 0, 0, -1, -1, "cancelled", "")},
    {"cancel wins over success",
     IN(SUPERVISE_JOB_CANCELLING, 0, 3, 1, T0, T0, T0 + 1500, 600, 0, 1, OK(0, T0 + 1000)),
     OUT(STOP_CANCELLED, 0, 0, -1, -1, "cancelled", "")},
    {"the job moved on (terminal or another attempt): superseded",
     IN(SUPERVISE_JOB_GONE, 0, 3, 1, T0, T0, T0 + 1500, 600, LOST_A, 1,
        EXIT(0, LOOM_EXIT_FAILED, T0 + 1000)),
     OUT(STOP_SUPERSEDED, 0, 0, -1, -1, "job is no longer running this attempt", "")},
    {"placement write still pending: wait, whatever the ranks say",
     IN(SUPERVISE_JOB_QUEUED, 0, 3, 0, T0, T0, T0 + 900000, 600, LOST_A, 2,
        EXIT(0, LOOM_EXIT_FAILED, T0 + 1000), RUN(1)),
     OUT(STOP_NONE, 0, 0, -1, -1, "", "")},
};

static void run_case(const struct tcase *tc, long max_runtime_s) {
    struct supervise_rank ranks[MAXR];
    struct supervise_node nodes[3];
    for (int i = 0; i < 3; i++)
        nodes[i] = (struct supervise_node){node_names[i], (tc->in.lost >> i) & 1};
    for (int r = 0; r < tc->in.world; r++)
        ranks[r] = (struct supervise_rank){tc->in.ranks[r].node, tc->in.ranks[r].state,
                                           tc->in.ranks[r].code, tc->in.ranks[r].at,
                                           tc->in.ranks[r].reason};
    struct supervise_input in = {
        .job = tc->in.job,
        .attempt = tc->in.attempt,
        .max_retries = tc->in.max_retries,
        .world = tc->in.world,
        .running = tc->in.running,
        .max_runtime_s = max_runtime_s,
        .started_ms = tc->in.started,
        .last_progress_ms = tc->in.progress,
        .now_ms = tc->in.now,
        .ranks = ranks,
        .nodes = nodes,
        .cfg = {.node_timeout_s = 15, .hang_timeout_s = tc->in.hang_s},
    };
    struct supervise_decision d;
    memset(&d, 0x5a, sizeof d); /* the decision must not depend on what was there */
    supervise_decide(&in, &d);
    const char *n = tc->name;
    CHECK(d.cause == tc->out.cause, "[%s] cause %s, expected %s", n, stop_cause_name(d.cause),
          stop_cause_name(tc->out.cause));
    CHECK(d.started == tc->out.started, "[%s] started %d, expected %d", n, d.started,
          tc->out.started);
    CHECK(d.rank == tc->out.rank && d.node == tc->out.node, "[%s] rank %d node %d, expected %d %d",
          n, d.rank, d.node, tc->out.rank, tc->out.node);
    CHECK(!strcmp(d.why, tc->out.why), "[%s] why '%s', expected '%s'", n, d.why, tc->out.why);
    if (supervise_is_failure(tc->out.cause)) {
        CHECK(d.retry == tc->out.retry, "[%s] retry %d, expected %d", n, d.retry, tc->out.retry);
        CHECK(strstr(d.reason, d.why) != NULL, "[%s] reason '%s' does not quote why", n, d.reason);
        char pending[320];
        snprintf(pending, sizeof pending, "retrying after: %s", d.why);
        CHECK(tc->out.retry ? !strcmp(d.pending, pending) : !d.pending[0],
              "[%s] pending reason '%s'", n, d.pending);
    } else {
        CHECK(!d.retry && !d.pending[0], "[%s] retry %d pending '%s' without a failure", n, d.retry,
              d.pending);
    }
    if (tc->out.reason[0]) {
        const char *text = tc->out.cause == STOP_NONE ? d.start_reason : d.reason;
        if (tc->out.started && tc->out.cause == STOP_SUCCEEDED) text = d.start_reason;
        CHECK(strstr(text, tc->out.reason) != NULL, "[%s] reason '%s' lacks '%s'", n, text,
              tc->out.reason);
    }
    if (tc->out.cause == STOP_SUCCEEDED)
        CHECK(!strcmp(d.reason, d.why), "[%s] success reason '%s'", n, d.reason);
    if (!tc->out.started)
        CHECK(!d.start_reason[0], "[%s] start reason '%s' without a start", n, d.start_reason);
}

struct tend {
    enum stop_cause cause;
    int all_ok;
    const char *end;
};

static const struct tend ends[] = {
    {STOP_SUCCEEDED, 1, "succeeded"},  {STOP_CANCELLED, 0, "cancelled"},
    {STOP_CANCELLED, 1, "succeeded"},  {STOP_SUPERSEDED, 0, "stopped"},
    {STOP_SUPERSEDED, 1, "succeeded"}, {STOP_RANK_FAILED, 0, "failed"},
    {STOP_NODE_LOST, 0, "failed"},     {STOP_HANG, 0, "failed"},
    {STOP_START_TIMEOUT, 0, "failed"}, {STOP_NOT_RECORDED, 0, "failed"},
    {STOP_HANG, 1, "succeeded"},       {STOP_TIME_LIMIT, 0, "failed"},
};

/* max_runtime_s (time limit): counted from placement, not retried, after
 * failures and success, before the start and the timeouts. */
struct tlimit {
    long max_runtime_s;
    struct tcase c;
};

static const struct tlimit limits[] = {
    {2,
     {"running 2.5 s with max_runtime_s=2: time limit, failed even with retries left",
      IN(ACTIVE, 0, 3, 1, T0, T0 + 2400, T0 + 2500, 600, 0, 2, RUN(0), RUN(1)),
      OUT(STOP_TIME_LIMIT, 0, NO_RETRY, -1, -1, "ran 2 s, over max_runtime_s=2",
          "TIME_LIMIT attempt 0 ran 2 s, over max_runtime_s=2; not retried")}},
    {2,
     {"exactly at the limit: keep going",
      IN(ACTIVE, 0, 3, 1, T0, T0 + 1900, T0 + 2000, 600, 0, 1, RUN(0)),
      OUT(STOP_NONE, 0, 0, -1, -1, "", "")}},
    {2,
     {"one ms past the limit", IN(ACTIVE, 1, 3, 1, T0, T0 + 1900, T0 + 2001, 600, 0, 1, RUN(0)),
      OUT(STOP_TIME_LIMIT, 0, NO_RETRY, -1, -1, "ran 2 s, over max_runtime_s=2",
          "TIME_LIMIT attempt 1")}},
    {0,
     {"max_runtime_s 0 is no limit",
      IN(ACTIVE, 0, 3, 1, T0, T0 + 90000000, T0 + 90000001, 600, 0, 1, RUN(0)),
      OUT(STOP_NONE, 0, 0, -1, -1, "", "")}},
    {1,
     {"a rank failure past the limit is still the rank failure",
      IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 5000, 600, 0, 1, EXIT(0, LOOM_EXIT_FAILED, T0 + 4000)),
      OUT(STOP_RANK_FAILED, 0, RETRY, 0, 0, "rank 0 on node a exited non-zero", "")}},
    {1,
     {"every rank exited 0 past the limit: succeeded",
      IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 5000, 600, 0, 1, OK(0, T0 + 4000)),
      OUT(STOP_SUCCEEDED, 0, 0, -1, -1, "all 1 ranks exited 0", "")}},
    {1,
     {"a lost node past the limit is still node loss",
      IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 5000, 600, LOST_A, 1, RUN(0)),
      OUT(STOP_NODE_LOST, 0, RETRY, 0, 0, "node a lost (no heartbeat for 15 s); rank 0 was on it",
          "")}},
    {10,
     {"still starting past the limit: time limit before the start timeout",
      IN(ACTIVE, 0, 3, 0, T0, T0, T0 + 70000, 600, 0, 2, RUN(0), PEND(1)),
      OUT(STOP_TIME_LIMIT, 0, NO_RETRY, -1, -1, "ran 70 s, over max_runtime_s=10", "")}},
    {10,
     {"hung past the limit: the time limit wins over the hang timeout",
      IN(ACTIVE, 0, 3, 1, T0, T0, T0 + 40000, 20, 0, 1, RUN(0)),
      OUT(STOP_TIME_LIMIT, 0, NO_RETRY, -1, -1, "ran 40 s, over max_runtime_s=10", "")}},
    {1,
     {"cancel past the limit is still a cancel",
      IN(SUPERVISE_JOB_CANCELLING, 0, 3, 1, T0, T0, T0 + 5000, 600, 0, 1, RUN(0)),
      OUT(STOP_CANCELLED, 0, 0, -1, -1, "cancelled", "")}},
};

struct texpire {
    int64_t last_hb, now;
    long timeout_s;
    int lost;
};

static const struct texpire expiries[] = {
    {1000, 16000, 15, 0}, /* exactly the timeout: not yet */
    {1000, 16001, 15, 1}, {1000, 1000, 15, 0}, {1000, 900, 15, 0}, /* clock behind: alive */
    {0, 2001, 2, 1},      {0, 2000, 2, 0},
};

int main(void) {
    int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < ncases; i++)
        run_case(&cases[i], 0);
    int nlimits = (int)(sizeof limits / sizeof limits[0]);
    for (int i = 0; i < nlimits; i++)
        run_case(&limits[i].c, limits[i].max_runtime_s);

    /* Every cause appears in the table. */
    for (int c = STOP_NONE; c <= STOP_SUPERSEDED; c++) {
        int seen = 0;
        for (int i = 0; i < ncases; i++)
            seen |= cases[i].out.cause == (enum stop_cause)c;
        CHECK(seen, "FAIL: no case decides %s", stop_cause_name((enum stop_cause)c));
    }
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        const char *e = supervise_end_state(ends[i].cause, ends[i].all_ok);
        CHECK(!strcmp(e, ends[i].end), "end state of %s (all ok %d): %s, expected %s",
              stop_cause_name(ends[i].cause), ends[i].all_ok, e, ends[i].end);
    }
    for (size_t i = 0; i < sizeof expiries / sizeof expiries[0]; i++) {
        const struct texpire *x = &expiries[i];
        int lost = supervise_node_expired(x->last_hb, x->now, x->timeout_s);
        CHECK(lost == x->lost, "node expiry hb %lld now %lld timeout %ld: %d, expected %d",
              (long long)x->last_hb, (long long)x->now, x->timeout_s, lost, x->lost);
    }
    CHECK(supervise_retries_left(0, 0, 3) == 3 && supervise_retries_left(3, 0, 3) == 0 &&
              supervise_retries_left(0, 0, 0) == 0,
          "retries left");
    /* Preempted attempts use no retry: attempt 3 after 2 preemptions has had
     * one failure. */
    CHECK(supervise_retries_left(3, 2, 3) == 2 && supervise_retries_left(5, 5, 0) == 0 &&
              supervise_retries_left(4, 1, 3) == 0,
          "retries left with preemptions");
    CHECK_STR(supervise_end_state(STOP_PREEMPTED, 0), "preempted");
    /* Cause names are distinct (logs and tests tell them apart). */
    for (int a = STOP_NONE; a <= STOP_PREEMPTED; a++)
        for (int b = a + 1; b <= STOP_PREEMPTED; b++)
            CHECK(strcmp(stop_cause_name((enum stop_cause)a), stop_cause_name((enum stop_cause)b)),
                  "cause names %d and %d collide", a, b);
    CHECK(!strcmp(stop_cause_name((enum stop_cause)99), "?"), "name of an unknown cause");

    CHECK(supervise_is_failure(STOP_TIME_LIMIT), "a time limit is a failure");
    printf("test_supervise: %d + %d time-limit cases, %zu end states, %zu node expiries\n", ncases,
           nlimits, sizeof ends / sizeof ends[0], sizeof expiries / sizeof expiries[0]);
    return check_summary("test_supervise");
}
