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
    int min_cc;         /* train.precision fp8: 89; 0: any node */
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
    { id, "t1", "cuda", p, t, w, tp, 0, e, 0, NULL, 0, 0 }
#define JOBA(id, w, avoid1, e)                                                                     \
    { id, "t1", "cuda", 50, 1, w, 1, 0, e, avoid1, NULL, 0, 0 }
/* typed job: submit order t, world w, tp, types ("A B" or NULL), allow_mixed, expect */
#define TJOB(id, t, w, tp, ty, mx, e)                                                              \
    { id, "t1", "cuda", 50, t, w, tp, 0, e, 0, ty, mx, 0 }
/* an fp8 job (compute capability 8.9 or newer): submit order t, world w, types, expect */
#define FJOB(id, t, w, ty, e)                                                                      \
    { id, "t1", "cuda", 50, t, w, 1, 0, e, 0, ty, 0, 89 }

static const struct tcase cases[] = {
    {"single rank on the fullest node that fits (best fit)",
     {GPUB("a", 4, 0x1), GPUB("b", 4, 0x7)},
     {{0}},
     {JOB("j1", 50, 1, 1, 1, "b3")}},
    {"4 ranks across two 2-device cpu nodes",
     {CPU("a", 2), CPU("b", 2)},
     {{0}},
     {{"j1", "t1", "cpu", 50, 1, 4, 1, 0, "a0 a1 b0 b1", 0, NULL, 0, 0}}},
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
      {"j3", "t2", "cuda", 10, 3, 6, 1, 0, "a2 a3 a4 a5 a6 a7", 0, NULL, 0, 0}}},
    {"quota-blocked head does not reserve",
     {GPU("a", 2)},
     {{"t1", 1, 1, NULL, 0, 0}},
     {JOB("j1", 90, 1, 2, 1, "-quota"),
      {"j2", "t2", "cuda", 10, 2, 2, 1, 0, "a0 a1", 0, NULL, 0, 0}}},
    {"QoS max_running_jobs: one already running, limit 2: one more starts",
     {GPU("a", 8)},
     {{"t1", 0, 0, "team-one", 2, 1}},
     {JOB("j1", 90, 1, 1, 1, "a0"),
      JOB("j2", 50, 2, 1, 1, "-tenant team-one max_running_jobs: 2 of 2 jobs running"),
      {"j3", "t2", "cuda", 10, 3, 1, 1, 0, "a1", 0, NULL, 0, 0}}},
    {"QoS max_running_jobs reached: nothing of the tenant starts, others do",
     {GPU("a", 4)},
     {{"t1", 0, 0, NULL, 1, 1}},
     {JOB("j1", 90, 1, 1, 1, "-tenant t1 max_running_jobs: 1 of 1 jobs running"),
      {"j2", "t2", "cuda", 10, 2, 2, 1, 0, "a0 a1", 0, NULL, 0, 0}}},
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
       0, 0}}},
    {"gpus_per_node caps ranks per node",
     {GPU("a", 4), GPU("b", 4)},
     {{0}},
     {{"j1", "t1", "cuda", 50, 1, 4, 1, 2, "a0 a1 b0 b1", 0, NULL, 0, 0}}},

    /* ---- GPU types over mixed fleets ---- */
    {"fp8 skips the A100 (no FP8 tensor cores) for the RTX4090 and H100 nodes",
     {TGPU("a", "A100-80GB", 8, 0), TGPU("r", "RTX4090", 2, 0x1), TGPU("h", "H100-SXM", 8, 0xfe)},
     {{0}},
     {FJOB("j1", 1, 1, NULL, "h0"), FJOB("j2", 2, 1, NULL, "r1"), JOB("j3", 50, 3, 1, 1, "a0")}},
    {"fp8 on a fleet of A100s and untyped nodes: the reason names the capability",
     {TGPU("a", "A100-80GB", 8, 0), GPU("u", 4)},
     {{0}},
     {FJOB("j1", 1, 1, NULL,
           "-train.precision fp8 needs FP8 tensor cores (compute capability 8.9 or newer: L4, L40, "
           "L40S, RTX4090, H100, H200, B200); no ready node has them (ready: A100-80GB 8.0, "
           "untyped)")}},
    {"fp8 asking the A100 by name: never placed",
     {TGPU("a", "A100-80GB", 8, 0), TGPU("h", "H100-SXM", 8, 0)},
     {{0}},
     {FJOB("j1", 1, 1, "A100-80GB", "-no ready node has gpu_type A100-80GB")}},
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
     {{"head", "t1", "cuda", 90, 1, 8, 1, 0, "-needs 8 x H100-SXM", 0, "H100-SXM", 0, 0},
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

/* ---- NVLink islands and node selectors ----
 * Nodes are cuda nodes with islands written "0246|1357" (hex device digits
 * per island; NULL: none reported), a pool and labels "k=v k=v". */
struct xnode {
    const char *name;
    int ndev;
    uint64_t busy;
    const char *islands, *pool, *labels;
    enum sched_node_state state;
};

struct xjob {
    const char *id;
    int world, tp;
    const char *pool, *labels;
    const char *expect; /* placement, or "-fragment of reason" */
    int cross;          /* expected cross_island when placed */
};

struct xcase {
    const char *name;
    struct xnode nodes[3];
    struct xjob jobs[3];
};

static const struct xcase xcases[] = {
    {"tp=4 on an 8-GPU node with two interleaved islands of 4 gets one island",
     {{"a", 8, 0, "0246|1357", NULL, NULL, SCHED_NODE_READY}},
     {{"j1", 4, 4, NULL, NULL, "a0 a2 a4 a6", 0}, {"j2", 4, 4, NULL, NULL, "a1 a3 a5 a7", 0}}},
    {"one device of island 0 busy: the free island, not adjacent devices 4-7",
     {{"a", 8, 0x01, "0246|1357", NULL, NULL, SCHED_NODE_READY}},
     {{"j1", 4, 4, NULL, NULL, "a1 a3 a5 a7", 0}}},
    {"6 free but 3 per island: tp=4 waits and the reason says why",
     {{"a", 8, 0x03, "0246|1357", NULL, NULL, SCHED_NODE_READY}},
     {{"j1", 4, 4, NULL, NULL,
       "-needs 4 GPUs with tp=4 inside one NVLink island; most free in one island is 3 on a "
       "(6 free in total)",
       0}}},
    {"tp=2 pairs stay inside islands of 4 (0123|4567); any two free devices of one island pair",
     {{"a", 8, 0x05, "0123|4567", NULL, NULL, SCHED_NODE_READY}},
     {{"j1", 4, 2, NULL, NULL, "a1 a3 a4 a5", 0}, {"j2", 2, 2, NULL, NULL, "a6 a7", 0}}},
    {"tp=8 is larger than every island: placed across them, counted for the warning",
     {{"a", 8, 0, "0123|4567", NULL, NULL, SCHED_NODE_READY}},
     {{"j1", 8, 8, NULL, NULL, "a0 a1 a2 a3 a4 a5 a6 a7", 1}}},
    {"an island node and a node without NVLink: tp=4 world 8 over both",
     {{"a", 8, 0xa0, "0246|1357", NULL, NULL, SCHED_NODE_READY},
      {"b", 4, 0, NULL, NULL, NULL, SCHED_NODE_READY}},
     {{"j1", 8, 4, NULL, NULL, "a0 a2 a4 a6 b0 b1 b2 b3", 0},
      {"j2", 4, 4, NULL, NULL,
       "-needs 4 GPUs with tp=4 inside one NVLink island; most free in one island is 2 on a", 0}}},
    {"all 8 in one island (NVSwitch): as a node without islands",
     {{"a", 8, 0x0f, "01234567", NULL, NULL, SCHED_NODE_READY}},
     {{"j1", 4, 4, NULL, NULL, "a4 a5 a6 a7", 0}}},
    {"resources.pool: only the pool's node, though the other fits better",
     {{"a", 4, 0x7, NULL, "", NULL, SCHED_NODE_READY},
      {"b", 4, 0, NULL, "train", NULL, SCHED_NODE_READY}},
     {{"j1", 1, 1, "train", NULL, "b0", 0}, {"j2", 1, 1, NULL, NULL, "a3", 0}}},
    {"resources.labels: every key=value must be on the node",
     {{"a", 4, 0, NULL, NULL, "zone=eu", SCHED_NODE_READY},
      {"b", 4, 0, NULL, NULL, "ib=yes zone=us", SCHED_NODE_READY}},
     {{"j1", 2, 1, NULL, "zone=us", "b0 b1", 0},
      {"j2", 2, 1, NULL, "ib=yes zone=eu", "-no ready node matches resources.labels ib=yes zone=eu",
       0},
      {"j3", 2, 1, NULL, "zone=eu", "a0 a1", 0}}},
    {"a pool no ready node has: the reason names it (the pool's node is drained)",
     {{"a", 4, 0, NULL, "gpu-b", NULL, SCHED_NODE_DRAINED},
      {"b", 4, 0, NULL, "gpu-a", NULL, SCHED_NODE_READY}},
     {{"j1", 1, 1, "gpu-b", NULL, "-no ready node matches resources.pool=gpu-b (1 ready node", 0}}},
    {"selected node busy: the shortage counts only matching nodes",
     {{"a", 4, 0xe, NULL, "p", "zone=eu", SCHED_NODE_READY},
      {"b", 4, 0, NULL, "q", "zone=eu", SCHED_NODE_READY}},
     {{"j1", 2, 1, "p", "zone=eu", "-needs 2 GPUs; 1 free (a: 1)", 0}}},
    {"selector larger than its nodes: never fits on the pool",
     {{"a", 4, 0, NULL, "p", NULL, SCHED_NODE_READY},
      {"b", 8, 0, NULL, "q", NULL, SCHED_NODE_READY}},
     {{"j1", 8, 1, "p", NULL, "-the 1 ready nodes have 4 in total", 0}}},
};

static int parse_islands(const char *spec, uint64_t *out) {
    int n = 0;
    for (const char *p = spec; p && *p && n < 8;) {
        uint64_t m = 0;
        for (; *p && *p != '|'; p++)
            m |= (uint64_t)1 << (*p <= '9' ? *p - '0' : *p - 'a' + 10);
        out[n++] = m;
        if (*p == '|') p++;
    }
    return n;
}

/* "k=v k=v" into keys/vals (buffers of 8 x 32 each). */
static int parse_kv(const char *spec, char (*kb)[32], char (*vb)[32], const char **keys,
                    const char **vals) {
    int n = 0;
    for (const char *p = spec; p && *p && n < 8;) {
        size_t l = strcspn(p, " "), e = strcspn(p, "=");
        snprintf(kb[n], 32, "%.*s", (int)e, p);
        snprintf(vb[n], 32, "%.*s", (int)(l - e - 1), p + e + 1);
        keys[n] = kb[n];
        vals[n] = vb[n];
        n++;
        p += l + (p[l] == ' ');
    }
    return n;
}

static void run_xcases(void) {
    for (size_t ci = 0; ci < sizeof xcases / sizeof *xcases; ci++) {
        const struct xcase *tc = &xcases[ci];
        struct sched_node nodes[3];
        struct sched_job jobs[3];
        struct sched_decision dec[3];
        uint64_t isl[3][8];
        char nk[3][8][32], nv[3][8][32], jk[3][8][32], jv[3][8][32];
        const char *nkp[3][8], *nvp[3][8], *jkp[3][8], *jvp[3][8];
        int nn = 0, nj = 0;
        for (; nn < 3 && tc->nodes[nn].name; nn++) {
            const struct xnode *x = &tc->nodes[nn];
            memset(&nodes[nn], 0, sizeof nodes[nn]);
            nodes[nn].name = x->name;
            nodes[nn].kind = "cuda";
            nodes[nn].ndev = x->ndev;
            nodes[nn].busy = x->busy;
            nodes[nn].state = x->state;
            nodes[nn].nislands = parse_islands(x->islands, isl[nn]);
            nodes[nn].islands = isl[nn];
            nodes[nn].pool = x->pool;
            nodes[nn].nlabels = parse_kv(x->labels, nk[nn], nv[nn], nkp[nn], nvp[nn]);
            nodes[nn].label_keys = nkp[nn];
            nodes[nn].label_vals = nvp[nn];
        }
        for (; nj < 3 && tc->jobs[nj].id; nj++) {
            const struct xjob *x = &tc->jobs[nj];
            memset(&jobs[nj], 0, sizeof jobs[nj]);
            jobs[nj].id = x->id;
            jobs[nj].tenant = "t1";
            jobs[nj].kind = "cuda";
            jobs[nj].priority = 50;
            jobs[nj].submit_ms = nj;
            jobs[nj].world = x->world;
            jobs[nj].tp = x->tp;
            jobs[nj].avoid_node = -1;
            jobs[nj].pool = x->pool;
            jobs[nj].nsel = parse_kv(x->labels, jk[nj], jv[nj], jkp[nj], jvp[nj]);
            jobs[nj].sel_keys = jkp[nj];
            jobs[nj].sel_vals = jvp[nj];
        }
        struct sched_cluster cl = {nodes, nn, NULL, 0};
        if (sched_place(&cl, jobs, nj, dec) < 0) {
            fprintf(stderr, "FAIL [%s]: sched_place failed\n", tc->name);
            failures++;
            continue;
        }
        for (int j = 0; j < nj; j++) {
            const char *e = tc->jobs[j].expect;
            char got[256];
            if (dec[j].placed) {
                format_ranks(&cl, &dec[j], jobs[j].world, got, sizeof got);
                /* "b0 b1 b2 b3 -": the first ranks as written, the rest anywhere */
                size_t el = strlen(e);
                int prefix = el > 2 && !strcmp(e + el - 2, " -");
                int ok =
                    e[0] != '-' && (prefix ? strncmp(got, e, el - 2) == 0 : strcmp(got, e) == 0);
                if (!ok || dec[j].cross_island != tc->jobs[j].cross) {
                    fprintf(stderr,
                            "FAIL [%s] job %s: placed at '%s' (cross_island %d), expected '%s' "
                            "(%d)\n",
                            tc->name, jobs[j].id, got, dec[j].cross_island, e, tc->jobs[j].cross);
                    failures++;
                }
            } else if (e[0] != '-' || !strstr(dec[j].reason, e + 1)) {
                fprintf(stderr, "FAIL [%s] job %s: queued with reason '%s', expected '%s'\n",
                        tc->name, jobs[j].id, dec[j].reason, e);
                failures++;
            }
        }
        sched_decisions_free(dec, nj);
    }
}

/* Random island layouts: every tp group sits inside one island whenever some
 * island of its node can hold tp devices; cross_island counts the others. */
static void run_island_random(void) {
    unsigned seed = 777;
    int placed = 0, crossed = 0;
    for (int iter = 0; iter < 300; iter++) {
        struct sched_node nodes[2];
        uint64_t isl[2][8];
        static const char *names[2] = {"p", "q"};
        for (int i = 0; i < 2; i++) {
            memset(&nodes[i], 0, sizeof nodes[i]);
            /* assign each of 8 devices to one of k islands at random */
            seed = seed * 1103515245 + 12345;
            int k = 1 + (int)((seed >> 16) % 4);
            memset(isl[i], 0, sizeof isl[i]);
            for (int d = 0; d < 8; d++) {
                seed = seed * 1103515245 + 12345;
                isl[i][(seed >> 16) % (unsigned)k] |= (uint64_t)1 << d;
            }
            int n = 0;
            for (int x = 0; x < k; x++)
                if (isl[i][x]) isl[i][n++] = isl[i][x];
            nodes[i].name = names[i];
            nodes[i].kind = "cuda";
            nodes[i].ndev = 8;
            seed = seed * 1103515245 + 12345;
            nodes[i].busy = (seed >> 8) & 0x3f & ((seed >> 20) & 0xff);
            nodes[i].islands = isl[i];
            nodes[i].nislands = n;
        }
        struct sched_job jobs[3];
        static const char *ids[3] = {"x", "y", "z"};
        for (int j = 0; j < 3; j++) {
            memset(&jobs[j], 0, sizeof jobs[j]);
            seed = seed * 1103515245 + 12345;
            jobs[j].id = ids[j];
            jobs[j].kind = "cuda";
            jobs[j].tp = 1 << ((seed >> 9) % 4);
            jobs[j].world = jobs[j].tp * (1 + (int)((seed >> 13) % 2));
            jobs[j].submit_ms = j;
            jobs[j].avoid_node = -1;
        }
        struct sched_decision dec[3];
        struct sched_cluster cl = {nodes, 2, NULL, 0};
        if (sched_place(&cl, jobs, 3, dec) < 0) {
            failures++;
            continue;
        }
        uint64_t used[2] = {nodes[0].busy, nodes[1].busy};
        for (int j = 0; j < 3; j++) {
            if (!dec[j].placed) continue;
            int tp = jobs[j].tp, cross = 0;
            for (int g = 0; g < jobs[j].world; g += tp) {
                const struct sched_node *n = &nodes[dec[j].ranks[g].node];
                uint64_t m = 0;
                int big = 0, inside = 0;
                for (int t = 0; t < tp; t++) {
                    uint64_t bit = (uint64_t)1 << dec[j].ranks[g + t].device;
                    if (dec[j].ranks[g + t].node != dec[j].ranks[g].node ||
                        (used[dec[j].ranks[g].node] & bit)) {
                        fprintf(stderr, "FAIL island random %d: job %d group %d split/overlap\n",
                                iter, j, g / tp);
                        failures++;
                    }
                    used[dec[j].ranks[g].node] |= bit;
                    m |= bit;
                }
                for (int k = 0; k < n->nislands; k++) {
                    int sz = __builtin_popcountll(n->islands[k]);
                    if (sz > big) big = sz;
                    inside |= (m & n->islands[k]) == m;
                }
                if (!inside && tp <= big) {
                    fprintf(stderr,
                            "FAIL island random %d: job %d tp=%d group spans islands "
                            "though one holds %d\n",
                            iter, j, tp, big);
                    failures++;
                }
                cross += !inside && tp > 1;
            }
            placed++;
            crossed += cross > 0;
            if (cross != dec[j].cross_island) {
                fprintf(stderr, "FAIL island random %d: job %d cross_island %d, counted %d\n", iter,
                        j, dec[j].cross_island, cross);
                failures++;
            }
        }
        sched_decisions_free(dec, 3);
    }
    /* the layouts must exercise both rules, or the checks above prove nothing */
    if (placed < 300 || crossed == 0) {
        fprintf(stderr, "FAIL island random: %d placed, %d across islands\n", placed, crossed);
        failures++;
    }
}

/* sched_islands over link matrices as NVML reports them (agent/gpu.h
 * topology: "NV<n>" entries are links). */
static void run_islands_from_links(void) {
    static const struct {
        const char *name;
        int n;
        const char *links; /* pairs "ab" of linked devices, one direction */
        int want_n;
        uint64_t want[8];
    } t[] = {
        {"HGX H100: NVSwitch links all 8",
         8,
         "01 02 03 04 05 06 07 12 13 14 15 16 17 23 24 25 26 27 34 35 36 37 45 46 47 56 57 67",
         1,
         {0xff}},
        {"two boards of 4", 8, "01 02 03 12 13 23 45 46 47 56 57 67", 2, {0x0f, 0xf0}},
        {"interleaved islands", 8, "02 24 46 13 35 57", 2, {0x55, 0xaa}},
        {"NVLink bridges in pairs (A100 PCIe)", 4, "01 23", 2, {0x3, 0xc}},
        {"one bridge, two unlinked cards", 4, "10", 3, {0x3, 0x4, 0x8}},
        {"no NVLink at all (RTX 4090 box)", 4, "", 0, {0}},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        unsigned char m[64] = {0};
        for (const char *p = t[i].links; *p; p += p[2] ? 3 : 2)
            m[(p[0] - '0') * t[i].n + (p[1] - '0')] = 1;
        uint64_t out[8] = {0};
        int n = sched_islands(t[i].n, m, out);
        int ok = n == t[i].want_n;
        for (int k = 0; ok && k < n; k++)
            ok = out[k] == t[i].want[k];
        if (!ok) {
            fprintf(stderr, "FAIL islands [%s]: %d islands (first 0x%llx), want %d (0x%llx)\n",
                    t[i].name, n, (unsigned long long)out[0], t[i].want_n,
                    (unsigned long long)t[i].want[0]);
            failures++;
        }
    }
}

/* The compute capability the daemon gives a node of this type (its data
 * sheet's; cluster.c takes it from api/gpu_types.c). */
static int test_cc(const char *type) {
    static const struct {
        const char *type;
        int cc;
    } tab[] = {{"A100-80GB", 80}, {"RTX4090", 89}, {"H100-SXM", 90}, {"H200", 90}};
    for (size_t i = 0; type && i < sizeof tab / sizeof *tab; i++)
        if (!strcmp(tab[i].type, type)) return tab[i].cc;
    return 0;
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
            memset(&nodes[nn], 0, sizeof nodes[nn]);
            nodes[nn].name = tc->nodes[nn].name;
            nodes[nn].kind = tc->nodes[nn].kind;
            nodes[nn].ndev = tc->nodes[nn].ndev;
            nodes[nn].busy = tc->nodes[nn].busy;
            nodes[nn].state = tc->nodes[nn].state;
            nodes[nn].gpu_type = tc->nodes[nn].gpu_type;
            nodes[nn].cc = test_cc(tc->nodes[nn].gpu_type);
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
                t->id, t->tenant,   t->kind,       t->prio,  t->submit, t->world,
                t->tp, t->per_node, t->avoid1 - 1, tptr[nj], nt,        t->mixed,
                0.0,   NULL,        NULL,          NULL,     0,         t->min_cc};
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
                                    types[(seed >> 24) % 3],
                                    NULL,
                                    0,
                                    NULL,
                                    NULL,
                                    NULL,
                                    0,
                                    0};
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
                                         0.0,
                                         NULL,
                                         NULL,
                                         NULL,
                                         0,
                                         0};
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
    run_xcases();
    run_island_random();
    run_islands_from_links();
    if (failures) {
        fprintf(stderr, "test_sched: %d failures\n", failures);
        return 1;
    }
    printf("test_sched: %d cases + 200 random clusters + %d island/selector cases + 300 random "
           "island layouts ok\n",
           ncases, (int)(sizeof xcases / sizeof *xcases));
    return 0;
}
