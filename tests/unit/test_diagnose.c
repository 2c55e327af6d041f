/* Table-driven tests of the straggler / communication-bound diagnosis
 * (daemon/diagnose.c). Each case generates every rank's timing for a run of
 * steps (a step of STEP_MS wall time; per-rank compute, with one rank slowed
 * by a factor over a range of steps; per-rank exposed communication as a
 * fraction of the step), feeds it in step order, rank-major order or with
 * one record missing, and lists the findings expected: kind, rank, and the
 * step that completed the streak. Then the record parser and the advice. */
#include "daemon/diagnose.h"

#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define STEP_MS 100.0
#define MAXW    4

enum order { BY_STEP = 0, RANK_MAJOR = 1 };

struct expect {
    enum diag_kind kind;
    int rank;
    long step;
};

struct tcase {
    const char *name;
    int world, steps;
    double compute;         /* ms, every rank */
    int slow_rank;          /* -1: none */
    int slow_from, slow_to; /* steps [from, to] are slow */
    double factor;          /* its compute x factor there */
    double comm[MAXW];      /* exposed communication / step, per rank */
    enum order order;
    int skip_rank, skip_step; /* a record that never arrives (skip_step 0: none) */
    int nexp;
    struct expect exp[3];
    int group; /* ranks per pipeline stage (0: all one group) */
};

static const struct tcase cases[] = {
    {"equal ranks", 2, 20, 50, -1, 0, 0, 1, {0.1, 0.1}, BY_STEP, 0, 0, 0, {{0}}, 0},
    {"rank 1 twice as slow for 5 steps",
     2,
     12,
     40,
     1,
     3,
     7,
     2.0,
     {0.1, 0.1},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 1, 7}},
     0},
    {"slow for 4 steps only", 2, 12, 40, 1, 3, 6, 2.0, {0.1, 0.1}, BY_STEP, 0, 0, 0, {{0}}, 0},
    {"slow for 12 steps: reported once",
     2,
     14,
     40,
     0,
     1,
     12,
     2.0,
     {0.1, 0.1},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 0, 5}},
     0},
    {"1.29x: below the ratio", 2, 10, 40, 1, 1, 10, 1.29, {0.1, 0.1}, BY_STEP, 0, 0, 0, {{0}}, 0},
    {"1.31x: above the ratio",
     2,
     10,
     40,
     1,
     1,
     10,
     1.31,
     {0.1, 0.1},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 1, 5}},
     0},
    /* 3 ms against 1 ms: 3x, but 2 ms is under 5% of a 100 ms step */
    {"gap under the noise floor", 2, 10, 1, 1, 1, 10, 3.0, {0.1, 0.1}, BY_STEP, 0, 0, 0, {{0}}, 0},
    {"world 4: the peers' median",
     4,
     10,
     30,
     2,
     1,
     10,
     1.5,
     {0.1, 0.1, 0.1, 0.1},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 2, 5}},
     0},
    {"comm-bound on every rank",
     2,
     10,
     30,
     -1,
     0,
     0,
     1,
     {0.25, 0.3},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_COMM_BOUND, 0, 5}},
     0},
    {"exactly 20%: not above", 2, 10, 30, -1, 0, 0, 1, {0.2, 0.2}, BY_STEP, 0, 0, 0, {{0}}, 0},
    /* a straggler's peer waits, the straggler does not: not comm-bound */
    {"one rank waiting is not comm-bound",
     2,
     10,
     30,
     1,
     1,
     10,
     2.0,
     {0.6, 0.05},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 1, 5}},
     0},
    /* the straggler waits 30 % of its step in the exchange: its own stalls
     * fall there too (SIGSTOP in integration.straggler_stop), so a step with a
     * slow rank is not judged comm-bound */
    {"a straggler's own wait is not comm-bound",
     2,
     20,
     30,
     1,
     1,
     20,
     2.0,
     {0.5, 0.3},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 1, 5}},
     0},
    /* the same exchange once the straggler is gone: both findings, the
     * comm-bound streak counted from the first step without a slow rank */
    {"both findings",
     2,
     20,
     30,
     1,
     1,
     10,
     2.0,
     {0.5, 0.3},
     BY_STEP,
     0,
     0,
     2,
     {{DIAG_STRAGGLER, 1, 5}, {DIAG_COMM_BOUND, 1, 15}},
     0},
    {"rank-major arrival",
     2,
     10,
     40,
     1,
     1,
     10,
     2.0,
     {0.1, 0.1},
     RANK_MAJOR,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 1, 5}},
     0},
    /* step 4 of rank 0 never arrives: judging waits until step 4 + DIAG_SLOTS
     * arrives, then gives it up; the streak restarts after the gap (judged
     * then: steps 5..9) */
    {"a lost record breaks the streak",
     2,
     30,
     40,
     1,
     1,
     30,
     2.0,
     {0.1, 0.1},
     BY_STEP,
     0,
     4,
     1,
     {{DIAG_STRAGGLER, 1, 4 + DIAG_STREAK}},
     0},
    /* pp2 x dp2: stage 1 (ranks 2, 3) holds the classifier and is slower by
     * design; only rank 3, slow against its stage peer 2, is a straggler */
    {"pp stages compared within themselves",
     4,
     10,
     30,
     3,
     1,
     10,
     1.5,
     {0.1, 0.1, 0.1, 0.1},
     BY_STEP,
     0,
     0,
     1,
     {{DIAG_STRAGGLER, 3, 5}},
     2},
    {"a stage of one rank has no peers",
     2,
     10,
     30,
     1,
     1,
     10,
     3.0,
     {0.1, 0.1},
     BY_STEP,
     0,
     0,
     0,
     {{0}},
     1},
    {"world 1: nothing to compare", 1, 10, 40, 0, 1, 10, 3.0, {0.9}, BY_STEP, 0, 0, 0, {{0}}, 0},
};

