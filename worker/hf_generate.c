/* Scoring and KV-cached generation (contract in hf_generate.h).
 *
 * The decode step is the block forward of model.c for one row at position
 * pos: the same backend operations with N = 1, except that RoPE takes the
 * explicit position (rope_at), GPT-2's learned position row pos is added
 * after the token embedding, and attention reads the cache (attention_decode)
 * after this row's k|v were appended to it. Sampling runs on the host over
 * the fp32 logits of the real vocabulary. */
#include "worker/hf_generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

int hf_score(struct model *m, const int32_t *tokens, int n, double *lp) {
    if (m->B != 1 || m->T < n || n < 1) {
        log_error("score: model built for B=%d T=%d, not 1 x %d tokens", m->B, m->T, n);
        return -1;
    }
    /* rows past n are padding: causal attention keeps them out of rows < n */
    int32_t *in = calloc((size_t)m->T, sizeof *in), *tg = malloc((size_t)m->T * sizeof *tg);
    if (!in || !tg) {
        free(in);
        free(tg);
        return -1;
    }
    memcpy(in, tokens, (size_t)n * sizeof *in);
    for (int i = 0; i < m->T; i++)
        tg[i] = i + 1 < n ? tokens[i + 1] : -1;
    int64_t cnt = 0;
    model_forward(m, in, tg, 0.0f, &cnt);
    lp[0] = NAN;
    for (int i = 1; i < n; i++)
        lp[i] = -(double)m->host_losses[i - 1];
    free(in);
    free(tg);
    return 0;
}

/* ---- decode ---- */

struct dec {
    struct model *m;
    void **kv; /* [L] device [cap, 2*NKV*HD] */
    int cap;
    void *x, *h, *qkv, *att, *tmp, *fch, *fca, *logits;
    float *mean, *rstd, *lf32, *host;
    int32_t *tok; /* device [1] */
};

static void *P(struct model *m, int i) {
    return i < 0 ? NULL : engine_param(m->e, i);
}

static void norm1(struct dec *d, void *out, const void *in, int w, int bias) {
    struct model *m = d->m;
    struct backend *b = m->e->be;
    if (m->e->cfg.norm == MODEL_NORM_LAYERNORM)
        b->layernorm_fwd(b->ctx, out, d->mean, d->rstd, in, P(m, w), P(m, bias), 1, m->C,
                         (float)m->e->cfg.norm_eps);
    else
        b->rmsnorm_fwd(b->ctx, out, d->rstd, in, P(m, w), 1, m->C, (float)m->e->cfg.norm_eps);
}

/* Feed token `tok` at position pos; leaves the fp32 logits of [0, V) in
 * d->host. */
