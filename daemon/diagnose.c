/* Straggler and communication-bound diagnosis: see diagnose.h. */
#include "daemon/diagnose.h"

#include <stdlib.h>
#include <string.h>

struct diag_slot {
    long step; /* -1: empty */
    int have;  /* ranks reported */
    double *step_ms, *compute_ms, *comm_ms;
    unsigned char *seen;
};

struct diag {
    int world;
    int group; /* ranks per peer group (pipeline stage) */
    long next; /* the next step to judge; -1 before the first record */
    struct diag_slot slots[DIAG_SLOTS];
    int *slow_streak;   /* per rank */
    double *slow_span;  /* per rank: wall ms the current streak covers */
    int *slow_reported; /* per rank */
    int comm_streak, comm_reported;
    double comm_span;
    double *scratch; /* world values */
    /* saw-tooth: per rank a ring of the last DIAG_SAW_WINDOW samples */
    double *util;   /* world x DIAG_SAW_WINDOW */
    int *util_n;    /* samples held per rank (<= window) */
    int *util_head; /* next write position per rank */
    int saw_reported;
};

struct diag *diag_new(int world, int group) {
    if (world < 1) return NULL;
    struct diag *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->world = world;
    d->group = group > 0 && group < world ? group : world;
    d->next = -1;
    size_t w = (size_t)world;
    int ok =
        (d->slow_streak = calloc(w, sizeof(int))) && (d->slow_span = calloc(w, sizeof(double))) &&
        (d->slow_reported = calloc(w, sizeof(int))) && (d->scratch = calloc(w, sizeof(double))) &&
        (d->util = calloc(w * DIAG_SAW_WINDOW, sizeof(double))) &&
        (d->util_n = calloc(w, sizeof(int))) && (d->util_head = calloc(w, sizeof(int)));
    for (int i = 0; ok && i < DIAG_SLOTS; i++) {
        struct diag_slot *s = &d->slots[i];
        s->step = -1;
        ok = (s->step_ms = calloc(w, sizeof(double))) &&
             (s->compute_ms = calloc(w, sizeof(double))) &&
             (s->comm_ms = calloc(w, sizeof(double))) && (s->seen = calloc(w, 1));
    }
    if (!ok) {
        diag_free(d);
        return NULL;
    }
    return d;
}

void diag_free(struct diag *d) {
    if (!d) return;
    for (int i = 0; i < DIAG_SLOTS; i++) {
        free(d->slots[i].step_ms);
        free(d->slots[i].compute_ms);
        free(d->slots[i].comm_ms);
        free(d->slots[i].seen);
    }
    free(d->slow_streak);
    free(d->slow_span);
    free(d->slow_reported);
    free(d->scratch);
    free(d->util);
    free(d->util_n);
    free(d->util_head);
    free(d);
}

