/* DP and ZeRO 0-3 (see zero.h): shard arithmetic, the engine hooks, the
 * memory model, full-weight gathering and checkpoint resharding.
 *
 * A "group" is the set of flat-buffer ranges of one layer: block l is one
 * contiguous range; layer -1 (embeddings, final norm, head) is usually two
 * (the front and the back of the buffer). Per-group collectives use the
 * variable-slice collectives with, for rank i, the part of the range that
 * falls in shard i, in place: stages 0/1 on the whole-stage windows, stages
 * 2/3 in the block slots and layer -1 buffers (the owned part is then added
 * into, or copied from, the shard window). */
#include "worker/zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/offload.h"
#include "worker/pp.h"
#include "worker/tp.h"
#include "worker/nccl/dp_transport.h"
#include "worker/tuning.h"
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
    int reduced; /* stages 0/1: this step's gradient reduction was issued */
    /* stages 1/2: this group's parameter all-gathers issued by param_sync,
     * waited for before the group's next forward */
    struct comm_req *preq[ZERO_MAX_RANGES];
};

/* A buffer holding one block's full parameters (stage 3 gather slot) or
 * gradients (stage 2/3 scratch). layer -2: empty. */
struct zslot {
    void *buf;
    int layer;
    struct comm_req *req; /* gather / reduce-scatter in flight */
    int pending;          /* scratch: reduced, not yet added into the shard */
    int final;            /* scratch: holds the step's last micro-step (e->micro_last) */
};

#define ZERO_SLOTS 2

struct zero {
    struct engine *e;
    struct comm *dp;
    int stage, P, rank;
    size_t lo, hi;     /* the flat range this rank's pipeline stage owns (pp.h) */
    size_t *off, *cnt; /* shard of each dp rank, inside [lo, hi) */
    size_t *counts;    /* scratch [P] */
    int L;
    int l0, l1;       /* this stage's blocks */
    size_t blk;       /* elements of the largest block of this stage (slot size) */
    struct zgroup *g; /* [L + 1]: index layer + 1 */
    struct comm_req **reqs;
    int nreqs, capreqs;
    int failed;
    int ordered; /* nccl on the cuda backend: collectives wait for a device fence */
    /* stage 0, dp == 2 on a backend with caps.pair_transport: gradients
     * summed by a transport beside the comm layer (worker/nccl/dp_transport.h,
     * the copy engines) instead of NCCL all-reduces; NULL otherwise */
    const struct dp_transport_ops *tops;
    struct dp_transport *tr;
    /* with the transport: the layer -1 group's gradients except the position
     * embedding are summed early (final once the head's backward is done),
     * and the token embedding's own part goes to the peer as per-token rows
     * (hook_embedding_bwd) */
    int emb_x;
    struct zrange early[ZERO_MAX_RANGES], late[ZERO_MAX_RANGES];
    int nearly, nlate;
    /* stage >= 2: gradient scratch; stage 3: parameter gather slots */
    struct zslot gs[ZERO_SLOTS], ps[ZERO_SLOTS];
    int nslots, gnext, cur;
    void *hg[ZERO_MAX_RANGES]; /* stage >= 2: layer -1 gradients, per range of its group */
    void *hp[ZERO_MAX_RANGES]; /* stage 3: layer -1 parameters (kept gathered) */
    void **xp, **xg;           /* [layout.n]: copies of tensors used outside [lo, hi) */
    /* made by zero_setup */
    struct comm_world *world;
    struct comm_groups groups;
};

static void params_gather_wait_all(struct zero *z);
static void params_gather_wait(struct zero *z, int layer);

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

/* Make the device work issued so far on n elements at p the input of the
 * next collectives: with NCCL on the CUDA backend, a fence on the compute
 * stream that the comm streams wait for (worker/nccl/nccl_order.h; no host
 * stall), else a full device sync as the comm contract asks. */
static void comm_ready(struct zero *z, void *p, size_t n) {
    struct backend *b = z->e->be;
#if defined(LOOM_HAVE_NCCL) && defined(LOOM_HAVE_CUDA)
    if (z->ordered) {
        backend_cuda_flush(b);
        nccl_order_mark(p, n * b->elt_size);
        return;
    }
#else
    (void)p, (void)n;
#endif
    b->sync(b->ctx);
}

static int on_stage(const struct zero *z, const struct model_tensor *t) {
    return (size_t)t->rank_offset >= z->lo && (size_t)t->rank_offset < z->hi;
}

/* Point the parameter or gradient views of block `layer`'s tensors into
 * buf, which holds the block's flat range (layer -2: none). */
static void set_views(struct zero *z, void **views, int layer, void *buf) {
    struct engine *e = z->e;
    if (layer < 0) return;
    size_t lo = z->g[layer + 1].r[0].lo;
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        if (t->layer == layer && on_stage(z, t))
            views[i] = backend_at(e->be, buf, (size_t)t->rank_offset - lo);
    }
}

