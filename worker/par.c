/* Layout glue for tp / pp > 1 over DP/ZeRO (see par.h). */
#include "worker/par.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/tp.h"

struct par {
    struct engine *e;
    struct zero *z;
    struct comm *world;
    struct engine_hooks inner; /* zero's */
    struct pp *pp;
    int tied;  /* pp > 1 with tied embeddings: wte on the first and last stage */
    int wte;   /* tensor index of the token embedding */
    void *tmp; /* device [wte rank_numel] for the tied gradient */
};

static enum comm_dtype cdt(const struct engine *e) {
    return e->be->dtype == BACKEND_BF16 ? COMM_BF16 : COMM_F32;
}

static double hook_norm(struct engine *e, void *user) {
    struct par *p = user;
    struct backend *b = e->be;
    size_t s0 = e->shard_off, s1 = e->shard_off + e->shard_n;
    float h = 0;
    b->zero(b->ctx, e->scalar, sizeof(float));
    int skip_all = e->shard_replicated && e->dp_idx != 0;
    for (int i = 0; i < e->layout.n && !skip_all; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        if (tp_replicated(t) && e->tp_idx != 0) continue;
        size_t lo = (size_t)t->rank_offset, hi = lo + (size_t)t->rank_numel;
        if (lo < s0) lo = s0;
        if (hi > s1) hi = s1;
        if (hi > lo) b->sumsq(b->ctx, e->scalar, engine_grads_at(e, lo), hi - lo);
    }
    b->download(b->ctx, &h, e->scalar, sizeof(float));
    double v = h;
    if (p->world && comm_allreduce(p->world, &v, 1, COMM_F64, COMM_SUM, NULL) != 0)
        die("gradient norm all-reduce failed: %s", comm_error(p->world));
    return v;
}

static int hook_allreduce_sum(struct engine *e, void *user, double *v, int n) {
    struct par *p = user;
    if (!p->world) return 0;
    if (comm_allreduce(p->world, v, (size_t)n, COMM_F64, COMM_SUM, NULL) != 0) {
        log_error("world all-reduce failed: %s", comm_error(p->world));
        return -1;
    }
    for (int i = 0; i < n; i++)
        v[i] /= e->tp;
    return 0;
}

static int hook_grad_sync(struct engine *e, void *user) {
    struct par *p = user;
    if (p->tied) {
        struct backend *b = e->be;
        const struct model_tensor *t = &e->layout.t[p->wte];
        size_t n = (size_t)t->rank_numel;
        void *g = engine_grad(e, p->wte);
        struct comm *c = e->pp_group;
        b->sync(b->ctx);
        if (e->pp_idx == e->pp - 1) {
            if (comm_send(c, g, n, cdt(e), 0, NULL) != 0) return -1;
        } else if (e->pp_idx == 0) {
            if (comm_recv(c, p->tmp, n, cdt(e), e->pp - 1, NULL) != 0) return -1;
            b->accumulate(b->ctx, g, p->tmp, n);
        }
    }
    return p->inner.grad_sync ? p->inner.grad_sync(e, p->inner.user) : 0;
}

static int hook_param_sync(struct engine *e, void *user) {
    struct par *p = user;
    int rc = p->inner.param_sync ? p->inner.param_sync(e, p->inner.user) : 0;
    if (rc == 0 && p->tied) {
        struct backend *b = e->be;
        const struct model_tensor *t = &e->layout.t[p->wte];
        void *w = engine_param(e, p->wte);
        b->sync(b->ctx);
        if (e->pp_idx == 0)
            rc = comm_send(e->pp_group, w, (size_t)t->rank_numel, cdt(e), e->pp - 1, NULL);
        else if (e->pp_idx == e->pp - 1)
            rc = comm_recv(e->pp_group, w, (size_t)t->rank_numel, cdt(e), 0, NULL);
    }
    return rc;
}

static void hook_grads_ready(struct engine *e, void *user, int layer) {
    struct par *p = user;
    if (p->inner.layer_grads_ready) p->inner.layer_grads_ready(e, p->inner.user, layer);
}

static void hook_grads_done(struct engine *e, void *user, int layer) {
    struct par *p = user;
    if (p->inner.layer_grads_done) p->inner.layer_grads_done(e, p->inner.user, layer);
}

static void hook_pre_forward(struct engine *e, void *user, int layer) {
    struct par *p = user;
    if (p->inner.layer_pre_forward) p->inner.layer_pre_forward(e, p->inner.user, layer);
}

static void hook_pre_backward(struct engine *e, void *user, int layer) {
    struct par *p = user;
    if (p->inner.layer_pre_backward) p->inner.layer_pre_backward(e, p->inner.user, layer);
}

