/* DP and ZeRO 0-3 (see zero.h): shard arithmetic, the engine hooks, the
 * memory model, full-weight gathering and checkpoint resharding.
 *
 * A "group" is the set of flat-buffer ranges of one layer: block l is one
 * contiguous range; layer -1 (embeddings, final norm, head) is usually two
 * (the front and the back of the buffer). Per-group collectives use the
 * variable-slice collectives with, for rank i, the part of the range that
 * falls in shard i, in place, so a layer gathers straight into the params
 * buffer and a layer's gradients reduce straight into the owner's shard. */
#include "worker/zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/pp.h"
#include "worker/tp.h"
#if defined(LOOM_HAVE_NCCL) && defined(LOOM_HAVE_CUDA)
#include "worker/cuda/cuda_backend.h"
#include "worker/nccl/nccl_order.h"
#endif

#define ZERO_MAX_RANGES 8

struct zrange {
    size_t lo, hi;
};

struct zgroup {
    struct zrange r[ZERO_MAX_RANGES];
    int n;
    int gathered;                               /* stage 3: params of the whole group are current */
    struct comm_req *prefetch[ZERO_MAX_RANGES]; /* stage 3: gathers in flight */
    int reduced;                                /* this step's gradient reduction was issued */
};

struct zero {
    struct engine *e;
    struct comm *dp;
    int stage, P, rank;
    size_t lo, hi;     /* the flat range this rank's pipeline stage owns (pp.h) */
    size_t *off, *cnt; /* shard of each dp rank, inside [lo, hi) */
    size_t *counts;    /* scratch [P] */
    int L;
    struct zgroup *g; /* [L + 1]: index layer + 1 */
    struct comm_req **reqs;
    int nreqs, capreqs;
    int failed;
    int ordered; /* nccl on the cuda backend: collectives wait for a device fence */
    /* made by zero_setup */
    struct comm_world *world;
    struct comm_groups groups;
};

static enum comm_dtype compute_dtype(const struct engine *e) {
    return e->be->dtype == BACKEND_BF16 ? COMM_BF16 : COMM_F32;
}

/* counts[i] = |[lo, hi) ∩ shard i|; returns this rank's part's start. */
static size_t range_counts(const struct zero *z, size_t lo, size_t hi, size_t *counts) {
    size_t mine = lo;
    for (int i = 0; i < z->P; i++) {
        size_t a = z->off[i] > lo ? z->off[i] : lo;
        size_t b = z->off[i] + z->cnt[i] < hi ? z->off[i] + z->cnt[i] : hi;
        counts[i] = b > a ? b - a : 0;
        if (i == z->rank) mine = counts[i] ? a : lo;
    }
    return mine;
}

static void fail(struct zero *z, const char *what, int layer) {
    if (!z->failed && layer >= -1)
        log_error("zero: %s of layer %d failed: %s", what, layer, comm_error(z->dp));
    else if (!z->failed)
        log_error("zero: %s failed: %s", what, comm_error(z->dp));
    z->failed = 1;
}

/* Make the device work issued so far on the ranges of group g the input of
 * the next collectives: with NCCL on the CUDA backend, per-range fences on
 * the compute stream that the comm streams wait for (worker/nccl/
 * nccl_order.h; no host stall), else a full device sync as the comm contract
 * asks. base: e->params or e->grads. */
static void comm_ready(struct zero *z, const struct zgroup *g, void *base) {
    struct backend *b = z->e->be;
#if defined(LOOM_HAVE_NCCL) && defined(LOOM_HAVE_CUDA)
    if (z->ordered) {
        backend_cuda_flush(b);
        for (int k = 0; k < g->n; k++)
            nccl_order_mark(backend_at(b, base, g->r[k].lo),
                            (g->r[k].hi - g->r[k].lo) * b->elt_size);
        return;
    }
#else
    (void)g, (void)base;
#endif
    b->sync(b->ctx);
}

/* ---- stage 3: gather / release parameters of a group */

/* Complete the group's prefetched gathers, if any. */
static void finish_prefetch(struct zero *z, struct zgroup *g, int layer) {
    for (int k = 0; k < g->n; k++) {
        if (g->prefetch[k] && comm_wait(g->prefetch[k]) != 0)
            fail(z, "parameter all-gather", layer);
        g->prefetch[k] = NULL;
    }
}

