/* Planner arithmetic (see planner.h for the contract and docs/planner.md
 * for the formulas). Three layers:
 *   1. per-tp facts from the layout table (parameters per layer, embedding,
 *      head; FLOPs per layer), computed once per tp degree;
 *   2. eval(): one layout -> memory by category for the worst stage,
 *      communication per group, time, MFU, cost, fit;
 *   3. enumeration for recommendations and the submit-time fit check.
 * Pure: no I/O, no globals written; any thread. */
#include "api/planner.h"
#include "common/buf.h"
#include "worker/lora_drop.h"  /* the cuda dropout kernels' workspace (header only) */
#include "worker/nf4_format.h" /* the NF4 buffer's size (header only) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static const struct planner_link_type link_types[] = {
    {"pcie3", 16, 0.8},     {"pcie4", 32, 0.8},     {"pcie5", 64, 0.8},      {"nvlink2", 300, 0.45},
    {"nvlink3", 600, 0.45}, {"nvlink4", 900, 0.45}, {"nvlink5", 1800, 0.45}, {"roce100", 12.5, 0.9},
    {"roce200", 25, 0.9},   {"roce400", 50, 0.9},   {"ib100", 12.5, 0.9},    {"ib200", 25, 0.9},
    {"ib400", 50, 0.9},     {"eth10", 1.25, 0.9},   {"eth25", 3.125, 0.9},   {"shm", 10, 1.0},
};

const struct planner_link_type *planner_link_types(size_t *n) {
    *n = sizeof link_types / sizeof *link_types;
    return link_types;
}

const struct planner_link_type *planner_link_find(const char *name) {
    for (size_t i = 0; i < sizeof link_types / sizeof *link_types; i++)
        if (strcasecmp(link_types[i].name, name) == 0) return &link_types[i];
    return NULL;
}

void planner_options_default(struct planner_options *o) {
    o->compute_efficiency = 0.5;
    o->overlap = 0.8;
    o->comm_warn = 0.20;
    o->bucket_mib = 25;
    o->latency_us_intra = 5;
    o->latency_us_inter = 15;
    o->max_alternatives = 10;
}

void planner_cluster_default(struct planner_cluster *c) {
    memset(c, 0, sizeof *c);
    c->nodes = 1;
    c->gpus_per_node = 8;
}

int planner_cluster_resolve(struct planner_cluster *c, enum jobspec_device dev,
                            struct loom_error *e) {
    if (c->nodes < 1 || c->nodes > 100000)
        return loom_error_set(e, 422, "OUT_OF_RANGE", "cluster.nodes",
                              "cluster.nodes=%d is out of range [1, 100000]", c->nodes);
    if (c->gpus_per_node < 1 || c->gpus_per_node > 64)
        return loom_error_set(e, 422, "OUT_OF_RANGE", "cluster.gpus_per_node",
                              "cluster.gpus_per_node=%d is out of range [1, 64]", c->gpus_per_node);
    if (!c->gpu[0])
        snprintf(c->gpu, sizeof c->gpu, "%s", dev == JOBSPEC_DEV_CPU ? "cpu" : "H100-SXM");
    const struct gpu_type *t = gpu_type_find(c->gpu);
    if (!t && (c->gpu_mem_gib <= 0 || c->peak_tflops <= 0)) {
        char names[256] = "";
        gpu_type_names(names, sizeof names);
        return loom_error_set(e, 422, "UNKNOWN_GPU", "cluster.gpu",
                              "unknown GPU type \"%s\" (known: %s; or give gpu_mem_gib and "
                              "peak_tflops)",
                              c->gpu, names);
    }
    if (t) {
        snprintf(c->gpu, sizeof c->gpu, "%s", t->name);
        if (c->gpu_mem_gib <= 0) c->gpu_mem_gib = t->mem_gib;
        if (c->hbm_tbps <= 0) c->hbm_tbps = t->mem_tbps;
    }
    if (c->hbm_tbps <= 0) c->hbm_tbps = 1.0;
    if (!c->intra_link[0])
        snprintf(c->intra_link, sizeof c->intra_link, "%s",
                 t                        ? t->intra_link
                 : dev == JOBSPEC_DEV_CPU ? "shm"
                                          : "pcie4");
    if (!c->inter_link[0]) snprintf(c->inter_link, sizeof c->inter_link, "roce100");
    const struct planner_link_type *li = planner_link_find(c->intra_link);
    const struct planner_link_type *lx = planner_link_find(c->inter_link);
    if (!li || !lx)
        return loom_error_set(e, 422, "UNKNOWN_LINK",
                              li ? "cluster.inter_link" : "cluster.intra_link",
                              "unknown link \"%s\" (known: pcie3-5, nvlink2-5, roce100/200/400, "
                              "ib100/200/400, eth10, eth25, shm)",
                              li ? c->inter_link : c->intra_link);
    if (c->nics_per_node <= 0) c->nics_per_node = 1;
    if (c->intra_gbps <= 0) c->intra_gbps = li->nominal_gbps * li->efficiency;
    if (c->inter_gbps <= 0) c->inter_gbps = lx->nominal_gbps * lx->efficiency * c->nics_per_node;
    if (c->host_mem_gib <= 0) c->host_mem_gib = 2048;
    if (c->host_mem_gbps <= 0) c->host_mem_gbps = 100;
    if (c->pcie_gbps <= 0) c->pcie_gbps = 25;
    if (c->price_per_gpu_hour <= 0) c->price_per_gpu_hour = 2.5;
    return 0;
}

/* ---- cluster JSON ---- */

enum cf_type { CF_INT, CF_DBL, CF_STR };
struct cfield {
    const char *name;
    enum cf_type type;
    size_t off;
    double min, max;
};
#define COFF(m) offsetof(struct planner_cluster, m)
static const struct cfield cluster_fields[] = {
    {"nodes", CF_INT, COFF(nodes), 1, 100000},
    {"gpus_per_node", CF_INT, COFF(gpus_per_node), 1, 64},
    {"gpu", CF_STR, COFF(gpu), 0, 0},
    {"gpu_mem_gib", CF_DBL, COFF(gpu_mem_gib), 0.001, 1e6},
    {"peak_tflops", CF_DBL, COFF(peak_tflops), 1e-6, 1e7},
    {"hbm_tbps", CF_DBL, COFF(hbm_tbps), 1e-6, 1e4},
    {"intra_link", CF_STR, COFF(intra_link), 0, 0},
    {"inter_link", CF_STR, COFF(inter_link), 0, 0},
    {"nics_per_node", CF_INT, COFF(nics_per_node), 1, 64},
    {"intra_gbps", CF_DBL, COFF(intra_gbps), 1e-6, 1e6},
    {"inter_gbps", CF_DBL, COFF(inter_gbps), 1e-6, 1e6},
    {"host_mem_gib", CF_DBL, COFF(host_mem_gib), 0.001, 1e7},
    {"host_mem_gbps", CF_DBL, COFF(host_mem_gbps), 1e-6, 1e6},
    {"pcie_gbps", CF_DBL, COFF(pcie_gbps), 1e-6, 1e6},
    {"price_per_gpu_hour", CF_DBL, COFF(price_per_gpu_hour), 0, 1e6},
};

int planner_cluster_from_json(const json_t *j, struct planner_cluster *c, struct loom_error *e) {
    if (!json_is_object(j))
        return loom_error_set(e, 422, "WRONG_TYPE", "cluster", "cluster must be an object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        char path[96];
        snprintf(path, sizeof path, "cluster.%.60s", key);
        const struct cfield *f = NULL;
        for (size_t i = 0; i < sizeof cluster_fields / sizeof *cluster_fields; i++)
            if (strcmp(cluster_fields[i].name, key) == 0) f = &cluster_fields[i];
        if (!f) return loom_error_set(e, 422, "UNKNOWN_FIELD", path, "unknown field %s", path);
        char *p = (char *)c + f->off;
        if (f->type == CF_STR) {
            if (!json_is_string(v))
                return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a string", path);
            if (json_string_length(v) >= PLANNER_NAME_MAX)
                return loom_error_set(e, 422, "OUT_OF_RANGE", path, "%s is too long", path);
            snprintf(p, PLANNER_NAME_MAX, "%s", json_string_value(v));
        } else if (f->type == CF_INT) {
            if (!json_is_integer(v))
                return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be an integer", path);
            json_int_t x = json_integer_value(v);
            if (x < f->min || x > f->max)
                return loom_error_set(e, 422, "OUT_OF_RANGE", path,
                                      "%s=%lld is out of range [%.0f, %.0f]", path, (long long)x,
                                      f->min, f->max);
            *(int *)p = (int)x;
        } else {
            if (!json_is_number(v))
                return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a number", path);
            double x = json_number_value(v);
            if (!(x >= f->min && x <= f->max))
                return loom_error_set(e, 422, "OUT_OF_RANGE", path,
                                      "%s=%g is out of range [%g, %g]", path, x, f->min, f->max);
            *(double *)p = x;
        }
    }
    return 0;
}

json_t *planner_cluster_to_json(const struct planner_cluster *c) {
    json_t *j = json_object();
    for (size_t i = 0; i < sizeof cluster_fields / sizeof *cluster_fields; i++) {
        const struct cfield *f = &cluster_fields[i];
        const char *p = (const char *)c + f->off;
        if (f->type == CF_STR)
            json_object_set_new(j, f->name, json_string(p));
        else if (f->type == CF_INT)
            json_object_set_new(j, f->name, json_integer(*(const int *)p));
        else
            json_object_set_new(j, f->name, json_real(*(const double *)p));
    }
    return j;
}

/* ---- per-tp facts ---- */

struct tp_facts {
    int tp, ok;
    double layer_p;  /* parameters of one block held by one tp rank */
    double embed_p;  /* token (+ position) embedding, one tp rank */
    double tok_p;    /* token embedding alone (the tied copy on the last stage) */
    double head_p;   /* final norm + untied lm_head, one tp rank */
    double total_p;  /* layout.rank_numel */
    double layer_mm; /* matmul parameters of one block (full, not per rank) */
};

/* Every block has the same tensors, so a one-block copy of the model gives
 * the per-block numbers without walking (and allocating) all n_layer blocks;
 * the test checks the totals against the full layout. */
static void tp_facts_init(struct tp_facts *f, const struct model_config *m, int tp) {
    memset(f, 0, sizeof *f);
    f->tp = tp;
    struct model_config one = *m;
    one.n_layer = 1;
    struct model_layout l;
    if (model_layout_init(&l, &one, tp) != 0) return;
    for (int i = 0; i < l.n; i++) {
        const struct model_tensor *t = &l.t[i];
        if (t->layer == 0) {
            f->layer_p += (double)t->rank_numel;
            if (t->kind == MODEL_T_LINEAR_W) f->layer_mm += (double)t->numel;
        } else if (t->layer < 0) {
            if (t->kind == MODEL_T_EMBED || t->kind == MODEL_T_POS)
                f->embed_p += (double)t->rank_numel;
            else
                f->head_p += (double)t->rank_numel;
            if (t->kind == MODEL_T_EMBED) f->tok_p = (double)t->rank_numel;
        }
    }
    f->total_p = f->embed_p + f->head_p + (double)m->n_layer * f->layer_p;
    f->ok = 1;
    model_layout_free(&l);
}

