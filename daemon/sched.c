/* Gang scheduler (pure function). See sched.h for the rules.
 *
 * Devices are tracked as one 64-bit mask per node. A job of world W and tensor
 * parallel size T needs W/T "groups"; a group is an aligned block of T
 * adjacent devices on one node. A node's capacity for a job is the number of
 * such blocks free on it (capped by max_per_node/T). Fewest nodes: take the
 * largest capacities; the last node is chosen best-fit. On a node with NVLink
 * islands the blocks are cut from each island's devices instead
 * (node_blocks, node_take), so a group never spans two islands unless no
 * island of the node could hold it. */
#include "daemon/sched.h"

#include "api/gpu_types.h" /* GPU_FP8_EXAMPLES (a macro: sched.c links nothing else) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct order_item {
    int idx;
    const struct sched_job *job;
};

static int order_cmp(const void *a, const void *b) {
    const struct sched_job *x = ((const struct order_item *)a)->job;
    const struct sched_job *y = ((const struct order_item *)b)->job;
    if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
    if (x->fair_usage != y->fair_usage) return x->fair_usage < y->fair_usage ? -1 : 1;
    if (x->submit_ms != y->submit_ms) return x->submit_ms < y->submit_ms ? -1 : 1;
    int s = strcmp(x->id ? x->id : "", y->id ? y->id : "");
    if (s) return s;
    return ((const struct order_item *)a)->idx - ((const struct order_item *)b)->idx;
}

static uint64_t dev_mask(int ndev) {
    if (ndev >= 64) return ~(uint64_t)0;
    if (ndev <= 0) return 0;
    return ((uint64_t)1 << ndev) - 1;
}

static uint64_t block_mask(int start, int tp) {
    return dev_mask(tp) << start;
}

static const char *ntype(const struct sched_node *n) {
    return n->gpu_type ? n->gpu_type : "";
}

static int type_listed(const struct sched_job *j, const char *t) {
    for (int i = 0; i < j->ngpu_types; i++)
        if (j->gpu_types[i] && strcmp(j->gpu_types[i], t) == 0) return 1;
    return 0;
}

/* The job's node selector (pool, labels) holds on node n. */
static int selector_ok(const struct sched_node *n, const struct sched_job *j) {
    if (j->pool && j->pool[0] && (!n->pool || strcmp(n->pool, j->pool) != 0)) return 0;
    for (int k = 0; k < j->nsel; k++) {
        int found = 0;
        for (int l = 0; l < n->nlabels && !found; l++)
            found = !strcmp(n->label_keys[l], j->sel_keys[k]) &&
                    !strcmp(n->label_vals[l], j->sel_vals[k]);
        if (!found) return 0;
    }
    return 1;
}

/* The node has the compute capability the job asks (min_cc). */
static int cc_ok(const struct sched_node *n, const struct sched_job *j) {
    return j->min_cc <= 0 || n->cc >= j->min_cc;
}

/* What a node must be for the job beside its kind and state: the selector
 * and the compute capability. */
static int node_ok(const struct sched_node *n, const struct sched_job *j) {
    return selector_ok(n, j) && cc_ok(n, j);
}

static int same_kind(const struct sched_node *n, const struct sched_job *j) {
    const char *nk = n->kind ? n->kind : "cuda", *jk = j->kind ? j->kind : "cuda";
    return strcmp(nk, jk) == 0;
}

/* Ready, of the job's device kind and matching its node selector. */
static int eligible_kind(const struct sched_node *n, const struct sched_job *j) {
    if (n->state != SCHED_NODE_READY) return 0;
    return same_kind(n, j) && node_ok(n, j);
}

/* Under a type choice: `type` set, nodes of that type only; NULL, any type the
 * job lists (every type when it lists none). */
static int eligible_t(const struct sched_node *n, const struct sched_job *j, const char *type) {
    if (!eligible_kind(n, j)) return 0;
    if (type) return strcmp(ntype(n), type) == 0;
    return j->ngpu_types <= 0 || type_listed(j, ntype(n));
}

static int eligible(const struct sched_node *n, const struct sched_job *j) {
    return eligible_t(n, j, NULL);
}

/* The distinct types of the ready nodes of the job's kind, in node order, into
 * types[] (c->nnodes entries). Returns the count. */
static int kind_types(const struct sched_cluster *c, const struct sched_job *j,
                      const char **types) {
    int nt = 0;
    for (int i = 0; i < c->nnodes; i++) {
        if (!eligible_kind(&c->nodes[i], j)) continue;
        int seen = 0;
        for (int k = 0; k < nt && !seen; k++)
            seen = strcmp(types[k], ntype(&c->nodes[i])) == 0;
        if (!seen) types[nt++] = ntype(&c->nodes[i]);
    }
    return nt;
}

