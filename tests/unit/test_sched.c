/* Table-driven tests of the gang scheduler (daemon/sched.c): each case is a
 * cluster state (nodes, busy devices, states, quotas) and a queue, with the
 * expected placement of every job ("a0 a1 b0" = rank 0 on node a device 0,
 * ...) or, for a job left queued, a fragment its pending reason must contain. */
#include "daemon/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 6
#define MAXJ 6

struct tnode {
    const char *name, *kind;
    int ndev;
    uint64_t busy;
    enum sched_node_state state;
};

struct tjob {
    const char *id, *tenant, *kind;
    int prio;
    int64_t submit;
    int world, tp, per_node;
    const char *expect; /* placement, or "-fragment of reason" */
    int avoid1;         /* 1-based index of the node to avoid (0: none) */
};

struct tcase {
    const char *name;
    struct tnode nodes[MAXN];
    struct sched_quota quotas[2];
    struct tjob jobs[MAXJ];
};

#define CPU(n, d)                                                                                  \
    { n, "cpu", d, 0, SCHED_NODE_READY }
#define GPU(n, d)                                                                                  \
    { n, "cuda", d, 0, SCHED_NODE_READY }
#define GPUB(n, d, b)                                                                              \
    { n, "cuda", d, b, SCHED_NODE_READY }
#define GPUS(n, d, s)                                                                              \
    { n, "cuda", d, 0, s }
#define JOB(id, p, t, w, tp, e)                                                                    \
    { id, "t1", "cuda", p, t, w, tp, 0, e, 0 }
#define JOBA(id, w, avoid1, e)                                                                     \
    { id, "t1", "cuda", 50, 1, w, 1, 0, e, avoid1 }