/* ---- one layout ---- */

struct ctx {
    const struct loom_spec *s;
    const struct planner_cluster *c; /* resolved */
    const struct planner_options *o;
    double e;    /* compute element bytes */
    double peak; /* FLOP/s per GPU */
    int cuda;
};

struct lay {
    int dp, tp, pp, zero, offload, mb;
    enum jobspec_recompute rc;
    double budget; /* bytes: train.recompute {"budget_gib": N} (rc is then full); 0: none */
};

/* Time of one collective call: ring within a node; hierarchical across
 * nodes, the node's network shared by every group on it. k = 2 for
 * all-reduce, 1 for reduce-scatter / all-gather. */
static double coll_time(const struct ctx *x, double k, int n, int per_node, int groups_per_node,
                        double bytes, double *gbps, int *cross) {
    const struct planner_cluster *c = x->c;
    if (n <= 1) {
        *gbps = c->intra_gbps;
        *cross = 0;
        return 0;
    }
    double ai = x->o->latency_us_intra * 1e-6, ax = x->o->latency_us_inter * 1e-6;
    if (per_node >= n) {
        *gbps = c->intra_gbps;
        *cross = 0;
        return k * (n - 1) / n * bytes / (c->intra_gbps * 1e9) + k * (n - 1) * ai;
    }
    int m = per_node < 1 ? 1 : per_node;
    int nd = (n + m - 1) / m;
    double intra = m > 1 ? k * (m - 1) / m * bytes / (c->intra_gbps * 1e9) + k * (m - 1) * ai : 0;
    double inter = k * (nd - 1) / (double)nd * bytes * groups_per_node / (c->inter_gbps * 1e9) +
                   k * (nd - 1) * ax;
    *cross = 1;
    /* effective per-rank bandwidth, for display */
    double t = intra + inter;
    *gbps = t > 0 ? k * (n - 1) / n * bytes / t / 1e9 : c->inter_gbps;
    return t;
}

double planner_offload_s(double shard, double e, int ranks_per_node, double hide_s,
                         double pcie_gbps, double host_mem_gbps) {
    double down = shard * e / (pcie_gbps * 1e9), up = down;
    down -= fmin(down, hide_s);
    double cpu = shard * (24 + 2 * e) * ranks_per_node / (host_mem_gbps * 1e9);
    return fmax(fmax(down, cpu), up);
}

static void add_comm(struct planner_estimate *est, const char *group, const char *op, int ranks,
                     int cross, double bytes, double count, double gbps, double per_call,
                     double exposed) {
    if (est->n_comm >= PLANNER_MAX_COMM || count <= 0 || ranks <= 1) return;
    struct planner_comm *p = &est->comm[est->n_comm++];
    snprintf(p->group, sizeof p->group, "%s", group);
    snprintf(p->op, sizeof p->op, "%s", op);
    p->ranks = ranks;
    p->cross_node = cross;
    p->bytes = bytes;
    p->count = count;
    p->gbps = gbps;
    p->seconds = per_call * count;
    p->exposed = exposed;
}

static void note(struct planner_estimate *est, const char *fmt, double v) {
    if (est->n_notes >= 4) return;
    snprintf(est->notes[est->n_notes++], sizeof est->notes[0], fmt, v);
}

/* FLOPs per token of the slowest pipeline stage (blocks by
 * model_stage_layers, the head on the last); its block count in *layers. */
static double slowest_stage(const struct model_config *mc, int pp, double fl_block, double fl_head,
                            int *layers) {
    double worst = 0;
    *layers = 0;
    for (int s = 0; s < pp; s++) {
        int l0, l1;
        model_stage_layers(mc, pp, s, &l0, &l1);
        double fl = (l1 - l0) * fl_block + (s == pp - 1 ? fl_head : 0);
        if (fl > worst) {
            worst = fl;
            *layers = l1 - l0;
        }
    }
    return worst;
}

/* ---- LoRA (worker/lora.c) ---- */

/* NF4 with double quantisation (bitsandbytes' QLoRA layout): 4-bit codes,
 * one 8-bit absmax per 64-weight block and one fp32 scale per 256 of those
 * blocks, about 0.516 bytes a weight; exactly nf4_bytes(n) a tensor
 * (worker/nf4_format.h, the engine's buffer: also the mean offset and the
 * 8-bit map), summed over one block's linear weights. tp > 1: tp rank 0's
 * shards (nf4_shard_bytes: the whole tensor's slices, or the shard's codes
 * with one fp32 absmax a block). A shard boundary inside a 64-weight block
 * (the engine refuses that tp: worker/nf4.c nf4_tp_check) sets *split and
 * counts that tensor's whole-tensor bytes / tp (an estimate; NULL split:
 * not reported). */
static double nf4_block_bytes(const struct model_config *mc, int tp, int *split) {
    struct model_config one = *mc;
    one.n_layer = 1;
    struct model_layout l;
    double b = 0;
    if (model_layout_init(&l, &one, 1) != 0) return 0;
    for (int i = 0; i < l.n; i++)
        if (l.t[i].layer == 0 && l.t[i].kind == MODEL_T_LINEAR_W && l.t[i].ndim == 2) {
            const struct model_tensor *t = &l.t[i];
            struct nf4_shard sh;
            int whole = 1;
            for (int k = 0; k < tp; k++) /* every rank's shard must be whole blocks */
                whole &= nf4_shard_geom((size_t)t->shape[0], (size_t)t->shape[1], (int)t->split,
                                        t->parts, tp, k, &sh) != NF4_SHARD_NONE;
            if (!whole) {
                if (split) *split = 1;
                b += (double)nf4_bytes((size_t)t->numel) / tp;
                continue;
            }
            nf4_shard_geom((size_t)t->shape[0], (size_t)t->shape[1], (int)t->split, t->parts, tp, 0,
                           &sh);
            b += (double)nf4_shard_bytes(&sh);
        }
    model_layout_free(&l);
    return b;
}

static double align64(double n) {
    return ceil(n / 64) * 64;
}

struct lora_facts {
    double arena;  /* adapter elements of one block, each tensor padded to 64 (lora.c's arena) */
    int per_layer; /* adapters of one block */
    double wmax, imax; /* widest site output and input (scratch rows) */
    /* tp > 1: elements of one block's replicated pieces (their gradients
     * summed over tp through one packed buffer), and the widest whole input
     * of a row-parallel target (the dropout scratch that keeps tp = 1's masks) */
    double rep, rowin;
    int ins[16], n_ins; /* each target's input width (this rank's share) */
};

/* (in, out) of each spec target, as lora.c places them: one tp rank's share
 * (a column-parallel base's B and a row-parallel base's A are split). */
static void lora_facts_init(const struct loom_spec *s, int tp, struct lora_facts *lf) {
    const struct model_config *mc = &s->model;
    double C = mc->d_model, hd = (double)mc->d_model / mc->n_head;
    double q = mc->n_head * hd, kv = mc->n_kv_head * hd, F = mc->d_ff;
    double QKV = q + 2 * kv, fcw = mc->act == MODEL_ACT_SWIGLU ? 2 * F : F;
    double r = s->train.lora.rank;
    memset(lf, 0, sizeof *lf);
    for (int i = 0; i < s->train.lora.n_targets; i++) {
        int64_t whole_in, whole_out;
        int row; /* o, down, proj, fc2: the input is split */
        if (model_lora_site(mc, s->train.lora.targets[i], &whole_in, &whole_out, &row) != 0)
            continue; /* the spec validator names it */
        double in = (double)whole_in / (row ? tp : 1), out = (double)whole_out / (row ? 1 : tp);
        lf->arena += align64(r * in) + align64(out * r);
        if (lf->n_ins < (int)(sizeof lf->ins / sizeof *lf->ins)) lf->ins[lf->n_ins++] = (int)in;
        lf->per_layer++;
        if (tp > 1) lf->rep += row ? out * r : r * in;
        if (tp > 1 && row && whole_in > lf->rowin) lf->rowin = (double)whole_in;
    }
    QKV /= tp, fcw /= tp, q /= tp, F /= tp;
    lf->wmax = QKV > C ? QKV : C;
    if (fcw > lf->wmax) lf->wmax = fcw;
    lf->imax = C > q ? C : q;
    if (F > lf->imax) lf->imax = F;
}

/* train.lora: the base frozen (its values only: no gradients, master or
 * moments; in NF4 with train.quantize_base, plus one block dequantized to
 * the compute dtype at a time), the adapters with values, gradients, an fp32
 * master (aliasing the values on fp32) and moments, sharded over dp with
 * ZeRO 1-2, their saved products (N x r per adapter, per micro-batch in
 * flight) and scratch. As lora_new and engine_place.frozen allocate. */
static void lora_mem(const struct ctx *x, const struct tp_facts *f, const struct lay *L, int layers,
                     double P, double N, struct planner_mem *m) {
    const struct loom_spec *s = x->s;
    double e = x->e, r = s->train.lora.rank;
    struct lora_facts lf;
    lora_facts_init(s, L->tp, &lf);
    double A = layers * lf.arena;
    double base = P * e;
    if (s->train.quantize_base == JOBSPEC_QUANT_NF4) {
        /* block linear weights (tp rank 0's shards) in NF4, the rest in the
         * compute dtype, the one-block scratch (worker/nf4.c nf4_attach) and
         * the engine's empty params window (one element) */
        double mm = f->layer_mm / L->tp, lin = layers * mm; /* one rank's share */
        base = layers * nf4_block_bytes(&s->model, L->tp, NULL) + (P - lin) * e + mm * e + e;
    }
    int dp = L->dp, zs = dp > 1 ? L->zero : 0;
    double shard = zs >= 1 ? ceil(A / dp) : A;
    m->params = base + A * e;
    m->grads = A * e + (zs >= 1 ? shard * e : 0) + layers * lf.rep * e;
    m->optimizer = shard * ((e < 4 ? 4 : 0) + 8) + 20; /* + the fp32 norm scalars (16 + 4) */
    /* the saved products per micro-batch in flight (worker/pp.c: a set per
     * slot, lora_reserve_slots), the scratch once */
    double acts =
        (double)m->inflight * layers * lf.per_layer * N * r * e + N * lf.wmax * e + N * r * e;
    if (s->train.lora.dropout > 0 && x->cuda && r <= 64) {
        /* cuda: the mask inside the x.A kernels (the lora-drop-fused row's
         * default, BACKEND_LORA_DROP_RMAX), whose backward's workspace is
         * the only scratch: the widest adapter's */
        double ws = 0;
        for (int i = 0; i < lf.n_ins; i++) {
            double w = (double)lora_drop_ws_bytes((int)N, lf.ins[i], (int)r);
            ws = w > ws ? w : ws;
        }
        acts += ws;
    } else if (s->train.lora.dropout > 0) {
        acts += 2 * N * lf.imax * e + N * lf.rowin * e;
    }
    m->act_other += acts;
    m->activations += acts;
    m->comm = 0; /* adapters reduce in place (NCCL) or through the host all-reduce */
    m->host_per_rank = m->host_per_node = 0;
}