static void step(struct dec *d, int32_t tok, int pos) {
    struct model *m = d->m;
    struct engine *e = m->e;
    struct backend *b = e->be;
    int C = m->C, HD = m->HD, NH = m->NH, NKV = m->NKV;
    int swiglu = e->cfg.act == MODEL_ACT_SWIGLU, rope = e->cfg.pos == MODEL_POS_ROPE;
    size_t es = b->elt_size, kvw = (size_t)2 * NKV * HD;
    b->upload(b->ctx, d->tok, &tok, sizeof tok);
    b->embedding_fwd(b->ctx, d->x, d->tok, P(m, m->wte), NULL, 1, 1, C);
    if (m->wpe >= 0)
        b->residual_fwd(b->ctx, d->x, d->x, backend_at(b, P(m, m->wpe), (size_t)pos * C),
                        (size_t)C);
    for (int l = 0; l < m->L; l++) {
        const struct model_block_idx *k = &m->blk[l];
        norm1(d, d->h, d->x, k->n1w, k->n1b);
        b->matmul_fwd(b->ctx, d->qkv, d->h, P(m, k->qkvw), P(m, k->qkvb), 1, C, m->QKV);
        if (rope)
            b->rope_at(b->ctx, d->qkv, 1, m->QKV, NH + NKV, HD, pos, (float)e->cfg.rope_theta);
        b->copy(b->ctx, backend_at(b, d->kv[l], (size_t)pos * kvw),
                backend_at(b, d->qkv, (size_t)NH * HD), kvw * es);
        b->attention_decode(b->ctx, d->att, d->qkv, d->kv[l], pos + 1, NH, NKV, HD);
        b->matmul_fwd(b->ctx, d->tmp, d->att, P(m, k->aow), P(m, k->aob), 1, NH * HD, C);
        b->residual_fwd(b->ctx, d->x, d->x, d->tmp, (size_t)C);
        norm1(d, d->h, d->x, k->n2w, k->n2b);
        b->matmul_fwd(b->ctx, d->fch, d->h, P(m, k->fcw), P(m, k->fcb), 1, C,
                      m->F * (swiglu ? 2 : 1));
        if (swiglu)
            b->swiglu_fwd(b->ctx, d->fca, d->fch, 1, m->F);
        else
            b->gelu_fwd(b->ctx, d->fca, d->fch, (size_t)m->F);
        b->matmul_fwd(b->ctx, d->tmp, d->fca, P(m, k->mpw), P(m, k->mpb), 1, m->F, C);
        b->residual_fwd(b->ctx, d->x, d->x, d->tmp, (size_t)C);
    }
    norm1(d, d->h, d->x, m->nfw, m->nfb);
    b->matmul_fwd(b->ctx, d->logits, d->h, P(m, m->head), NULL, 1, C, m->Vp);
    b->to_f32(b->ctx, d->lf32, d->logits, (size_t)m->V);
    b->download(b->ctx, d->host, d->lf32, (size_t)m->V * sizeof(float));
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct cand {
    float p;
    int id;
};

static int cand_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Next token from logits l[0..V): argmax at temperature 0, else a draw from
 * softmax(l / temperature) restricted to the top-p nucleus. */
static int sample(const float *l, int V, const struct hf_sample_opts *o, uint64_t *rng,
                  struct cand *c) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    if (o->temperature <= 0) return best;
    double z = 0;
    for (int v = 0; v < V; v++) {
        c[v].p = (float)exp((l[v] - l[best]) / o->temperature);
        c[v].id = v;
        z += c[v].p;
    }
    qsort(c, (size_t)V, sizeof *c, cand_desc);
    double keep = 0;
    int n = 0;
    while (n < V && (n == 0 || keep < o->top_p * z))
        keep += c[n++].p;
    double u = (double)(splitmix(rng) >> 11) / 9007199254740992.0 * keep, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

static void dec_free(struct dec *d) {
    struct backend *b = d->m->e->be;
    for (int l = 0; d->kv && l < d->m->L; l++)
        b->free(b->ctx, d->kv[l]);
    free(d->kv);
    void *dev[] = {d->x,   d->h,      d->qkv,  d->att,  d->tmp,  d->fch,
                   d->fca, d->logits, d->mean, d->rstd, d->lf32, d->tok};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        b->free(b->ctx, dev[i]);
    free(d->host);
}

static int is_eos(const struct hf_sample_opts *o, int t) {
    for (int k = 0; k < o->n_eos; k++)
        if (t == o->eos[k]) return 1;
    return 0;
}

/* Without decode operations: the training forward over the whole sequence
 * for every new token (rows past it padding), logits of its last row. */
static int generate_recompute(struct model *m, const int32_t *prompt, int n,
                              const struct hf_sample_opts *o, int32_t *out) {
    int T = m->T, got = 0, rc = -1;
    int32_t *in = calloc((size_t)T, sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    float *host = malloc((size_t)m->V * sizeof *host);
    struct cand *c = malloc((size_t)m->V * sizeof *c);
    if (!in || !tg || !host || !c) goto out;
    memcpy(in, prompt, (size_t)n * sizeof *in);
    for (int i = 0; i < T; i++)
        tg[i] = -1;
    uint64_t rng = o->seed ^ 0x6c6f6f6d2d67656eull; /* "loom-gen", as the cached path */
    for (int len = n; got < o->max_new;) {
        model_forward(m, in, tg, 0.0f, NULL);
        if (model_row_logits(m, len - 1, host) != 0) goto out;
        int t = sample(host, m->V, o, &rng, c);
        out[got++] = t;
        if (is_eos(o, t)) break;
        in[len++] = t;
    }
    rc = got;
out:
    free(in);
    free(tg);
    free(host);
    free(c);
    return rc;
}

int hf_generate(struct model *m, const int32_t *prompt, int n, const struct hf_sample_opts *o,
                int recompute, int32_t *out) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    if (e->tp != 1 || e->pp != 1) {
        log_error("generate: needs one process (tp=%d pp=%d)", e->tp, e->pp);
        return -1;
    }
    if (n < 1 || o->max_new < 0 || (int64_t)n + o->max_new > e->cfg.seq_len) {
        log_error("generate: %d prompt + %d new tokens exceed the model's %d positions (or the "
                  "prompt is empty)",
                  n, o->max_new, e->cfg.seq_len);
        return -1;
    }
    if (recompute || !b->rope_at || !b->attention_decode) {
        if (m->B != 1 || m->T < n + o->max_new) {
            log_error("generate: without a KV cache the model must hold %d positions (built "
                      "for %d)",
                      n + o->max_new, m->T);
            return -1;
        }
        log_info("generate: re-running the forward over the sequence for each new token (%s)",
                 recompute ? "--generate-recompute" : "the backend has no decode operations");
        return generate_recompute(m, prompt, n, o, out);
    }
    struct dec d;
    memset(&d, 0, sizeof d);
    d.m = m;
    d.cap = n + o->max_new;
    size_t es = b->elt_size, kvw = (size_t)2 * m->NKV * m->HD;
    size_t wide = (size_t)m->F * 2 > (size_t)m->QKV ? (size_t)m->F * 2 : (size_t)m->QKV;
    int rc = -1, got = 0;
    d.kv = calloc((size_t)m->L, sizeof *d.kv);
    struct cand *c = malloc((size_t)m->V * sizeof *c);
    d.host = malloc((size_t)m->V * sizeof *d.host);
    if (!d.kv || !c || !d.host) goto out;
    for (int l = 0; l < m->L; l++)
        if (!(d.kv[l] = b->alloc(b->ctx, (size_t)d.cap * kvw * es))) goto out;
    d.x = b->alloc(b->ctx, (size_t)m->C * es);
    d.h = b->alloc(b->ctx, (size_t)m->C * es);
    d.qkv = b->alloc(b->ctx, wide * es);
    d.att = b->alloc(b->ctx, (size_t)m->NH * m->HD * es);
    d.tmp = b->alloc(b->ctx, (size_t)m->C * es);
    d.fch = b->alloc(b->ctx, wide * es);
    d.fca = b->alloc(b->ctx, (size_t)m->F * es);
    d.logits = b->alloc(b->ctx, (size_t)m->Vp * es);
    d.mean = b->alloc(b->ctx, sizeof(float));
    d.rstd = b->alloc(b->ctx, sizeof(float));
    d.lf32 = b->alloc(b->ctx, (size_t)m->Vp * sizeof(float));
    d.tok = b->alloc(b->ctx, sizeof(int32_t));
    if (!d.x || !d.h || !d.qkv || !d.att || !d.tmp || !d.fch || !d.fca || !d.logits || !d.mean ||
        !d.rstd || !d.lf32 || !d.tok)
        goto out;
    log_info("generate: key/value cache of %d positions x %d blocks (%.1f MiB on %s)", d.cap, m->L,
             (double)m->L * d.cap * kvw * es / 1048576.0, b->name);
    uint64_t rng = o->seed ^ 0x6c6f6f6d2d67656eull; /* "loom-gen" */
    for (int i = 0; i < n; i++)
        step(&d, prompt[i], i);
    for (got = 0; got < o->max_new;) {
        int t = sample(d.host, m->V, o, &rng, c);
        out[got++] = t;
        if (is_eos(o, t) || got == o->max_new) break;
        step(&d, t, n + got - 1);
    }
    rc = got;
out:
    if (rc < 0) log_error("generate: out of memory (%d positions)", d.cap);
    dec_free(&d);
    free(c);
    return rc;
}
