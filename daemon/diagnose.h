/* Diagnosis of a running attempt from every rank's step timing: a rank that
 * is persistently slower than its peers (STRAGGLER) and a layout whose steps
 * are persistently communication-bound (COMM_BOUND).
 *
 * Input: one record per (step, rank), the worker's "ms" object: the step's
 * wall time, `comm_exposed` (time blocked in the gradient synchronisation
 * after the backward) and `compute` (the rest). In synchronous training every
 * rank's step takes the same wall time (the others wait for the slowest in
 * the collective), so a straggler shows in its compute time, and its peers
 * show the same gap as communication wait. Hence the rules, judged on each
 * step once every rank has reported it, in step order:
 *   STRAGGLER rank r  compute_r > DIAG_STRAGGLER_RATIO x the median compute
 *                     of the other ranks of its pipeline stage, and by at least DIAG_MIN_GAP_MS and
 *                     DIAG_MIN_GAP_FRAC of its step (scheduling noise on
 *                     millisecond steps is not a straggler), for DIAG_STREAK
 *                     consecutive steps;
 *   COMM_BOUND        comm_exposed / step > DIAG_COMM_FRAC and comm_exposed >=
 *                     DIAG_MIN_GAP_MS on every rank (the least-waiting rank
 *                     included, so a straggler's peers waiting for it do not
 *                     count) for DIAG_STREAK consecutive steps at which no
 *                     rank is a straggler by the rule above (its streak and
 *                     span reached: a stalling rank stalls inside the
 *                     exchange too, and everyone, itself included, waits for
 *                     it there; that is its finding, not the network's).
 * Noise floors for both (tiny jobs on a loaded host, where a rank descheduled
 * for a few time slices looks 2x slower): a step whose median wall time over
 * the ranks is under DIAG_MIN_STEP_MS is not judged (it breaks the streaks),
 * and a streak must also cover DIAG_MIN_SPAN_MS of wall time, so the
 * consecutive steps needed are max(DIAG_STREAK, DIAG_MIN_SPAN_MS / step).
 * Each finding is reported once per attempt (per rank for STRAGGLER).
 * Cost: O(log world) per record amortized (a sort per pipeline stage per
 * judged step; tests/bench/bench_diag_cost.c); no I/O.
 *
 * The state is per attempt, owned by the caller (daemon/cluster.h keeps it
 * in the attempt, under the cluster mutex); the functions are pure
 * otherwise (tests/unit/test_diagnose.c). */
#ifndef LOOM_DAEMON_DIAGNOSE_H
#define LOOM_DAEMON_DIAGNOSE_H

#include <jansson.h>

#define DIAG_STRAGGLER_RATIO 1.3
#define DIAG_MIN_GAP_MS      5.0 /* about one scheduler time slice (CFS: 3-6 ms) */
#define DIAG_MIN_GAP_FRAC    0.05
#define DIAG_COMM_FRAC       0.20
#define DIAG_STREAK          5
#define DIAG_MIN_STEP_MS     10.0
#define DIAG_MIN_SPAN_MS     500.0
#define DIAG_SLOTS           16 /* steps held while waiting for every rank */
/* Saw-tooth utilization (the agent's per-device telemetry, one sample per
 * heartbeat): within the last DIAG_SAW_WINDOW samples of a rank's device, at
 * least DIAG_SAW_SWINGS moves between busy (>= DIAG_SAW_HIGH %) and idle
 * (<= DIAG_SAW_LOW %), counted with hysteresis (a sample between the two
 * levels changes nothing): the device computes, then waits on the network,
 * over and over. Reported once per attempt, for the first rank that shows it. */
#define DIAG_SAW_WINDOW 16
#define DIAG_SAW_SWINGS 6
#define DIAG_SAW_HIGH   70.0
#define DIAG_SAW_LOW    30.0

enum diag_kind { DIAG_STRAGGLER = 0, DIAG_COMM_BOUND = 1, DIAG_SAWTOOTH = 2 };

struct diag_finding {
    enum diag_kind kind;
    long step;                  /* the step that completed the streak */
    int rank;                   /* STRAGGLER: the slow rank; COMM_BOUND: the least-waiting rank */
    double value;               /* STRAGGLER: compute over the peers' median - 1 (0.45 = +45%);
                                 * COMM_BOUND: the least comm_exposed / step over the ranks;
                                 * SAWTOOTH: the swings counted in the window */
    double compute_ms, peer_ms; /* STRAGGLER: its compute, the peers' median;
                                 * SAWTOOTH: the window's lowest and highest utilization */
    int streak;                 /* STRAGGLER, COMM_BOUND: the consecutive steps judged
                                 * (>= DIAG_STREAK, more on short steps: DIAG_MIN_SPAN_MS) */
};

struct diag;

/* A new state for `world` ranks whose peers come in groups of `group`
 * consecutive ranks: the ranks of one pipeline stage (dp x tp of them, the
 * layout's order), which do the same work; stages differ by design (the last
 * one holds the classifier), so a rank is compared with its own stage only
 * and a stage of one rank is never a straggler. group <= 0 or >= world: one
 * group. NULL when out of memory or world < 1. diag_free accepts NULL. */
struct diag *diag_new(int world, int group);
void diag_free(struct diag *d);

/* Adds rank's timing for `step`. Judges every step that is now complete (in
 * order) and writes up to max findings to out; returns how many. Records of
 * steps already judged or too old to wait for are ignored; a step that is
 * pushed out before every rank reported it breaks the streaks. */
int diag_add(struct diag *d, long step, int rank, double step_ms, double compute_ms, double comm_ms,
             struct diag_finding *out, int max);

/* Adds one utilization sample (percent) of rank's device. Returns 1 and
 * fills *out (kind DIAG_SAWTOOTH, step -1) when the rank's window now shows
 * a saw-tooth and none was reported for the attempt yet, else 0. */
int diag_util_add(struct diag *d, int rank, double util_pct, struct diag_finding *out);

/* The worker's "ms" object of a step or rank_step record -> the three
 * times, compute_ms being the rank's own time: compute plus data_wait (when
 * the record has it). 0, or -1 when a field is missing. */
int diag_times(const json_t *record, double *step_ms, double *compute_ms, double *comm_ms);

/* The per-rank series loomd stores (the rank_step records of ranks other
 * than 0; rank 0's step records are all kept) is bounded: a job of up to
 * DIAG_SERIES_POINTS steps keeps every step, a longer one every k-th step (k
 * = ceil(steps / DIAG_SERIES_POINTS)) and its last; steps <= 0 (not known):
 * every step up to DIAG_SERIES_POINTS, then every 2^j-th with 2^j >= step /
 * DIAG_SERIES_POINTS (DIAG_SERIES_POINTS / 2 more per doubling). Diagnosis
 * itself sees every record. 1: store it, 0: leave it out. */
#define DIAG_SERIES_POINTS 2000
int diag_series_keep(long step, long steps);

/* The advice for a COMM_BOUND layout from the job spec's parallel and
 * train sections (static text). */
const char *diag_comm_advice(const json_t *spec);

#endif