static const struct tcase cases[] = {
    {"single rank on the fullest node that fits (best fit)",
     {GPUB("a", 4, 0x1), GPUB("b", 4, 0x7)},
     {{0}},
     {JOB("j1", 50, 1, 1, 1, "b3")}},
    {"4 ranks across two 2-device cpu nodes",
     {CPU("a", 2), CPU("b", 2)},
     {{0}},
     {{"j1", "t1", "cpu", 50, 1, 4, 1, 0, "a0 a1 b0 b1", 0}}},
    {"pack onto the fewest nodes",
     {GPU("a", 2), GPU("b", 4), GPU("c", 2)},
     {{0}},
     {JOB("j1", 50, 1, 4, 1, "b0 b1 b2 b3")}},
    {"tp group never spans nodes; aligned adjacent blocks",
     {GPUB("a", 4, 0x2), GPUB("b", 4, 0x0)},
     {{0}},
     {JOB("j1", 50, 1, 4, 2, "b0 b1 b2 b3"), JOB("j2", 50, 2, 2, 2, "a2 a3"),
      JOB("j3", 50, 3, 2, 2, "-largest free block is 1 on a")}},
    {"tp=8 on 4-device nodes never fits",
     {GPU("a", 4), GPU("b", 4)},
     {{0}},
     {JOB("j1", 50, 1, 8, 8, "-tp=8 on one node; largest node has 4 (a)"),
      JOB("j2", 50, 2, 8, 4, "a0 a1 a2 a3 b0 b1 b2 b3")}},
    {"gang all-or-nothing: 5 ranks on 4 free devices places none",
     {GPUB("a", 4, 0x3), GPU("b", 2)},
     {{0}},
     {JOB("j1", 50, 1, 5, 1, "-needs 5 GPUs; 4 free (a: 2, b: 2)")}},
    {"priority before submit time",
     {GPU("a", 2)},
     {{0}},
     {JOB("low", 10, 1, 2, 1, "-needs 2 GPUs; 0 free"), JOB("high", 90, 5, 2, 1, "a0 a1")}},
    {"FIFO at equal priority",
     {GPU("a", 2)},
     {{0}},
     {JOB("second", 50, 2, 2, 1, "-needs 2 GPUs; 0 free"), JOB("first", 50, 1, 2, 1, "a0 a1")}},
    {"backfill a small job that does not touch the head's reservation",
     /* a is busy (2 of 4), b idle with 2: head needs 4 on one node (tp=4);
        its reservation is node a (2 free now beats b's 2? tie on cap, a has
        2 free now, b 2) -> lower index a. Small job fits on b. */
     {GPUB("a", 4, 0x3), GPU("b", 2)},
     {{0}},
     {JOB("head", 90, 1, 4, 4, "-largest free block is 2"), JOB("small", 10, 2, 2, 1, "b0 b1")}},
    {"backfill refused when it would take the head's devices",
     {GPUB("a", 4, 0x3), GPU("b", 2)},
     {{0}},
     {JOB("head", 90, 1, 4, 4, "-largest free block is 2"), JOB("s1", 10, 2, 2, 1, "b0 b1"),
      JOB("s2", 10, 3, 2, 1, "-held for job head")}},
    {"drained and lost nodes take no new work",
     {GPUS("a", 4, SCHED_NODE_DRAINED), GPUS("b", 4, SCHED_NODE_LOST), GPU("c", 2)},
     {{0}},
     {JOB("j1", 50, 1, 2, 1, "c0 c1"), JOB("j2", 50, 2, 4, 1, "-ready nodes have 2 in total")}},
    {"no node of the job's device kind",
     {CPU("a", 4)},
     {{0}},
     {JOB("j1", 50, 1, 1, 1, "-no ready node offers GPUs")}},
    {"tenant quota on concurrent GPUs",
     {GPU("a", 8)},
     {{"t1", 4, 2, "team-one"}, {"t2", 0, 0, NULL}},
     {JOB("j1", 90, 1, 4, 1, "-tenant team-one quota: holds 2 of 4"),
      JOB("j2", 50, 2, 2, 1, "a0 a1"),
      {"j3", "t2", "cuda", 10, 3, 6, 1, 0, "a2 a3 a4 a5 a6 a7", 0}}},
    {"quota-blocked head does not reserve",
     {GPU("a", 2)},
     {{"t1", 1, 1, NULL}},
     {JOB("j1", 90, 1, 2, 1, "-quota"), {"j2", "t2", "cuda", 10, 2, 2, 1, 0, "a0 a1", 0}}},
    {"a retry avoids the node its last attempt failed on",
     {GPU("a", 4), GPU("b", 4)},
     {{0}},
     {JOBA("j1", 2, 1, "b0 b1")}},
    {"but not at the cost of an extra node",
     {GPU("a", 4), GPU("b", 2), GPU("c", 2)},
     {{0}},
     {JOBA("j1", 4, 1, "a0 a1 a2 a3")}},
    {"gpus_per_node cap can make a job never fit",
     {GPU("a", 4), GPU("b", 4)},
     {{0}},
     {{"j1", "t1", "cuda", 50, 1, 6, 1, 2, "-at most 2 per node (resources.gpus_per_node)", 0}}},
    {"gpus_per_node caps ranks per node",
     {GPU("a", 4), GPU("b", 4)},
     {{0}},
     {{"j1", "t1", "cuda", 50, 1, 4, 1, 2, "a0 a1 b0 b1", 0}}},
};

static int failures;

static void format_ranks(const struct sched_cluster *c, const struct sched_decision *d, int world,
                         char *buf, size_t len) {
    size_t off = 0;
    buf[0] = 0;
    for (int r = 0; r < world && off < len; r++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s%d", r ? " " : "",
                                c->nodes[d->ranks[r].node].name, d->ranks[r].device);
}