static void times(const struct tcase *c, int step, int rank, double *st, double *cp, double *cm) {
    *st = STEP_MS;
    *cp = c->compute;
    if (c->group > 0 && rank >= c->group) *cp *= 2; /* the later stage: more work by design */
    if (rank == c->slow_rank && step >= c->slow_from && step <= c->slow_to) *cp *= c->factor;
    *cm = c->comm[rank] * STEP_MS;
}

static void run_case(const struct tcase *c) {
    struct diag *d = diag_new(c->world, c->group);
    CHECK(d != NULL, "%s: diag_new", c->name);
    if (!d) return;
    struct diag_finding got[16];
    int n = 0;
    int outer = c->order == BY_STEP ? c->steps : c->world;
    int inner = c->order == BY_STEP ? c->world : c->steps;
    for (int i = 0; i < outer; i++)
        for (int j = 0; j < inner; j++) {
            int step = (c->order == BY_STEP ? i : j) + 1, rank = c->order == BY_STEP ? j : i;
            if (step == c->skip_step && rank == c->skip_rank) continue;
            double st, cp, cm;
            times(c, step, rank, &st, &cp, &cm);
            n += diag_add(d, step, rank, st, cp, cm, got + n, 16 - n);
        }
    CHECK(n == c->nexp, "%s: %d finding(s), want %d", c->name, n, c->nexp);
    for (int i = 0; i < n && i < c->nexp; i++) {
        CHECK(got[i].kind == c->exp[i].kind && got[i].rank == c->exp[i].rank &&
                  got[i].step == c->exp[i].step,
              "%s: finding %d is kind %d rank %d step %ld, want kind %d rank %d step %ld", c->name,
              i, got[i].kind, got[i].rank, got[i].step, c->exp[i].kind, c->exp[i].rank,
              c->exp[i].step);
        CHECK(got[i].streak >= DIAG_STREAK && got[i].streak * STEP_MS >= DIAG_MIN_SPAN_MS,
              "%s: streak %d", c->name, got[i].streak);
        if (got[i].kind == DIAG_STRAGGLER)
            CHECK_NEAR(got[i].value, c->factor - 1, 1e-9);
        else
            CHECK(got[i].value > DIAG_COMM_FRAC, "%s: comm fraction %g", c->name, got[i].value);
    }
    diag_free(d);
}

/* Noisy synchronous training, as a loaded host runs it: every step each rank
 * computes `base` ms, plus, with probability `p`, a deschedule of 1..`slices`
 * scheduler slices of 4 ms; rank `slow` adds `slow_ms` over steps
 * [slow_from, slow_to]. Every rank's step is the slowest rank's time plus
 * `comm` ms of exchange; a rank's exposed communication is its wait for the
 * slowest plus that exchange. Fixed seed: the same series every run. */
struct noisy {
    const char *name;
    int world, steps;
    double base, comm, p;
    int slices;
    int slow;
    double slow_ms;
    int slow_from, slow_to;
    int old_flags;      /* 1: the rules without the noise floors name something here */
    int want_straggler; /* the rank that must be named once (-1: nobody) */
};