/* Memory of stage `st` (bytes per GPU). */
static void stage_mem(const struct ctx *x, const struct tp_facts *f, const struct lay *L,
                      int64_t ga, int st, struct planner_mem *m) {
    const struct model_config *mc = &x->s->model;
    double e = x->e;
    int tp = L->tp, pp = L->pp, dp = L->dp;
    int l0, l1;
    model_stage_layers(mc, pp, st, &l0, &l1);
    int layers = l1 - l0;
    int first = st == 0, last = st == pp - 1;
    double P = layers * f->layer_p + (first ? f->embed_p : 0) + (last ? f->head_p : 0) +
               (last && pp > 1 && mc->tied_embeddings ? f->tok_p : 0);
    memset(m, 0, sizeof *m);
    m->worst_stage = st;
    /* As the engine allocates (worker/zero.c, checked by unit.mem.zero): a
     * rank owns its stage's tensors Po (the last stage's tied copy X of the
     * embedding is extra). ZeRO-2 keeps gradients as the rank's shard Po/dp
     * plus the embeddings/head group H (held whole) plus two block slots K
     * (the block in use and the one being reduced); ZeRO-3 does the same for
     * parameters (gather slots: the block in use and the prefetched next one).
     * With one dp rank there is nothing to shard: stages 2/3 act as 1. */
    double X = last && pp > 1 && mc->tied_embeddings ? f->tok_p : 0;
    double Po = P - X;
    double H = (first ? f->embed_p : 0) + (last ? f->head_p : 0);
    double K = (layers < 2 ? layers : 2) * f->layer_p;
    int zs = dp == 1 && L->zero > 1 ? 1 : L->zero;
    double win = Po / dp + H + K;
    m->stage_params = P;
    m->params = ((zs >= 3 ? win : Po) + X) * e;
    m->grads = ((zs >= 2 ? win : Po) + X) * e;
    double shard = Po / (zs >= 1 ? dp : 1);
    double master = e < 4 ? 4 : 0; /* fp32 master aliases the params on fp32 */
    double opt_bytes = shard * (master + 8);
    if (L->offload) {
        int per_node = x->c->gpus_per_node;
        int world = dp * tp * pp;
        if (world < per_node) per_node = world;
        /* as worker/offload.c allocates: fp32 master and moments (12 B) and
         * the transfer buffer the gradients come down into and the updated
         * parameters go up from (one compute element) */
        m->host_per_rank = shard * (12 + e);
        m->host_per_node = per_node * m->host_per_rank;
    } else {
        m->optimizer = opt_bytes;
    }

    /* activations: the engine's per-layer buffers (worker/model.c) */
    double N = (double)L->mb * mc->seq_len;
    double C = mc->d_model, hd = (double)mc->d_model / mc->n_head;
    double QKV = (mc->n_head + 2.0 * mc->n_kv_head) * hd;
    double F = mc->d_ff, fcw = mc->act == MODEL_ACT_SWIGLU ? 2 * F : F;
    double NH = mc->n_head;
    double attn = N * (e * (QKV + C) / tp + 4 * NH / tp); /* qkv, attention out, lse */
    double mlp = N * e * (fcw + F) / tp;                  /* fc pre-activation, activation */
    double normres = N * (e * 4 * C + 16);                /* n1, r1, n2, r2 + fp32 stats */
    double attn_s = attn, mlp_s = mlp, normres_s = normres;
    if (L->rc == JOBSPEC_RECOMPUTE_SELECTIVE) {
        /* the norms' outputs and the MLP activation recomputed in the backward
         * from what each block keeps, into one n1 (= n2) and one activation
         * buffer shared by the blocks (added below) */
        mlp_s = N * e * fcw / tp;
        normres_s = N * (e * 2 * C + 16);
    } else if (L->rc == JOBSPEC_RECOMPUTE_FULL) {
        attn_s = mlp_s = 0;
        normres_s = N * e * C; /* the block input only */
    }
    int inflight = pp == 1 ? 1 : (int)((pp - st) < ga ? (pp - st) : ga);
    m->inflight = inflight;
    double k = (double)inflight * layers;
    /* full recompute: one block's buffers but its output (r2), shared by the
     * blocks of each in-flight micro-batch's model (worker/pp.c: a model each) */
    double full_sh = L->rc == JOBSPEC_RECOMPUTE_FULL ? inflight : 0;
    m->act_attention = k * attn_s + full_sh * attn;
    m->act_mlp = k * mlp_s + full_sh * mlp;
    m->act_norm_residual = k * normres_s + full_sh * (normres - N * e * C);
    if (L->rc == JOBSPEC_RECOMPUTE_SELECTIVE) { /* the shared n1 and activation, a set per slot */
        m->act_mlp += inflight * N * e * F / tp;
        m->act_norm_residual += inflight * N * e * C;
    }
    m->keep = -1;
    m->layers = layers;
    double wide = C;
    if (QKV / tp > wide) wide = QKV / tp;
    if (fcw / tp > wide) wide = fcw / tp;
    /* enc, nf, dres, dnf, two scratch buffers; fp32 norm stats, losses, int32 tokens+targets */
    m->act_other = inflight * N * (e * (4 * C + 2 * wide) + 20);
    m->activations = m->act_attention + m->act_mlp + m->act_norm_residual + m->act_other;

    /* communication buffers */
    double bucket = x->o->bucket_mib * MIB;
    if (dp > 1) {
        double pb = P * e;
        m->comm += 2 * (pb < bucket ? pb : bucket);
    }
    /* cuda, ZeRO 0, two dp ranks on one node: the copy-engine gradient sum
     * (worker/nccl/pair.h) keeps a receive area the size of the gradients */
    if (x->cuda && zs == 0 && dp == 2 && tp == 1 && pp == 1 && x->c->gpus_per_node >= 2) {
        m->comm += Po * e;
        /* and the token embedding's per-token rows: this rank's and the
         * peer's side area (rows and ids), worker/zero.c */
        m->comm += 2 * N * C * e + N * 4;
    }
    if (tp > 1) m->comm += N * C * e;
    if (pp > 1) m->comm += 2 * N * C * e;
    if (x->s->train.lora.enabled) lora_mem(x, f, L, layers, P, N, m);
    /* train.precision fp8 (cuda; worker/cuda fp8_freeze) and one E4M3 buffer
     * for the widest layer input or output gradient; LoRA on one GPU: the base
     * held as E4M3 W alone (worker/fp8base.h), 1 byte a block linear weight in
     * place of bf16's 2, and a buffer for the widest weight's W^T (made at each
     * input-gradient GEMM; at most C x the widest block width); LoRA on more
     * GPUs: the E4M3 W and W^T beside the bf16 base, 2 bytes a weight; a full fine-tune
     * (weights quantized at each use, weight gradients in E4M3): the largest
     * weight's E4M3 form (at most C x the widest block width) and two more
     * activation buffers for the transposed dY and X */
    if (x->cuda && x->s->train.precision == JOBSPEC_PREC_FP8 &&
        !(x->s->train.lora.enabled && x->s->train.quantize_base == JOBSPEC_QUANT_NF4)) {
        if (x->s->train.lora.enabled && tp * dp * pp == 1 && !L->offload) {
            m->params -= 1.0 * layers * f->layer_mm;
            m->workspace += N * wide + wide * C + 128;
        } else if (x->s->train.lora.enabled) {
            m->params += 2.0 * layers * f->layer_mm / tp;
            m->workspace += N * wide + 128;
        } else {
            m->workspace += 3 * N * wide + wide * C + 128;
        }
    }
    /* workspace: the classifier's row chunk of logits, as the backends take it:
     * cpu 64 rows of fp32; cuda bf16, as many rows as fit in 2 GiB (512 MiB when
     * the head is frozen, LoRA), rounded down to 64 and at most the micro-batch's
     * N (worker/cuda/cuda_backend.c reserve, at the xent-chunk-mib row's default) */
    if (last) {
        double vl = (double)mc->padded_vocab / tp;
        if (x->cuda) {
            double cap = (x->s->train.lora.enabled ? 512.0 : 2048.0) * MIB;
            double rows = floor(cap / (vl * 2));
            rows = rows >= N ? N : rows >= 64 ? floor(rows / 64) * 64 : rows < 1 ? 1 : rows;
            m->workspace += rows * vl * 2;
        } else {
            m->workspace += 64 * vl * 4;
        }
    }
    if (x->cuda) {
        m->workspace += 32 * MIB; /* cuBLAS */
        /* attention (multi-head and grouped-query) runs through cuDNN's
         * fused engines where libcudnn.so.9 is found: their deterministic
         * backward keeps dP (micro-batch x query heads x T x T, bf16) in a
         * workspace, beside fp32 softmax sums (worker/cuda/cudnn_attn.h);
         * counted even where the worker then falls back to k_attn.cu */
        m->workspace += N * mc->seq_len * (NH / tp) * 2 + N * (NH / tp) * 4;
        m->reserved = 1 * GIB; /* CUDA context and allocator slack */
    }
    m->total =
        m->params + m->grads + m->optimizer + m->activations + m->comm + m->workspace + m->reserved;
    if (L->budget > 0 && L->rc == JOBSPEC_RECOMPUTE_FULL) {
        /* The budget mode: the first K blocks keep what selective recompute
         * keeps (their norms' outputs and activation go into one shared n1
         * and activation buffer), the others recompute in full, sharing one
         * block's buffers but its output (worker/model.c model_opts.keep).
         * K = L-1 costs more than K = L (the shared block), so the candidates
         * are L, then L-2 down to 0. */
        double sel[3] = {attn, N * e * fcw / tp, N * (e * 2 * C + 16)}, out = N * e * C;
        double per = (m->act_attention + m->act_mlp + m->act_norm_residual);
        double rest = m->total - per, acts[3] = {0, 0, 0};
        int K = layers;
        for (;;) {
            int some = K < layers;
            /* shared: a whole block but its output, or (all kept) n1 and the activation */
            double sh[3] = {some ? attn : 0, some ? mlp : N * e * F / tp,
                            some ? normres - out : N * e * C};
            for (int i = 0; i < 3; i++)
                acts[i] = inflight * (K * sel[i] + sh[i]);
            acts[2] += inflight * (layers - K) * out;
            if (K == 0 || rest + acts[0] + acts[1] + acts[2] <= L->budget) break;
            K = K == layers ? layers - 2 : K - 1;
            if (K < 0) K = 0;
        }
        m->budget_floor = rest + per;
        m->keep = K;
        m->act_attention = acts[0];
        m->act_mlp = acts[1];
        m->act_norm_residual = acts[2];
        m->activations = acts[0] + acts[1] + acts[2] + m->act_other;
        m->total = rest + acts[0] + acts[1] + acts[2];
    }
    m->gpu_bytes = x->c->gpu_mem_gib * GIB;
    m->host_bytes = x->c->host_mem_gib * GIB;
}

