/* Tensor parallelism: tp all-reduce, vocabulary-parallel embedding and
 * cross-entropy, and slicing of full tensors into tp shares (see tp.h). */
#include "worker/tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/comm/comm.h"
#if defined(LOOM_HAVE_CUDA) && defined(LOOM_HAVE_NCCL)
#include "worker/cuda/cuda_backend.h"
#endif

struct tp_state {
    int N, T, C, Vr, Vlo, Vv;
    int32_t *ltok_h, *ltg_h;   /* host [N]: local token / target rows */
    int32_t *ltok, *ltg, *pos; /* device int32 [N] */
    float *lse, *tl, *aux;     /* device fp32 [N] */
    float *hf, *hg;            /* host fp32 [N] */
    double *hz;                /* host [N]: global log-sum-exp */
    void *scratch;             /* device [N, C] compute dtype */
    /* device [Vr + 1, C]: the embedding slice plus a zero row that tokens of
     * other slices look up (forward), or their gradient sink (backward); one
     * bulk copy instead of a memset per run of foreign tokens */
    void *ext;
};

static enum comm_dtype cdt(const struct engine *e) {
    return e->be->dtype == BACKEND_BF16 ? COMM_BF16 : COMM_F32;
}

static void allreduce(struct engine *e, void *buf, size_t n, enum comm_dtype dt, enum comm_op op) {
    if (e->tp <= 1 || n == 0) return;
    struct comm *c = e->tp_group;
    if (!c) die("tp=%d but the tp communicator is not set up", e->tp);
    e->be->sync(e->be->ctx);
    if (comm_allreduce(c, buf, n, dt, op, NULL) != 0)
        die("tensor-parallel all-reduce failed: %s", comm_error(c));
}

void tp_allreduce(struct engine *e, void *buf, size_t n) {
#if defined(LOOM_HAVE_CUDA) && defined(LOOM_HAVE_NCCL)
    /* activations on the critical path: on the compute stream itself, no
     * host round trip (comm_allreduce_stream); the tp-stream row off
     * (LOOM_TP_STREAM=0, e->tp_host_sync) for the comm-thread path */
    void *st = backend_cuda_stream(e->be);
    if (e->tp > 1 && n > 0 && st && e->tp_group && !e->tp_host_sync) {
        backend_cuda_flush(e->be); /* held work (a matmul) produces buf */
        int rc = comm_allreduce_stream(e->tp_group, buf, n, cdt(e), COMM_SUM, st);
        if (rc < 0) die("tensor-parallel all-reduce failed: %s", comm_error(e->tp_group));
        if (rc == 0) return;
    }
#endif
    allreduce(e, buf, n, cdt(e), COMM_SUM);
}

struct tp_state *tp_state_new(struct model *m) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    if (!b->classifier_vp) {
        log_error("tp: the %s backend has no vocabulary-parallel classifier; tp=%d unsupported",
                  b->name, e->tp);
        return NULL;
    }
    struct tp_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    int N = m->B * m->T;
    s->N = N;
    s->T = m->T;
    s->C = m->C;
    s->Vr = m->Vp;
    s->Vlo = e->tp_idx * m->Vp;
    s->Vv = m->V - s->Vlo;
    if (s->Vv < 0) s->Vv = 0;
    if (s->Vv > s->Vr) s->Vv = s->Vr;
    s->ltok_h = malloc((size_t)N * sizeof(int32_t));
    s->ltg_h = malloc((size_t)N * sizeof(int32_t));
    s->hf = malloc((size_t)N * sizeof(float));
    s->hg = malloc((size_t)N * sizeof(float));
    s->hz = malloc((size_t)N * sizeof(double));
    size_t *acts = &e->mem.activations;
    s->ltok = engine_alloc(e, (size_t)N * sizeof(int32_t), acts);
    s->ltg = engine_alloc(e, (size_t)N * sizeof(int32_t), acts);
    s->pos = engine_alloc(e, (size_t)N * sizeof(int32_t), acts);
    s->lse = engine_alloc(e, (size_t)N * sizeof(float), acts);
    s->tl = engine_alloc(e, (size_t)N * sizeof(float), acts);
    s->aux = engine_alloc(e, (size_t)N * sizeof(float), acts);
    s->scratch = engine_alloc(e, (size_t)N * m->C * b->elt_size, acts);
    s->ext = engine_alloc(e, ((size_t)s->Vr + 1) * m->C * b->elt_size, acts);
    if (!s->ltok_h || !s->ltg_h || !s->hf || !s->hg || !s->hz || !s->ltok || !s->ltg || !s->pos ||
        !s->lse || !s->tl || !s->aux || !s->scratch || !s->ext) {
        log_error("tp: out of memory");
        tp_state_free(m, s);
        return NULL;
    }
    for (int r = 0; r < N; r++)
        s->ltok_h[r] = r % m->T;
    b->upload(b->ctx, s->pos, s->ltok_h, (size_t)N * sizeof(int32_t));
    return s;
}