/* Start gathering the group's parameters; async (prefetch) or blocking. */
static void gather_start(struct zero *z, int layer, int async) {
    if (layer < -1 || layer >= z->L) return;
    struct zgroup *g = &z->g[layer + 1];
    struct engine *e = z->e;
    if (g->gathered) return;
    comm_ready(z, g, e->params);
    for (int k = 0; k < g->n; k++) {
        size_t lo = g->r[k].lo, hi = g->r[k].hi;
        size_t mine = range_counts(z, lo, hi, z->counts);
        if (comm_all_gatherv(z->dp, backend_at(e->be, e->params, mine),
                             backend_at(e->be, e->params, lo), z->counts, compute_dtype(e),
                             async ? &g->prefetch[k] : NULL) != 0)
            fail(z, "parameter all-gather", layer);
    }
    g->gathered = 1; /* current once the prefetch (if any) completes */
}

/* Make the group's parameters usable now. */
static void gather(struct zero *z, int layer) {
    struct zgroup *g = &z->g[layer + 1];
    gather_start(z, layer, 0);
    finish_prefetch(z, g, layer);
}

static void zero_range(struct engine *e, size_t lo, size_t hi) {
    if (hi > lo)
        e->be->zero(e->be->ctx, backend_at(e->be, e->params, lo), (hi - lo) * e->be->elt_size);
}

/* Drop the parts of the group's params this rank does not own. */
static void release(struct zero *z, int layer) {
    if (layer < -1 || layer >= z->L) return;
    struct zgroup *g = &z->g[layer + 1];
    if (!g->gathered) return;
    finish_prefetch(z, g, layer); /* never zero under a gather in flight */
    size_t s0 = z->off[z->rank], s1 = s0 + z->cnt[z->rank];
    for (int k = 0; k < g->n; k++) {
        size_t lo = g->r[k].lo, hi = g->r[k].hi;
        zero_range(z->e, lo, hi < s0 ? hi : s0 > lo ? s0 : lo);
        zero_range(z->e, s1 > lo ? (s1 < hi ? s1 : hi) : lo, hi);
    }
    g->gathered = 0;
}

static void release_all(struct zero *z) {
    for (int l = -1; l < z->L; l++)
        release(z, l);
}

/* Forward: layer l is needed now, l+1 next (prefetched while l computes). */
static void hook_pre_forward(struct engine *e, void *user, int layer) {
    struct zero *z = user;
    if (layer >= 1) release(z, layer - 1);
    gather(z, layer);
    gather_start(z, layer + 1, 1);
}

static void hook_pre_backward(struct engine *e, void *user, int layer) {
    struct zero *z = user;
    if (layer == z->L - 1) release(z, -1); /* the final norm's backward is done */
    if (layer >= 0 && layer + 1 < z->L) release(z, layer + 1);
    if (layer == -1) {
        release(z, 0);
        return; /* the embedding backward reads no parameters */
    }
    gather(z, layer);
    if (layer >= 1) gather_start(z, layer - 1, 1); /* backward goes down: prefetch l-1 */
}

/* ---- stage 2/3: per-layer reduce-scatter of gradients */

static int push_req(struct zero *z, struct comm_req *r) {
    if (!r) return 0;
    if (z->nreqs == z->capreqs) {
        int cap = z->capreqs ? 2 * z->capreqs : 16;
        struct comm_req **n = realloc(z->reqs, sizeof(*n) * (size_t)cap);
        if (!n) return -1;
        z->reqs = n;
        z->capreqs = cap;
    }
    z->reqs[z->nreqs++] = r;
    return 0;
}

/* Start reducing one layer's gradients over dp (async, in the order the
 * backward finishes layers): all-reduce for stage 0, reduce-scatter into the
 * owners' shards for stages >= 1. */
