/* Table-driven tests of the gang scheduler (daemon/sched.c): each case is a
 * cluster state (nodes, busy devices, states, quotas) and a queue, with the
 * expected placement of every job ("a0 a1 b0" = rank 0 on node a device 0,
 * ...) or, for a job left queued, a fragment its pending reason must contain.
 * The GPU-type cases run over mixed fleets (H100-SXM, A100-80GB, RTX4090
 * nodes): a job's resources.gpu_type restricts its nodes, its ranks never mix
 * types unless allow_mixed, and its pending reason names the shortage. */
#include "daemon/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 6
#define MAXJ 6
#define MAXT 4

struct tnode {
    const char *name, *kind;
    int ndev;
    uint64_t busy;
    enum sched_node_state state;
    const char *gpu_type; /* NULL: untyped */
};

struct tjob {
    const char *id, *tenant, *kind;
    int prio;
    int64_t submit;
    int world, tp, per_node;
    const char *expect; /* placement, or "-fragment of reason" */
    int avoid1;         /* 1-based index of the node to avoid (0: none) */
    const char *types;  /* resources.gpu_type, space-separated in preference order; NULL: any */
    int mixed;          /* resources.allow_mixed */
};

struct tcase {
    const char *name;
    struct tnode nodes[MAXN];
    struct sched_quota quotas[2];
    struct tjob jobs[MAXJ];
};

#define CPU(n, d)                                                                                  \
    { n, "cpu", d, 0, SCHED_NODE_READY, NULL }
#define GPU(n, d)                                                                                  \
    { n, "cuda", d, 0, SCHED_NODE_READY, NULL }
#define GPUB(n, d, b)                                                                              \
    { n, "cuda", d, b, SCHED_NODE_READY, NULL }
#define GPUS(n, d, s)                                                                              \
    { n, "cuda", d, 0, s, NULL }
/* typed GPU node: type, devices, busy mask */
#define TGPU(n, ty, d, b)                                                                          \
    { n, "cuda", d, b, SCHED_NODE_READY, ty }
#define JOB(id, p, t, w, tp, e)                                                                    \
    { id, "t1", "cuda", p, t, w, tp, 0, e, 0, NULL, 0 }
#define JOBA(id, w, avoid1, e)                                                                     \
    { id, "t1", "cuda", 50, 1, w, 1, 0, e, avoid1, NULL, 0 }
/* typed job: submit order t, world w, tp, types ("A B" or NULL), allow_mixed, expect */
#define TJOB(id, t, w, tp, ty, mx, e)                                                              \
    { id, "t1", "cuda", 50, t, w, tp, 0, e, 0, ty, mx }