void tp_state_free(struct model *m, struct tp_state *s) {
    if (!s) return;
    struct backend *b = m->e->be;
    void *dev[] = {s->ltok, s->ltg, s->pos, s->lse, s->tl, s->aux, s->scratch, s->ext};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        b->free(b->ctx, dev[i]);
    free(s->ltok_h);
    free(s->ltg_h);
    free(s->hf);
    free(s->hg);
    free(s->hz);
    free(s);
}

void tp_embedding_fwd(struct model *m, void *out, const int32_t *tokens_host, const void *wte,
                      const void *wpe) {
    struct tp_state *s = m->tp;
    struct engine *e = m->e;
    struct backend *b = e->be;
    size_t row = (size_t)s->C * b->elt_size;
    for (int r = 0; r < s->N; r++) {
        int t = tokens_host[r], in = t >= s->Vlo && t < s->Vlo + s->Vr;
        s->ltok_h[r] = in ? t - s->Vlo : s->Vr; /* foreign tokens read the zero row */
    }
    b->upload(b->ctx, s->ltok, s->ltok_h, (size_t)s->N * sizeof(int32_t));
    b->copy(b->ctx, s->ext, wte, (size_t)s->Vr * row);
    b->zero(b->ctx, backend_at(b, s->ext, (size_t)s->Vr * s->C), row);
    b->embedding_fwd(b->ctx, out, s->ltok, s->ext, NULL, m->B, m->T, s->C);
    tp_allreduce(e, out, (size_t)s->N * s->C); /* exactly one rank holds each row */
    if (wpe) {                                 /* positions: wpe looked up as a table by position */
        b->embedding_fwd(b->ctx, s->scratch, s->pos, wpe, NULL, m->B, m->T, s->C);
        b->residual_fwd(b->ctx, out, out, s->scratch, (size_t)s->N * s->C);
    }
}

void tp_embedding_bwd(struct model *m, void *dwte, void *dwpe, const void *dout) {
    struct tp_state *s = m->tp;
    struct backend *b = m->e->be;
    /* rows of foreign tokens land in the sink row Vr, which is dropped */
    b->zero(b->ctx, s->ext, ((size_t)s->Vr + 1) * s->C * b->elt_size);
    b->embedding_bwd(b->ctx, s->ext, NULL, dout, s->ltok, m->B, m->T, s->C);
    b->accumulate(b->ctx, dwte, s->ext, (size_t)s->Vr * s->C);
    if (dwpe) b->embedding_bwd(b->ctx, dwpe, NULL, dout, s->pos, m->B, m->T, s->C);
}