static void eval(const struct ctx *x, const struct tp_facts *f, const struct lay *L,
                 struct planner_estimate *est) {
    const struct loom_spec *s = x->s;
    const struct model_config *mc = &s->model;
    const struct planner_cluster *c = x->c;
    const struct planner_options *o = x->o;
    memset(est, 0, sizeof *est);
    int dp = L->dp, tp = L->tp, pp = L->pp;
    int world = dp * tp * pp;
    int G = c->gpus_per_node;
    if (s->resources.gpus_per_node < G) G = s->resources.gpus_per_node;
    if (G < tp) G = tp;
    double T = mc->seq_len, N = (double)L->mb * T, e = x->e, C = mc->d_model;
    int64_t ga = s->train.global_batch_tokens / ((int64_t)L->mb * mc->seq_len * dp);
    est->dp = dp;
    est->tp = tp;
    est->pp = pp;
    est->zero_stage = L->zero;
    est->offload = L->offload;
    est->micro_batch = L->mb;
    est->recompute = L->rc;
    est->world = world;
    est->nodes = (world + G - 1) / G;
    est->grad_accum = ga;

    /* memory: first and last stage bound every other one */
    struct planner_mem m0, m1;
    stage_mem(x, f, L, ga, 0, &m0);
    est->mem = m0;
    if (pp > 1) {
        stage_mem(x, f, L, ga, pp - 1, &m1);
        if (m1.total > m0.total) est->mem = m1;
    }

    /* compute, per token, forward + backward: a full fine-tune's 6 FLOPs a
     * matmul weight; LoRA's frozen base only its forward and input gradient
     * (4), plus the adapters' 6 a parameter (model_lora_flops_per_token) */
    int lora = s->train.lora.enabled;
    double mmk = lora ? 4 : 6, ad_layer = (double)jobspec_lora_params(s) / mc->n_layer;
    double fl_layer = mmk * f->layer_mm + 6 * ad_layer + 12 * C * T;
    double fwd_layer = 2 * f->layer_mm + 2 * ad_layer + 4 * C * T;
    double fl_head = mmk * mc->padded_vocab * C;
    double extra = 0;
    /* the budget mode recomputes the worst stage's blocks but the kept ones */
    double rc_frac = est->mem.keep >= 0 && est->mem.layers > 0
                         ? (double)(est->mem.layers - est->mem.keep) / est->mem.layers
                         : 1;
    if (L->rc == JOBSPEC_RECOMPUTE_FULL) extra = fwd_layer * rc_frac;
    /* selective recomputes norms and the activation: no matmul work */
    /* the slowest stage sets the pace (the last one carries the head) */
    int layers = 0;
    double stage_fl = slowest_stage(mc, pp, fl_layer + extra, fl_head, &layers);
    if (pp > 1 && !mc->pp_balance) {
        struct model_config bal = *mc;
        int lb;
        bal.pp_balance = 1;
        double fb = slowest_stage(&bal, pp, fl_layer + extra, fl_head, &lb);
        if (fb < 0.98 * stage_fl)
            note(est, "parallel.pp_balance: true would cut the slowest stage's work by %.0f%%",
                 100 * (1 - fb / stage_fl));
    }
    double t_mb = stage_fl * N / tp / (x->peak * o->compute_efficiency);
    double t_bwd = t_mb * (1 - fwd_layer / fl_layer);
    /* == model_flops_per_token or model_lora_flops_per_token (checked by the
     * tests), without a layout walk */
    est->flops_per_token = mmk * (mc->n_layer * f->layer_mm + (double)mc->padded_vocab * C) +
                           6 * ad_layer * mc->n_layer + 12.0 * mc->n_layer * C * T;
    est->compute_s = ga * t_mb;
    if (lora && s->train.quantize_base == JOBSPEC_QUANT_NF4 && layers > 0) {
        /* QLoRA: each block's NF4 weights dequantized into the compute dtype
         * before its forward and again before its backward (worker/nf4.c
         * nf4_layer; the last forward block is still there when the backward
         * starts), a pass that reads the codes and writes the weights at the
         * HBM bandwidth */
        double per_block = nf4_block_bytes(mc, tp, NULL) + f->layer_mm / tp * e;
        double dq = ga * (2.0 * layers - 1) * per_block / (c->hbm_tbps * 1e12);
        est->compute_s += dq;
        note(est, "NF4 base: %.3f s a step dequantizing blocks", dq);
    }
    est->bubble_s = (pp - 1) * t_mb;

    /* communication */
    double exposed = 0, total = 0, gb, t;
    int cross;
    if (tp > 1) {
        double bytes = N * C * e;
        double count =
            (double)ga * (layers * (L->rc == JOBSPEC_RECOMPUTE_FULL ? 4 + 2 * rc_frac : 4) + 2);
        t = coll_time(x, 2, tp, tp, 1, bytes, &gb, &cross);
        add_comm(est, "tp", "all_reduce", tp, cross, bytes, count, gb, t, t * count);
        exposed += t * count;
        total += t * count;
    }
    if (pp > 1) {
        double bytes = N * C * e;
        double count = 2.0 * ga;
        int senders = dp * tp < G ? dp * tp : G;
        int xnode = world > G;
        double bw = xnode ? c->inter_gbps / senders : c->intra_gbps;
        double a = (xnode ? o->latency_us_inter : o->latency_us_intra) * 1e-6;
        t = bytes / (bw * 1e9) + a;
        add_comm(est, "pp", "send_recv", pp, xnode, bytes, count, bw, t, t * count);
        exposed += t * count;
        total += t * count;
        if (mc->tied_embeddings) {
            double eb = f->tok_p * e;
            double te = eb / (bw * 1e9) + a;
            add_comm(est, "embed", "all_reduce", 2, xnode, eb, 1, bw, te, te);
            exposed += te;
            total += te;
        }
    }
    /* what dp reduces and the optimizer steps: the stage's parameters on one
     * tp rank, or with LoRA its adapters (the base is frozen) */
    double trained = est->mem.stage_params;
    if (lora) {
        struct lora_facts lf;
        lora_facts_init(s, tp, &lf);
        trained = est->mem.layers * lf.arena;
    }
    if (dp > 1) {
        double P = trained;
        double bytes = P * e;
        int per_node = G / tp;
        if (per_node < 1) per_node = 1;
        if (per_node > dp) per_node = dp;
        int groups = G / per_node;
        if (L->zero == 0) {
            t = coll_time(x, 2, dp, per_node, groups, bytes, &gb, &cross);
            double ex = t - fmin(t, o->overlap * t_bwd);
            add_comm(est, "dp", "all_reduce", dp, cross, bytes, 1, gb, t, ex);
            exposed += ex;
            total += t;
        } else {
            double trs = coll_time(x, 1, dp, per_node, groups, bytes, &gb, &cross);
            double tag = coll_time(x, 1, dp, per_node, groups, bytes, &gb, &cross);
            if (L->zero <= 2) {
                double n_rs = L->zero == 2 ? (double)ga : 1;
                double ex_rs = n_rs * (trs - fmin(trs, o->overlap * t_bwd));
                add_comm(est, "dp", "reduce_scatter", dp, cross, bytes, n_rs, gb, trs, ex_rs);
                add_comm(est, "dp", "all_gather", dp, cross, bytes, 1, gb, tag, tag);
                exposed += ex_rs + tag;
                total += n_rs * trs + tag;
            } else {
                double per_ms = 2 * tag + trs;
                double ex = ga * (per_ms - fmin(per_ms, o->overlap * t_mb));
                add_comm(est, "dp", "all_gather", dp, cross, bytes, 2.0 * ga, gb, tag,
                         ex * 2 * tag / per_ms);
                add_comm(est, "dp", "reduce_scatter", dp, cross, bytes, (double)ga, gb, trs,
                         ex * trs / per_ms);
                exposed += ex;
                total += ga * per_ms;
            }
        }
    }
    est->comm_s = total;
    est->comm_exposed_s = exposed;

    /* optimizer */
    double P = trained;
    double shard = P / (L->zero >= 1 ? dp : 1);
    if (L->offload) {
        /* worker/offload.c's pipeline over 64 MiB chunks: the shard's gradients
         * come down over PCIe (ZeRO-2/3: during the last backward, hidden up to
         * overlap x t_bwd), the CPU updates each chunk as it lands at the host
         * memory bandwidth the node's ranks share (fp32 master, m, v read and
         * written, the gradient read and the parameter written over it:
         * 24 + 2e bytes per parameter), and the chunk goes back up on the other
         * PCIe direction; the three stages overlap, so the step pays the
         * slowest (planner_offload_s). */
        int per_node = world < c->gpus_per_node ? world : c->gpus_per_node;
        est->optimizer_s =
            planner_offload_s(shard, e, per_node, L->zero >= 2 ? o->overlap * t_bwd : 0,
                              c->pcie_gbps, c->host_mem_gbps);
    } else {
        est->optimizer_s = shard * 28 / (c->hbm_tbps * 1e12);
    }

    est->step_s = est->compute_s + est->bubble_s + exposed + est->optimizer_s;
    double tokens = (double)s->train.global_batch_tokens;
    est->tokens_per_s = tokens / est->step_s;
    est->mfu = est->flops_per_token * est->tokens_per_s / (world * x->peak);
    est->comm_fraction = exposed / est->step_s;
    est->bubble_fraction = est->bubble_s / est->step_s;
    est->run_hours = s->train.steps * est->step_s / 3600;
    est->gpu_hours = est->run_hours * world;
    est->cost = est->gpu_hours * c->price_per_gpu_hour;

    /* fit */
    est->fits = 1;
    if (est->mem.total > est->mem.gpu_bytes) {
        est->fits = 0;
        snprintf(est->reason, sizeof est->reason, "does not fit: %.1f GiB/GPU > %.0f GiB",
                 est->mem.total / GIB, est->mem.gpu_bytes / GIB);
    } else if (L->offload && est->mem.host_per_node > 0.9 * est->mem.host_bytes) {
        est->fits = 0;
        snprintf(est->reason, sizeof est->reason,
                 "does not fit: offloaded optimizer needs %.0f GiB host memory per node > 90%% of "
                 "%.0f GiB",
                 est->mem.host_per_node / GIB, est->mem.host_bytes / GIB);
    }
    if (est->comm_fraction > o->comm_warn)
        note(est, "communication %.0f%% of step", 100 * est->comm_fraction);
    if (est->bubble_fraction > 0.10)
        note(est, "pipeline bubble %.0f%% of step", 100 * est->bubble_fraction);
    if (L->offload) note(est, "optimizer offloaded to host: %.2f s/step", est->optimizer_s);
    if (est->mem.keep >= 0 && est->n_notes < 4) {
        char *nt = est->notes[est->n_notes++];
        if (est->mem.budget_floor > L->budget)
            snprintf(nt, sizeof est->notes[0],
                     "recompute budget %.1f GiB is under the %.1f GiB of every block recomputed",
                     L->budget / GIB, est->mem.budget_floor / GIB);
        else
            snprintf(nt, sizeof est->notes[0],
                     "recompute budget %.1f GiB: %d of %d blocks kept, +%.0f%% compute",
                     L->budget / GIB, est->mem.keep, est->mem.layers, 100.0 / 3 * rc_frac);
    } else if (L->rc == JOBSPEC_RECOMPUTE_FULL) {
        note(est, "full recompute: +%.0f%% compute", 100.0 / 3);
    }
}

