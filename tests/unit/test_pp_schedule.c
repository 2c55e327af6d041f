/* Pipeline schedules (worker/pp.h), table-driven, no processes:
 *  - every schedule runs each micro-batch's forward and backward exactly
 *    once per stage, the forward first, backwards in micro-batch order;
 *  - the most micro-batches a stage holds = pp_schedule_slots (GPipe M,
 *    1F1B min(pp - stage, M)), the activation memory the runner allocates;
 *  - an event simulation of the stages (forward 1 unit, backward 2 units,
 *    free transfers, each stage executing its action list in order) finishes
 *    in (M + pp - 1) * 3 units for both schedules, i.e. the idle time of
 *    every stage is (pp - 1) * 3 and the bubble fraction (pp-1)/(M+pp-1) =
 *    pp_bubble_ideal; the simulation also proves the order deadlock-free.
 * Usage: test_pp_schedule */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/pp.h"
#include "tests/check.h"

#define MAXP 8
#define MAXM 16

struct tcase {
    int pp, M;
};

static const struct tcase cases[] = {{2, 2}, {2, 4}, {2, 8}, {4, 4},  {4, 8},
                                     {4, 5}, {3, 7}, {8, 8}, {8, 16}, {1, 3}};

/* Simulate; returns the makespan (or -1 on deadlock) and each stage's busy
 * time in busy[]. F takes 1 unit, B 2. */
static double simulate(enum pp_schedule s, int P, int M, double *busy) {
    struct pp_action act[MAXP][2 * MAXM];
    int n[MAXP], pos[MAXP];
    double clock[MAXP], fdone[MAXP][MAXM], bdone[MAXP][MAXM];
    for (int st = 0; st < P; st++) {
        n[st] = pp_schedule_actions(s, P, st, M, act[st]);
        pos[st] = 0;
        clock[st] = 0;
        busy[st] = 0;
        for (int i = 0; i < M; i++)
            fdone[st][i] = bdone[st][i] = -1;
    }
    int progress = 1;
    while (progress) {
        progress = 0;
        for (int st = 0; st < P; st++) {
            while (pos[st] < n[st]) {
                struct pp_action a = act[st][pos[st]];
                double ready;
                if (a.fwd) {
                    ready = st == 0 ? 0 : fdone[st - 1][a.micro];
                } else {
                    ready = st == P - 1 ? fdone[st][a.micro] : bdone[st + 1][a.micro];
                    if (fdone[st][a.micro] < 0) ready = -1;
                }
                if (ready < 0) break; /* waits for another stage */
                double start = clock[st] > ready ? clock[st] : ready, cost = a.fwd ? 1 : 2;
                clock[st] = start + cost;
                busy[st] += cost;
                if (a.fwd)
                    fdone[st][a.micro] = clock[st];
                else
                    bdone[st][a.micro] = clock[st];
                pos[st]++;
                progress = 1;
            }
        }
    }
    double end = 0;
    for (int st = 0; st < P; st++) {
        if (pos[st] < n[st]) return -1;
        end = clock[st] > end ? clock[st] : end;
    }
    return end;
}

int main(void) {
    for (int sc = 0; sc < 2; sc++) {
        enum pp_schedule s = sc ? PP_GPIPE : PP_1F1B;
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            int P = cases[c].pp, M = cases[c].M;
            const char *nm = pp_schedule_name(s);
            for (int st = 0; st < P; st++) {
                struct pp_action a[2 * MAXM];
                int n = pp_schedule_actions(s, P, st, M, a);
                CHECK(n == 2 * M, "%s pp=%d M=%d stage %d: %d actions", nm, P, M, st, n);
                int seenf[MAXM] = {0}, seenb[MAXM] = {0}, inflight = 0, most = 0, nextb = 0;
                for (int k = 0; k < n; k++) {
                    int i = a[k].micro;
                    if (a[k].fwd) {
                        CHECK(!seenf[i], "%s: F%d twice", nm, i);
                        seenf[i] = 1;
                        most = ++inflight > most ? inflight : most;
                    } else {
                        CHECK(seenf[i] && !seenb[i], "%s: B%d before F%d or twice", nm, i, i);
                        CHECK(i == nextb, "%s: B%d out of order (want B%d)", nm, i, nextb);
                        seenb[i] = 1;
                        nextb++;
                        inflight--;
                    }
                }
                int want = s == PP_GPIPE ? M : (P - st < M ? P - st : M);
                CHECK(most == want && pp_schedule_slots(s, P, st, M) == want,
                      "%s pp=%d M=%d stage %d: %d in flight, slots %d, want %d", nm, P, M, st, most,
                      pp_schedule_slots(s, P, st, M), want);
            }
            double busy[MAXP];
            double end = simulate(s, P, M, busy);
            CHECK(end == (M + P - 1) * 3.0, "%s pp=%d M=%d: makespan %g, want %g", nm, P, M, end,
                  (M + P - 1) * 3.0);
            for (int st = 0; st < P && end > 0; st++) {
                double frac = (end - busy[st]) / end;
                CHECK(fabs(frac - pp_bubble_ideal(P, M)) < 1e-12,
                      "%s pp=%d M=%d stage %d: bubble %g, formula %g", nm, P, M, st, frac,
                      pp_bubble_ideal(P, M));
            }
            printf("%-5s pp=%d M=%-2d makespan %3g units, bubble %.4f\n", nm, P, M, end,
                   pp_bubble_ideal(P, M));
        }
    }
    CHECK(pp_schedule_parse("gpipe") == PP_GPIPE && pp_schedule_parse("1f1b") == PP_1F1B &&
              pp_schedule_parse("interleaved") == -1,
          "schedule names");
    return check_summary("test_pp_schedule");
}