static const struct noisy noisy_cases[] = {
    /* a 2 ms step with random deschedules, and a burst: rank 1 slowed 8 ms
     * for 7 steps in a row; the exchange is 1/3 of an undisturbed step */
    {"tiny job on a loaded host", 2, 300, 2, 1, 0.25, 6, 1, 8, 50, 56, 1, -1},
    {"tiny job, world 4, noise only", 4, 300, 3, 1.5, 0.1, 5, -1, 0, 0, 0, 1, -1},
    /* a real straggler (+50%) on 30 ms steps stays visible through the noise */
    {"real straggler through the noise", 2, 80, 30, 2, 0.1, 3, 1, 15, 1, 80, 1, 1},
};

static unsigned long long noisy_rng;

static double noisy_u01(void) {
    noisy_rng = noisy_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(noisy_rng >> 11) / 9007199254740992.0;
}

/* The rules before the floors (1 ms gap, no step or span floor, streak 5)
 * on one judged step; returns 1 when some streak reached DIAG_STREAK. */
static int old_rules(int W, const double *own, const double *cm, const double *st, int *slow,
                     int *bound) {
    int hit = 0;
    for (int r = 0; r < W; r++) {
        double v[MAXW];
        int k = 0;
        for (int j = 0; j < W; j++)
            if (j != r) v[k++] = own[j];
        for (int a = 0; a < k; a++) /* insertion sort: k < MAXW */
            for (int b = a; b > 0 && v[b] < v[b - 1]; b--) {
                double t = v[b];
                v[b] = v[b - 1], v[b - 1] = t;
            }
        double peer = k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
        double floor = 0.05 * st[r] > 1.0 ? 0.05 * st[r] : 1.0;
        slow[r] = own[r] > 1.3 * peer && own[r] - peer >= floor ? slow[r] + 1 : 0;
        if (slow[r] >= DIAG_STREAK) hit = 1;
    }
    double least = 2;
    for (int r = 0; r < W; r++)
        if (cm[r] / st[r] < least) least = cm[r] / st[r];
    *bound = least > 0.2 ? *bound + 1 : 0;
    return hit || *bound >= DIAG_STREAK;
}

static void run_noisy(const struct noisy *c) {
    struct diag *d = diag_new(c->world, 0);
    CHECK(d != NULL, "%s: diag_new", c->name);
    if (!d) return;
    noisy_rng = 0x9e3779b97f4a7c15ULL;
    int slow[MAXW] = {0}, bound = 0, old = 0, n = 0;
    struct diag_finding got[16];
    for (int step = 1; step <= c->steps; step++) {
        double own[MAXW], cm[MAXW], st[MAXW], wall = 0;
        for (int r = 0; r < c->world; r++) {
            own[r] = c->base;
            if (noisy_u01() < c->p) own[r] += 4.0 * (1 + (int)(noisy_u01() * c->slices));
            if (r == c->slow && step >= c->slow_from && step <= c->slow_to) own[r] += c->slow_ms;
            if (own[r] > wall) wall = own[r];
        }
        for (int r = 0; r < c->world; r++) {
            st[r] = wall + c->comm;
            cm[r] = wall - own[r] + c->comm;
        }
        old |= old_rules(c->world, own, cm, st, slow, &bound);
        for (int r = 0; r < c->world; r++)
            n += diag_add(d, step, r, st[r], own[r], cm[r], got + n, 16 - n);
    }
    CHECK(old == c->old_flags, "%s: the rules without floors flag it: %d, want %d", c->name, old,
          c->old_flags);
    int want = c->want_straggler >= 0;
    CHECK(n == want, "%s: %d finding(s), want %d (first: kind %d rank %d step %ld)", c->name, n,
          want, n ? (int)got[0].kind : -1, n ? got[0].rank : -1, n ? got[0].step : -1L);
    if (want && n == 1)
        CHECK(got[0].kind == DIAG_STRAGGLER && got[0].rank == c->want_straggler,
              "%s: kind %d rank %d", c->name, got[0].kind, got[0].rank);
    diag_free(d);
}

/* Recorded steps (ms: step, compute, exposed communication; rank 0 then
 * rank 1) of integration.netns.cluster's dp2 job over 8 Mbit/s links: the
 * compute is a few ms and noisy, so at step 4, 5, 7, 10, 11 and 12 one rank
 * or the other is slow by the STRAGGLER test for that one step; the exchange
 * is 113-141 ms of every step on both. COMM_BOUND must be named (at step 5:
 * 5 steps covering 645 ms), and no straggler. */