static int popcount64(uint64_t v) {
    return __builtin_popcountll(v);
}

/* Devices in the node's largest NVLink island (0: no islands reported). */
static int largest_island(const struct sched_node *n) {
    int big = 0;
    for (int k = 0; k < n->nislands; k++) {
        int sz = popcount64(n->islands[k] & dev_mask(n->ndev));
        if (sz > big) big = sz;
    }
    return big;
}

/* 1 when tp groups on node n are cut from its NVLink islands. */
static int island_blocks(const struct sched_node *n, int tp) {
    return tp > 1 && n->nislands > 0 && tp <= largest_island(n);
}

/* Number of tp groups node n can hold in `avail`: aligned blocks of tp
 * adjacent devices, or on a node whose islands can hold tp, any tp free
 * devices of one island (NVLink joins each pair of an island alike, so no
 * alignment is needed there). */
static int node_blocks(const struct sched_node *n, uint64_t avail, int tp) {
    int cnt = 0;
    if (island_blocks(n, tp)) {
        for (int k = 0; k < n->nislands; k++)
            cnt += popcount64(avail & n->islands[k] & dev_mask(n->ndev)) / tp;
        return cnt;
    }
    for (int s = 0; s + tp <= n->ndev; s += tp)
        if ((avail & block_mask(s, tp)) == block_mask(s, tp)) cnt++;
    return cnt;
}

/* Takes up to `want` tp groups for node `node` out of *av, preferring
 * devices in pf (free now) first, into ranks from *rank. Returns the groups
 * taken. */
static int node_take(const struct sched_node *n, int node, uint64_t *av, uint64_t pf, int tp,
                     int want, struct sched_rank *ranks, int *rank) {
    int got = 0;
    for (int pass = 0; pass < 2 && got < want; pass++) {
        if (island_blocks(n, tp)) {
            for (int k = 0; k < n->nislands && got < want; k++) {
                uint64_t isl = n->islands[k] & dev_mask(n->ndev);
                for (;;) {
                    uint64_t from = pass == 0 ? *av & pf & isl : *av & isl;
                    if (got >= want || popcount64(from) < tp) break;
                    /* pass 1: devices free now first, then the rest */
                    uint64_t order[2] = {from & pf, from & ~pf};
                    int t = 0;
                    for (int o = 0; o < 2 && t < tp; o++)
                        for (int d = 0; d < n->ndev && t < tp; d++) {
                            if (!((order[o] >> d) & 1)) continue;
                            ranks[*rank].node = node;
                            ranks[*rank].device = d;
                            (*rank)++;
                            *av &= ~((uint64_t)1 << d);
                            t++;
                        }
                    got++;
                }
            }
            continue;
        }
        for (int s = 0; s + tp <= n->ndev && got < want; s += tp) {
            uint64_t bm = block_mask(s, tp);
            if ((*av & bm) != bm) continue;
            if (pass == 0 && (pf & bm) != bm) continue;
            for (int t = 0; t < tp; t++) {
                ranks[*rank].node = node;
                ranks[*rank].device = s + t;
                (*rank)++;
            }
            *av &= ~bm;
            got++;
        }
    }
    return got;
}

struct cand {
    int node;
    int cap;  /* groups it can hold */
    int pref; /* devices free now (tie-break for reservations) */
};

static int cand_cmp(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->cap != y->cap) return y->cap - x->cap;
    if (x->pref != y->pref) return y->pref - x->pref;
    return x->node - y->node;
}

/* Place job `j` on the devices in avail[] (per node). `pref` (may be NULL)
 * holds devices free right now; blocks inside it are preferred. On success
 * writes world entries into `ranks` and returns 0; returns -1 when it does not
 * fit, -2 when out of memory. */