/* Block `layer` leaves a slot: its views go (they would alias the next
 * block's; engine_params_from_host writes through views). */
static void clear_views(struct zero *z, void **views, int layer) {
    struct engine *e = z->e;
    for (int i = 0; layer >= 0 && i < e->layout.n; i++)
        if (e->layout.t[i].layer == layer && on_stage(z, &e->layout.t[i])) views[i] = NULL;
}

/* ---- stage 3: parameter gather slots (the block in use and the next) */

static void slot_wait(struct zero *z, struct zslot *s, const char *what) {
    if (s->req && comm_wait(s->req) != 0) fail(z, what, s->layer);
    s->req = NULL;
}

static struct zslot *pslot_find(struct zero *z, int layer) {
    for (int k = 0; k < z->nslots; k++)
        if (z->ps[k].layer == layer) return &z->ps[k];
    return NULL;
}

/* Gather block `layer` into a slot not holding the block in use; async
 * (prefetch) or blocking. */
static void gather_start(struct zero *z, int layer, int async) {
    if (layer < z->l0 || layer >= z->l1 || pslot_find(z, layer)) return;
    struct engine *e = z->e;
    struct backend *b = e->be;
    struct zslot *s = NULL;
    for (int k = 0; k < z->nslots && !s; k++)
        if (z->ps[k].layer != z->cur || z->ps[k].layer == -2) s = &z->ps[k];
    if (!s) {
        if (async) return; /* one slot, in use: no prefetch */
        s = &z->ps[0];
    }
    slot_wait(z, s, "parameter all-gather");
    clear_views(z, e->pview, s->layer);
    const struct zrange *r = &z->g[layer + 1].r[0];
    size_t mine = range_counts(z, r->lo, r->hi, z->counts);
    void *dst = backend_at(b, s->buf, mine - r->lo);
    if (z->counts[z->rank])
        b->copy(b->ctx, dst, engine_params_at(e, mine), z->counts[z->rank] * b->elt_size);
    comm_ready(z, s->buf, r->hi - r->lo);
    if (comm_all_gatherv(z->dp, dst, s->buf, z->counts, compute_dtype(e), async ? &s->req : NULL) !=
        0)
        fail(z, "parameter all-gather", layer);
    s->layer = layer;
    set_views(z, e->pview, layer, s->buf);
}

/* Make block `layer`'s parameters usable now. */
static void gather(struct zero *z, int layer) {
    gather_start(z, layer, 0);
    struct zslot *s = pslot_find(z, layer);
    if (s) slot_wait(z, s, "parameter all-gather");
    z->cur = layer;
}

/* After the optimizer step: every gathered block is stale; the layer -1
 * group is gathered again at once (it stays resident). */
static void regather(struct zero *z) {
    struct engine *e = z->e;
    struct backend *b = e->be;
    for (int k = 0; k < z->nslots; k++) {
        slot_wait(z, &z->ps[k], "parameter all-gather");
        clear_views(z, e->pview, z->ps[k].layer);
        z->ps[k].layer = -2;
    }
    z->cur = -2;
    const struct zgroup *g = &z->g[0];
    for (int k = 0; k < g->n; k++) {
        size_t mine = range_counts(z, g->r[k].lo, g->r[k].hi, z->counts);
        void *dst = backend_at(b, z->hp[k], mine - g->r[k].lo);
        if (z->counts[z->rank])
            b->copy(b->ctx, dst, engine_params_at(e, mine), z->counts[z->rank] * b->elt_size);
        comm_ready(z, z->hp[k], g->r[k].hi - g->r[k].lo);
        if (comm_all_gatherv(z->dp, dst, z->hp[k], z->counts, compute_dtype(e), NULL) != 0)
            fail(z, "parameter all-gather", -1);
    }
}

/* ---- stage 2/3: gradient scratch, reduce-scattered every micro-step */

/* Complete a scratch slot's reduction and add this rank's part into the
 * gradient shard (the window). */
static void gslot_finish(struct zero *z, struct zslot *s) {
    if (!s->pending) return;
    struct backend *b = z->e->be;
    slot_wait(z, s, "gradient reduce-scatter");
    s->pending = 0;
    const struct zrange *r = &z->g[s->layer + 1].r[0];
    size_t mine = range_counts(z, r->lo, r->hi, z->counts);
    if (z->counts[z->rank])
        b->accumulate(b->ctx, engine_grads_at(z->e, mine), backend_at(b, s->buf, mine - r->lo),
                      z->counts[z->rank]);
    /* the last micro-step's add: this part of the shard is final; the
     * offload downloads it now, overlapping the rest of the backward */
    if (s->final) offload_grads_final(z->e, mine, z->counts[z->rank]);
}