static int ctx_init(struct ctx *x, const struct loom_spec *s, const struct planner_cluster *c,
                    const struct planner_options *o) {
    x->s = s;
    x->c = c;
    x->o = o;
    x->cuda = s->resources.device == JOBSPEC_DEV_CUDA;
    x->e = (!x->cuda || s->train.precision == JOBSPEC_PREC_FP32) ? 4 : 2;
    const struct gpu_type *t = gpu_type_find(c->gpu);
    double tf = c->peak_tflops;
    if (tf <= 0 && t) tf = x->e == 4 ? t->fp32_tflops : t->bf16_tflops;
    if (tf <= 0) tf = 1;
    x->peak = tf * 1e12;
    return 0;
}

/* The context, tp facts and layout of the spec's own layout (the budget mode
 * as full recompute with its budget). */
static int spec_ctx(const struct loom_spec *s, const struct planner_cluster *c,
                    const struct planner_options *o, struct ctx *x, struct tp_facts *f,
                    struct lay *L, struct loom_error *e) {
    ctx_init(x, s, c, o);
    tp_facts_init(f, &s->model, s->parallel.tp);
    if (!f->ok)
        return loom_error_set(e, 422, "TP_HEADS", "parallel.tp", "tp=%d does not split the model",
                              s->parallel.tp);
    *L = (struct lay){s->parallel.dp,
                      s->parallel.tp,
                      s->parallel.pp,
                      s->parallel.zero_stage,
                      s->train.offload_optimizer,
                      s->train.micro_batch,
                      s->train.recompute,
                      0};
    if (s->train.recompute_budget_gib > 0) {
        L->rc = JOBSPEC_RECOMPUTE_FULL;
        L->budget = s->train.recompute_budget_gib * GIB;
    }
    return 0;
}

int planner_estimate(const struct loom_spec *s, const struct planner_cluster *cin,
                     const struct planner_options *oin, struct planner_estimate *out,
                     struct loom_error *e) {
    struct planner_options o;
    if (oin)
        o = *oin;
    else
        planner_options_default(&o);
    struct planner_cluster c;
    if (cin)
        c = *cin;
    else
        planner_cluster_default(&c);
    if (planner_cluster_resolve(&c, s->resources.device, e) != 0) return -1;
    if (jobspec_validate(s, JOBSPEC_FOR_PLAN, e) != 0) return -1;
    int world = s->parallel.dp * s->parallel.tp * s->parallel.pp;
    if (world > c.nodes * c.gpus_per_node)
        return loom_error_set(e, 422, "LAYOUT_EXCEEDS_CLUSTER", "parallel",
                              "dp*tp*pp = %d*%d*%d = %d ranks but the cluster has %d x %d = %d "
                              "GPUs",
                              s->parallel.dp, s->parallel.tp, s->parallel.pp, world, c.nodes,
                              c.gpus_per_node, c.nodes * c.gpus_per_node);
    if (s->parallel.tp > c.gpus_per_node)
        return loom_error_set(e, 422, "TP_CROSSES_NODE", "parallel.tp",
                              "tp=%d exceeds the cluster's gpus_per_node=%d", s->parallel.tp,
                              c.gpus_per_node);
    struct ctx x;
    struct tp_facts f;
    struct lay L;
    if (spec_ctx(s, &c, &o, &x, &f, &L, e) != 0) return -1;
    eval(&x, &f, &L, out);
    return 0;
}

int planner_recompute_keep(const struct loom_spec *s, int stage, int *keep, double *floor_gib,
                           struct loom_error *e) {
    if (s->train.recompute_budget_gib <= 0)
        return loom_error_set(e, 422, "OUT_OF_RANGE", "train.recompute",
                              "train.recompute has no budget_gib");
    int world = s->parallel.dp * s->parallel.tp * s->parallel.pp;
    struct planner_cluster c;
    planner_cluster_default(&c);
    c.nodes = 1;
    c.gpus_per_node = world > 0 ? world : 1;
    struct planner_options o;
    planner_options_default(&o);
    if (planner_cluster_resolve(&c, s->resources.device, e) != 0) return -1;
    if (jobspec_validate(s, JOBSPEC_FOR_PLAN, e) != 0) return -1;
    struct ctx x;
    struct tp_facts f;
    struct lay L;
    if (spec_ctx(s, &c, &o, &x, &f, &L, e) != 0) return -1;
    if (stage < 0 || stage >= s->parallel.pp)
        return loom_error_set(e, 422, "OUT_OF_RANGE", "parallel.pp", "stage %d of pp=%d", stage,
                              s->parallel.pp);
    int64_t ga = s->train.global_batch_tokens / ((int64_t)L.mb * s->model.seq_len * s->parallel.dp);
    struct planner_mem m;
    stage_mem(&x, &f, &L, ga, stage, &m);
    *keep = m.keep;
    *floor_gib = m.budget_floor / GIB;
    if (m.budget_floor > L.budget)
        return loom_error_set(e, 422, "RECOMPUTE_BUDGET_TOO_SMALL", "train.recompute.budget_gib",
                              "train.recompute.budget_gib %.2f is under the %.2f GiB this rank "
                              "needs with every block recomputed (stage %d)",
                              s->train.recompute_budget_gib, *floor_gib, stage);
    return 0;
}

int planner_estimate_job(const struct loom_spec *s, const char *gpu, double gpu_mem_gib,
                         struct planner_estimate *est, struct loom_error *e) {
    struct planner_cluster c;
    planner_cluster_default(&c);
    int g = s->resources.gpus_per_node > 0 ? s->resources.gpus_per_node : 1;
    int world = s->parallel.dp * s->parallel.tp * s->parallel.pp;
    c.gpus_per_node = g;
    c.nodes = (world + g - 1) / g;
    if (gpu) snprintf(c.gpu, sizeof c.gpu, "%s", gpu);
    if (gpu_mem_gib > 0) {
        c.gpu_mem_gib = gpu_mem_gib;
        if (gpu && !gpu_type_find(gpu))
            c.peak_tflops = s->resources.device == JOBSPEC_DEV_CPU ? 0.2 : 100; /* nominal */
    }
    return planner_estimate(s, &c, NULL, est, e);
}

/* ---- recommendation ---- */

static double complexity(const struct planner_estimate *est) {
    return est->offload * 4 + (est->pp > 1) * 2 + (est->tp > 1) + est->zero_stage * 0.5 +
           (double)est->recompute;
}

static int cand_cmp(const void *a, const void *b) {
    const struct planner_candidate *x = a, *y = b;
    if (x->est.fits != y->est.fits) return y->est.fits - x->est.fits;
    double kx = x->est.fits ? x->score : x->est.mem.total;
    double ky = y->est.fits ? y->score : y->est.mem.total;
    return kx < ky ? -1 : kx > ky ? 1 : 0;
}

static void describe(struct planner_candidate *p) {
    const struct planner_estimate *est = &p->est;
    if (!est->fits) {
        snprintf(p->why, sizeof p->why, "%s", est->reason);
        return;
    }
    int n = snprintf(p->why, sizeof p->why, "fits: %.1f GiB/GPU, %.3g s/step, %.0f%% MFU",
                     est->mem.total / GIB, est->step_s, 100 * est->mfu);
    for (int i = 0; i < est->n_notes && n > 0 && (size_t)n < sizeof p->why; i++)
        n += snprintf(p->why + n, sizeof p->why - n, "; %s", est->notes[i]);
}

int planner_recommend(const struct loom_spec *s, const struct planner_cluster *cin,
                      const struct planner_options *oin, struct planner_candidate **out, int *nout,
                      struct loom_error *e) {
    *out = NULL;
    *nout = 0;
    struct planner_options o;
    if (oin)
        o = *oin;
    else
        planner_options_default(&o);
    struct planner_cluster c;
    if (cin)
        c = *cin;
    else
        planner_cluster_default(&c);
    if (planner_cluster_resolve(&c, s->resources.device, e) != 0) return -1;
    const struct model_config *mc = &s->model;
    char err[256];
    if (model_config_check(mc, err, sizeof err, NULL) != 0)
        return loom_error_set(e, 422, "INVALID_MODEL", "model", "%s", err);
    struct loom_spec sp = *s;
    sp.resources.gpus_per_node = c.gpus_per_node;
    struct ctx x;
    ctx_init(&x, &sp, &c, &o);
    int G = c.gpus_per_node;

    /* world sizes: 1, 2, 4, .. < G, G, then 2G, 4G, .. < nodes*G, nodes*G */
    int worlds[64], nw = 0;
    for (int w = 1; w < G && nw < 32; w *= 2)
        worlds[nw++] = w;
    worlds[nw++] = G;
    for (int n = 2; n < c.nodes && nw < 60; n *= 2)
        worlds[nw++] = n * G;
    if (c.nodes > 1) worlds[nw++] = c.nodes * G;

    struct tp_facts facts[65];
    memset(facts, 0, sizeof facts);
    int cap = 256, n = 0;
    struct planner_candidate *list = malloc((size_t)cap * sizeof *list);
    if (!list) return loom_error_set(e, 500, "INTERNAL", "", "out of memory");
    int max_mb = sp.train.micro_batch;
    int cuda = sp.resources.device == JOBSPEC_DEV_CUDA;
    for (int wi = 0; wi < nw; wi++) {
        int w = worlds[wi];
        for (int tp = 1; tp <= G && tp <= w; tp++) {
            if (G % tp || w % tp || mc->n_head % tp || mc->n_kv_head % tp || mc->d_ff % tp)
                continue;
            if (!facts[tp].tp) tp_facts_init(&facts[tp], mc, tp);
            if (!facts[tp].ok) continue;
            /* an NF4 base under tp needs every shard boundary on a 64-weight
             * block (worker/main.c lora_check, docs/engine.md "QLoRA") */
            int split = 0;
            if (tp > 1 && sp.train.lora.enabled && sp.train.quantize_base == JOBSPEC_QUANT_NF4)
                nf4_block_bytes(mc, tp, &split);
            if (split) continue;
            /* pp runs over the divisors of n_layer (<= 1024), not of the GPU count */
            for (int pp = 1; pp <= mc->n_layer && pp <= w / tp; pp++) {
                if ((w / tp) % pp || mc->n_layer % pp) continue;
                int dp = w / tp / pp;
                for (int z = 0; z <= 3; z++) {
                    if ((z > 0 && dp == 1) || (z >= 2 && pp > 1)) continue;
                    for (int off = 0; off <= cuda; off++) {
                        struct planner_candidate best;
                        int have = 0;
                        for (int rc = 0; rc <= 2; rc++)
                            for (int mb = max_mb; mb >= 1; mb /= 2) {
                                int64_t unit = (int64_t)mb * mc->seq_len * dp;
                                if (sp.train.global_batch_tokens % unit) continue;
                                int64_t ga = sp.train.global_batch_tokens / unit;
                                if (pp > 1 && ga < pp) continue;
                                struct lay L = {dp, tp, pp, z, off, mb, (enum jobspec_recompute)rc,
                                                0};
                                struct planner_candidate cd;
                                memset(&cd, 0, sizeof cd);
                                eval(&x, &facts[tp], &L, &cd.est);
                                cd.score = cd.est.step_s * (1 + 0.01 * complexity(&cd.est));
                                int better =
                                    !have || (cd.est.fits && !best.est.fits) ||
                                    (cd.est.fits == best.est.fits &&
                                     (cd.est.fits ? cd.score < best.score
                                                  : cd.est.mem.total < best.est.mem.total));
                                if (better) {
                                    best = cd;
                                    have = 1;
                                }
                            }
                        if (!have) continue;
                        if (BUF_GROW(list, cap, n + 1, 1) != 0) {
                            free(list);
                            return loom_error_set(e, 500, "INTERNAL", "", "out of memory");
                        }
                        list[n++] = best;
                    }
                }
            }
        }
    }
    /* scaling: a layout on w GPUs must beat the best on the next smaller GPU
     * count by 1.2x, else its extra GPUs are wasted */
    for (int i = 0; i < n; i++) {
        list[i].scaling_ok = 1;
        describe(&list[i]);
        if (!list[i].est.fits) continue;
        int w = list[i].est.world, prev = 0;
        for (int k = 0; k < nw; k++)
            if (worlds[k] < w && worlds[k] > prev) prev = worlds[k];
        if (!prev) continue;
        double best_prev = 0;
        for (int k = 0; k < n; k++)
            if (list[k].est.fits && list[k].est.world == prev &&
                (best_prev == 0 || list[k].est.step_s < best_prev))
                best_prev = list[k].est.step_s;
        if (best_prev > 0 && best_prev / list[i].est.step_s < 1.2) {
            list[i].scaling_ok = 0;
            size_t l = strlen(list[i].why);
            snprintf(list[i].why + l, sizeof list[i].why - l,
                     "; only %.2fx faster than the best on %d GPUs", best_prev / list[i].est.step_s,
                     prev);
        }
    }
    qsort(list, (size_t)n, sizeof *list, cand_cmp);
    *out = list;
    *nout = n;
    return 0;
}