static int place_one(const struct sched_cluster *c, const struct sched_job *j, const char *type,
                     const uint64_t *avail, const uint64_t *pref, struct sched_rank *ranks) {
    int tp = j->tp > 0 ? j->tp : 1;
    int groups = j->world / tp;
    struct cand *cands = calloc((size_t)(c->nnodes > 0 ? c->nnodes : 1), sizeof *cands);
    if (!cands) return -2;
    int nc = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const struct sched_node *n = &c->nodes[i];
        if (!eligible_t(n, j, type)) continue;
        int cap = node_blocks(n, avail[i], tp);
        if (j->max_per_node > 0 && cap > j->max_per_node / tp) cap = j->max_per_node / tp;
        if (cap <= 0) continue;
        cands[nc].node = i;
        cands[nc].cap = cap;
        cands[nc].pref = pref ? popcount64(pref[i] & avail[i]) : 0;
        nc++;
    }
    qsort(cands, (size_t)nc, sizeof *cands, cand_cmp);
    int sum = 0, k = 0;
    while (k < nc && sum < groups)
        sum += cands[k++].cap;
    if (sum < groups) {
        free(cands);
        return -1;
    }
    /* Top k-1 nodes are used fully; the last one best-fit among the rest. */
    int before = sum - cands[k - 1].cap, rem = groups - before;
    int best = k - 1;
    for (int i = k - 1; i < nc; i++)
        if (cands[i].cap >= rem && cands[i].cap < cands[best].cap) best = i;
    int rank = 0;
    for (int ci = 0; ci < k; ci++) {
        const struct cand *cd = ci == k - 1 ? &cands[best] : &cands[ci];
        const struct sched_node *n = &c->nodes[cd->node];
        int want = ci == k - 1 ? rem : cd->cap;
        uint64_t av = avail[cd->node];
        uint64_t pf = pref ? pref[cd->node] : av;
        node_take(n, cd->node, &av, pf, tp, want, ranks, &rank);
    }
    free(cands);
    return 0;
}

static int count_nodes(const struct sched_rank *r, int n);
static int any_islands(const struct sched_cluster *c, const struct sched_job *j);

/* Free devices in avail[] on nodes of `type` for job j. */
static int type_free(const struct sched_cluster *c, const struct sched_job *j, const char *type,
                     const uint64_t *avail) {
    int f = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (eligible_t(&c->nodes[i], j, type)) f += popcount64(avail[i]);
    return f;
}

/* place_one under the type rules (sched.h): one type per job unless
 * allow_mixed; the first listed type that fits, or with no list the best of
 * the cluster's types. Same returns as place_one. */
static int place_typed(const struct sched_cluster *c, const struct sched_job *j,
                       const uint64_t *avail, const uint64_t *pref, struct sched_rank *ranks) {
    if (j->allow_mixed) return place_one(c, j, NULL, avail, pref, ranks);
    if (j->ngpu_types > 0) {
        for (int t = 0; t < j->ngpu_types; t++) {
            if (!j->gpu_types[t]) continue;
            int r = place_one(c, j, j->gpu_types[t], avail, pref, ranks);
            if (r != -1) return r;
        }
        return -1;
    }
    int rc = -1;
    const char **types = calloc((size_t)(c->nnodes > 0 ? c->nnodes : 1), sizeof *types);
    struct sched_rank *tmp = calloc((size_t)(j->world > 0 ? j->world : 1), sizeof *tmp);
    if (!types || !tmp) {
        rc = -2;
        goto out;
    }
    int nt = kind_types(c, j, types);
    if (nt <= 1) { /* one type (or none): the plain placement */
        rc = place_one(c, j, nt ? types[0] : NULL, avail, pref, ranks);
        goto out;
    }
    int best_nodes = 0, best_free = 0;
    const char *best = NULL;
    for (int t = 0; t < nt; t++) {
        int r = place_one(c, j, types[t], avail, pref, tmp);
        if (r == -2) {
            rc = -2;
            goto out;
        }
        if (r != 0) continue;
        int nodes = count_nodes(tmp, j->world), fr = type_free(c, j, types[t], avail);
        if (!best || nodes < best_nodes || (nodes == best_nodes && fr < best_free) ||
            (nodes == best_nodes && fr == best_free && strcmp(types[t], best) < 0)) {
            best = types[t];
            best_nodes = nodes;
            best_free = fr;
            memcpy(ranks, tmp, sizeof *tmp * (size_t)j->world);
        }
    }
    rc = best ? 0 : -1;
out:
    free(types);
    free(tmp);
    return rc;
}

/* Job wording for typed reasons: "H100-SXM", "H100-SXM|A100-80GB" or NULL (any type). */
static void type_label(const struct sched_job *j, char *buf, size_t len) {
    size_t off = 0;
    buf[0] = 0;
    for (int t = 0; t < j->ngpu_types && off < len; t++)
        if (j->gpu_types[t])
            off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "|" : "", j->gpu_types[t]);
}

/* 1 when the job's reasons speak of GPU types: it names types, or it may not
 * mix them and the ready nodes of its kind have several. */
static int typed_job(const struct sched_cluster *c, const struct sched_job *j) {
    if (j->ngpu_types > 0) return 1;
    if (j->allow_mixed) return 0;
    const char **types = calloc((size_t)(c->nnodes > 0 ? c->nnodes : 1), sizeof *types);
    int nt = types ? kind_types(c, j, types) : 0;
    free(types);
    return nt > 1;
}