/* Before block `layer`'s backward: give it a zeroed scratch slot. */
static void gslot_assign(struct zero *z, int layer) {
    struct backend *b = z->e->be;
    struct zslot *s = &z->gs[z->gnext];
    z->gnext = (z->gnext + 1) % z->nslots;
    gslot_finish(z, s);
    clear_views(z, z->e->gview, s->layer);
    b->zero(b->ctx, s->buf, z->blk * b->elt_size);
    s->layer = layer;
    set_views(z, z->e->gview, layer, s->buf);
}

/* Block `layer`'s gradients of this micro-step are final: reduce-scatter them
 * over dp (async); gslot_finish adds the owned part into the shard. */
static void hook_grads_done(struct engine *e, void *user, int layer) {
    struct zero *z = user;
    if (layer < 0) return; /* the layer -1 group accumulates until grad_sync */
    struct zslot *s = NULL;
    for (int k = 0; k < z->nslots; k++)
        if (z->gs[k].layer == layer && !z->gs[k].pending) s = &z->gs[k];
    if (!s) {
        fail(z, "gradient scratch lookup", layer);
        return;
    }
    const struct zrange *r = &z->g[layer + 1].r[0];
    size_t mine = range_counts(z, r->lo, r->hi, z->counts);
    comm_ready(z, s->buf, r->hi - r->lo);
    if (comm_reduce_scatterv(z->dp, s->buf, backend_at(e->be, s->buf, mine - r->lo), z->counts,
                             compute_dtype(e), COMM_SUM, &s->req) != 0)
        fail(z, "gradient reduce-scatter", layer);
    s->pending = 1;
    s->final = e->micro_last;
}

/* Forward: layer l is needed now, l+1 next (prefetched while l computes). */
static void hook_pre_forward(struct engine *e, void *user, int layer) {
    struct zero *z = user;
    (void)e;
    if (z->stage == 1 || z->stage == 2) {
        params_gather_wait(z, layer); /* issued by the last param_sync */
        return;
    }
    if (z->stage < 3 || layer < 0) return; /* layer -1 stays gathered */
    gather(z, layer);
    gather_start(z, layer + 1, 1);
}

static void hook_pre_backward(struct engine *e, void *user, int layer) {
    struct zero *z = user;
    (void)e;
    if (layer < 0) return; /* the embedding backward reads no block parameters */
    gslot_assign(z, layer);
    if (z->stage < 3) return;
    gather(z, layer);
    gather_start(z, layer - 1, 1); /* backward goes down: prefetch l-1 */
}

/* ---- stage 2/3: per-layer reduce-scatter of gradients */

static int push_req(struct zero *z, struct comm_req *r) {
    if (!r) return 0;
    if (BUF_GROW(z->reqs, z->capreqs, z->nreqs + 1, 16) != 0) return -1;
    z->reqs[z->nreqs++] = r;
    return 0;
}

static void pair_start_all(struct zero *z, const struct zrange *r, int n, int layer) {
    for (int k = 0; k < n; k++)
        if (z->tops->start(z->tr, r[k].lo, r[k].hi) != 0) {
            log_error("zero: gradient exchange of layer %d: %s", layer, z->tops->error(z->tr));
            z->failed = 1;
        }
}

/* The embedding backward with the transport's exchange (emb_x): earlier
 * micro-steps sum locally (with the head's part); the last one goes through
 * the transport (dp_transport.h, embedding_bwd). */
static void hook_embedding_bwd(struct engine *e, void *user, void *dwte, void *dwpe,
                               const void *dout, const int32_t *tokens, int B, int T, int C) {
    struct zero *z = user;
    struct backend *b = e->be;
    if (!e->micro_last || z->failed) {
        b->embedding_bwd(b->ctx, dwte, dwpe, dout, tokens, B, T, C);
        return;
    }
    if (z->tops->embedding_bwd(z->tr, dwte, dwpe, dout, tokens, B, T, C) != 0) z->failed = 1;
}

/* Before grad_sync with the embedding exchange: the compute stream may wait
 * on the peer's rows, so the host waits for it with the comm timeout. */