int planner_pick(const struct planner_candidate *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i].est.fits && list[i].scaling_ok) return i;
    for (int i = 0; i < n; i++)
        if (list[i].est.fits) return i;
    return -1;
}

static int layout_str(char *buf, size_t n, const struct planner_estimate *est) {
    return snprintf(buf, n,
                    "dp=%d tp=%d pp=%d zero_stage=%d offload_optimizer=%s recompute=%s "
                    "micro_batch=%d",
                    est->dp, est->tp, est->pp, est->zero_stage, est->offload ? "true" : "false",
                    jobspec_recompute_name(est->recompute), est->micro_batch);
}

/* The budget mode's floor on every stage (it does not depend on the GPU):
 * 422 RECOMPUTE_BUDGET_TOO_SMALL at submit rather than at the worker. */
static int budget_check(const struct loom_spec *s, struct loom_error *e) {
    if (s->train.recompute_budget_gib <= 0) return 0;
    for (int st = 0; st < s->parallel.pp; st++) {
        int keep;
        double floor_gib;
        if (planner_recompute_keep(s, st, &keep, &floor_gib, e) != 0) return -1;
    }
    return 0;
}

/* A full fine-tune that does not fit as submitted, as LoRA (rank 16, alpha
 * 32, every projection of the family: train.lora's defaults) and as QLoRA
 * (the same over an NF4 base, bf16 compute): each variant's estimate with the
 * spec's layout or, where that does not fit, its recommended layout. Fills
 * out[0..1] and returns how many were planned (0: the spec already trains
 * adapters, or the variants are not valid specs). */
static int lora_options(const struct loom_spec *s, const struct planner_cluster *c,
                        const struct planner_options *o, struct planner_lora_option *out) {
    if (s->train.lora.enabled) return 0;
    int n = 0;
    for (int q = 0; q < 2; q++) {
        json_t *j = jobspec_to_json(s);
        json_t *t = json_object_get(j, "train");
        json_object_set_new(t, "lora", json_pack("{s:i, s:f}", "rank", 16, "alpha", 32.0));
        if (q) {
            json_object_set_new(t, "quantize_base", json_string("nf4"));
            if (s->train.precision == JOBSPEC_PREC_FP8)
                json_object_set_new(t, "precision", json_string("bf16"));
        }
        json_object_del(j, "export"); /* export.hf of a full fine-tune: the variant's own */
        struct planner_lora_option *r = &out[n];
        memset(r, 0, sizeof *r);
        struct loom_error ign;
        int ok = t && jobspec_parse(&r->spec, j, JOBSPEC_FOR_PLAN, &ign) == 0 &&
                 planner_estimate(&r->spec, c, o, &r->est, &ign) == 0;
        json_decref(j);
        if (!ok) continue;
        r->qlora = q;
        r->as_submitted = r->est.fits;
        if (!r->est.fits) {
            struct planner_candidate *list = NULL;
            int nl = 0;
            if (planner_recommend(&r->spec, c, o, &list, &nl, &ign) == 0) {
                int pick = planner_pick(list, nl);
                if (pick >= 0) r->est = list[pick].est;
            }
            free(list);
        }
        n++;
    }
    return n;
}

/* "as LoRA (train.lora rank 16) it fits as submitted: 17.6 GiB/GPU, 1708
 * tokens/s"; a recommended layout is named after the numbers. */
static void lora_option_str(const struct planner_lora_option *r, char *buf, size_t len) {
    char what[96];
    snprintf(what, sizeof what, "%s (train.lora rank %d%s)", r->qlora ? "QLoRA" : "LoRA",
             r->spec.train.lora.rank, r->qlora ? ", quantize_base nf4" : "");
    if (!r->est.fits) {
        snprintf(buf, len, "as %s it does not fit either (%.1f GiB/GPU)", what,
                 r->est.mem.total / GIB);
        return;
    }
    int k = snprintf(buf, len, "as %s it fits%s: %.1f GiB/GPU, %.0f tokens/s", what,
                     r->as_submitted ? " as submitted" : "", r->est.mem.total / GIB,
                     r->est.tokens_per_s);
    if (!r->as_submitted && k > 0 && (size_t)k < len) {
        char ls[200];
        layout_str(ls, sizeof ls, &r->est);
        snprintf(buf + k, len - (size_t)k, " with %s", ls);
    }
}

int planner_check_fit(const struct loom_spec *s, const struct planner_cluster *c,
                      const struct planner_options *o, struct loom_error *e) {
    if (budget_check(s, e) != 0) return -1;
    struct planner_estimate est;
    if (planner_estimate(s, c, o, &est, e) != 0) return -1;
    if (est.fits) return 0;
    struct planner_candidate *list = NULL;
    int n = 0;
    char alt[320] = "no layout of this model fits the cluster";
    if (planner_recommend(s, c, o, &list, &n, e) == 0) {
        int pick = -1;
        for (int i = 0; i < n && pick < 0; i++)
            if (list[i].est.fits && list[i].est.world == est.world) pick = i;
        if (pick < 0) pick = planner_pick(list, n);
        if (pick >= 0) {
            char ls[200];
            layout_str(ls, sizeof ls, &list[pick].est);
            snprintf(alt, sizeof alt, "best feasible on %d GPUs: %s (%.1f GiB/GPU, %.3g s/step)",
                     list[pick].est.world, ls, list[pick].est.mem.total / GIB,
                     list[pick].est.step_s);
        }
    }
    free(list);
    /* a full fine-tune too big for the cluster: what adapters would need */
    char lo[2][400] = {"", ""};
    struct planner_lora_option opt[2];
    int nopt = lora_options(s, c, o, opt);
    for (int i = 0; i < nopt; i++) {
        lo[i][0] = ';';
        lo[i][1] = ' ';
        lora_option_str(&opt[i], lo[i] + 2, sizeof lo[i] - 2);
    }
    const struct planner_mem *m = &est.mem;
    return loom_error_set(e, 422, "DOES_NOT_FIT", "parallel",
                          "%s (params %.1f, grads %.1f, optimizer %.1f, activations %.1f, comm "
                          "%.1f, workspace %.1f, reserved %.1f GiB); %s%s%s",
                          est.reason, m->params / GIB, m->grads / GIB, m->optimizer / GIB,
                          m->activations / GIB, m->comm / GIB, m->workspace / GIB,
                          m->reserved / GIB, alt, lo[0], lo[1]);
}

/* ---- JSON ---- */

static json_t *gib(double bytes) {
    return json_real(round(bytes / GIB * 1000) / 1000);
}

json_t *planner_estimate_to_json(const struct planner_estimate *est) {
    const struct planner_mem *m = &est->mem;
    json_t *mem = json_object();
    json_object_set_new(mem, "params", gib(m->params));
    json_object_set_new(mem, "grads", gib(m->grads));
    json_object_set_new(mem, "optimizer", gib(m->optimizer));
    json_object_set_new(mem, "activations", gib(m->activations));
    json_object_set_new(mem, "comm", gib(m->comm));
    json_object_set_new(mem, "workspace", gib(m->workspace));
    json_object_set_new(mem, "reserved", gib(m->reserved));
    json_object_set_new(mem, "total", gib(m->total));
    json_object_set_new(mem, "gpu", gib(m->gpu_bytes));
    json_object_set_new(mem, "host_offload_per_node", gib(m->host_per_node));
    json_object_set_new(mem, "host_offload_per_rank", gib(m->host_per_rank));
    json_object_set_new(mem, "stage", json_integer(m->worst_stage));
    json_object_set_new(mem, "inflight_micro_batches", json_integer(m->inflight));
    json_t *act = json_object();
    json_object_set_new(act, "attention", gib(m->act_attention));
    json_object_set_new(act, "mlp", gib(m->act_mlp));
    json_object_set_new(act, "norm_residual", gib(m->act_norm_residual));
    json_object_set_new(act, "other", gib(m->act_other));
    json_object_set_new(mem, "activations_by_layer_type", act);

    json_t *comm = json_array();
    for (int i = 0; i < est->n_comm; i++) {
        const struct planner_comm *p = &est->comm[i];
        json_array_append_new(comm, json_pack("{s:s, s:s, s:i, s:b, s:f, s:f, s:f, s:f, s:f}",
                                              "group", p->group, "op", p->op, "ranks", p->ranks,
                                              "cross_node", p->cross_node, "bytes", p->bytes,
                                              "count", p->count, "gbps", p->gbps, "seconds",
                                              p->seconds, "exposed_seconds", p->exposed));
    }
    json_t *time =
        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "compute_s", est->compute_s,
                  "bubble_s", est->bubble_s, "comm_s", est->comm_s, "comm_exposed_s",
                  est->comm_exposed_s, "optimizer_s", est->optimizer_s, "step_s", est->step_s,
                  "tokens_per_s", est->tokens_per_s, "mfu", est->mfu, "comm_fraction",
                  est->comm_fraction, "bubble_fraction", est->bubble_fraction);
    json_t *run = json_pack("{s:f, s:f, s:f}", "hours", est->run_hours, "gpu_hours", est->gpu_hours,
                            "cost", est->cost);
    json_t *layout = json_pack(
        "{s:i, s:i, s:i, s:i, s:b, s:s, s:i, s:I, s:i, s:i}", "dp", est->dp, "tp", est->tp, "pp",
        est->pp, "zero_stage", est->zero_stage, "offload_optimizer", est->offload, "recompute",
        jobspec_recompute_name(est->recompute), "micro_batch", est->micro_batch, "grad_accum",
        (json_int_t)est->grad_accum, "gpus", est->world, "nodes", est->nodes);
    if (est->mem.keep >= 0) /* the budget mode: blocks kept whole on the worst stage */
        json_object_set_new(layout, "recompute_keep_blocks",
                            json_pack("{s:i, s:i, s:f}", "kept", est->mem.keep, "of",
                                      est->mem.layers, "floor_gib", est->mem.budget_floor / GIB));
    json_t *notes = json_array();
    if (est->reason[0]) json_array_append_new(notes, json_string(est->reason));
    for (int i = 0; i < est->n_notes; i++)
        json_array_append_new(notes, json_string(est->notes[i]));
    return json_pack("{s:o, s:b, s:o, s:o, s:o, s:o, s:f, s:o}", "layout", layout, "fits",
                     est->fits, "memory_gib", mem, "communication", comm, "time", time, "run", run,
                     "flops_per_token", est->flops_per_token, "reasons", notes);
}