struct par *par_setup(struct engine *e, struct zero *z, struct model *m,
                      const struct model_opts *mo, const char *schedule, char *err, size_t errlen) {
    int sched = pp_schedule_parse(schedule);
    if (sched < 0) {
        snprintf(err, errlen, "pipeline schedule \"%s\": expected 1f1b or gpipe", schedule);
        return NULL;
    }
    struct par *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "par: out of memory");
        return NULL;
    }
    p->e = e;
    p->z = z;
    p->world = z ? zero_world_comm(z) : NULL;
    p->inner = e->hooks;
    p->wte = m->wte;
    /* a frozen base (train.lora) has no wte gradient and never changes wte */
    p->tied = e->pp > 1 && e->cfg.tied_embeddings && !e->frozen;
    if (p->tied && e->pp_idx == 0) {
        size_t bytes = (size_t)e->layout.t[p->wte].rank_numel * e->be->elt_size;
        p->tmp = engine_alloc(e, bytes, &e->mem.comm);
        if (!p->tmp) {
            snprintf(err, errlen, "par: out of memory for the tied embedding's gradient");
            par_free(p);
            return NULL;
        }
    }
    if (e->pp > 1 && !(p->pp = pp_new(m, mo, (enum pp_schedule)sched, err, errlen))) {
        par_free(p);
        return NULL;
    }
    struct engine_hooks h = {.user = p,
                             .grad_sync = hook_grad_sync,
                             .param_sync = hook_param_sync,
                             .allreduce_sum = hook_allreduce_sum,
                             .grad_norm_sq = hook_norm};
    if (p->inner.layer_grads_ready) h.layer_grads_ready = hook_grads_ready;
    if (p->inner.layer_grads_done) h.layer_grads_done = hook_grads_done;
    if (p->inner.layer_pre_forward) h.layer_pre_forward = hook_pre_forward;
    if (p->inner.layer_pre_backward) h.layer_pre_backward = hook_pre_backward;
    e->hooks = h;
    return p;
}

void par_free(struct par *p) {
    if (!p) return;
    pp_free(p->pp);
    if (p->tmp) p->e->be->free(p->e->be->ctx, p->tmp);
    free(p);
}

void par_train_opts(struct par *p, struct train_opts *o) {
    if (!p->pp) return;
    /* the slots now, so the start-up memory line counts them; on failure the
     * first step reports it */
    if (pp_reserve(p->pp, o->grad_accum) != 0)
        log_warn("pp: cannot allocate %d micro-batch slots yet", o->grad_accum);
    o->micro_steps = pp_micro_steps;
    o->micro_user = p->pp;
    o->step_extra = pp_step_extra;
    o->step_extra_user = p->pp;
    o->forward_only = pp_forward_only;
}

int par_gather_full(struct par *p, float *h) {
    struct engine *e = p->e;
    struct backend *b = e->be;
    int W = e->world, rc = -1;
    struct model_layout full;
    if (!p->world || model_layout_init(&full, &e->cfg, 1) != 0) return -1;
    /* every rank's (tp_idx, offset, count) of its optimizer range */
    int64_t *meta = calloc(3 * (size_t)W, sizeof *meta);
    size_t *counts = calloc((size_t)W, sizeof *counts);
    int64_t *dmeta = b->alloc(b->ctx, 3 * (size_t)W * sizeof *meta);
    float *all = NULL, *host = NULL, *part = NULL;
    if (!meta || !counts || !dmeta) goto out;
    meta[3 * e->rank] = e->tp_idx;
    meta[3 * e->rank + 1] = (int64_t)e->shard_off;
    meta[3 * e->rank + 2] = (int64_t)e->shard_n;
    b->upload(b->ctx, dmeta, meta, 3 * (size_t)W * sizeof *meta);
    b->sync(b->ctx);
    if (comm_allreduce(p->world, dmeta, 3 * (size_t)W, COMM_I64, COMM_SUM, NULL) != 0) goto out;
    b->download(b->ctx, meta, dmeta, 3 * (size_t)W * sizeof *meta);
    size_t total = 0, mine = 0;
    for (int r = 0; r < W; r++) {
        counts[r] = (size_t)meta[3 * r + 2];
        if (r < e->rank) mine += counts[r];
        total += counts[r];
    }
    /* the fp32 master shards of every rank, in rank order, in backend memory */
    all = b->alloc(b->ctx, (total ? total : 1) * sizeof(float));
    host = malloc((total ? total : 1) * sizeof(float));
    part = malloc((size_t)e->n_params * sizeof(float));
    if (!all || !host || !part) goto out;
    if (e->frozen) { /* train.lora: no master; the (merged) parameters themselves */
        float *fz = malloc((e->shard_n ? e->shard_n : 1) * sizeof *fz);
        if (!fz) goto out;
        engine_opt_read(e, ENGINE_OPT_MASTER, fz, 0, e->shard_n);
        b->upload(b->ctx, all + mine, fz, e->shard_n * sizeof *fz);
        free(fz);
    } else {
        engine_master_to_dev(e, all + mine);
    }
    b->sync(b->ctx);
    if (comm_all_gatherv(p->world, all + mine, all, counts, COMM_F32, NULL) != 0) goto out;
    b->download(b->ctx, host, all, total * sizeof(float));
    /* per tp rank: its flat buffer from the pieces, then its share of each tensor */
    for (int t = 0; t < e->tp; t++) {
        size_t at = 0;
        for (int r = 0; r < W; r++) {
            if (meta[3 * r] == t)
                memcpy(part + meta[3 * r + 1], host + at, counts[r] * sizeof(float));
            at += counts[r];
        }
        for (int i = 0; i < e->layout.n; i++)
            tp_unslice(&e->layout.t[i], e->tp, t, part + e->layout.t[i].rank_offset,
                       h + full.t[i].offset);
    }
    rc = 0;
out:
    if (rc != 0) log_error("gathering the weights of all ranks failed");
    b->free(b->ctx, dmeta);
    b->free(b->ctx, all);
    free(meta);
    free(counts);
    free(host);
    free(part);
    model_layout_free(&full);
    return rc;
}