static void slot_reset(struct diag *d, struct diag_slot *s, long step) {
    s->step = step;
    s->have = 0;
    memset(s->seen, 0, (size_t)d->world);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* An index of value x in the sorted v[0..n) (x is one of them). */
static int sorted_index(const double *v, int n, double x) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Median of the sorted v[0..n) with v[i] left out (n >= 2). */
static double median_without(const double *v, int n, int i) {
    int m = n - 1;
#define AT(p) ((p) < i ? v[(p)] : v[(p) + 1])
    double med = m % 2 ? AT(m / 2) : 0.5 * (AT(m / 2 - 1) + AT(m / 2));
#undef AT
    return med;
}

static void break_streaks(struct diag *d) {
    memset(d->slow_streak, 0, (size_t)d->world * sizeof(int));
    memset(d->slow_span, 0, (size_t)d->world * sizeof(double));
    d->comm_streak = 0;
    d->comm_span = 0;
}

/* Judges one complete step; returns the findings written. */
static int judge(struct diag *d, const struct diag_slot *s, struct diag_finding *out, int max) {
    int n = 0, W = d->world;
    if (W < 2) return 0; /* nothing to compare, no communication */
    /* the noise floor: steps this short are scheduling noise, not judged */
    memcpy(d->scratch, s->step_ms, (size_t)W * sizeof(double));
    double wall = median(d->scratch, W);
    if (wall < DIAG_MIN_STEP_MS) {
        break_streaks(d);
        return 0;
    }
    int g0 = -1, G = 0; /* the group whose compute times are sorted in scratch */
    int straggling = 0; /* some rank is a straggler by the rule at this step */
    for (int r = 0; r < W && d->group > 1; r++) {
        if (r / d->group * d->group != g0) {
            /* sorted once per group: each rank's peer median is then the
             * median with its own value left out, O(1) (was a sort per rank:
             * 30 us a record at world 512) */
            g0 = r / d->group * d->group;
            G = g0 + d->group <= W ? d->group : W - g0;
            memcpy(d->scratch, s->compute_ms + g0, (size_t)G * sizeof(double));
            qsort(d->scratch, (size_t)G, sizeof(double), cmp_double);
        }
        if (G < 2) continue;
        double c = s->compute_ms[r];
        double peer = median_without(d->scratch, G, sorted_index(d->scratch, G, c));
        double floor = DIAG_MIN_GAP_FRAC * s->step_ms[r];
        if (floor < DIAG_MIN_GAP_MS) floor = DIAG_MIN_GAP_MS;
        int slow = c > DIAG_STRAGGLER_RATIO * peer && c - peer >= floor;
        d->slow_streak[r] = slow ? d->slow_streak[r] + 1 : 0;
        d->slow_span[r] = slow ? d->slow_span[r] + s->step_ms[r] : 0;
        int named = slow && d->slow_streak[r] >= DIAG_STREAK && d->slow_span[r] >= DIAG_MIN_SPAN_MS;
        straggling |= named;
        if (named && !d->slow_reported[r] && n < max) {
            d->slow_reported[r] = 1;
            out[n++] = (struct diag_finding){.kind = DIAG_STRAGGLER,
                                             .step = s->step,
                                             .rank = r,
                                             .value = peer > 0 ? c / peer - 1 : 0,
                                             .compute_ms = c,
                                             .peer_ms = peer,
                                             .streak = d->slow_streak[r]};
        }
    }
    double least = 2, least_ms = 0;
    int who = 0;
    for (int r = 0; r < W; r++) {
        double f = s->step_ms[r] > 0 ? s->comm_ms[r] / s->step_ms[r] : 0;
        if (f < least) least = f, who = r;
        if (r == 0 || s->comm_ms[r] < least_ms) least_ms = s->comm_ms[r];
    }
    /* A step at which some rank is a straggler by the rule above is not
     * judged for COMM_BOUND (the streak breaks): a rank that stalls also
     * stalls inside the exchange, where every rank, itself included, waits
     * for it, so its own exposed time is no measure of the network. One slow
     * step is not enough: on exchange-bound steps the small compute is noisy
     * (a rank 15 ms over its peer's 2 ms, now one rank, now the other). */
    int bound = !straggling && least > DIAG_COMM_FRAC && least_ms >= DIAG_MIN_GAP_MS;
    d->comm_streak = bound ? d->comm_streak + 1 : 0;
    d->comm_span = bound ? d->comm_span + wall : 0;
    if (bound && d->comm_streak >= DIAG_STREAK && d->comm_span >= DIAG_MIN_SPAN_MS &&
        !d->comm_reported && n < max) {
        d->comm_reported = 1;
        out[n++] = (struct diag_finding){.kind = DIAG_COMM_BOUND,
                                         .step = s->step,
                                         .rank = who,
                                         .value = least,
                                         .streak = d->comm_streak};
    }
    return n;
}

int diag_add(struct diag *d, long step, int rank, double step_ms, double compute_ms, double comm_ms,
             struct diag_finding *out, int max) {
    if (!d || rank < 0 || rank >= d->world || step < 0) return 0;
    if (d->next < 0) d->next = step;
    if (step < d->next) return 0; /* judged already, or before the first one held */
    if (step >= d->next + DIAG_SLOTS) {
        /* Steps the oldest slots wait for are given up: a gap breaks the
         * streaks (consecutive means consecutive judged steps). */
        d->next = step - DIAG_SLOTS + 1;
        break_streaks(d);
    }
    struct diag_slot *s = &d->slots[step % DIAG_SLOTS];
    if (s->step != step) slot_reset(d, s, step);
    if (!s->seen[rank]) {
        s->seen[rank] = 1;
        s->have++;
    }
    s->step_ms[rank] = step_ms;
    s->compute_ms[rank] = compute_ms;
    s->comm_ms[rank] = comm_ms;
    int n = 0;
    for (;;) {
        struct diag_slot *q = &d->slots[d->next % DIAG_SLOTS];
        if (q->step != d->next || q->have < d->world) break;
        n += judge(d, q, out + n, max - n);
        q->step = -1;
        d->next++;
    }
    return n;
}

int diag_util_add(struct diag *d, int rank, double util_pct, struct diag_finding *out) {
    if (!d || rank < 0 || rank >= d->world) return 0;
    double *ring = d->util + (size_t)rank * DIAG_SAW_WINDOW;
    ring[d->util_head[rank]] = util_pct;
    d->util_head[rank] = (d->util_head[rank] + 1) % DIAG_SAW_WINDOW;
    if (d->util_n[rank] < DIAG_SAW_WINDOW) d->util_n[rank]++;
    if (d->saw_reported || d->util_n[rank] < DIAG_SAW_WINDOW) return 0;
    /* oldest to newest; state -1 idle, +1 busy, 0 not yet known */
    int state = 0, swings = 0;
    double lo = 100, hi = 0;
    for (int k = 0; k < DIAG_SAW_WINDOW; k++) {
        double u = ring[(d->util_head[rank] + k) % DIAG_SAW_WINDOW];
        if (u < lo) lo = u;
        if (u > hi) hi = u;
        int s = u >= DIAG_SAW_HIGH ? 1 : u <= DIAG_SAW_LOW ? -1 : 0;
        if (s == 0) continue;
        if (state != 0 && s != state) swings++;
        state = s;
    }
    if (swings < DIAG_SAW_SWINGS) return 0;
    d->saw_reported = 1;
    *out = (struct diag_finding){.kind = DIAG_SAWTOOTH,
                                 .step = -1,
                                 .rank = rank,
                                 .value = swings,
                                 .compute_ms = lo,
                                 .peer_ms = hi};
    return 1;
}

int diag_times(const json_t *record, double *step_ms, double *compute_ms, double *comm_ms) {
    const json_t *ms = json_object_get(record, "ms");
    const json_t *st = json_object_get(ms, "step"), *cp = json_object_get(ms, "compute"),
                 *cm = json_object_get(ms, "comm_exposed");
    if (!json_is_number(st) || !json_is_number(cp) || !json_is_number(cm)) return -1;
    *step_ms = json_number_value(st);
    /* a rank slow to get its batches holds its peers up like a slow device */
    const json_t *dw = json_object_get(ms, "data_wait");
    *compute_ms = json_number_value(cp) + (json_is_number(dw) ? json_number_value(dw) : 0);
    *comm_ms = json_number_value(cm);
    return 0;
}

int diag_series_keep(long step, long steps) {
    if (step <= 0) return 1;
    if (steps > 0) {
        long k = (steps + DIAG_SERIES_POINTS - 1) / DIAG_SERIES_POINTS;
        return k <= 1 || step % k == 0 || step == steps;
    }
    if (step <= DIAG_SERIES_POINTS) return 1;
    long p = 1;
    while (p * DIAG_SERIES_POINTS < step)
        p *= 2;
    return step % p == 0;
}

/* The planner's communication terms (docs/planner.md) in words, the
 * costliest first. */
const char *diag_comm_advice(const json_t *spec) {
    const json_t *par = json_object_get(spec, "parallel");
    long zero = (long)json_integer_value(json_object_get(par, "zero_stage"));
    long tp = (long)json_integer_value(json_object_get(par, "tp"));
    if (zero >= 3)
        return "ZeRO stage 3 gathers every parameter twice a step: stage 1 sends about a third "
               "as much where the optimizer state fits";
    if (zero == 2) return "ZeRO stage 2 reduces every micro-step: stage 1 reduces once a step";
    if (tp > 1)
        return "tp all-reduces run twice per block and pass: keep tp inside one node (NVLink) "
               "and grow dp or pp across nodes";
    return "a larger micro-batch or more gradient accumulation spreads each gradient exchange "
           "over more tokens";
}