/* The type (of those the job may use) with the most devices in avail[]; with
 * allow_mixed all of them count together (type NULL). */
static const char *richest_type(const struct sched_cluster *c, const struct sched_job *j,
                                const uint64_t *avail, int *free_out) {
    *free_out = 0;
    if (j->allow_mixed) {
        *free_out = type_free(c, j, NULL, avail);
        return NULL;
    }
    const char *best = NULL;
    for (int i = 0; i < c->nnodes; i++) {
        const char *t = ntype(&c->nodes[i]);
        if (!eligible_t(&c->nodes[i], j, NULL)) continue;
        int f = type_free(c, j, t, avail);
        if (!best || f > *free_out) {
            best = t;
            *free_out = f;
        }
    }
    return best;
}

/* "needs 8 x H100-SXM; largest free: 4 (H100-SXM: a 2, b 2)". */
static void reason_typed_now(const struct sched_cluster *c, const struct sched_job *j,
                             const uint64_t *avail, char *buf, size_t len) {
    char label[128], nodes[160] = "", tpw[48] = "";
    type_label(j, label, sizeof label);
    int tp = j->tp > 0 ? j->tp : 1, fr = 0, listed = 0;
    const char *t = richest_type(c, j, avail, &fr);
    size_t no = 0;
    for (int i = 0; i < c->nnodes && no < sizeof nodes; i++) {
        int f = popcount64(avail[i]);
        if (!eligible_t(&c->nodes[i], j, t) || !f) continue;
        if (listed == 4) {
            snprintf(nodes + no, sizeof nodes - no, ", ...");
            break;
        }
        no += (size_t)snprintf(nodes + no, sizeof nodes - no, "%s%s %d", listed ? ", " : "",
                               c->nodes[i].name, f);
        listed++;
    }
    if (tp > 1)
        snprintf(tpw, sizeof tpw, " with tp=%d %s", tp,
                 any_islands(c, j) ? "inside one NVLink island" : "on one node");
    int named = listed && t && *t;
    snprintf(buf, len, "needs %d x %s%s; largest free: %d%s%s%s%s%s%s", j->world,
             label[0] ? label : "GPUs of one type", tpw, fr, listed ? " (" : "", named ? t : "",
             named ? ": " : "", nodes, listed ? ")" : "",
             label[0] ? "" : "; resources.allow_mixed lets it combine types");
}

/* A typed job that does not fit even on the idle cluster. Returns 0 when the
 * plain reason (reason_never_fits) says it better (enough devices of a type,
 * but tp / gpus_per_node shapes forbid it). */
static int reason_typed_never(const struct sched_cluster *c, const struct sched_job *j, char *buf,
                              size_t len) {
    char label[128];
    type_label(j, label, sizeof label);
    uint64_t *all = calloc((size_t)(c->nnodes > 0 ? c->nnodes : 1), sizeof *all);
    if (!all) return 0;
    for (int i = 0; i < c->nnodes; i++)
        all[i] = dev_mask(c->nodes[i].ndev);
    int total = 0;
    const char *t = richest_type(c, j, all, &total);
    free(all);
    if (total >= j->world) return 0;
    if (!total && j->ngpu_types > 0) {
        int off = snprintf(buf, len, "no ready node has gpu_type %s (ready:", label);
        const char **types = calloc((size_t)(c->nnodes > 0 ? c->nnodes : 1), sizeof *types);
        int nt = types ? kind_types(c, j, types) : 0;
        for (int k = 0; k < nt && off > 0 && (size_t)off < len; k++) {
            int n = 0;
            for (int i = 0; i < c->nnodes; i++)
                if (eligible_t(&c->nodes[i], j, types[k])) n += c->nodes[i].ndev;
            off += snprintf(buf + off, len - (size_t)off, "%s%s x %d", k ? ", " : " ",
                            *types[k] ? types[k] : "untyped", n);
        }
        free(types);
        if (off > 0 && (size_t)off < len)
            snprintf(buf + off, len - (size_t)off, "%s)", nt ? "" : " none");
        return 1;
    }
    snprintf(buf, len, "needs %d x %s; the largest pool of one type is %s with %d%s", j->world,
             label[0] ? label : "GPUs of one type", t && *t ? t : "(untyped)", total,
             label[0] || j->allow_mixed ? "" : "; resources.allow_mixed lets it combine types");
    if (j->allow_mixed)
        snprintf(buf, len, "needs %d x %s; the ready nodes of those types have %d in total",
                 j->world, label, total);
    return 1;
}

static const char *dev_word(const struct sched_job *j) {
    return j->kind && !strcmp(j->kind, "cpu") ? "CPU devices" : "GPUs";
}