static void reduce_group(struct zero *z, int layer) {
    struct zgroup *g = &z->g[layer + 1];
    struct engine *e = z->e;
    if (g->reduced) return;
    g->reduced = 1;
    comm_ready(z, g, e->grads); /* the layer's gradients are final on the device */
    for (int k = 0; k < g->n; k++) {
        size_t lo = g->r[k].lo, hi = g->r[k].hi;
        struct comm_req *r = NULL;
        int rc;
        if (z->stage == 0) {
            rc = comm_allreduce(z->dp, backend_at(e->be, e->grads, lo), hi - lo, compute_dtype(e),
                                COMM_SUM, &r);
        } else {
            size_t mine = range_counts(z, lo, hi, z->counts);
            rc = comm_reduce_scatterv(z->dp, backend_at(e->be, e->grads, lo),
                                      backend_at(e->be, e->grads, mine), z->counts,
                                      compute_dtype(e), COMM_SUM, &r);
        }
        if (rc != 0 || push_req(z, r) != 0) fail(z, "gradient reduction", layer);
    }
}

static void hook_grads_ready(struct engine *e, void *user, int layer) {
    reduce_group(user, layer);
}

/* ---- step hooks */

/* After the last micro-step: every layer's reduction was started by
 * layer_grads_ready during the backward (any the backward did not announce is
 * started now); wait for all of them. */
static int hook_grad_sync(struct engine *e, void *user) {
    struct zero *z = user;
    int rc = 0;
    for (int l = z->L - 1; l >= -1; l--)
        reduce_group(z, l);
    for (int i = 0; i < z->nreqs; i++)
        if (comm_wait(z->reqs[i]) != 0) rc = -1;
    z->nreqs = 0;
    for (int l = -1; l < z->L; l++)
        z->g[l + 1].reduced = 0;
    if (rc != 0) fail(z, "gradient sync", -2);
    return z->failed ? -1 : 0;
}

static int hook_param_sync(struct engine *e, void *user) {
    struct zero *z = user;
    if (z->stage == 1 || z->stage == 2) {
        e->be->sync(e->be->ctx);
        if (comm_all_gather(z->dp, backend_at(e->be, e->params, e->shard_off),
                            backend_at(e->be, e->params, z->lo), z->hi - z->lo, compute_dtype(e),
                            NULL) != 0)
            fail(z, "parameter all-gather", -2);
    } else if (z->stage == 3) {
        release_all(z); /* gathered copies are stale now; the next use gathers */
    }
    return z->failed ? -1 : 0;
}

static int hook_allreduce_sum(struct engine *e, void *user, double *v, int n) {
    struct zero *z = user;
    if (comm_allreduce(z->dp, v, (size_t)n, COMM_F64, COMM_SUM, NULL) != 0) {
        fail(z, "scalar all-reduce", -2);
        return -1;
    }
    return 0;
}

/* ---- set-up */

static int build_groups(struct zero *z) {
    const struct model_layout *lay = &z->e->layout;
    z->L = z->e->cfg.n_layer;
    z->g = calloc((size_t)z->L + 1, sizeof(*z->g));
    if (!z->g) return -1;
    for (int i = 0; i < lay->n; i++) {
        const struct model_tensor *t = &lay->t[i];
        if (t->layer < -1 || t->layer >= z->L) return -1;
        struct zgroup *g = &z->g[t->layer + 1];
        size_t lo = (size_t)t->rank_offset, hi = lo + (size_t)t->rank_numel;
        if (lo < z->lo || hi > z->hi) continue; /* another pipeline stage's tensor */
        if (g->n > 0 && g->r[g->n - 1].hi == lo) {
            g->r[g->n - 1].hi = hi;
        } else {
            if (g->n == ZERO_MAX_RANGES) return -1;
            g->r[g->n].lo = lo;
            g->r[g->n].hi = hi;
            g->n++;
        }
    }
    return 0;
}