static void test_recorded_commbound(void) {
    static const double ms[12][2][3] = {
        {{143, 25, 117}, {139, 18, 121}}, {{147, 26, 121}, {149, 28, 121}},
        {{123, 2, 121}, {121, 2, 120}},   {{131, 17, 114}, {132, 2, 130}},
        {{127, 1, 126}, {128, 15, 113}},  {{122, 2, 121}, {122, 2, 120}},
        {{130, 2, 128}, {129, 11, 118}},  {{120, 6, 113}, {119, 3, 117}},
        {{140, 21, 119}, {141, 18, 123}}, {{126, 2, 125}, {126, 11, 115}},
        {{130, 18, 113}, {130, 10, 120}}, {{143, 2, 141}, {142, 24, 118}}};
    struct diag *d = diag_new(2, 0);
    CHECK(d != NULL, "recorded: diag_new");
    if (!d) return;
    struct diag_finding got[8];
    int n = 0;
    for (int st = 0; st < 12; st++)
        for (int r = 0; r < 2; r++)
            n += diag_add(d, st + 1, r, ms[st][r][0], ms[st][r][1], ms[st][r][2], got + n, 8 - n);
    CHECK(n == 1 && got[0].kind == DIAG_COMM_BOUND && got[0].step == 5,
          "recorded comm-bound run: %d finding(s), first kind %d step %ld", n,
          n ? (int)got[0].kind : -1, n ? got[0].step : -1L);
    diag_free(d);
}

/* The stored per-rank series: every step of a short job, about
 * DIAG_SERIES_POINTS of a long one (its last included), and a bounded,
 * slowly growing count when the job's steps are not known. */
static void test_series(void) {
    static const struct {
        long steps, upto;
        long lo, hi; /* kept steps of 1..upto within [lo, hi] */
    } rows[] = {
        {100, 100, 100, 100},
        {DIAG_SERIES_POINTS, DIAG_SERIES_POINTS, DIAG_SERIES_POINTS, DIAG_SERIES_POINTS},
        {DIAG_SERIES_POINTS + 1, DIAG_SERIES_POINTS + 1, DIAG_SERIES_POINTS / 2,
         DIAG_SERIES_POINTS / 2 + 1},
        {1000000, 1000000, DIAG_SERIES_POINTS, DIAG_SERIES_POINTS + 1},
        {999999, 999999, DIAG_SERIES_POINTS, DIAG_SERIES_POINTS + 1},
        {0, DIAG_SERIES_POINTS, DIAG_SERIES_POINTS, DIAG_SERIES_POINTS},
        /* unknown length: 2000 + 1000 per doubling (2^10 x 2000 steps) */
        {0, 1024L * DIAG_SERIES_POINTS, 12 * DIAG_SERIES_POINTS / 2, 12 * DIAG_SERIES_POINTS / 2},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        long kept = 0;
        for (long s = 1; s <= rows[i].upto; s++)
            kept += diag_series_keep(s, rows[i].steps);
        CHECK(kept >= rows[i].lo && kept <= rows[i].hi, "series of %ld steps (known %ld): %ld kept",
              rows[i].upto, rows[i].steps, kept);
        if (rows[i].steps > 0)
            CHECK(diag_series_keep(rows[i].steps, rows[i].steps), "the last step %ld is kept",
                  rows[i].steps);
    }
}

static void test_times(void) {
    json_t *ok = json_loads("{\"ms\":{\"step\":10,\"compute\":7.5,\"comm_exposed\":2.5}}", 0, NULL);
    json_t *bad = json_loads("{\"ms\":{\"step\":10,\"compute\":7.5}}", 0, NULL);
    json_t *dw = json_loads(
        "{\"ms\":{\"step\":10,\"compute\":6,\"comm_exposed\":2.5,\"data_wait\":1.5}}", 0, NULL);
    double st = 0, cp = 0, cm = 0;
    CHECK_EQ_INT(diag_times(ok, &st, &cp, &cm), 0);
    CHECK_NEAR(st, 10, 0);
    CHECK_NEAR(cp, 7.5, 0);
    CHECK_NEAR(cm, 2.5, 0);
    CHECK_EQ_INT(diag_times(dw, &st, &cp, &cm), 0);
    CHECK_NEAR(cp, 7.5, 0); /* own time: compute + data_wait */
    CHECK_NEAR(cm, 2.5, 0);
    json_decref(dw);
    CHECK_EQ_INT(diag_times(bad, &st, &cp, &cm), -1);
    CHECK_EQ_INT(diag_times(NULL, &st, &cp, &cm), -1);
    json_decref(ok);
    json_decref(bad);
}

/* Saw-tooth: series written out per case; "report" is the sample index
 * (0-based) at which the finding must come, -1 for never. */