/* Largest run of adjacent free devices over eligible nodes; on a node whose
 * tp groups come from NVLink islands, the most free devices of one island
 * (*island set to 1 when the largest is such a count). */
static void largest_block(const struct sched_cluster *c, const struct sched_job *j,
                          const uint64_t *avail, int *len, int *node, int *island) {
    int tp = j->tp > 0 ? j->tp : 1;
    *len = 0;
    *node = -1;
    *island = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const struct sched_node *n = &c->nodes[i];
        if (!eligible(n, j)) continue;
        if (island_blocks(n, tp)) {
            for (int k = 0; k < n->nislands; k++) {
                int f = popcount64(avail[i] & n->islands[k]);
                if (f > *len) {
                    *len = f;
                    *node = i;
                    *island = 1;
                }
            }
            continue;
        }
        int run = 0;
        for (int d = 0; d < n->ndev; d++) {
            run = (avail[i] >> d) & 1 ? run + 1 : 0;
            if (run > *len) {
                *len = run;
                *node = i;
                *island = 0;
            }
        }
    }
}

/* 1 when some eligible node cuts the job's tp groups from NVLink islands. */
static int any_islands(const struct sched_cluster *c, const struct sched_job *j) {
    int tp = j->tp > 0 ? j->tp : 1;
    for (int i = 0; i < c->nnodes; i++)
        if (eligible(&c->nodes[i], j) && island_blocks(&c->nodes[i], tp)) return 1;
    return 0;
}

/* "resources.pool=train, resources.labels zone=eu" into buf. */
static void selector_label(const struct sched_job *j, char *buf, size_t len) {
    int off = 0;
    buf[0] = 0;
    if (j->pool && j->pool[0]) off = snprintf(buf, len, "resources.pool=%s", j->pool);
    for (int k = 0; k < j->nsel && off >= 0 && (size_t)off < len; k++)
        off += snprintf(buf + off, len - (size_t)off, "%s%s=%s",
                        k     ? " "
                        : off ? ", resources.labels "
                              : "resources.labels ",
                        j->sel_keys[k], j->sel_vals[k]);
}

/* A job with a node selector that no ready node of its kind matches: the
 * reason names the selector. Returns 0 when some node matches (or the job has
 * no selector). */
static int reason_selector(const struct sched_cluster *c, const struct sched_job *j, char *buf,
                           size_t len) {
    if (!(j->pool && j->pool[0]) && j->nsel == 0) return 0;
    int ready = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const struct sched_node *n = &c->nodes[i];
        if (n->state != SCHED_NODE_READY || !same_kind(n, j)) continue;
        if (selector_ok(n, j)) return 0;
        ready++;
    }
    char sel[160];
    selector_label(j, sel, sizeof sel);
    snprintf(buf, len,
             "no ready node matches %s (%d ready node%s of the job's device kind; "
             "GET /v1/nodes shows each node's pool and labels)",
             sel, ready, ready == 1 ? "" : "s");
    return 1;
}

/* A job asking a compute capability (train.precision fp8) that no ready node
 * of its kind matching its selector has: the reason names the capability and
 * the types there are. Returns 0 when some node has it (or none is asked). */
static int reason_cc(const struct sched_cluster *c, const struct sched_job *j, char *buf,
                     size_t len) {
    if (j->min_cc <= 0) return 0;
    /* one node of each type there is, for its name and capability */
    const struct sched_node **types =
        calloc((size_t)(c->nnodes > 0 ? c->nnodes : 1), sizeof *types);
    if (!types) return 0;
    int nt = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const struct sched_node *n = &c->nodes[i];
        if (n->state != SCHED_NODE_READY || !same_kind(n, j) || !selector_ok(n, j)) continue;
        if (cc_ok(n, j)) {
            free(types);
            return 0;
        }
        int seen = 0;
        for (int k = 0; k < nt && !seen; k++)
            seen = strcmp(ntype(types[k]), ntype(n)) == 0;
        if (!seen) types[nt++] = n;
    }
    int off = snprintf(buf, len,
                       "train.precision fp8 needs FP8 tensor cores (compute capability %d.%d or "
                       "newer: " GPU_FP8_EXAMPLES "); no ready node has them (ready:",
                       j->min_cc / 10, j->min_cc % 10);
    for (int k = 0; k < nt && off > 0 && (size_t)off < len; k++) {
        const char *t = ntype(types[k]);
        off += snprintf(buf + off, len - (size_t)off, "%s%s", k ? ", " : " ", *t ? t : "untyped");
        if (types[k]->cc > 0 && off > 0 && (size_t)off < len)
            off += snprintf(buf + off, len - (size_t)off, " %d.%d", types[k]->cc / 10,
                            types[k]->cc % 10);
    }
    if (off > 0 && (size_t)off < len)
        snprintf(buf + off, len - (size_t)off, "%s)", nt ? "" : " none");
    free(types);
    return 1;
}