void zero_mem_model(const struct engine *e, int stage, int dp, struct engine_mem *out) {
    size_t slo, shi;
    pp_stage_range(e, &slo, &shi);
    size_t es = e->be->elt_size, P = shi - slo, S = (P + (size_t)dp - 1) / (size_t)dp;
    size_t per = 2 * sizeof(float) + (e->be->dtype == BACKEND_F32 ? 0 : sizeof(float));
    out->activations = e->mem.activations;
    out->grads = (stage >= 2 ? S : P) * es;
    out->optimizer = per * (stage >= 1 ? S : P) + 4 * sizeof(float);
    out->comm = stage >= 1 && dp > 1 ? 2 * S * es : 0;
    out->params = P * es;
    if (stage == 3) {
        /* working set: the layer -1 group plus the largest block */
        size_t head = 0, block = 0;
        int L = e->cfg.n_layer;
        for (int i = 0; i < e->layout.n; i++)
            if (e->layout.t[i].layer < 0 && (size_t)e->layout.t[i].rank_offset >= slo &&
                (size_t)e->layout.t[i].rank_offset < shi)
                head += (size_t)e->layout.t[i].rank_numel;
        for (int l = 0; l < L; l++) {
            size_t n = 0;
            for (int i = 0; i < e->layout.n; i++)
                if (e->layout.t[i].layer == l) n += (size_t)e->layout.t[i].rank_numel;
            block = n > block ? n : block;
        }
        out->params = (S + head + block) * es;
    }
}

struct zero *zero_new(struct engine *e, struct comm *dp, int stage, char *err, size_t errlen) {
    struct zero *z = NULL;
    if (stage < 0 || stage > 3) {
        snprintf(err, errlen, "zero_stage %d: expected 0, 1, 2 or 3", stage);
        return NULL;
    }
    z = calloc(1, sizeof(*z));
    if (!z) goto nomem;
    z->e = e;
    z->dp = dp;
    z->stage = stage;
    z->P = comm_size(dp);
    z->rank = comm_rank(dp);
    z->off = calloc((size_t)z->P, sizeof(size_t));
    z->cnt = calloc((size_t)z->P, sizeof(size_t));
    z->counts = calloc((size_t)z->P, sizeof(size_t));
    if (!z->off || !z->cnt || !z->counts) goto nomem;
    pp_stage_range(e, &z->lo, &z->hi);
    for (int i = 0; i < z->P; i++) {
        comm_shard_range(z->hi - z->lo, z->P, i, &z->off[i], &z->cnt[i]);
        z->off[i] += z->lo;
    }
    if (build_groups(z) != 0) {
        snprintf(err, errlen, "zero: cannot group the %d tensors by layer", e->layout.n);
        zero_free(z);
        return NULL;
    }
    int staged = z->lo != 0 || z->hi != e->n_params; /* pp > 1: optimizer on the stage only */
    if ((stage >= 1 || staged) &&
        engine_set_shard(e, stage >= 1 ? z->off[z->rank] : z->lo,
                         stage >= 1 ? z->cnt[z->rank] : z->hi - z->lo) != 0) {
        snprintf(err, errlen, "zero: cannot allocate the optimizer shard");
        zero_free(z);
        return NULL;
    }
    e->shard_replicated = stage == 0 && z->P > 1;
    struct engine_hooks h = {.user = z,
                             .grad_sync = hook_grad_sync,
                             .param_sync = hook_param_sync,
                             .allreduce_sum = hook_allreduce_sum};
    h.layer_grads_ready = hook_grads_ready;
    if (stage == 3) {
        h.layer_pre_forward = hook_pre_forward;
        h.layer_pre_backward = hook_pre_backward;
    }
    e->hooks = h;
    struct engine_mem m;
    zero_mem_model(e, stage, z->P, &m);
    e->mem = m;
    if (stage == 3) {
        /* Start released: only gathers make other ranks' parameters visible. */
        for (int l = -1; l < z->L; l++)
            z->g[l + 1].gathered = 1;
        release_all(z);
    }
    return z;
nomem:
    snprintf(err, errlen, "zero: out of memory");
    zero_free(z);
    return NULL;
}

void zero_free(struct zero *z) {
    if (!z) return;
    for (int i = 0; i < z->nreqs; i++)
        comm_wait(z->reqs[i]);
    for (int l = -1; z->g && l < z->L; l++)
        for (int k = 0; k < z->g[l + 1].n; k++)
            comm_wait(z->g[l + 1].prefetch[k]);
    free(z->reqs);
    free(z->off);
    free(z->cnt);
    free(z->counts);
    free(z->g);
#if defined(LOOM_HAVE_NCCL) && defined(LOOM_HAVE_CUDA)
    if (z->ordered) nccl_order_detach();
#endif
    comm_groups_free(&z->groups);
    comm_world_free(z->world);
    free(z);
}