static int hook_compute_sync(struct engine *e, void *user) {
    struct zero *z = user;
    (void)e;
    if (z->tops->compute_sync(z->tr) != 0) {
        log_error("zero: %s", z->tops->error(z->tr));
        return -1;
    }
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
    if (z->tr) {
        backend_flush(e->be); /* the fence must follow the held work */
        const struct zrange *r = g->r;
        int n = g->n;
        if (z->emb_x && layer == z->L - 1) { /* the head's part is final: sum it now */
            pair_start_all(z, z->early, z->nearly, -1);
            if (z->tops->mark(z->tr) != 0) z->failed = 1;
        }
        if (z->emb_x && layer == -1) r = z->late, n = z->nlate;
        pair_start_all(z, r, n, layer);
        return;
    }
    for (int k = 0; k < g->n; k++) /* the layer's gradients are final on the device */
        comm_ready(z, engine_grads_at(e, g->r[k].lo), g->r[k].hi - g->r[k].lo);
    for (int k = 0; k < g->n; k++) {
        size_t lo = g->r[k].lo, hi = g->r[k].hi;
        struct comm_req *r = NULL;
        int rc;
        if (z->stage == 0) {
            rc = comm_allreduce(z->dp, engine_grads_at(e, lo), hi - lo, compute_dtype(e), COMM_SUM,
                                &r);
        } else {
            size_t mine = range_counts(z, lo, hi, z->counts);
            rc = comm_reduce_scatterv(z->dp, engine_grads_at(e, lo), engine_grads_at(e, mine),
                                      z->counts, compute_dtype(e), COMM_SUM, &r);
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
    params_gather_wait_all(z); /* normally done: the forward waited for each */
    if (z->stage >= 2) {
        /* blocks: finish the last reductions; layer -1: reduce-scatter its
         * accumulated gradients now and add the owned part into the shard */
        struct backend *b = e->be;
        for (int k = 0; k < z->nslots; k++)
            gslot_finish(z, &z->gs[k]);
        const struct zgroup *g = &z->g[0];
        for (int k = 0; k < g->n; k++) {
            size_t lo = g->r[k].lo, hi = g->r[k].hi;
            size_t mine = range_counts(z, lo, hi, z->counts);
            void *part = backend_at(b, z->hg[k], mine - lo);
            comm_ready(z, z->hg[k], hi - lo);
            if (comm_reduce_scatterv(z->dp, z->hg[k], part, z->counts, compute_dtype(e), COMM_SUM,
                                     NULL) != 0)
                fail(z, "gradient reduce-scatter", -1);
            else if (z->counts[z->rank]) {
                b->accumulate(b->ctx, engine_grads_at(e, mine), part, z->counts[z->rank]);
                offload_grads_final(e, mine, z->counts[z->rank]);
            }
        }
        return z->failed ? -1 : 0;
    }
    for (int l = z->L - 1; l >= -1; l--)
        reduce_group(z, l);
    if (z->tr && z->tops->finish(z->tr) != 0) {
        log_error("zero: gradient exchange: %s", z->tops->error(z->tr));
        rc = -1;
    }
    for (int i = 0; i < z->nreqs; i++)
        if (comm_wait(z->reqs[i]) != 0) rc = -1;
    z->nreqs = 0;
    for (int l = -1; l < z->L; l++)
        z->g[l + 1].reduced = 0;
    if (rc != 0) fail(z, "gradient sync", -2);
    return z->failed ? -1 : 0;
}

/* Stages 1/2: all-gather group `layer`'s updated parameters in place in the
 * params window (async; each owner's part is already there). */
static void params_gather_start(struct zero *z, int layer) {
    struct engine *e = z->e;
    struct zgroup *g = &z->g[layer + 1];
    for (int k = 0; k < g->n; k++) {
        size_t lo = g->r[k].lo, hi = g->r[k].hi;
        size_t mine = range_counts(z, lo, hi, z->counts);
        comm_ready(z, engine_params_at(e, lo), hi - lo);
        if (comm_all_gatherv(z->dp, engine_params_at(e, mine), engine_params_at(e, lo), z->counts,
                             compute_dtype(e), &g->preq[k]) != 0)
            fail(z, "parameter all-gather", layer);
    }
}

static void params_gather_wait(struct zero *z, int layer) {
    struct zgroup *g = &z->g[layer + 1];
    for (int k = 0; k < g->n; k++) {
        if (g->preq[k] && comm_wait(g->preq[k]) != 0) fail(z, "parameter all-gather", layer);
        g->preq[k] = NULL;
    }
}

static void params_gather_wait_all(struct zero *z) {
    for (int l = -1; z->g && l < z->L; l++)
        params_gather_wait(z, l);
}

static int hook_param_sync(struct engine *e, void *user) {
    struct zero *z = user;
    if (z->stage == 1 || z->stage == 2) {
        /* a second param_sync before a forward waited for the first (the
         * delayed offload's flush, worker/offload.h): finish those gathers */
        params_gather_wait_all(z);
        /* per group in the order the next forward uses them (embeddings and
         * head, then blocks 0..L-1), asynchronously: hook_pre_forward waits
         * for a group just before its forward, so the later groups' gathers
         * overlap the first blocks' compute instead of stalling the step */
        for (int l = -1; l < z->L; l++)
            params_gather_start(z, l);
        /* with pp the tied embedding is sent to the last stage right after
         * this (worker/par.c): keep the blocking behaviour there */
        if (e->pp > 1) params_gather_wait_all(z);
    } else if (z->stage == 3) {
        regather(z); /* gathered blocks are stale now; the next use gathers */
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

/* Elements of the tensors this stage uses but does not own (the tied
 * embedding on the last pp stage), of its layer -1 group, and of its
 * largest block; the number of its blocks. */
static void stage_sizes(const struct engine *e, size_t slo, size_t shi, size_t *extra, size_t *head,
                        size_t *block, int *nblocks) {
    *extra = *head = *block = 0;
    *nblocks = 0;
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        size_t o = (size_t)t->rank_offset, n = (size_t)t->rank_numel;
        int in = o >= slo && o < shi;
        if (!in && e->pp > 1 && model_tensor_on_stage(&e->cfg, t, e->pp, e->pp_idx)) *extra += n;
        if (in && t->layer < 0) *head += n;
    }
    for (int l = 0; l < e->cfg.n_layer; l++) {
        size_t n = 0;
        for (int i = 0; i < e->layout.n; i++) {
            const struct model_tensor *t = &e->layout.t[i];
            size_t o = (size_t)t->rank_offset;
            if (t->layer == l && o >= slo && o < shi) n += (size_t)t->rank_numel;
        }
        if (n) ++*nblocks;
        *block = n > *block ? n : *block;
    }
}

void zero_mem_model(const struct engine *e, int stage, int dp, struct engine_mem *out) {
    size_t slo, shi, extra, head, block;
    int nblocks;
    pp_stage_range(e, &slo, &shi);
    if (dp == 1 && stage > 1) stage = 1; /* zero_new: nothing to shard */
    stage_sizes(e, slo, shi, &extra, &head, &block, &nblocks);
    size_t es = e->be->elt_size, P = shi - slo, off, S;
    /* this rank's shard (comm_shard_range: the first P % dp shards are one larger) */
    comm_shard_range(P, dp, dp == e->dp ? e->dp_idx : 0, &off, &S);
    size_t slots = (size_t)(nblocks < ZERO_SLOTS ? nblocks : ZERO_SLOTS);
    size_t per = 2 * sizeof(float) + (e->be->dtype == BACKEND_F32 ? 0 : sizeof(float));
    out->activations = e->mem.activations;
    /* offload: master and moments in host memory with the transfer buffer */
    out->host = e->offload ? offload_host_bytes(stage >= 1 ? S : P, es) : 0;
    if (e->offload) per = 0;
    /* stage 3: the shard, the layer -1 group kept gathered, two block slots */
    out->params = ((stage >= 3 ? (S ? S : 1) + head + slots * block : (P ? P : 1)) + extra) * es;
    /* stage >= 2: the shard, layer -1's gradients, two block scratch slots */
    out->grads = ((stage >= 2 ? (S ? S : 1) + head + slots * block : (P ? P : 1)) + extra) * es;
    out->optimizer = per * (stage >= 1 ? S : P) + 4 * sizeof(float);
    out->comm = stage >= 1 && dp > 1 ? 2 * ((P + (size_t)dp - 1) / (size_t)dp) * es : 0;
}

/* A frozen base (LoRA) with pp > 1: the tensors this stage uses off its
 * range (the last stage's tied embedding) get a copy of their values, as
 * alloc_buffers keeps for a trained base (no gradient copy: nothing is
 * trained, so no transfer keeps it in step either). Before the weights are
 * initialised, which write the copies through the views. 0 or -1. */
static int frozen_extras(struct zero *z) {
    struct engine *e = z->e;
    struct backend *b = e->be;
    size_t es = b->elt_size;
    z->xp = calloc((size_t)e->layout.n, sizeof(void *));
    z->xg = calloc((size_t)e->layout.n, sizeof(void *));
    if (!z->xp || !z->xg) return -1;
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        size_t n = (size_t)t->rank_numel;
        if (on_stage(z, t) || !model_tensor_on_stage(&e->cfg, t, e->pp, e->pp_idx)) continue;
        if (!(z->xp[i] = engine_alloc(e, n * es, &e->mem.params))) return -1;
        b->zero(b->ctx, z->xp[i], n * es);
        e->pview[i] = z->xp[i];
    }
    return 0;
}

/* Allocate what this rank keeps outside the windows and shrink the windows
 * (zero.h, "Memory"): copies of tensors used off the stage range (tied
 * embedding), stage >= 2 gradient scratch (layer -1 group, block slots),
 * stage 3 parameter buffers (layer -1 group, block slots); then params
 * [lo, hi) or the shard (stage 3), grads [lo, hi) or the shard (stage >= 2).
 * Runs once, after the parameters were initialised in the full window. */
static int alloc_buffers(struct zero *z) {
    struct engine *e = z->e;
    struct backend *b = e->be;
    size_t es = b->elt_size, extra, head, block;
    int nblocks;
    stage_sizes(e, z->lo, z->hi, &extra, &head, &block, &nblocks);
    (void)extra, (void)head;
    z->blk = block;
    z->nslots = nblocks < ZERO_SLOTS ? nblocks : ZERO_SLOTS;
    z->l0 = z->L;
    z->l1 = 0;
    for (int l = 0; l < z->L; l++) {
        if (!z->g[l + 1].n) continue;
        if (z->g[l + 1].n != 1) return -1; /* a block is one contiguous range */
        if (l < z->l0) z->l0 = l;
        z->l1 = l + 1;
    }
    z->xp = calloc((size_t)e->layout.n, sizeof(void *));
    z->xg = calloc((size_t)e->layout.n, sizeof(void *));
    if (!z->xp || !z->xg) return -1;
    /* engine_place.windows_later: nothing is resident yet and the weights are
     * initialised after this, through the views and windows set up here */
    int empty = e->p_hi == e->p_lo && e->n_params > 0;
    for (int i = 0; i < e->layout.n && e->pp > 1; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        size_t n = (size_t)t->rank_numel;
        if (on_stage(z, t) || !model_tensor_on_stage(&e->cfg, t, e->pp, e->pp_idx)) continue;
        z->xp[i] = engine_alloc(e, n * es, &e->mem.params);
        z->xg[i] = engine_alloc(e, n * es, &e->mem.grads);
        if (!z->xp[i] || !z->xg[i]) return -1;
        if (empty)
            b->zero(b->ctx, z->xp[i], n * es);
        else
            b->copy(b->ctx, z->xp[i], engine_param(e, i), n * es);
        b->zero(b->ctx, z->xg[i], n * es);
        e->pview[i] = z->xp[i];
        e->gview[i] = z->xg[i];
    }
    const struct zgroup *g = &z->g[0];
    for (int k = 0; k < g->n && z->stage >= 2; k++) {
        size_t lo = g->r[k].lo, n = g->r[k].hi - lo;
        z->hg[k] = engine_alloc(e, n * es, &e->mem.grads);
        if (z->stage == 3) z->hp[k] = engine_alloc(e, n * es, &e->mem.params);
        if (!z->hg[k] || (z->stage == 3 && !z->hp[k])) return -1;
        b->zero(b->ctx, z->hg[k], n * es);
        if (z->stage == 3 && empty) b->zero(b->ctx, z->hp[k], n * es);
        if (z->stage == 3 && !empty) b->copy(b->ctx, z->hp[k], engine_params_at(e, lo), n * es);
        for (int i = 0; i < e->layout.n; i++) {
            size_t o = (size_t)e->layout.t[i].rank_offset;
            if (o < lo || o >= lo + n) continue;
            e->gview[i] = backend_at(b, z->hg[k], o - lo);
            if (z->stage == 3) e->pview[i] = backend_at(b, z->hp[k], o - lo);
        }
    }
    for (int k = 0; k < z->nslots && z->stage >= 2; k++) {
        z->gs[k].layer = z->ps[k].layer = -2;
        z->gs[k].buf = engine_alloc(e, block * es, &e->mem.grads);
        if (z->stage == 3) z->ps[k].buf = engine_alloc(e, block * es, &e->mem.params);
        if (!z->gs[k].buf || (z->stage == 3 && !z->ps[k].buf)) return -1;
    }
    z->cur = -2;
    size_t s0 = z->off[z->rank], s1 = s0 + z->cnt[z->rank];
    if (z->lo == 0 && z->hi == e->n_params && z->stage < 2 && !empty)
        return 0; /* nothing to shrink */
    b->sync(b->ctx);
    return engine_set_windows(e, z->stage >= 3 ? s0 : z->lo, z->stage >= 3 ? s1 : z->hi,
                              z->stage >= 2 ? s0 : z->lo, z->stage >= 2 ? s1 : z->hi);
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
    z->P = comm_size(dp);
    z->rank = comm_rank(dp);
    /* one dp rank: nothing to shard; stages 2/3 would only add scratch */
    if (z->P == 1 && stage > 1) stage = 1;
    z->stage = stage;
    z->off = calloc((size_t)z->P, sizeof(size_t));
    z->cnt = calloc((size_t)z->P, sizeof(size_t));
    z->counts = calloc((size_t)z->P, sizeof(size_t));
    if (!z->off || !z->cnt || !z->counts) goto nomem;
    pp_stage_range(e, &z->lo, &z->hi);
    if (e->frozen) { /* LoRA: the base never changes, so none of it travels; the adapters
                      * synchronise themselves (worker/lora.c) over zero_dp_comm */
        z->stage = 0;
        /* an NF4 base (QLoRA) has no window: nf4_attach gave every tensor
         * of the stage a view, the tied copy included (worker/nf4.h) */
        int window = !e->nf4;
        if ((window && engine_set_windows(e, z->lo, z->hi, 0, 0) != 0) ||
            engine_set_shard(e, z->lo, z->hi - z->lo) != 0 ||
            (window && e->pp > 1 && frozen_extras(z) != 0)) {
            snprintf(err, errlen, "zero: out of memory for the frozen parameters");
            zero_free(z);
            return NULL;
        }
        e->hooks = (struct engine_hooks){.user = z, .allreduce_sum = hook_allreduce_sum};
        return z;
    }
    for (int i = 0; i < z->P; i++) {
        comm_shard_range(z->hi - z->lo, z->P, i, &z->off[i], &z->cnt[i]);
        z->off[i] += z->lo;
    }
    if (build_groups(z) != 0) {
        snprintf(err, errlen, "zero: cannot group the %d tensors by layer", e->layout.n);
        zero_free(z);
        return NULL;
    }
    if (alloc_buffers(z) != 0) {
        snprintf(err, errlen, "zero: out of memory for the stage %d buffers", stage);
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
    if (stage < 2) {
        h.layer_grads_ready = hook_grads_ready;
    } else {
        h.layer_grads_done = hook_grads_done;
        h.layer_pre_backward = hook_pre_backward;
    }
    if (stage >= 1) h.layer_pre_forward = hook_pre_forward;
    e->hooks = h;
    /* params, grads and optimizer are what the engine really holds (the unit
     * test checks them against zero_mem_model); comm is the Gloo reduce-scatter
     * ring's staging, by formula. NCCL (the cuda backend's comms) takes uneven
     * slices as grouped reduces / broadcasts without such a buffer, so nothing
     * is reported there (its own internal buffers are not the engine's). */
    struct engine_mem m;
    zero_mem_model(e, stage, z->P, &m);
    e->mem.comm = e->be->caps.device_collectives ? 0 : m.comm;
    return z;
nomem:
    snprintf(err, errlen, "zero: out of memory");
    zero_free(z);
    return NULL;
}

void zero_free(struct zero *z) {
    if (!z) return;
    struct engine *e = z->e;
    size_t es = e->be->elt_size;
    for (int i = 0; i < z->nreqs; i++)
        comm_wait(z->reqs[i]);
    params_gather_wait_all(z);
    for (int k = 0; k < ZERO_SLOTS; k++) {
        comm_wait(z->gs[k].req);
        comm_wait(z->ps[k].req);
        engine_release(e, z->gs[k].buf, z->blk * es, &e->mem.grads);
        engine_release(e, z->ps[k].buf, z->blk * es, &e->mem.params);
    }
    for (int k = 0; z->g && k < z->g[0].n; k++) {
        size_t n = z->g[0].r[k].hi - z->g[0].r[k].lo;
        engine_release(e, z->hg[k], n * es, &e->mem.grads);
        engine_release(e, z->hp[k], n * es, &e->mem.params);
    }
    for (int i = 0; i < e->layout.n && z->xp; i++) {
        size_t n = (size_t)e->layout.t[i].rank_numel * es;
        engine_release(e, z->xp[i], n, &e->mem.params);
        engine_release(e, z->xg[i], n, &e->mem.grads);
    }
    for (int i = 0; i < e->layout.n; i++) /* every view pointed into these buffers */
        e->pview[i] = e->gview[i] = NULL;
    free(z->xp);
    free(z->xg);
    free(z->reqs);
    free(z->off);
    free(z->cnt);
    free(z->counts);
    free(z->g);
    if (z->tr) z->tops->close(z->tr);
#if defined(LOOM_HAVE_NCCL) && defined(LOOM_HAVE_CUDA)
    if (z->ordered) nccl_order_detach();
#endif
    comm_groups_free(&z->groups);
    comm_world_free(z->world);
    free(z);
}

/* The layer -1 group of this stage split for the embedding exchange: early =
 * every tensor but the position embedding (final once the head's backward
 * is done), late = the position embedding; contiguous ones merged. -1 when
 * the token embedding is not in this stage. */
static int emb_split(struct zero *z) {
    const struct model_layout *lay = &z->e->layout;
    int have_embed = 0;
    z->nearly = z->nlate = 0;
    for (int i = 0; i < lay->n; i++) {
        const struct model_tensor *t = &lay->t[i];
        size_t lo = (size_t)t->rank_offset, hi = lo + (size_t)t->rank_numel;
        if (t->layer != -1 || lo < z->lo || hi > z->hi) continue;
        have_embed |= t->kind == MODEL_T_EMBED;
        struct zrange *r = t->kind == MODEL_T_POS ? z->late : z->early;
        int *n = t->kind == MODEL_T_POS ? &z->nlate : &z->nearly;
        if (*n > 0 && r[*n - 1].hi == lo) {
            r[*n - 1].hi = hi;
        } else {
            if (*n == ZERO_MAX_RANGES) return -1;
            r[*n].lo = lo;
            r[*n].hi = hi;
            (*n)++;
        }
    }
    return have_embed ? 0 : -1;
}

/* The dp pair transport, where this build has one (worker/nccl/dp_pair.c). */
static const struct dp_transport_ops *pair_transport(void) {
#if defined(LOOM_HAVE_NCCL) && defined(LOOM_HAVE_CUDA)
    return dp_pair_transport();
#else
    return NULL;
#endif
}

/* Stage 0 over two dp ranks: the gradients are summed by the pair transport
 * (the copy engines, dp_transport.h: no NCCL kernels holding SMs during the
 * backward); falls back to the comm layer's all-reduces where it cannot be
 * set up. dp-pair off (LOOM_DP_PAIR=0) keeps NCCL (for comparison); tp 1,
 * pp 1 only: the layouts it was tested and measured in (2 GPUs); with tp or
 * pp the dp pairs also need more GPUs than have been lent so far. */
static void pair_setup(struct zero *z, const struct zero_setup_opts *o,
                       const struct comm_tuning *tu, int timeout_ms) {
    struct engine *e = z->e;
    const struct dp_transport_ops *ops = pair_transport();
    if (!ops || e->frozen || !e->be->caps.pair_transport || !z->ordered || z->stage != 0 ||
        z->P != 2 || o->tp != 1 || o->pp != 1 || (tu && !tu->dp_pair))
        return;
    /* dp-emb-exchange off (LOOM_DP_EMB_EXCHANGE=0): the token embedding's
     * gradient is summed dense at the tail like the rest of its group */
    struct dp_transport_opts to = {.lo = z->lo,
                                   .hi = z->hi,
                                   .timeout_ms = timeout_ms,
                                   .chunk_kib = tu ? tu->pair_chunk_kib : 0,
                                   .trace = tu ? tu->pair_trace : 0,
                                   .priority = tu ? tu->pair_priority : NULL};
    if (o->micro_tokens > 0 && (!tu || tu->dp_emb_exchange) && emb_split(z) == 0 && z->nearly > 0)
        to.emb_tokens = (size_t)o->micro_tokens;
    char perr[256];
    z->tr = ops->open(e, z->dp, &to, &z->emb_x, perr, sizeof perr);
    if (!z->tr) {
        log_warn("zero: %s; dp gradients go through NCCL all-reduces", perr);
        return;
    }
    z->tops = ops;
    if (z->emb_x) {
        e->hooks.embedding_bwd = hook_embedding_bwd;
        e->hooks.compute_sync = hook_compute_sync;
    }
    log_info("zero: dp gradients summed by the copy engines (%.1f MiB receive area%s)",
             (z->hi - z->lo) * e->be->elt_size / 1048576.0,
             z->emb_x ? "; token embedding exchanged as per-token rows" : "");
}

struct zero *zero_setup(struct engine *e, const struct zero_setup_opts *o, char *err,
                        size_t errlen) {
    const struct comm_tuning *tu = o->tune;
    struct comm_world_opts wo = {.device = o->device,
                                 .rank = o->rank,
                                 .world = o->world,
                                 .rdzv = o->rdzv,
                                 .token = o->token,
                                 .timeout_ms = o->timeout_ms,
                                 .cuda_device = o->cuda_device};
    if (tu) {
        if (!wo.timeout_ms) wo.timeout_ms = (int)tu->timeout_ms;
        if (tu->backend && *tu->backend) wo.backend = tu->backend;
        wo.iface = tu->iface;
        wo.host = tu->host;
        wo.nccl_stream_priority = tu->nccl_stream_priority;
        wo.nccl_cta_policy = tu->nccl_cta_policy;
    }
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
    /* comm-order=sync (LOOM_COMM_ORDER) keeps the host sync (for comparison) */
    const char *ord = tu ? tu->order : NULL;
    z->ordered = strcmp(comm_world_backend(w), "nccl") == 0 && backend_cuda_stream(e->be) &&
                 !(ord && strcmp(ord, "sync") == 0) &&
                 nccl_order_attach(backend_cuda_stream(e->be)) == 0;
#endif
    pair_setup(z, o, tu, wo.timeout_ms);
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

struct comm *zero_dp_comm(struct zero *z) {
    return z->dp;
}

int zero_barrier(void *ctx) {
    struct zero *z = ctx;
    return z->groups.world ? comm_barrier(z->groups.world, NULL) : 0;
}

int zero_gather_master(struct zero *z, float *h) {
    struct engine *e = z->e;
    struct backend *b = e->be;
    b->sync(b->ctx);
    if (z->stage == 0) {
        engine_opt_read(e, ENGINE_OPT_MASTER, h, 0, e->n_params);
        return 0;
    }
    /* Gather in backend memory (device memory for nccl), then download. */
    float *d = b->alloc(b->ctx, e->n_params * sizeof(float));
    if (!d) return -1;
    engine_master_to_dev(e, d + e->shard_off);
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
    engine_opt_write(e, ENGINE_OPT_M, m, 0, e->shard_n);
    engine_opt_write(e, ENGINE_OPT_V, v, 0, e->shard_n);
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