void tp_classifier(struct model *m, float *losses, void *dinp, void *dW, const void *inp,
                   const void *W, const int32_t *targets_host, float grad_scale) {
    struct tp_state *s = m->tp;
    struct engine *e = m->e;
    struct backend *b = e->be;
    int N = s->N;
    size_t fb = (size_t)N * sizeof(float);
    for (int r = 0; r < N; r++) {
        int t = targets_host[r];
        s->ltg_h[r] = t >= s->Vlo && t < s->Vlo + s->Vv ? t - s->Vlo : -1;
    }
    b->upload(b->ctx, s->ltg, s->ltg_h, (size_t)N * sizeof(int32_t));
    b->classifier_vp(b->ctx, s->lse, s->tl, NULL, NULL, inp, W, s->ltg, NULL, N, s->C, s->Vv, s->Vr,
                     0.0f);
    /* global log-sum-exp: max over tp, then the sum of exp(lse_r - max) */
    b->copy(b->ctx, s->aux, s->lse, fb);
    allreduce(e, s->aux, (size_t)N, COMM_F32, COMM_MAX);
    b->download(b->ctx, s->hf, s->aux, fb);
    b->download(b->ctx, s->hg, s->lse, fb);
    for (int r = 0; r < N; r++)
        s->hg[r] = isinf(s->hg[r]) ? 0.0f : (float)exp((double)s->hg[r] - s->hf[r]);
    b->upload(b->ctx, s->aux, s->hg, fb);
    allreduce(e, s->aux, (size_t)N, COMM_F32, COMM_SUM);
    b->download(b->ctx, s->hg, s->aux, fb);
    for (int r = 0; r < N; r++)
        s->hz[r] = (double)s->hf[r] + log((double)s->hg[r]);
    /* the target's logit from the rank that holds it */
    allreduce(e, s->tl, (size_t)N, COMM_F32, COMM_SUM);
    b->download(b->ctx, s->hg, s->tl, fb);
    for (int r = 0; r < N; r++)
        s->hf[r] = targets_host[r] < 0 ? 0.0f : (float)(s->hz[r] - s->hg[r]);
    b->upload(b->ctx, losses, s->hf, fb);
    if (!dinp && !dW) return;
    for (int r = 0; r < N; r++)
        s->hf[r] = targets_host[r] < 0 ? INFINITY : (float)s->hz[r];
    b->upload(b->ctx, s->aux, s->hf, fb);
    b->classifier_vp(b->ctx, NULL, NULL, dinp, dW, inp, W, s->ltg, s->aux, N, s->C, s->Vv, s->Vr,
                     grad_scale);
    if (dinp) tp_allreduce(e, dinp, (size_t)N * s->C);
}

/* ---- slicing ---- */

static void slice_copy(const struct model_tensor *t, int tp, int idx, float *full, float *part,
                       int to_part) {
    int64_t d0 = t->shape[0], d1 = t->shape[1];
    int64_t r0 = t->rank_shape[0], r1 = t->rank_shape[1];
    switch (t->split) {
    case MODEL_SPLIT_COLUMN: {
        int64_t blk = d0 / t->parts, per = blk / tp;
        for (int k = 0; k < t->parts; k++)
            for (int64_t i = 0; i < per; i++) {
                float *f = full + (k * blk + idx * per + i) * d1, *p = part + (k * per + i) * d1;
                if (to_part)
                    memcpy(p, f, (size_t)d1 * sizeof *f);
                else
                    memcpy(f, p, (size_t)d1 * sizeof *f);
            }
        break;
    }
    case MODEL_SPLIT_ROW:
        for (int64_t i = 0; i < d0; i++) {
            float *f = full + i * d1 + idx * r1, *p = part + i * r1;
            if (to_part)
                memcpy(p, f, (size_t)r1 * sizeof *f);
            else
                memcpy(f, p, (size_t)r1 * sizeof *f);
        }
        break;
    case MODEL_SPLIT_VOCAB:
        for (int64_t i = 0; i < r0; i++) {
            int64_t g = idx * r0 + i;
            float *p = part + i * d1;
            if (g >= d0) {
                if (to_part) memset(p, 0, (size_t)d1 * sizeof *p);
                continue;
            }
            if (to_part)
                memcpy(p, full + g * d1, (size_t)d1 * sizeof *p);
            else
                memcpy(full + g * d1, p, (size_t)d1 * sizeof *p);
        }
        break;
    default:
        if (to_part)
            memcpy(part, full, (size_t)t->numel * sizeof *full);
        else
            memcpy(full, part, (size_t)t->numel * sizeof *full);
        break;
    }
    (void)r1;
}

void tp_slice(const struct model_tensor *t, int tp, int idx, const float *full, float *out) {
    slice_copy(t, tp, idx, (float *)full, out, 1);
}

void tp_unslice(const struct model_tensor *t, int tp, int idx, const float *part, float *full) {
    slice_copy(t, tp, idx, full, (float *)part, 0);
}