struct zero *zero_setup(struct engine *e, const struct zero_setup_opts *o, char *err,
                        size_t errlen) {
    struct comm_world_opts wo = {.device = o->device,
                                 .rank = o->rank,
                                 .world = o->world,
                                 .rdzv = o->rdzv,
                                 .token = o->token,
                                 .timeout_ms = o->timeout_ms,
                                 .cuda_device = o->cuda_device};
    const char *t = getenv("LOOM_COMM_TIMEOUT_MS");
    if (!wo.timeout_ms && t && *t) wo.timeout_ms = atoi(t);
    const char *be = getenv("LOOM_COMM_BACKEND");
    if (be && *be) wo.backend = be;
    struct comm_world *w = comm_world_new(&wo, err, errlen);
    if (!w) return NULL;
    struct comm_layout l = {o->tp, o->dp, o->pp};
    struct comm_groups g;
    if (comm_groups_init(w, &l, &g, err, errlen) != 0) {
        comm_world_free(w);
        return NULL;
    }
    struct zero *z = zero_new(e, g.dp, o->zero_stage, err, errlen);
    if (!z) {
        comm_groups_free(&g);
        comm_world_free(w);
        return NULL;
    }
    z->world = w;
    z->groups = g;
#if defined(LOOM_HAVE_NCCL) && defined(LOOM_HAVE_CUDA)
    /* LOOM_COMM_ORDER=sync keeps the host sync (for comparison) */
    const char *ord = getenv("LOOM_COMM_ORDER");
    z->ordered = strcmp(comm_world_backend(w), "nccl") == 0 && backend_cuda_stream(e->be) &&
                 !(ord && strcmp(ord, "sync") == 0) &&
                 nccl_order_attach(backend_cuda_stream(e->be)) == 0;
#endif
    e->tp_group = g.tp;
    e->dp_group = g.dp;
    e->pp_group = g.pp;
    return z;
}

int zero_stage(const struct zero *z) {
    return z->stage;
}

struct comm *zero_world_comm(struct zero *z) {
    return z->groups.world;
}

int zero_barrier(void *ctx) {
    struct zero *z = ctx;
    return z->groups.world ? comm_barrier(z->groups.world, NULL) : 0;
}

int zero_agree(void *ctx, int *ok) {
    struct zero *z = ctx;
    if (!z->groups.world) return 0;
    int32_t v = *ok ? 1 : 0;
    if (comm_allreduce(z->groups.world, &v, 1, COMM_I32, COMM_MIN, NULL) != 0) return -1;
    *ok = v;
    return 0;
}

int zero_gather_master(struct zero *z, float *h) {
    struct engine *e = z->e;
    struct backend *b = e->be;
    b->sync(b->ctx);
    if (z->stage == 0) {
        b->download(b->ctx, h, e->master, e->n_params * sizeof(float));
        return 0;
    }
    /* Gather in backend memory (device memory for nccl), then download. */
    float *d = b->alloc(b->ctx, e->n_params * sizeof(float));
    if (!d) return -1;
    b->copy(b->ctx, d + e->shard_off, e->master, e->shard_n * sizeof(float));
    b->sync(b->ctx);
    int rc = comm_all_gather(z->dp, d + e->shard_off, d, e->n_params, COMM_F32, NULL);
    if (rc == 0) b->download(b->ctx, h, d, e->n_params * sizeof(float));
    b->free(b->ctx, d);
    return rc == 0 ? 0 : -1;
}

/* ---- checkpoint resharding */