static void reason_unfit_now(const struct sched_cluster *c, const struct sched_job *j,
                             const uint64_t *avail, char *buf, size_t len) {
    int tp = j->tp > 0 ? j->tp : 1;
    int total = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (eligible(&c->nodes[i], j)) total += popcount64(avail[i]);
    if (tp > 1) {
        int bl, bn, isl;
        largest_block(c, j, avail, &bl, &bn, &isl);
        if (bn >= 0 && any_islands(c, j))
            snprintf(buf, len,
                     "needs %d %s with tp=%d inside one NVLink island; most free in one %s is %d "
                     "on %s (%d free in total)",
                     j->world, dev_word(j), tp, isl ? "island" : "block", bl, c->nodes[bn].name,
                     total);
        else if (bn >= 0)
            snprintf(buf, len,
                     "needs %d %s with tp=%d on one node (blocks of %d adjacent); largest free "
                     "block is %d on %s (%d free in total)",
                     j->world, dev_word(j), tp, tp, bl, c->nodes[bn].name, total);
        else
            snprintf(buf, len, "needs %d %s with tp=%d on one node; none are free", j->world,
                     dev_word(j), tp);
        return;
    }
    int off = snprintf(buf, len, "needs %d %s; %d free", j->world, dev_word(j), total);
    int listed = 0;
    for (int i = 0; i < c->nnodes && off > 0 && (size_t)off < len; i++) {
        if (!eligible(&c->nodes[i], j)) continue;
        int f = popcount64(avail[i]);
        if (!f) continue;
        if (listed == 4) {
            off += snprintf(buf + off, len - (size_t)off, ", ...");
            break;
        }
        off += snprintf(buf + off, len - (size_t)off, "%s%s: %d", listed ? ", " : " (",
                        c->nodes[i].name, f);
        listed++;
    }
    if (listed && off > 0 && (size_t)off < len) snprintf(buf + off, len - (size_t)off, ")");
}

static void reason_never_fits(const struct sched_cluster *c, const struct sched_job *j, char *buf,
                              size_t len) {
    int tp = j->tp > 0 ? j->tp : 1;
    int ready = 0, drained = 0, lost = 0, other_kind = 0, total = 0, biggest = 0, bnode = -1;
    if (reason_selector(c, j, buf, len)) return;
    for (int i = 0; i < c->nnodes; i++) {
        const struct sched_node *n = &c->nodes[i];
        const char *nk = n->kind ? n->kind : "cuda", *jk = j->kind ? j->kind : "cuda";
        if (strcmp(nk, jk)) {
            other_kind++;
            continue;
        }
        if (n->state == SCHED_NODE_DRAINED) drained++;
        if (n->state == SCHED_NODE_LOST) lost++;
        if (n->state != SCHED_NODE_READY || !node_ok(n, j)) continue;
        ready++;
        total += n->ndev;
        if (n->ndev > biggest) {
            biggest = n->ndev;
            bnode = i;
        }
    }
    if (!ready) {
        snprintf(buf, len,
                 "no ready node offers %s (%d drained, %d lost, %d of another device kind)",
                 dev_word(j), drained, lost, other_kind);
    } else if (tp > biggest) {
        snprintf(buf, len, "needs %d %s with tp=%d on one node; largest node has %d (%s)", j->world,
                 dev_word(j), tp, biggest, c->nodes[bnode].name);
    } else if (j->max_per_node > 0 && j->world > ready * (j->max_per_node / tp) * tp) {
        snprintf(buf, len,
                 "needs %d %s with at most %d per node (resources.gpus_per_node); the %d ready "
                 "nodes can hold at most %d that way",
                 j->world, dev_word(j), j->max_per_node, ready,
                 ready * (j->max_per_node / tp) * tp);
    } else if (j->world > total) {
        snprintf(buf, len, "needs %d %s; the %d ready nodes have %d in total (%d drained, %d lost)",
                 j->world, dev_word(j), ready, total, drained, lost);
    } else {
        snprintf(buf, len,
                 "needs %d %s in blocks of tp=%d %s%s; ready nodes cannot hold "
                 "that layout even when idle",
                 j->world, dev_word(j), tp,
                 any_islands(c, j) ? "devices inside one NVLink island" : "adjacent devices",
                 j->max_per_node > 0 ? " under gpus_per_node" : "");
    }
}