static int parse_options(const json_t *j, struct planner_options *o, struct loom_error *e) {
    if (!json_is_object(j))
        return loom_error_set(e, 422, "WRONG_TYPE", "options", "options must be an object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        char path[96];
        snprintf(path, sizeof path, "options.%.60s", key);
        if (strcmp(key, "max_alternatives") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000)
                return loom_error_set(e, 422, "OUT_OF_RANGE", path,
                                      "%s must be an integer in [0, 1000]", path);
            o->max_alternatives = (int)json_integer_value(v);
            continue;
        }
        double *dst = strcmp(key, "compute_efficiency") == 0 ? &o->compute_efficiency
                      : strcmp(key, "overlap") == 0          ? &o->overlap
                      : strcmp(key, "comm_warn") == 0        ? &o->comm_warn
                                                             : NULL;
        if (!dst) return loom_error_set(e, 422, "UNKNOWN_FIELD", path, "unknown field %s", path);
        if (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 1)
            return loom_error_set(e, 422, "OUT_OF_RANGE", path, "%s must be a number in (0, 1]",
                                  path);
        *dst = json_number_value(v);
    }
    return 0;
}

int planner_plan_json(const json_t *body, const struct planner_cluster *dflt, json_t **out,
                      struct loom_error *e) {
    *out = NULL;
    if (!json_is_object(body))
        return loom_error_set(e, 400, "INVALID_JSON", "", "the plan request must be a JSON object");
    int rc = -1;
    json_t *specj = json_copy((json_t *)body);
    struct planner_candidate *list = NULL;
    int n = 0;
    struct planner_cluster c;
    struct planner_options o;
    struct loom_spec s;
    if (!specj) return loom_error_set(e, 500, "INTERNAL", "", "out of memory");
    if (dflt)
        c = *dflt;
    else
        planner_cluster_default(&c);
    planner_options_default(&o);
    json_t *cj = json_object_get(body, "cluster");
    json_t *oj = json_object_get(body, "options");
    json_object_del(specj, "cluster");
    json_object_del(specj, "options");
    if (cj && planner_cluster_from_json(cj, &c, e) != 0) goto out;
    if (oj && parse_options(oj, &o, e) != 0) goto out;
    if (jobspec_parse(&s, specj, JOBSPEC_FOR_PLAN, e) != 0) goto out;
    if (planner_cluster_resolve(&c, s.resources.device, e) != 0) goto out;
    struct planner_estimate est;
    if (planner_estimate(&s, &c, &o, &est, e) != 0) goto out;
    if (planner_recommend(&s, &c, &o, &list, &n, e) != 0) goto out;
    struct jobspec_derived d;
    jobspec_derive(&s, &d);
    json_t *alts = json_array();
    for (int i = 0; i < n && i < o.max_alternatives; i++) {
        json_t *a = planner_estimate_to_json(&list[i].est);
        json_object_set_new(a, "rank", json_integer(i + 1));
        json_object_set_new(a, "why", json_string(list[i].why));
        json_array_append_new(alts, a);
    }
    int pick = planner_pick(list, n);
    json_t *rec = json_null();
    if (pick >= 0) {
        json_decref(rec);
        rec = planner_estimate_to_json(&list[pick].est);
        json_object_set_new(rec, "rank", json_integer(pick + 1));
        json_object_set_new(rec, "why", json_string(list[pick].why));
    }
    /* a full fine-tune that does not fit as submitted: LoRA and QLoRA beside
     * the layouts, each with its spec fields and its estimate */
    json_t *lora_opts = json_array();
    struct planner_lora_option opt[2];
    int nopt = est.fits ? 0 : lora_options(&s, &c, &o, opt);
    for (int i = 0; i < nopt; i++) {
        json_t *a = planner_estimate_to_json(&opt[i].est);
        const struct loom_spec *v = &opt[i].spec; /* the spec fields to add, from the variant */
        json_t *tr = json_pack("{s:{s:i, s:f}}", "lora", "rank", v->train.lora.rank, "alpha",
                               v->train.lora.alpha);
        if (opt[i].qlora) json_object_set_new(tr, "quantize_base", json_string("nf4"));
        char why[400];
        lora_option_str(&opt[i], why, sizeof why);
        json_object_set_new(a, "kind", json_string(opt[i].qlora ? "qlora" : "lora"));
        json_object_set_new(a, "train", tr);
        json_object_set_new(a, "fits", json_boolean(opt[i].est.fits));
        json_object_set_new(a, "as_submitted", json_boolean(opt[i].as_submitted));
        json_object_set_new(a, "why", json_string(why));
        json_array_append_new(lora_opts, a);
    }
    json_t *reasons = json_array();
    if (!est.fits) json_array_append_new(reasons, json_string(est.reason));
    for (int i = 0; i < est.n_notes; i++)
        json_array_append_new(reasons, json_string(est.notes[i]));
    *out = json_pack("{s:b, s:o, s:o, s:o, s:o, s:b, s:o, s:o, s:o, s:i, s:o}", "valid", 1, "spec",
                     jobspec_to_json(&s), "derived", jobspec_derived_to_json(&d), "cluster",
                     planner_cluster_to_json(&c), "estimate", planner_estimate_to_json(&est),
                     "fits", est.fits, "reasons", reasons, "recommended", rec, "alternatives", alts,
                     "layouts_considered", n, "lora_options", lora_opts);
    if (!*out) {
        loom_error_set(e, 500, "INTERNAL", "", "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(list);
    json_decref(specj);
    return rc;
}

/* ---- the real fleet ---- */

void planner_pool_cluster(const struct planner_pool *p, struct planner_cluster *c) {
    planner_cluster_default(c);
    c->nodes = p->nodes > 0 ? p->nodes : 1;
    c->gpus_per_node = p->gpus_per_node < 1 ? 1 : p->gpus_per_node > 64 ? 64 : p->gpus_per_node;
    snprintf(c->gpu, sizeof c->gpu, "%s", p->gpu);
    c->gpu_mem_gib = p->gpu_mem_gib;
    c->host_mem_gib = p->host_mem_gib;
    c->price_per_gpu_hour = p->price_per_gpu_hour;
    if (!gpu_type_find(p->gpu)) c->peak_tflops = 100; /* "unknown" / "mixed": nominal */
    /* a measured peak (cpu nodes: the agent's start-up GEMM calibration) beats the table's */
    if (p->peak_tflops > 0) c->peak_tflops = p->peak_tflops;
}

static int pool_is_cpu(const struct planner_pool *p) {
    return strcmp(p->gpu, "cpu") == 0;
}

/* A pool the planner can describe: a known type, or reported memory. */
static int pool_usable(const struct planner_pool *p) {
    return p->gpus > 0 && (gpu_type_find(p->gpu) || p->gpu_mem_gib > 0);
}

/* GPU type `name` has FP8 tensor cores (what train.precision fp8 needs). */
static int type_fp8(const char *name) {
    const struct gpu_type *t = gpu_type_find(name);
    return t && t->cc >= GPU_FP8_MIN_CC;
}

/* The pool's GPUs have them: by its type, or what its nodes report. */
static int pool_fp8(const struct planner_pool *p) {
    return gpu_type_find(p->gpu) ? type_fp8(p->gpu) : p->cc >= GPU_FP8_MIN_CC;
}

int planner_fleet_candidates(const struct loom_spec *s, const struct planner_fleet *f,
                             const char (*types)[GPU_TYPE_NAME_MAX], int ntypes, int *idx) {
    int cpu = s->resources.device == JOBSPEC_DEV_CPU, n = 0;
    int fp8 = !cpu && s->train.precision == JOBSPEC_PREC_FP8;
    if (!cpu && ntypes > 0) {
        for (int t = 0; t < ntypes; t++)
            for (int i = 0; i < f->n && n < PLANNER_MAX_POOLS; i++)
                if (strcmp(f->pool[i].gpu, types[t]) == 0 && pool_usable(&f->pool[i]) &&
                    (!fp8 || pool_fp8(&f->pool[i])))
                    idx[n++] = i;
        return n;
    }
    for (int i = 0; i < f->n && n < PLANNER_MAX_POOLS; i++)
        if (pool_is_cpu(&f->pool[i]) == cpu && pool_usable(&f->pool[i]) &&
            (!fp8 || pool_fp8(&f->pool[i])))
            idx[n++] = i;
    return n;
}

/* train.precision fp8 with GPU types none of which has FP8 tensor cores:
 * the listed types (ntypes > 0) or, with none listed, the fleet's pools of
 * GPUs (none yet: nothing to judge). Returns 0, or -1 with e filled. */
static int fp8_check(const struct loom_spec *s, const struct planner_fleet *f,
                     const char (*types)[GPU_TYPE_NAME_MAX], int ntypes, struct loom_error *e) {
    if (s->resources.device == JOBSPEC_DEV_CPU || s->train.precision != JOBSPEC_PREC_FP8) return 0;
    char have[256] = "";
    size_t off = 0;
    int any = 0, seen = 0;
    for (int k = 0; k < (ntypes > 0 ? ntypes : f->n); k++) {
        const char *name = ntypes > 0 ? types[k] : f->pool[k].gpu;
        if (ntypes == 0 && pool_is_cpu(&f->pool[k])) continue;
        const struct gpu_type *t = gpu_type_find(name);
        any |= ntypes > 0 ? type_fp8(name) : pool_fp8(&f->pool[k]);
        seen++;
        int cc = t ? t->cc : ntypes > 0 ? 0 : f->pool[k].cc;
        if (off < sizeof have && cc > 0)
            off += (size_t)snprintf(have + off, sizeof have - off, "%s%s (%d.%d)", off ? ", " : "",
                                    *name ? name : "untyped GPUs", cc / 10, cc % 10);
        else if (off < sizeof have)
            off += (size_t)snprintf(have + off, sizeof have - off, "%s%s", off ? ", " : "",
                                    *name ? name : "untyped GPUs");
    }
    if (any || !seen) return 0;
    return loom_error_set(e, 422, "PRECISION_GPU", "train.precision",
                          "train.precision fp8 needs FP8 tensor cores (compute capability %d.%d or "
                          "newer: " GPU_FP8_EXAMPLES "); %s %s",
                          GPU_FP8_MIN_CC / 10, GPU_FP8_MIN_CC % 10,
                          ntypes > 0 ? "resources.gpu_type lists" : "the cluster has", have);
}

/* The pool's cluster, grown to the job when the planner would otherwise
 * refuse the layout for size alone (the capacity rule is checked apart). */
static void job_cluster(const struct loom_spec *s, const struct planner_pool *p,
                        struct planner_cluster *c) {
    planner_pool_cluster(p, c);
    int world = s->parallel.dp * s->parallel.tp * s->parallel.pp;
    if (c->gpus_per_node < s->parallel.tp) c->gpus_per_node = s->parallel.tp;
    if (c->nodes * c->gpus_per_node < world)
        c->nodes = (world + c->gpus_per_node - 1) / c->gpus_per_node;
}

/* "H100-SXM: 16 on 2 nodes, RTX4090: 2 on 1 node" for the pools of the spec's kind. */
static void fleet_summary(const struct loom_spec *s, const struct planner_fleet *f, char *buf,
                          size_t len) {
    int cpu = s->resources.device == JOBSPEC_DEV_CPU;
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < f->n && off < len; i++)
        if (pool_is_cpu(&f->pool[i]) == cpu)
            off += (size_t)snprintf(buf + off, len - off, "%s%s: %d on %d node%s", off ? ", " : "",
                                    f->pool[i].gpu, f->pool[i].gpus, f->pool[i].nodes,
                                    f->pool[i].nodes == 1 ? "" : "s");
}

int planner_fleet_check(const struct loom_spec *s, const struct planner_fleet *f,
                        const char (*types)[GPU_TYPE_NAME_MAX], int ntypes, int allow_mixed,
                        struct loom_error *e) {
    if (budget_check(s, e) != 0) return -1;
    if (fp8_check(s, f, types, ntypes, e) != 0) return -1;
    int cpu = s->resources.device == JOBSPEC_DEV_CPU;
    int world = s->parallel.dp * s->parallel.tp * s->parallel.pp, tp = s->parallel.tp;
    int idx[PLANNER_MAX_POOLS], n = planner_fleet_candidates(s, f, types, ntypes, idx);
    int of_kind = 0;
    for (int i = 0; i < f->n; i++)
        of_kind += pool_is_cpu(&f->pool[i]) == cpu;
    char have[256];
    fleet_summary(s, f, have, sizeof have);
    if (!of_kind) { /* no node of the kind has joined yet: memory only, on a default node */
        if (cpu) return 0;
        struct planner_pool p = {.nodes = 1, .gpus = world, .gpus_per_node = 8};
        snprintf(p.gpu, sizeof p.gpu, "%s", ntypes > 0 ? types[0] : "H100-SXM");
        if (s->resources.gpus_per_node > p.gpus_per_node)
            p.gpus_per_node = s->resources.gpus_per_node;
        struct planner_cluster c;
        job_cluster(s, &p, &c);
        return planner_check_fit(s, &c, NULL, e);
    }
    if (!n) {
        char want[128] = "";
        size_t off = 0;
        for (int t = 0; t < ntypes && off < sizeof want; t++)
            off += (size_t)snprintf(want + off, sizeof want - off, "%s%s", t ? "|" : "", types[t]);
        int fp8 = !cpu && s->train.precision == JOBSPEC_PREC_FP8;
        return loom_error_set(e, 422, "UNSCHEDULABLE", "resources.gpu_type",
                              "no node of gpu_type %s%s in the cluster (it has %s)", want,
                              fp8 ? " with FP8 tensor cores (train.precision fp8)" : "", have);
    }
    /* capacity: which candidate pools could ever hold the ranks */
    int hold[PLANNER_MAX_POOLS], nh = 0, total = 0, biggest_node = 0, biggest_pool = 0;
    for (int k = 0; k < n; k++) {
        const struct planner_pool *p = &f->pool[idx[k]];
        total += p->gpus;
        if (p->gpus_per_node > biggest_node) biggest_node = p->gpus_per_node;
        if (p->gpus > biggest_pool) biggest_pool = p->gpus;
        if ((allow_mixed || p->gpus >= world) && p->gpus_per_node >= tp) hold[nh++] = idx[k];
    }
    if (tp > biggest_node)
        return loom_error_set(e, 422, "UNSCHEDULABLE", "parallel.tp",
                              "tp=%d needs %d devices on one node but the largest node has %d "
                              "(cluster: %s)",
                              tp, tp, biggest_node, have);
    if (world > (allow_mixed ? total : biggest_pool))
        return loom_error_set(
            e, 422, "UNSCHEDULABLE", "parallel",
            "dp*tp*pp = %d*%d*%d = %d ranks but the cluster can hold at most %d "
            "%s (%s)",
            s->parallel.dp, tp, s->parallel.pp, world, allow_mixed ? total : biggest_pool,
            cpu               ? "cpu devices"
            : allow_mixed     ? "GPUs of the types it allows"
            : n > 1 || ntypes ? "GPUs of one type (resources.allow_mixed combines types)"
                              : "GPUs",
            have);
    /* memory: the layout fits some pool that holds it (allow_mixed: every one) */
    int fits_any = 0, fits_all = 1;
    for (int k = 0; k < nh; k++) {
        struct planner_cluster c;
        struct planner_estimate est;
        job_cluster(s, &f->pool[hold[k]], &c);
        if (planner_estimate(s, &c, NULL, &est, e) != 0) return -1;
        fits_any |= est.fits;
        fits_all &= est.fits;
    }
    if (allow_mixed ? fits_all : fits_any) return 0;
    /* refused: the first holding pool's estimate and layouts, and any other type present
     * where the layout fits as submitted */
    const struct planner_pool *p0 = &f->pool[hold[0]];
    struct planner_cluster c0;
    job_cluster(s, p0, &c0);
    struct loom_error fit;
    memset(&fit, 0, sizeof fit);
    if (planner_check_fit(s, &c0, NULL, &fit) == 0) { /* mixed: another candidate failed */
        snprintf(fit.message, sizeof fit.message,
                 "the layout fits %s but not every type the "
                 "job may mix",
                 p0->gpu);
    }
    char other[200] = "";
    for (int i = 0; i < f->n && !other[0]; i++) {
        const struct planner_pool *p = &f->pool[i];
        int listed = 0;
        for (int k = 0; k < n; k++)
            listed |= idx[k] == i;
        if (pool_is_cpu(p) != cpu || (listed && !allow_mixed) || !pool_usable(p) ||
            p->gpus < world || p->gpus_per_node < tp)
            continue;
        struct planner_cluster c;
        struct planner_estimate est;
        struct loom_error ign;
        job_cluster(s, p, &c);
        if (planner_estimate(s, &c, NULL, &est, &ign) == 0 && est.fits)
            snprintf(other, sizeof other,
                     "another GPU type in the cluster fits it as submitted: %s (%.1f GiB/GPU of "
                     "%.0f; set resources.gpu_type to \"%s\"); ",
                     p->gpu, est.mem.total / GIB, est.mem.gpu_bytes / GIB, p->gpu);
    }
    if (other[0])
        return loom_error_set(e, 422, "DOES_NOT_FIT", "parallel", "does not fit %s; %son %s: %s",
                              p0->gpu, other, p0->gpu, fit.message);
    return loom_error_set(e, 422, "DOES_NOT_FIT", "parallel", "on %s: %s", p0->gpu, fit.message);
}

json_t *planner_fleet_costs(const struct loom_spec *s, const struct planner_fleet *f,
                            const char **cheapest) {
    json_t *arr = json_array();
    double best = -1;
    *cheapest = NULL;
    int idx[PLANNER_MAX_POOLS], n = planner_fleet_candidates(s, f, NULL, 0, idx);
    for (int k = 0; k < n; k++) {
        const struct planner_pool *p = &f->pool[idx[k]];
        struct planner_cluster c;
        struct planner_estimate est;
        struct loom_error ign;
        const char *how = NULL;
        planner_pool_cluster(p, &c);
        int ok = planner_estimate(s, &c, NULL, &est, &ign) == 0;
        if (ok && est.fits) {
            how = "as submitted";
        } else {
            struct planner_candidate *list = NULL;
            int nl = 0;
            if (planner_recommend(s, &c, NULL, &list, &nl, &ign) == 0) {
                int pick = planner_pick(list, nl);
                if (pick >= 0) {
                    est = list[pick].est;
                    how = "recommended";
                }
            }
            free(list);
        }
        json_t *o = json_pack("{s:s, s:i, s:i, s:f, s:b}", "gpu_type", p->gpu, "nodes", p->nodes,
                              "gpus", p->gpus, "gpu_mem_gib",
                              c.gpu_mem_gib > 0       ? c.gpu_mem_gib
                              : gpu_type_find(p->gpu) ? gpu_type_find(p->gpu)->mem_gib
                                                      : 0,
                              "fits", ok && est.fits);
        json_object_set_new(o, "layout", how ? json_string(how) : json_null());
        if (how) {
            char ls[200];
            layout_str(ls, sizeof ls, &est);
            json_object_set_new(o, "parallel", json_string(ls));
            json_object_set_new(o, "step_s", json_real(est.step_s));
            json_object_set_new(o, "hours", json_real(est.run_hours));
            json_object_set_new(o, "gpu_hours", json_real(est.gpu_hours));
        }
        json_object_set_new(o, "per_gpu_hour",
                            p->price_per_gpu_hour > 0 ? json_real(p->price_per_gpu_hour)
                                                      : json_null());
        json_object_set_new(o, "currency", p->currency[0] ? json_string(p->currency) : json_null());
        double cost = how && p->price_per_gpu_hour > 0 ? est.gpu_hours * p->price_per_gpu_hour : -1;
        json_object_set_new(o, "cost", cost >= 0 ? json_real(cost) : json_null());
        if (ok && est.fits && cost >= 0 && (best < 0 || cost < best)) {
            best = cost;
            *cheapest = p->gpu;
        }
        json_array_append_new(arr, o);
    }
    return arr;
}