static int cmp_range(const void *a, const void *b) {
    const struct zrange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int zero_load_checkpoint(struct engine *e, const char *dir, char *err, size_t errlen) {
    struct backend *b = e->be;
    struct ckpt_reader *r = NULL;
    float *full = NULL, *m = NULL, *v = NULL, *tmp = NULL;
    struct zrange *have = NULL;
    int rc = -1, world = 0, nhave = 0;
    size_t N = e->n_params, s0 = e->shard_off, s1 = e->shard_off + e->shard_n;
    if (ckpt_open(dir, 0, &r, err, errlen) != 0) goto out;
    world = ckpt_world(r);
    const json_t *lay = json_object_get(ckpt_manifest(r), "layout");
    int otp = (int)json_integer_value(json_object_get(lay, "tp"));
    if (otp && otp != e->tp) { /* reshard across tp (any pp, dp, stage): worker/tp.h */
        ckpt_close(r);
        return tp_load_checkpoint(e, dir, otp, err, errlen);
    }
    /* Same tp: the flat buffer of each tp rank has one layout whatever pp,
     * dp and the stage were, so the shards of this tp rank cover it. */
    ckpt_close(r);
    r = NULL;
    full = malloc((N ? N : 1) * sizeof(float));
    m = calloc(e->shard_n ? e->shard_n : 1, sizeof(float));
    v = calloc(e->shard_n ? e->shard_n : 1, sizeof(float));
    have = calloc((size_t)world + 1, sizeof(*have));
    if (!full || !m || !v || !have) {
        snprintf(err, errlen, "out of memory loading %s", dir);
        goto out;
    }
    for (int k = 0; k < world; k++) {
        if (ckpt_open(dir, k, &r, err, errlen) != 0) goto out;
        const json_t *meta = ckpt_rank_meta(r);
        const json_t *mtp = json_object_get(meta, "tp");
        if (mtp && (int)json_integer_value(mtp) != e->tp_idx) { /* another tp rank's layout */
            ckpt_close(r);
            r = NULL;
            continue;
        }
        size_t off = (size_t)json_integer_value(json_object_get(meta, "offset"));
        size_t cnt = (size_t)json_integer_value(json_object_get(meta, "count"));
        if (!json_object_get(meta, "count")) { /* unsharded writer: the whole buffer */
            off = 0;
            cnt = N;
        }
        if (off + cnt > N) {
            snprintf(err, errlen, "checkpoint %s rank %d holds [%zu, %zu) beyond %zu parameters",
                     dir, k, off, off + cnt, N);
            goto out;
        }
        if (cnt > 0) {
            free(tmp);
            tmp = malloc(cnt * sizeof(float));
            if (!tmp) {
                snprintf(err, errlen, "out of memory loading %s", dir);
                goto out;
            }
            if (ckpt_read_f32(r, "params", tmp, cnt, err, errlen) != 0) goto out;
            memcpy(full + off, tmp, cnt * sizeof(float));
            size_t a = off > s0 ? off : s0, z = off + cnt < s1 ? off + cnt : s1;
            if (z > a) {
                if (ckpt_read_f32(r, "adam_m", tmp, cnt, err, errlen) != 0) goto out;
                memcpy(m + (a - s0), tmp + (a - off), (z - a) * sizeof(float));
                if (ckpt_read_f32(r, "adam_v", tmp, cnt, err, errlen) != 0) goto out;
                memcpy(v + (a - s0), tmp + (a - off), (z - a) * sizeof(float));
            }
            have[nhave].lo = off;
            have[nhave].hi = off + cnt;
            nhave++;
        }
        ckpt_close(r);
        r = NULL;
    }
    qsort(have, (size_t)nhave, sizeof(*have), cmp_range);
    size_t covered = 0;
    for (int k = 0; k < nhave; k++) {
        if (have[k].lo > covered) break;
        if (have[k].hi > covered) covered = have[k].hi;
    }
    if (covered < N) {
        snprintf(err, errlen, "checkpoint %s covers only %zu of %zu parameters", dir, covered, N);
        goto out;
    }
    if (engine_params_from_host(e, 0, full, N) != 0) {
        snprintf(err, errlen, "out of memory loading %s", dir);
        goto out;
    }
    b->upload(b->ctx, e->opt_m, m, e->shard_n * sizeof(float));
    b->upload(b->ctx, e->opt_v, v, e->shard_n * sizeof(float));
    b->sync(b->ctx);
    rc = 0;
out:
    ckpt_close(r);
    free(full);
    free(m);
    free(v);
    free(tmp);
    free(have);
    return rc;
}