static int uses_node(const struct sched_rank *r, int n, int node) {
    for (int i = 0; i < n; i++)
        if (r[i].node == node) return 1;
    return 0;
}

static int count_nodes(const struct sched_rank *r, int n) {
    int cnt = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < i && !seen; k++)
            seen = r[k].node == r[i].node;
        cnt += !seen;
    }
    return cnt;
}

/* tp groups of a placement whose devices are not all in one island of a
 * node that reports islands. */
static int cross_islands(const struct sched_cluster *c, const struct sched_rank *r, int world,
                         int tp) {
    int cross = 0;
    for (int g = 0; tp > 1 && g + tp <= world; g += tp) {
        const struct sched_node *n = &c->nodes[r[g].node];
        if (n->nislands <= 0) continue;
        uint64_t m = 0;
        for (int t = 0; t < tp; t++)
            m |= (uint64_t)1 << r[g + t].device;
        int inside = 0;
        for (int k = 0; k < n->nislands && !inside; k++)
            inside = (m & n->islands[k]) == m;
        cross += !inside;
    }
    return cross;
}

static struct sched_quota *find_quota(struct sched_quota *q, int n, const char *tenant) {
    for (int i = 0; i < n; i++)
        if (q[i].tenant && tenant && !strcmp(q[i].tenant, tenant)) return &q[i];
    return NULL;
}

int sched_place(const struct sched_cluster *c, const struct sched_job *jobs, int njobs,
                struct sched_decision *out) {
    int placed = 0, rc = -1;
    int nn = c->nnodes > 0 ? c->nnodes : 1;
    struct order_item *order = calloc((size_t)(njobs > 0 ? njobs : 1), sizeof *order);
    uint64_t *avail = calloc((size_t)nn, sizeof *avail);
    uint64_t *idle = calloc((size_t)nn, sizeof *idle);
    uint64_t *reserved = calloc((size_t)nn, sizeof *reserved);
    struct sched_quota *quotas = calloc((size_t)(c->nquotas > 0 ? c->nquotas : 1), sizeof *quotas);
    const struct sched_job *head = NULL;
    if (!order || !avail || !idle || !reserved || !quotas) goto out;
    memset(out, 0, sizeof *out * (size_t)njobs);
    if (c->nquotas > 0) memcpy(quotas, c->quotas, sizeof *quotas * (size_t)c->nquotas);
    for (int i = 0; i < c->nnodes; i++) {
        uint64_t all = dev_mask(c->nodes[i].ndev);
        avail[i] = all & ~c->nodes[i].busy;
        idle[i] = all;
    }
    for (int i = 0; i < njobs; i++) {
        order[i].idx = i;
        order[i].job = &jobs[i];
    }
    qsort(order, (size_t)njobs, sizeof *order, order_cmp);

    for (int oi = 0; oi < njobs; oi++) {
        const struct sched_job *j = order[oi].job;
        struct sched_decision *d = &out[order[oi].idx];
        int tp = j->tp > 0 ? j->tp : 1;
        if (j->world <= 0 || j->world % tp) {
            snprintf(d->reason, sizeof d->reason,
                     "invalid shape: world=%d is not a multiple of tp=%d", j->world, tp);
            continue;
        }
        struct sched_quota *q = find_quota(quotas, c->nquotas, j->tenant);
        if (q && q->max_running > 0 && q->running >= q->max_running) {
            snprintf(d->reason, sizeof d->reason,
                     "tenant %s max_running_jobs: %d of %d jobs running",
                     q->name ? q->name : j->tenant, q->running, q->max_running);
            continue;
        }
        if (q && q->max_gpus > 0 && q->used_gpus + j->world > q->max_gpus) {
            snprintf(d->reason, sizeof d->reason,
                     "tenant %s quota: holds %d of %d GPUs, job needs %d more",
                     q->name ? q->name : j->tenant, q->used_gpus, q->max_gpus, j->world);
            continue;
        }
        d->ranks = calloc((size_t)j->world, sizeof *d->ranks);
        if (!d->ranks) goto out;
        int fit = place_typed(c, j, avail, NULL, d->ranks);
        if (fit == -2) goto out;
        if (fit == 0 && j->avoid_node >= 0 && j->avoid_node < c->nnodes &&
            uses_node(d->ranks, j->world, j->avoid_node)) {
            /* Retry elsewhere if that needs no more nodes than this placement. */
            struct sched_rank *alt = calloc((size_t)j->world, sizeof *alt);
            if (!alt) goto out;
            uint64_t saved = avail[j->avoid_node];
            avail[j->avoid_node] = 0;
            int f2 = place_typed(c, j, avail, NULL, alt);
            avail[j->avoid_node] = saved;
            if (f2 == 0 && count_nodes(alt, j->world) <= count_nodes(d->ranks, j->world)) {
                free(d->ranks);
                d->ranks = alt;
            } else {
                free(alt);
            }
        }
        if (fit == 0) {
            d->placed = 1;
            d->cross_island = cross_islands(c, d->ranks, j->world, tp);
            placed++;
            for (int r = 0; r < j->world; r++)
                avail[d->ranks[r].node] &= ~((uint64_t)1 << d->ranks[r].device);
            if (q) {
                q->used_gpus += j->world;
                q->running++;
            }
            continue;
        }
        /* Not now. Would it fit without the reservation, or on an idle cluster? */
        int never = place_typed(c, j, idle, NULL, d->ranks);
        int typed = typed_job(c, j);
        if (never == -2) goto out;
        if (never != 0) {
            if (!reason_selector(c, j, d->reason, sizeof d->reason) &&
                !reason_cc(c, j, d->reason, sizeof d->reason) &&
                (!typed || !reason_typed_never(c, j, d->reason, sizeof d->reason)))
                reason_never_fits(c, j, d->reason, sizeof d->reason);
        } else if (head) {
            uint64_t *unres = calloc((size_t)nn, sizeof *unres);
            if (!unres) goto out;
            for (int i = 0; i < c->nnodes; i++)
                unres[i] = avail[i] | (reserved[i] & ~c->nodes[i].busy);
            int f2 = place_typed(c, j, unres, NULL, d->ranks);
            free(unres);
            if (f2 == -2) goto out;
            if (f2 == 0)
                snprintf(d->reason, sizeof d->reason,
                         "fits now, but the free devices are held for job %s (priority %d, "
                         "queued earlier; needs %d)",
                         head->id, head->priority, head->world);
            else if (typed)
                reason_typed_now(c, j, avail, d->reason, sizeof d->reason);
            else
                reason_unfit_now(c, j, avail, d->reason, sizeof d->reason);
        } else {
            /* This is the head: reserve its placement on the idle cluster,
             * preferring devices that are free right now. */
            if (typed)
                reason_typed_now(c, j, avail, d->reason, sizeof d->reason);
            else
                reason_unfit_now(c, j, avail, d->reason, sizeof d->reason);
            uint64_t *usable = calloc((size_t)nn, sizeof *usable);
            if (!usable) goto out;
            for (int i = 0; i < c->nnodes; i++)
                usable[i] = idle[i];
            int f3 = place_typed(c, j, usable, avail, d->ranks);
            free(usable);
            if (f3 == -2) goto out;
            if (f3 == 0) {
                for (int r = 0; r < j->world; r++) {
                    uint64_t bit = (uint64_t)1 << d->ranks[r].device;
                    reserved[d->ranks[r].node] |= bit;
                    avail[d->ranks[r].node] &= ~bit;
                }
                head = j;
                d->reserved = 1;
            }
        }
        free(d->ranks);
        d->ranks = NULL;
    }
    rc = placed;
out:
    if (rc < 0) sched_decisions_free(out, njobs);
    free(order);
    free(avail);
    free(idle);
    free(reserved);
    free(quotas);
    return rc;
}