int main(void) {
    int ncases = (int)(sizeof cases / sizeof *cases);
    for (int ci = 0; ci < ncases; ci++) {
        const struct tcase *tc = &cases[ci];
        struct sched_node nodes[MAXN];
        struct sched_job jobs[MAXJ];
        struct sched_decision dec[MAXJ];
        int nn = 0, nj = 0, nq = 0;
        for (; nn < MAXN && tc->nodes[nn].name; nn++) {
            nodes[nn].name = tc->nodes[nn].name;
            nodes[nn].kind = tc->nodes[nn].kind;
            nodes[nn].ndev = tc->nodes[nn].ndev;
            nodes[nn].busy = tc->nodes[nn].busy;
            nodes[nn].state = tc->nodes[nn].state;
        }
        while (nq < 2 && tc->quotas[nq].tenant)
            nq++;
        for (; nj < MAXJ && tc->jobs[nj].id; nj++) {
            const struct tjob *t = &tc->jobs[nj];
            jobs[nj] = (struct sched_job){t->id,    t->tenant, t->kind,     t->prio,      t->submit,
                                          t->world, t->tp,     t->per_node, t->avoid1 - 1};
        }
        struct sched_cluster cl = {nodes, nn, tc->quotas, nq};
        int placed = sched_place(&cl, jobs, nj, dec);
        if (placed < 0) {
            fprintf(stderr, "FAIL [%s]: sched_place returned %d\n", tc->name, placed);
            failures++;
            continue;
        }
        int want_placed = 0;
        for (int j = 0; j < nj; j++) {
            const char *e = tc->jobs[j].expect;
            char got[256];
            if (e[0] != '-') want_placed++;
            if (dec[j].placed) {
                format_ranks(&cl, &dec[j], jobs[j].world, got, sizeof got);
                if (e[0] == '-' || strcmp(got, e)) {
                    fprintf(stderr, "FAIL [%s] job %s: placed at '%s', expected '%s'\n", tc->name,
                            jobs[j].id, got, e);
                    failures++;
                }
            } else if (e[0] != '-' || !strstr(dec[j].reason, e + 1)) {
                fprintf(stderr, "FAIL [%s] job %s: queued with reason '%s', expected '%s'\n",
                        tc->name, jobs[j].id, dec[j].reason, e);
                failures++;
            } else if (!dec[j].reason[0]) {
                fprintf(stderr, "FAIL [%s] job %s: queued with no reason\n", tc->name, jobs[j].id);
                failures++;
            }
        }
        if (placed != want_placed) {
            fprintf(stderr, "FAIL [%s]: placed %d jobs, expected %d\n", tc->name, placed,
                    want_placed);
            failures++;
        }
        sched_decisions_free(dec, nj);
    }

    /* Larger randomized check: placements never overlap busy or each other,
     * tp groups share a node and sit on aligned adjacent devices. */
    unsigned seed = 12345;
    for (int iter = 0; iter < 200; iter++) {
        struct sched_node nodes[MAXN];
        struct sched_job jobs[MAXJ];
        struct sched_decision dec[MAXJ];
        static const char *names[MAXN] = {"n0", "n1", "n2", "n3", "n4", "n5"};
        static const char *ids[MAXJ] = {"j0", "j1", "j2", "j3", "j4", "j5"};
        for (int i = 0; i < MAXN; i++) {
            seed = seed * 1103515245 + 12345;
            nodes[i] =
                (struct sched_node){names[i], "cuda", 8, (seed >> 8) & 0xff,
                                    (seed >> 20) % 5 == 0 ? SCHED_NODE_DRAINED : SCHED_NODE_READY};
        }
        for (int j = 0; j < MAXJ; j++) {
            seed = seed * 1103515245 + 12345;
            int tp = 1 << ((seed >> 9) % 4);
            int world = tp * (1 + (int)((seed >> 13) % 4));
            jobs[j] = (struct sched_job){ids[j], "t", "cuda", (int)((seed >> 17) % 3),   j,
                                         world,  tp,  0,      j % 3 == 0 ? j % MAXN : -1};
        }
        struct sched_cluster cl = {nodes, MAXN, NULL, 0};
        if (sched_place(&cl, jobs, MAXJ, dec) < 0) {
            failures++;
            continue;
        }
        uint64_t used[MAXN];
        for (int i = 0; i < MAXN; i++)
            used[i] = nodes[i].busy;
        for (int j = 0; j < MAXJ; j++) {
            if (!dec[j].placed) {
                if (!dec[j].reason[0]) failures++;
                continue;
            }
            for (int r = 0; r < jobs[j].world; r++) {
                int n = dec[j].ranks[r].node, d = dec[j].ranks[r].device;
                uint64_t bit = (uint64_t)1 << d;
                if (used[n] & bit || nodes[n].state != SCHED_NODE_READY) {
                    fprintf(stderr, "FAIL random %d: job %d rank %d on used/drained %d:%d\n", iter,
                            j, r, n, d);
                    failures++;
                }
                used[n] |= bit;
                int g0 = r - r % jobs[j].tp;
                if (dec[j].ranks[g0].node != n || d != dec[j].ranks[g0].device + r % jobs[j].tp ||
                    dec[j].ranks[g0].device % jobs[j].tp) {
                    fprintf(stderr, "FAIL random %d: job %d rank %d breaks its tp group\n", iter, j,
                            r);
                    failures++;
                }
            }
        }
        sched_decisions_free(dec, MAXJ);
    }
    if (failures) {
        fprintf(stderr, "test_sched: %d failures\n", failures);
        return 1;
    }
    printf("test_sched: %d cases + 200 random clusters ok\n", ncases);
    return 0;
}