/* ---- checkpoints written at another tp degree ---- */

int tp_load_checkpoint(struct engine *e, const char *dir, int old_tp, char *err, size_t errlen) {
    static const char *names[3] = {"params", "adam_m", "adam_v"};
    struct model_layout ol;
    struct ckpt_reader *r = NULL;
    float *full[3] = {0}, *part[3] = {0}, *mine[3] = {0}, *tmp = NULL;
    char *seen = NULL;
    int rc = -1, world = 0;
    if (model_layout_init(&ol, &e->cfg, old_tp) != 0) {
        snprintf(err, errlen, "checkpoint %s: tp=%d does not fit this model", dir, old_tp);
        return -1;
    }
    size_t N = (size_t)ol.rank_numel, F = (size_t)ol.numel, n = e->n_params;
    for (int k = 0; k < 3; k++) {
        full[k] = malloc(F * sizeof(float));
        part[k] = malloc(N * sizeof(float));
        mine[k] = malloc(n * sizeof(float));
        if (!full[k] || !part[k] || !mine[k]) goto nomem;
    }
    seen = malloc(N ? N : 1);
    if (!seen) goto nomem;
    if (ckpt_open(dir, 0, &r, err, errlen) != 0) goto out;
    world = ckpt_world(r);
    ckpt_close(r);
    r = NULL;
    for (int t = 0; t < old_tp; t++) {
        memset(seen, 0, N ? N : 1);
        for (int k = 0; k < world; k++) {
            if (ckpt_open(dir, k, &r, err, errlen) != 0) goto out;
            const json_t *meta = ckpt_rank_meta(r);
            if ((int)json_integer_value(json_object_get(meta, "tp")) != t) {
                ckpt_close(r);
                r = NULL;
                continue;
            }
            size_t off = (size_t)json_integer_value(json_object_get(meta, "offset"));
            size_t cnt = (size_t)json_integer_value(json_object_get(meta, "count"));
            if (!json_object_get(meta, "count")) {
                off = 0;
                cnt = N;
            }
            if (off + cnt > N) {
                snprintf(err, errlen, "checkpoint %s rank %d holds [%zu, %zu) beyond %zu", dir, k,
                         off, off + cnt, N);
                goto out;
            }
            free(tmp);
            tmp = malloc((cnt ? cnt : 1) * sizeof(float));
            if (!tmp) goto nomem;
            for (int q = 0; q < 3; q++) {
                if (ckpt_read_f32(r, names[q], tmp, cnt, err, errlen) != 0) goto out;
                memcpy(part[q] + off, tmp, cnt * sizeof(float));
            }
            memset(seen + off, 1, cnt);
            ckpt_close(r);
            r = NULL;
        }
        for (size_t i = 0; i < N; i++)
            if (!seen[i]) {
                snprintf(err, errlen, "checkpoint %s: tp rank %d's element %zu is in no shard", dir,
                         t, i);
                goto out;
            }
        for (int i = 0; i < ol.n; i++)
            for (int q = 0; q < 3; q++)
                tp_unslice(&ol.t[i], old_tp, t, part[q] + ol.t[i].rank_offset,
                           full[q] + ol.t[i].offset);
    }
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        for (int q = 0; q < 3; q++)
            tp_slice(t, e->tp, e->tp_idx, full[q] + t->offset, mine[q] + t->rank_offset);
    }
    if (engine_params_from_host(e, 0, mine[0], n) != 0) goto nomem;
    engine_opt_write(e, ENGINE_OPT_M, mine[1] + e->shard_off, 0, e->shard_n);
    engine_opt_write(e, ENGINE_OPT_V, mine[2] + e->shard_off, 0, e->shard_n);
    e->be->sync(e->be->ctx);
    rc = 0;
    goto out;
nomem:
    snprintf(err, errlen, "out of memory loading %s", dir);
out:
    ckpt_close(r);
    for (int k = 0; k < 3; k++) {
        free(full[k]);
        free(part[k]);
        free(mine[k]);
    }
    free(tmp);
    free(seen);
    model_layout_free(&ol);
    return rc;
}