void sched_decisions_free(struct sched_decision *d, int n) {
    if (!d) return;
    for (int i = 0; i < n; i++) {
        free(d[i].ranks);
        d[i].ranks = NULL;
    }
}

int sched_islands(int n, const unsigned char *linked, uint64_t *out) {
    if (n > SCHED_MAX_NODE_DEVICES) n = SCHED_MAX_NODE_DEVICES;
    int comp[SCHED_MAX_NODE_DEVICES], any = 0, nc = 0;
    for (int d = 0; d < n; d++)
        comp[d] = -1;
    /* Components by flood fill from each unvisited device, in index order. */
    for (int d = 0; d < n; d++) {
        if (comp[d] >= 0) continue;
        int stack[SCHED_MAX_NODE_DEVICES], sp = 0;
        comp[d] = nc;
        stack[sp++] = d;
        out[nc] = 0;
        while (sp > 0) {
            int a = stack[--sp];
            out[nc] |= (uint64_t)1 << a;
            for (int b = 0; b < n; b++) {
                if (b == a || !(linked[a * n + b] || linked[b * n + a])) continue;
                any = 1;
                if (comp[b] >= 0) continue;
                comp[b] = nc;
                stack[sp++] = b;
            }
        }
        nc++;
    }
    return any ? nc : 0;
}

int sched_selector_ok(const struct sched_node *n, const struct sched_job *j) {
    return selector_ok(n, j);
}