struct saw_case {
    const char *name;
    int n;
    double u[40];
    int report;
    int swings; /* counted at the report */
};

static const struct saw_case saw_cases[] = {
    {"steady busy",
     20,
     {95, 96, 94, 95, 97, 95, 96, 94, 95, 95, 96, 94, 95, 97, 95, 96, 94, 95, 95, 96},
     -1,
     0},
    {"steady idle", 16, {5, 3, 4, 6, 2, 5, 3, 4, 6, 2, 5, 3, 4, 6, 2, 5}, -1, 0},
    {"saw-tooth 90/10 every sample: reported when the window fills",
     20,
     {90, 10, 90, 10, 90, 10, 90, 10, 90, 10, 90, 10, 90, 10, 90, 10, 90, 10, 90, 10},
     15,
     15},
    {"saw-tooth of two-sample teeth: 7 swings in 16",
     16,
     {90, 90, 10, 10, 90, 90, 10, 10, 90, 90, 10, 10, 90, 90, 10, 10},
     15,
     7},
    {"five swings only: not enough",
     16,
     {90, 90, 90, 10, 10, 10, 90, 90, 90, 10, 10, 10, 90, 90, 10, 10},
     -1,
     0},
    {"wobble inside the band (40-60): no swing",
     16,
     {40, 60, 40, 60, 40, 60, 40, 60, 40, 60, 40, 60, 40, 60, 40, 60},
     -1,
     0},
    {"mid values between the levels do not count as a move",
     16,
     {90, 50, 90, 50, 10, 50, 10, 50, 90, 50, 10, 50, 90, 50, 10, 50},
     -1,
     0},
    {"exactly at the levels (70 / 30) counts",
     16,
     {70, 30, 70, 30, 70, 30, 70, 30, 50, 50, 50, 50, 50, 50, 50, 50},
     15,
     7},
    {"8 swings in all, at most 4 in any 16 samples: not reported",
     19,
     {90, 10, 90, 10, 95, 95, 95, 95, 95, 95, 95, 95, 95, 95, 95, 95, 10, 90, 10},
     -1,
     0},
};

static void test_sawtooth(void) {
    for (size_t i = 0; i < sizeof saw_cases / sizeof *saw_cases; i++) {
        const struct saw_case *c = &saw_cases[i];
        struct diag *d = diag_new(2, 2);
        int at = -1;
        struct diag_finding f = {0}, g;
        for (int k = 0; k < c->n; k++) {
            diag_util_add(d, 0, 95, &g); /* rank 0 steady: never named */
            if (diag_util_add(d, 1, c->u[k], &g) && at < 0) {
                at = k;
                f = g;
            } else if (at >= 0) {
                CHECK(!diag_util_add(d, 1, c->u[k], &g), "%s: reported twice", c->name);
            }
        }
        CHECK(at == c->report, "%s: reported at sample %d, want %d", c->name, at, c->report);
        if (at >= 0) {
            CHECK(f.kind == DIAG_SAWTOOTH && f.rank == 1 && (int)f.value == c->swings,
                  "%s: kind %d rank %d swings %g", c->name, f.kind, f.rank, f.value);
            CHECK(f.compute_ms <= DIAG_SAW_LOW && f.peer_ms >= DIAG_SAW_HIGH, "%s: range %g..%g",
                  c->name, f.compute_ms, f.peer_ms);
        }
        diag_free(d);
    }
}

static void test_advice(void) {
    static const struct {
        const char *spec, *fragment;
    } rows[] = {
        {"{\"parallel\":{\"dp\":4,\"zero_stage\":3}}", "stage 1"},
        {"{\"parallel\":{\"dp\":4,\"zero_stage\":2}}", "every micro-step"},
        {"{\"parallel\":{\"dp\":2,\"tp\":4,\"zero_stage\":1}}", "keep tp inside one node"},
        {"{\"parallel\":{\"dp\":2}}", "larger micro-batch"},
        {"{}", "larger micro-batch"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        json_t *s = json_loads(rows[i].spec, 0, NULL);
        const char *a = diag_comm_advice(s);
        CHECK(a && strstr(a, rows[i].fragment), "advice for %s: %s", rows[i].spec, a);
        json_decref(s);
    }
}

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(&cases[i]);
    CHECK(diag_new(0, 0) == NULL, "world 0");
    diag_free(NULL);
    for (size_t i = 0; i < sizeof noisy_cases / sizeof *noisy_cases; i++)
        run_noisy(&noisy_cases[i]);
    test_recorded_commbound();
    test_series();
    test_times();
    test_sawtooth();
    test_advice();
    return check_summary("test_diagnose");
}