static const struct tcase cases[] = {
    {"single rank on the fullest node that fits (best fit)",
     {GPUB("a", 4, 0x1), GPUB("b", 4, 0x7)},
     {{0}},
     {JOB("j1", 50, 1, 1, 1, "b3")}},
    {"4 ranks across two 2-device cpu nodes",
     {CPU("a", 2), CPU("b", 2)},
     {{0}},
     {{"j1", "t1", "cpu", 50, 1, 4, 1, 0, "a0 a1 b0 b1", 0, NULL, 0}}},
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
     {{"t1", 4, 2, "team-one", 0, 0}, {"t2", 0, 0, NULL, 0, 0}},
     {JOB("j1", 90, 1, 4, 1, "-tenant team-one quota: holds 2 of 4"),
      JOB("j2", 50, 2, 2, 1, "a0 a1"),
      {"j3", "t2", "cuda", 10, 3, 6, 1, 0, "a2 a3 a4 a5 a6 a7", 0, NULL, 0}}},
    {"quota-blocked head does not reserve",
     {GPU("a", 2)},
     {{"t1", 1, 1, NULL, 0, 0}},
     {JOB("j1", 90, 1, 2, 1, "-quota"), {"j2", "t2", "cuda", 10, 2, 2, 1, 0, "a0 a1", 0, NULL, 0}}},
    {"QoS max_running_jobs: one already running, limit 2: one more starts",
     {GPU("a", 8)},
     {{"t1", 0, 0, "team-one", 2, 1}},
     {JOB("j1", 90, 1, 1, 1, "a0"),
      JOB("j2", 50, 2, 1, 1, "-tenant team-one max_running_jobs: 2 of 2 jobs running"),
      {"j3", "t2", "cuda", 10, 3, 1, 1, 0, "a1", 0, NULL, 0}}},
    {"QoS max_running_jobs reached: nothing of the tenant starts, others do",
     {GPU("a", 4)},
     {{"t1", 0, 0, NULL, 1, 1}},
     {JOB("j1", 90, 1, 1, 1, "-tenant t1 max_running_jobs: 1 of 1 jobs running"),
      {"j2", "t2", "cuda", 10, 2, 2, 1, 0, "a0 a1", 0, NULL, 0}}},
    {"QoS max_running_jobs 0 is no limit",
     {GPU("a", 4)},
     {{"t1", 0, 0, NULL, 0, 7}},
     {JOB("j1", 90, 1, 1, 1, "a0"), JOB("j2", 50, 2, 1, 1, "a1")}},
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
     {{"j1", "t1", "cuda", 50, 1, 6, 1, 2, "-at most 2 per node (resources.gpus_per_node)", 0, NULL,
       0}}},
    {"gpus_per_node caps ranks per node",
     {GPU("a", 4), GPU("b", 4)},
     {{0}},
     {{"j1", "t1", "cuda", 50, 1, 4, 1, 2, "a0 a1 b0 b1", 0, NULL, 0}}},

    /* ---- GPU types over mixed fleets ---- */
    {"gpu_type restricts the nodes: H100 job skips the fuller A100 node",
     {TGPU("a", "A100-80GB", 8, 0x3), TGPU("h", "H100-SXM", 8, 0)},
     {{0}},
     {TJOB("j1", 1, 2, 1, "H100-SXM", 0, "h0 h1"), TJOB("j2", 2, 2, 1, "A100-80GB", 0, "a2 a3")}},
    {"shortage of the asked type is named: needs 8 x H100-SXM; largest free: 4",
     {TGPU("h", "H100-SXM", 8, 0x0f), TGPU("a", "A100-80GB", 8, 0)},
     {{0}},
     {TJOB("j1", 1, 8, 1, "H100-SXM", 0, "-needs 8 x H100-SXM; largest free: 4 (H100-SXM: h 4)")}},
    {"no node of the type at all: the reason lists what the cluster has",
     {TGPU("a", "A100-80GB", 8, 0), TGPU("r", "RTX4090", 2, 0)},
     {{0}},
     {TJOB("j1", 1, 1, 1, "H200", 0,
           "-no ready node has gpu_type H200 (ready: A100-80GB x 8, RTX4090 x 2)")}},
    {"more than the cluster's pool of the type: never fits",
     {TGPU("h1", "H100-SXM", 4, 0), TGPU("h2", "H100-SXM", 4, 0), TGPU("a", "A100-80GB", 8, 0)},
     {{0}},
     {TJOB("j1", 1, 12, 1, "H100-SXM", 0, "-largest pool of one type is H100-SXM with 8")}},
    {"ranks never mix types: 8 free over 4 H100 + 4 A100 places nothing",
     {TGPU("h", "H100-SXM", 8, 0x0f), TGPU("a", "A100-80GB", 8, 0x0f)},
     {{0}},
     {TJOB("j1", 1, 8, 1, NULL, 0, "-needs 8 x GPUs of one type; largest free: 4")}},
    {"allow_mixed combines them",
     {TGPU("h", "H100-SXM", 8, 0x0f), TGPU("a", "A100-80GB", 8, 0x0f)},
     {{0}},
     {TJOB("j1", 1, 8, 1, NULL, 1, "h4 h5 h6 h7 a4 a5 a6 a7")}},
    {"untyped job takes one type: the one that needs the fewest nodes",
     {TGPU("a1", "A100-80GB", 4, 0), TGPU("a2", "A100-80GB", 4, 0), TGPU("h", "H100-SXM", 8, 0)},
     {{0}},
     {TJOB("j1", 1, 8, 1, NULL, 0, "h0 h1 h2 h3 h4 h5 h6 h7")}},
    {"untyped job, equal nodes: the type with fewer free devices (best fit)",
     {TGPU("h", "H100-SXM", 8, 0), TGPU("r", "RTX4090", 2, 0)},
     {{0}},
     {TJOB("j1", 1, 2, 1, NULL, 0, "r0 r1"),
      TJOB("j2", 2, 8, 8, NULL, 0, "h0 h1 h2 h3 h4 h5 h6 h7")}},
    {"a type list is a preference order: first listed type that fits",
     {TGPU("h", "H100-SXM", 8, 0xfc), TGPU("a", "A100-80GB", 8, 0), TGPU("r", "RTX4090", 2, 0)},
     {{0}},
     {TJOB("j1", 1, 4, 1, "H100-SXM A100-80GB", 0, "a0 a1 a2 a3"),
      TJOB("j2", 2, 2, 1, "H100-SXM A100-80GB", 0, "h0 h1"),
      TJOB("j3", 3, 2, 1, "RTX4090 H100-SXM", 0, "r0 r1")}},
    {"multi-node job of one type across two H100 nodes, not onto the A100 node",
     {TGPU("p", "H100-SXM", 8, 0xf0), TGPU("a", "A100-80GB", 8, 0), TGPU("q", "H100-SXM", 8, 0xf0)},
     {{0}},
     {TJOB("j1", 1, 8, 2, "H100-SXM", 0, "p0 p1 p2 p3 q0 q1 q2 q3")}},
    {"mixed with a list: only listed types, combined",
     {TGPU("h", "H100-SXM", 4, 0x3), TGPU("a", "A100-80GB", 4, 0x3), TGPU("r", "RTX4090", 2, 0)},
     {{0}},
     {TJOB("j1", 1, 4, 1, "H100-SXM A100-80GB", 1, "h2 h3 a2 a3"),
      TJOB("j2", 2, 4, 1, "H100-SXM A100-80GB", 1,
           "-needs 4 x H100-SXM|A100-80GB; largest free: 0")}},
    {"tp groups of a typed job: largest free names the type's nodes",
     {TGPU("h", "H100-SXM", 8, 0x55), TGPU("a", "A100-80GB", 8, 0)},
     {{0}},
     {TJOB("j1", 1, 4, 4, "H100-SXM", 0,
           "-needs 4 x H100-SXM with tp=4 on one node; largest free: 4")}},
    {"a typed head reserves only its type: an A100 job backfills",
     {TGPU("h", "H100-SXM", 8, 0x0f), TGPU("a", "A100-80GB", 8, 0)},
     {{0}},
     {{"head", "t1", "cuda", 90, 1, 8, 1, 0, "-needs 8 x H100-SXM", 0, "H100-SXM", 0},
      TJOB("small", 2, 8, 1, "A100-80GB", 0, "a0 a1 a2 a3 a4 a5 a6 a7"),
      TJOB("h4", 3, 4, 1, "H100-SXM", 0, "-held for job head")}},
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
            nodes[nn].gpu_type = tc->nodes[nn].gpu_type;
        }
        while (nq < 2 && tc->quotas[nq].tenant)
            nq++;
        char tbuf[MAXJ][MAXT][24];
        const char *tptr[MAXJ][MAXT];
        for (; nj < MAXJ && tc->jobs[nj].id; nj++) {
            const struct tjob *t = &tc->jobs[nj];
            int nt = 0;
            for (const char *p = t->types; p && *p && nt < MAXT;) {
                size_t l = strcspn(p, " ");
                snprintf(tbuf[nj][nt], sizeof tbuf[nj][nt], "%.*s", (int)l, p);
                tptr[nj][nt] = tbuf[nj][nt];
                nt++;
                p += l + (p[l] == ' ');
            }
            jobs[nj] = (struct sched_job){
                t->id,       t->tenant,     t->kind,  t->prio, t->submit, t->world, t->tp,
                t->per_node, t->avoid1 - 1, tptr[nj], nt,      t->mixed,  0.0};
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
        static const char *const types[3] = {"H100-SXM", "A100-80GB", "RTX4090"};
        for (int i = 0; i < MAXN; i++) {
            seed = seed * 1103515245 + 12345;
            nodes[i] =
                (struct sched_node){names[i],
                                    "cuda",
                                    8,
                                    (seed >> 8) & 0xff,
                                    (seed >> 20) % 5 == 0 ? SCHED_NODE_DRAINED : SCHED_NODE_READY,
                                    types[(seed >> 24) % 3]};
        }
        for (int j = 0; j < MAXJ; j++) {
            seed = seed * 1103515245 + 12345;
            int tp = 1 << ((seed >> 9) % 4);
            int world = tp * (1 + (int)((seed >> 13) % 4));
            int mixed = (seed >> 27) % 4 == 0;
            jobs[j] = (struct sched_job){ids[j],
                                         "t",
                                         "cuda",
                                         (int)((seed >> 17) % 3),
                                         j,
                                         world,
                                         tp,
                                         0,
                                         j % 3 == 0 ? j % MAXN : -1,
                                         (seed >> 29) % 2 ? &types[(seed >> 25) % 3] : NULL,
                                         (seed >> 29) % 2 ? 1 : 0,
                                         mixed,
                                         0.0};
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
                if (!jobs[j].allow_mixed &&
                    strcmp(nodes[n].gpu_type, nodes[dec[j].ranks[0].node].gpu_type) != 0) {
                    fprintf(stderr, "FAIL random %d: job %d mixes GPU types\n", iter, j);
                    failures++;
                }
                if (jobs[j].ngpu_types && strcmp(nodes[n].gpu_type, jobs[j].gpu_types[0]) != 0) {
                    fprintf(stderr, "FAIL random %d: job %d on a type it did not ask for\n", iter,
                            j);
                    failures++;
                }
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
