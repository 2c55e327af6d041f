/* Model: forward and backward of the GPT-2 / Llama transformer through the
 * backend interface, over the engine's flat parameter and gradient buffers.
 *
 * Activation gradients use three reusable buffers: dres (the residual
 * stream's gradient, accumulated into by both norms' backward) and two
 * scratch buffers wide enough for any layer's input or output, so backward
 * memory does not grow with depth. See model.h for the contract. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/log.h"
#include "worker/lora.h"
#include "worker/fp8base.h"
#include "worker/nf4.h"
#include "worker/model.h"
#include "worker/tp.h"

struct layer_acts {
    void *n1, *qkv, *atty, *r1, *n2, *fch, *fca, *r2;
    float *n1_mean, *n1_rstd, *n2_mean, *n2_rstd, *lse;
};

struct model_acts {
    void *enc, *nf, *s1, *s2, *dres, *dnf;
    float *nf_mean, *nf_rstd;
    struct layer_acts *l; /* [L]; only this stage's blocks [l0, l1) are allocated */
    /* recompute: buffers shared by every block (selective: n1 = n2 and fca;
     * full: everything of a block but r2) */
    struct layer_acts rc;
};

/* ---- helpers ---- */

static void *act_alloc(struct model *m, size_t elems) {
    struct engine *e = m->e;
    return engine_alloc(e, (elems ? elems : 1) * e->be->elt_size, &e->mem.activations);
}

static float *f32_alloc(struct model *m, size_t elems) {
    struct engine *e = m->e;
    return engine_alloc(e, (elems ? elems : 1) * sizeof(float), &e->mem.activations);
}

/* Tensor index by name; `fmt` holds one %d for the layer, or layer < 0 for a
 * plain name. */
static int find(struct engine *e, const char *fmt, int layer, int required) {
    char name[MODEL_TENSOR_MAX];
    if (layer < 0)
        snprintf(name, sizeof name, "%s", fmt);
    else
        snprintf(name, sizeof name, fmt, layer);
    int i = engine_tensor_find(e, name);
    if (i < 0 && required) log_error("model: tensor %s missing from the layout", name);
    return i;
}

/* Two tensors whose rows must be stacked in the flat buffer (q|k|v, gate|up). */
static int adjacent(struct engine *e, int a, int b) {
    const struct model_tensor *ta = &e->layout.t[a], *tb = &e->layout.t[b];
    return ta->rank_offset + ta->rank_numel == tb->rank_offset;
}

static int resolve(struct model *m) {
    struct engine *e = m->e;
    int gpt2 = e->cfg.family == MODEL_GPT2, bias = e->cfg.bias;
    if (gpt2) {
        m->wte = find(e, "transformer.wte.weight", -1, 1);
        m->wpe = e->cfg.pos == MODEL_POS_LEARNED ? find(e, "transformer.wpe.weight", -1, 1) : -1;
        m->nfw = find(e, "transformer.ln_f.weight", -1, 1);
        m->nfb = bias ? find(e, "transformer.ln_f.bias", -1, 1) : -1;
    } else {
        m->wte = find(e, "model.embed_tokens.weight", -1, 1);
        m->wpe = -1;
        m->nfw = find(e, "model.norm.weight", -1, 1);
        m->nfb = -1;
    }
    m->head = e->cfg.tied_embeddings ? m->wte : find(e, "lm_head.weight", -1, 1);
    if (m->wte < 0 || m->nfw < 0 || m->head < 0 || (gpt2 && m->wpe < 0 && e->cfg.pos == 0))
        return -1;
    for (int l = 0; l < m->L; l++) {
        struct model_block_idx *k = &m->blk[l];
        if (gpt2) {
            k->n1w = find(e, "transformer.h.%d.ln_1.weight", l, 1);
            k->n1b = bias ? find(e, "transformer.h.%d.ln_1.bias", l, 1) : -1;
            k->qkvw = find(e, "transformer.h.%d.attn.c_attn.weight", l, 1);
            k->qkvb = bias ? find(e, "transformer.h.%d.attn.c_attn.bias", l, 1) : -1;
            k->aow = find(e, "transformer.h.%d.attn.c_proj.weight", l, 1);
            k->aob = bias ? find(e, "transformer.h.%d.attn.c_proj.bias", l, 1) : -1;
            k->n2w = find(e, "transformer.h.%d.ln_2.weight", l, 1);
            k->n2b = bias ? find(e, "transformer.h.%d.ln_2.bias", l, 1) : -1;
            k->fcw = find(e, "transformer.h.%d.mlp.c_fc.weight", l, 1);
            k->fcb = bias ? find(e, "transformer.h.%d.mlp.c_fc.bias", l, 1) : -1;
            k->mpw = find(e, "transformer.h.%d.mlp.c_proj.weight", l, 1);
            k->mpb = bias ? find(e, "transformer.h.%d.mlp.c_proj.bias", l, 1) : -1;
            if (k->n1w < 0 || k->qkvw < 0 || k->aow < 0 || k->n2w < 0 || k->fcw < 0 || k->mpw < 0 ||
                (bias && (k->n1b < 0 || k->qkvb < 0 || k->aob < 0 || k->n2b < 0 || k->fcb < 0 ||
                          k->mpb < 0)))
                return -1;
        } else {
            k->n1w = find(e, "model.layers.%d.input_layernorm.weight", l, 1);
            k->qkvw = find(e, "model.layers.%d.self_attn.q_proj.weight", l, 1);
            int kw = find(e, "model.layers.%d.self_attn.k_proj.weight", l, 1);
            int vw = find(e, "model.layers.%d.self_attn.v_proj.weight", l, 1);
            k->aow = find(e, "model.layers.%d.self_attn.o_proj.weight", l, 1);
            k->n2w = find(e, "model.layers.%d.post_attention_layernorm.weight", l, 1);
            k->fcw = find(e, "model.layers.%d.mlp.gate_proj.weight", l, 1);
            int up = find(e, "model.layers.%d.mlp.up_proj.weight", l, 1);
            k->mpw = find(e, "model.layers.%d.mlp.down_proj.weight", l, 1);
            k->n1b = k->qkvb = k->aob = k->n2b = k->fcb = k->mpb = -1;
            if (k->n1w < 0 || k->qkvw < 0 || kw < 0 || vw < 0 || k->aow < 0 || k->n2w < 0 ||
                k->fcw < 0 || up < 0 || k->mpw < 0)
                return -1;
            if (e->cfg.qkv_bias) { /* Qwen2: q|k|v biases, stacked like the weights */
                k->qkvb = find(e, "model.layers.%d.self_attn.q_proj.bias", l, 1);
                int kb = find(e, "model.layers.%d.self_attn.k_proj.bias", l, 1);
                int vb = find(e, "model.layers.%d.self_attn.v_proj.bias", l, 1);
                if (k->qkvb < 0 || kb < 0 || vb < 0) return -1;
                if (!adjacent(e, k->qkvb, kb) || !adjacent(e, kb, vb)) {
                    log_error("model: layer %d: q|k|v biases are not adjacent in the layout", l);
                    return -1;
                }
            }
            if (!adjacent(e, k->qkvw, kw) || !adjacent(e, kw, vw) || !adjacent(e, k->fcw, up)) {
                log_error("model: layer %d: q|k|v or gate|up are not adjacent in the layout", l);
                return -1;
            }
        }
    }
    return 0;
}

static void *P(struct model *m, int i) {
    return i < 0 ? NULL : engine_param(m->e, i);
}

/* NULL with LoRA: the base tensors are frozen. */
static void *G(struct model *m, int i) {
    return i < 0 || m->lora ? NULL : engine_grad(m->e, i);
}

/* ---- life cycle ---- */

struct model *model_new(struct engine *e, int B, int T, int threads) {
    struct model_opts o = {.B = B, .T = T, .threads = threads};
    return model_new_ex(e, &o);
}

struct model *model_new_ex(struct engine *e, const struct model_opts *o) {
    const struct model_config *c = &e->cfg;
    int B = o->B, T = o->T, threads = o->threads;
    int pp_ok = c->pp_balance ? c->n_layer >= e->pp : c->n_layer % e->pp == 0;
    if (e->pp < 1 || !pp_ok || e->tp < 1 || c->n_head % e->tp != 0 || c->n_kv_head % e->tp != 0 ||
        c->d_ff % e->tp != 0) {
        log_error("model: layout tp=%d pp=%d does not fit n_layer=%d n_head=%d n_kv_head=%d "
                  "d_ff=%d",
                  e->tp, e->pp, c->n_layer, c->n_head, c->n_kv_head, c->d_ff);
        return NULL;
    }
    if (o->recompute < MODEL_RECOMPUTE_NONE || o->recompute > MODEL_RECOMPUTE_FULL) {
        log_error("model: unknown recompute mode %d", o->recompute);
        return NULL;
    }
    if (o->keep < 0 || (o->keep > 0 && o->recompute != MODEL_RECOMPUTE_FULL)) {
        log_error("model: keep=%d needs full recompute (recompute mode %d)", o->keep, o->recompute);
        return NULL;
    }
    if (B < 1 || T < 1 || T > c->seq_len) {
        log_error("model: micro-batch B=%d T=%d invalid (seq_len=%d)", B, T, c->seq_len);
        return NULL;
    }
    struct model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->e = e;
    m->B = B;
    m->T = T;
    m->C = c->d_model;
    m->NH = c->n_head / e->tp;
    m->NKV = c->n_kv_head / e->tp;
    m->HD = model_head_dim(c);
    m->F = c->d_ff / e->tp;
    m->QKV = (m->NH + 2 * m->NKV) * m->HD;
    m->V = c->vocab_size;
    m->Vp = c->padded_vocab;
    m->L = c->n_layer;
    m->recompute = o->recompute;
    model_stage_layers(&e->cfg, e->pp, e->pp_idx, &m->l0, &m->l1);
    m->keep = o->keep < m->l1 - m->l0 ? o->keep : m->l1 - m->l0;
    m->first = e->pp_idx == 0;
    m->last = e->pp_idx == e->pp - 1;
    m->blk = calloc((size_t)m->L, sizeof *m->blk);
    m->acts = calloc(1, sizeof *m->acts);
    if (!m->blk || !m->acts) goto fail;
    m->acts->l = calloc((size_t)m->L, sizeof *m->acts->l);
    if (!m->acts->l) goto fail;
    if (resolve(m) != 0) goto fail;
    m->Vp = (int)e->layout.t[m->wte].rank_shape[0]; /* vocabulary rows of this tp rank */

    struct backend *b = e->be;
    if (c->pos == MODEL_POS_ROPE && c->rope_scaling != MODEL_ROPE_SCALE_NONE) {
        if (!b->rope_set_freqs) {
            log_error("model: RoPE scaling (llama3) is not implemented by the %s backend; "
                      "use --device cpu",
                      b->name);
            goto fail;
        }
        double *inv = malloc((size_t)(m->HD / 2) * sizeof *inv);
        int rrc = inv ? 0 : -1;
        if (inv) model_rope_inv_freq(c, m->HD, inv);
        if (rrc == 0) rrc = b->rope_set_freqs(b->ctx, inv, m->HD / 2);
        free(inv);
        if (rrc != 0) goto fail;
    }
    struct backend_limits lim = {0};
    lim.B = B;
    lim.T = T;
    lim.C = m->C;
    lim.NH = m->NH;
    lim.NKV = m->NKV;
    lim.HD = m->HD;
    lim.F = m->F;
    lim.Vp = m->Vp;
    lim.threads = threads;
    lim.frozen_head = e->frozen;
    if (b->reserve(b->ctx, &lim) != 0) goto fail;

    if (!o->acts_later && model_alloc_acts(m) != 0) goto fail;
    if (e->tp > 1 && !(m->tp = tp_state_new(m))) goto fail;
    return m;
fail:
    model_free(m);
    return NULL;
}

int model_alloc_acts(struct model *m) {
    if (m->acts_ready) return 0;
    struct engine *e = m->e;
    const struct model_config *c = &e->cfg;
    int B = m->B, T = m->T;
    size_t N = (size_t)B * T, C = (size_t)m->C;
    int swiglu = c->act == MODEL_ACT_SWIGLU;
    size_t fcw = (size_t)m->F * (swiglu ? 2 : 1);
    size_t wide = C;
    if ((size_t)m->QKV > wide) wide = (size_t)m->QKV;
    if (fcw > wide) wide = fcw;
    if ((size_t)(m->NH * m->HD) > wide) wide = (size_t)(m->NH * m->HD);
    struct model_acts *a = m->acts;
    /* sel: blocks that recompute their norms' outputs and activation (every
     * block with SELECTIVE, the kept ones of the budget mode); full: some
     * block recomputes in full */
    int sel = m->recompute == MODEL_RECOMPUTE_SELECTIVE ||
              (m->recompute == MODEL_RECOMPUTE_FULL && m->keep > 0),
        full = m->recompute == MODEL_RECOMPUTE_FULL && m->keep < m->l1 - m->l0;
    if (sel || full) {
        struct layer_acts *x = &a->rc;
        x->n1 = act_alloc(m, N * C);
        x->fca = act_alloc(m, N * m->F);
        x->n2 = full ? act_alloc(m, N * C) : x->n1;
        if (!x->n1 || !x->n2 || !x->fca) goto oom;
        if (full) {
            x->qkv = act_alloc(m, N * m->QKV);
            x->atty = act_alloc(m, N * m->NH * m->HD);
            x->r1 = act_alloc(m, N * C);
            x->fch = act_alloc(m, N * fcw);
            x->n1_mean = f32_alloc(m, N);
            x->n1_rstd = f32_alloc(m, N);
            x->n2_mean = f32_alloc(m, N);
            x->n2_rstd = f32_alloc(m, N);
            x->lse = f32_alloc(m, (size_t)B * m->NH * T);
            if (!x->qkv || !x->atty || !x->r1 || !x->fch || !x->n1_mean || !x->n1_rstd ||
                !x->n2_mean || !x->n2_rstd || !x->lse)
                goto oom;
        }
    }
    a->enc = act_alloc(m, N * C);
    a->nf = act_alloc(m, N * C);
    a->s1 = act_alloc(m, N * wide);
    a->s2 = act_alloc(m, N * wide);
    a->dres = act_alloc(m, N * C);
    a->dnf = act_alloc(m, N * C);
    a->nf_mean = f32_alloc(m, N);
    a->nf_rstd = f32_alloc(m, N);
    if (!a->enc || !a->nf || !a->s1 || !a->s2 || !a->dres || !a->dnf || !a->nf_mean || !a->nf_rstd)
        goto oom;
    for (int l = m->l0; l < m->l1; l++) {
        struct layer_acts *x = &a->l[l];
        if (full && l - m->l0 >= m->keep) { /* only the block's output is its own */
            *x = a->rc;
            x->r2 = act_alloc(m, N * C);
            if (!x->r2) goto oom;
            continue;
        }
        x->n1 = sel ? a->rc.n1 : act_alloc(m, N * C);
        x->qkv = act_alloc(m, N * m->QKV);
        x->atty = act_alloc(m, N * m->NH * m->HD);
        x->r1 = act_alloc(m, N * C);
        x->n2 = sel ? a->rc.n1 : act_alloc(m, N * C); /* n2 in n1's buffer */
        x->fch = act_alloc(m, N * fcw);
        x->fca = sel ? a->rc.fca : act_alloc(m, N * m->F);
        x->r2 = act_alloc(m, N * C);
        x->n1_mean = f32_alloc(m, N);
        x->n1_rstd = f32_alloc(m, N);
        x->n2_mean = f32_alloc(m, N);
        x->n2_rstd = f32_alloc(m, N);
        x->lse = f32_alloc(m, (size_t)B * m->NH * T);
        if (!x->n1 || !x->qkv || !x->atty || !x->r1 || !x->n2 || !x->fch || !x->fca || !x->r2 ||
            !x->n1_mean || !x->n1_rstd || !x->n2_mean || !x->n2_rstd || !x->lse)
            goto oom;
    }
    m->tokens = engine_alloc(e, N * sizeof(int32_t), &e->mem.activations);
    m->targets = engine_alloc(e, N * sizeof(int32_t), &e->mem.activations);
    m->losses = f32_alloc(m, N);
    m->host_losses = malloc(N * sizeof(float));
    if (!m->tokens || !m->targets || !m->losses || !m->host_losses) goto oom;
    m->acts_ready = 1;
    return 0;
oom:
    log_error("model: out of memory for activations (B=%d T=%d)", B, T);
    return -1;
}

void model_free(struct model *m) {
    if (!m) return;
    struct backend *b = m->e->be;
    struct model_acts *a = m->acts;
    if (a) {
        void *bufs[] = {a->enc, a->nf, a->s1, a->s2, a->dres, a->dnf, a->nf_mean, a->nf_rstd};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            b->free(b->ctx, bufs[i]);
        struct layer_acts *rc = &a->rc;
        void *shared[] = {rc->n1,  rc->qkv,     rc->atty,    rc->r1,      rc->n2,      rc->fch,
                          rc->fca, rc->n1_mean, rc->n1_rstd, rc->n2_mean, rc->n2_rstd, rc->lse};
        size_t ns = sizeof shared / sizeof *shared;
        for (int l = 0; a->l && l < m->L; l++) {
            struct layer_acts *x = &a->l[l];
            void *lb[] = {x->n1, x->qkv,     x->atty,    x->r1,      x->n2,      x->fch, x->fca,
                          x->r2, x->n1_mean, x->n1_rstd, x->n2_mean, x->n2_rstd, x->lse};
            for (size_t i = 0; i < sizeof lb / sizeof *lb; i++) {
                int own = 1;
                for (size_t k = 0; k < ns; k++)
                    own &= !lb[i] || lb[i] != shared[k];
                if (own) b->free(b->ctx, lb[i]);
            }
        }
        for (size_t k = 0; k < ns; k++) { /* n1 == n2 with selective: free once */
            int dup = 0;
            for (size_t j = 0; j < k; j++)
                dup |= shared[j] == shared[k];
            if (!dup) b->free(b->ctx, shared[k]);
        }
        free(a->l);
        free(a);
    }
    tp_state_free(m, m->tp);
    b->free(b->ctx, m->tokens);
    b->free(b->ctx, m->targets);
    b->free(b->ctx, m->losses);
    free(m->host_losses);
    free(m->blk);
    free(m);
}

/* ---- initialisation ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *s) {
    return ((splitmix(s) >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Box-Muller pairs from stream s into h[0, n). */
static void fill_stream(float *h, size_t n, uint64_t s, double std) {
    for (size_t j = 0; j < n; j += 2) {
        double u1 = unit(&s), u2 = unit(&s), r = sqrt(-2.0 * log(u1));
        h[j] = (float)(std * r * cos(2 * M_PI * u2));
        if (j + 1 < n) h[j + 1] = (float)(std * r * sin(2 * M_PI * u2));
    }
}

#define INIT_CHUNK ((size_t)1 << 20) /* even: a Box-Muller pair never straddles chunks */

void model_fill_normal(float *h, size_t n, uint64_t s, double std, size_t par_min, int threads) {
    if (n < par_min) {
        fill_stream(h, n, s, std);
        return;
    }
    /* ~13.5e9 values serially would take minutes: one stream per chunk */
    long nc = (long)((n + INIT_CHUNK - 1) / INIT_CHUNK);
#ifdef _OPENMP
    int nt = threads > 0 ? threads : omp_get_max_threads();
#else
    int nt = 1;
    (void)threads;
#endif
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (long c = 0; c < nc; c++) {
        uint64_t cs = s ^ ((uint64_t)(c + 1) * 0xd1b54a32d192ed03ull);
        cs = splitmix(&cs);
        size_t j0 = (size_t)c * INIT_CHUNK, j1 = j0 + INIT_CHUNK < n ? j0 + INIT_CHUNK : n;
        fill_stream(h + j0, j1 - j0, cs, std);
    }
}

/* Tensor t's full values (numel) from its own stream into h. */
static void init_tensor(const struct model *m, const struct model_tensor *t, uint64_t seed,
                        float *h) {
    uint64_t s = seed ^ 0x6c6f6f6d2d696e69ull; /* "loom-ini" */
    for (const char *p = t->name; *p; p++)
        s = (s ^ (unsigned char)*p) * 0x100000001b3ull;
    size_t n = (size_t)t->numel;
    if (t->kind == MODEL_T_NORM_W) {
        for (size_t j = 0; j < n; j++)
            h[j] = 1.0f;
    } else if (t->kind == MODEL_T_NORM_B || t->kind == MODEL_T_LINEAR_B) {
        memset(h, 0, n * sizeof *h);
    } else {
        double std = 0.02;
        if (ends_with(t->name, "attn.c_proj.weight") || ends_with(t->name, "mlp.c_proj.weight") ||
            ends_with(t->name, "o_proj.weight") || ends_with(t->name, "down_proj.weight"))
            std = 0.02 / sqrt(2.0 * m->L);
        model_fill_normal(h, n, s, std, MODEL_INIT_PAR_MIN, 0);
        if (t->kind == MODEL_T_EMBED || t->kind == MODEL_T_LM_HEAD)
            memset(h + (size_t)m->V * t->shape[1], 0,
                   (size_t)(t->shape[0] - m->V) * t->shape[1] * sizeof *h);
    }
}

/* Tensors below MODEL_INIT_PAR_MIN are drawn serially each (their values
 * never change) but many at once, one thread each, up to this many elements
 * per batch (the 26M-element projections of a 13B model: ten at a time). */
#define INIT_BATCH ((size_t)1 << 28)

/* Upload tensor t's full values v (this rank's tp share of them). */
static int put_tensor(struct engine *e, const struct model_tensor *t, float *v, float *part) {
    if (nf4_full_tensor(e->nf4, (int)(t - e->layout.t))) /* QLoRA under tp: quantized whole */
        return nf4_put_full(e->nf4, (int)(t - e->layout.t), 0, v, (size_t)t->numel, sizeof *v);
    if (e->tp > 1) /* this rank's share of the full tensor (same values at any tp) */
        tp_slice(t, e->tp, e->tp_idx, v, part);
    return engine_params_from_host(e, (size_t)t->rank_offset, e->tp > 1 ? part : v,
                                   (size_t)t->rank_numel);
}

/* Fill the batched small tensors idx[0..nb) side by side and upload them. */
static int flush_batch(struct model *m, uint64_t seed, const int *idx, const size_t *at, int nb,
                       float *buf, float *part) {
    struct engine *e = m->e;
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < nb; k++)
        init_tensor(m, &e->layout.t[idx[k]], seed, buf + at[k]);
    for (int k = 0; k < nb; k++)
        if (put_tensor(e, &e->layout.t[idx[k]], buf + at[k], part) != 0) return -1;
    return 0;
}

int model_fp8_freeze(struct model *m, int bf16_base, int *n_fp8, size_t *bytes) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    *n_fp8 = 0;
    *bytes = 0;
    if (!b->fp8_freeze || e->nf4) {
        log_error("model: fp8 needs block weights in the compute dtype on a backend with "
                  "fp8_freeze (%s backend%s)",
                  b->name, e->nf4 ? ", NF4 base" : "");
        return -1;
    }
    if (e->fp8b) { /* held as E4M3 alone already: the handles stay */
        *n_fp8 = m->fp8_n;
        *bytes = m->fp8_bytes;
        return 0;
    }
    int fcw = m->F * (e->cfg.act == MODEL_ACT_SWIGLU ? 2 : 1), nw = 0;
    struct fp8base_weight *w = malloc((size_t)4 * (m->l1 - m->l0 + 1) * sizeof *w);
    if (!w) return -1;
    for (int l = m->l0; l < m->l1; l++) {
        const struct model_block_idx *k = &m->blk[l];
        /* the four block linear weights as the forward passes them: W, OC, IC */
        w[nw++] = (struct fp8base_weight){k->qkvw, m->QKV, m->C};
        w[nw++] = (struct fp8base_weight){k->aow, m->C, m->NH * m->HD};
        w[nw++] = (struct fp8base_weight){k->fcw, fcw, m->C};
        w[nw++] = (struct fp8base_weight){k->mpw, m->C, m->F};
    }
    int rc = 1;
    if (e->frozen && !bf16_base) { /* the base as E4M3 alone (worker/fp8base.h) */
        rc = fp8base_attach(e, w, nw, n_fp8, bytes);
        if (rc < 0) goto out;
    }
    if (rc == 1) /* the bf16 base stays; a frozen one gets W8 and W8^T beside it */
        for (int i = 0; i < nw; i++) {
            /* a trained weight (no LoRA) also takes its gradient in E4M3, and is quantized
             * at each use (no copies kept) */
            rc = b->fp8_freeze(b->ctx, P(m, w[i].t), w[i].oc, w[i].ic, !e->frozen, NULL);
            if (rc < 0) goto out;
            if (rc == 0) {
                (*n_fp8)++;
                *bytes += e->frozen ? (size_t)2 * w[i].oc * w[i].ic : 0;
            }
        }
    if (!m->fp8 && !e->fp8b) e->mem.params += *bytes; /* the first call makes the copies */
    m->fp8 = 1;
    m->fp8_n = *n_fp8;
    m->fp8_bytes = *bytes;
    rc = 0;
out:
    free(w);
    return rc < 0 ? -1 : 0;
}

int model_init_params(struct model *m, uint64_t seed) {
    struct engine *e = m->e;
    int nt = e->layout.n, rc = -1, nb = 0;
    size_t maxn = 0, small = 0, used = 0;
    for (int i = 0; i < nt; i++) {
        size_t n = (size_t)e->layout.t[i].numel;
        if (n > maxn) maxn = n;
        if (n < MODEL_INIT_PAR_MIN) small += n;
    }
    size_t cap = small < INIT_BATCH ? small : INIT_BATCH;
    float *h = malloc((maxn > MODEL_INIT_PAR_MIN ? maxn : 1) * sizeof *h);
    float *buf = malloc((cap ? cap : 1) * sizeof *buf);
    float *part = e->tp > 1 ? malloc(maxn * sizeof *part) : NULL;
    int *idx = malloc((size_t)nt * sizeof *idx);
    size_t *at = malloc((size_t)nt * sizeof *at);
    if (!h || !buf || (e->tp > 1 && !part) || !idx || !at) goto out;
    for (int i = 0; i < nt; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        size_t n = (size_t)t->numel;
        if (n >= MODEL_INIT_PAR_MIN) { /* parallel inside (chunked streams) */
            init_tensor(m, t, seed, h);
            if (put_tensor(e, t, h, part) != 0) goto out;
            continue;
        }
        if (used + n > cap) {
            if (flush_batch(m, seed, idx, at, nb, buf, part) != 0) goto out;
            nb = 0;
            used = 0;
        }
        idx[nb] = i;
        at[nb++] = used;
        used += n;
    }
    if (flush_batch(m, seed, idx, at, nb, buf, part) != 0) goto out;
    rc = 0;
out:
    free(h);
    free(buf);
    free(part);
    free(idx);
    free(at);
    return rc;
}

/* ---- forward / backward ---- */

static void norm_fwd(struct model *m, void *out, float *mean, float *rstd, const void *inp, int w,
                     int bias) {
    struct backend *b = m->e->be;
    int N = m->B * m->T;
    if (m->e->cfg.norm == MODEL_NORM_LAYERNORM)
        b->layernorm_fwd(b->ctx, out, mean, rstd, inp, P(m, w), P(m, bias), N, m->C,
                         (float)m->e->cfg.norm_eps);
    else
        b->rmsnorm_fwd(b->ctx, out, rstd, inp, P(m, w), N, m->C, (float)m->e->cfg.norm_eps);
}

static void norm_bwd(struct model *m, void *dinp, const void *dout, const void *inp, int w,
                     int bias, const float *mean, const float *rstd) {
    struct backend *b = m->e->be;
    int N = m->B * m->T;
    if (m->e->cfg.norm == MODEL_NORM_LAYERNORM)
        b->layernorm_bwd(b->ctx, dinp, G(m, w), G(m, bias), dout, inp, P(m, w), mean, rstd, N,
                         m->C);
    else
        b->rmsnorm_bwd(b->ctx, dinp, G(m, w), dout, inp, P(m, w), rstd, N, m->C);
}

/* MLP activation: fca = act(fch). */
static void act_fwd(struct model *m, struct layer_acts *s) {
    struct backend *b = m->e->be;
    int N = m->B * m->T;
    if (m->e->cfg.act == MODEL_ACT_SWIGLU)
        b->swiglu_fwd(b->ctx, s->fca, s->fch, N, m->F);
    else
        b->gelu_fwd(b->ctx, s->fca, s->fch, (size_t)N * m->F);
}

/* Bias of a row-parallel projection: added by tp rank 0 only (before the
 * all-reduce that sums the ranks' partial outputs). */
static void *row_bias(struct model *m, int i) {
    return m->e->tp_idx == 0 ? P(m, i) : NULL;
}

/* Block l's forward from its input x into a->l[l] (a->s1 as scratch). */
static void block_fwd(struct model *m, int l, const void *x) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    struct model_acts *a = m->acts;
    const struct model_block_idx *k = &m->blk[l];
    struct layer_acts *s = &a->l[l];
    int B = m->B, T = m->T, N = B * T, C = m->C;
    int swiglu = e->cfg.act == MODEL_ACT_SWIGLU, rope = e->cfg.pos == MODEL_POS_ROPE;
    int fcw = m->F * (swiglu ? 2 : 1);
    nf4_layer(e->nf4, l); /* QLoRA: block l's weights into the scratch (NULL: none) */
    norm_fwd(m, s->n1, s->n1_mean, s->n1_rstd, x, k->n1w, k->n1b);
    b->matmul_fwd(b->ctx, s->qkv, s->n1, P(m, k->qkvw), P(m, k->qkvb), N, C, m->QKV);
    if (m->lora) lora_fwd(m->lora, l, LORA_SITE_QKV, s->qkv, s->n1);
    if (rope)
        b->rope_fwd(b->ctx, s->qkv, N, T, m->QKV, m->NH + m->NKV, m->HD, (float)e->cfg.rope_theta);
    b->attention_fwd(b->ctx, s->atty, s->lse, s->qkv, B, T, m->NH, m->NKV, m->HD);
    /* projections + residual: one fused call where the backend has it (and
     * no tp all-reduce sits between them); an adapter's product is added to
     * the sum after it (the same kernels as without adapters, so B = 0 gives
     * the base model's bits) */
    int fuse = b->matmul_residual_fwd && e->tp == 1;
    if (fuse) {
        b->matmul_residual_fwd(b->ctx, s->r1, s->atty, P(m, k->aow), row_bias(m, k->aob), x, N,
                               m->NH * m->HD, C);
        if (m->lora) lora_fwd(m->lora, l, LORA_SITE_O, s->r1, s->atty);
    } else {
        b->matmul_fwd(b->ctx, a->s1, s->atty, P(m, k->aow), row_bias(m, k->aob), N, m->NH * m->HD,
                      C);
        if (m->lora) lora_fwd(m->lora, l, LORA_SITE_O, a->s1, s->atty);
        tp_allreduce(e, a->s1, (size_t)N * C);
        b->residual_fwd(b->ctx, s->r1, x, a->s1, (size_t)N * C);
    }
    norm_fwd(m, s->n2, s->n2_mean, s->n2_rstd, s->r1, k->n2w, k->n2b);
    b->matmul_fwd(b->ctx, s->fch, s->n2, P(m, k->fcw), P(m, k->fcb), N, C, fcw);
    if (m->lora) lora_fwd(m->lora, l, LORA_SITE_FC, s->fch, s->n2);
    act_fwd(m, s);
    if (fuse) {
        b->matmul_residual_fwd(b->ctx, s->r2, s->fca, P(m, k->mpw), row_bias(m, k->mpb), s->r1, N,
                               m->F, C);
        if (m->lora) lora_fwd(m->lora, l, LORA_SITE_DOWN, s->r2, s->fca);
    } else {
        b->matmul_fwd(b->ctx, a->s1, s->fca, P(m, k->mpw), row_bias(m, k->mpb), N, m->F, C);
        if (m->lora) lora_fwd(m->lora, l, LORA_SITE_DOWN, a->s1, s->fca);
        tp_allreduce(e, a->s1, (size_t)N * C);
        b->residual_fwd(b->ctx, s->r2, s->r1, a->s1, (size_t)N * C);
    }
}

int model_row_logits(struct model *m, int r, float *out) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    if (m->tp || !m->first || !m->last || r < 0 || r >= m->B * m->T) return -1;
    void *lg = b->alloc(b->ctx, (size_t)m->Vp * b->elt_size);
    float *f = b->alloc(b->ctx, (size_t)m->Vp * sizeof *f);
    int rc = lg && f ? 0 : -1;
    if (rc == 0) {
        b->matmul_fwd(b->ctx, lg, backend_at(b, m->acts->nf, (size_t)r * m->C), P(m, m->head), NULL,
                      1, m->C, m->Vp);
        b->to_f32(b->ctx, f, lg, (size_t)m->V);
        b->download(b->ctx, out, f, (size_t)m->V * sizeof *out);
    }
    b->free(b->ctx, lg);
    b->free(b->ctx, f);
    return rc;
}

void *model_stage_input(struct model *m) {
    return m->acts->enc;
}

const void *model_stage_output(struct model *m) {
    return m->l1 > m->l0 ? m->acts->l[m->l1 - 1].r2 : m->acts->enc;
}

void *model_stage_dout(struct model *m) {
    return m->acts->dres;
}

const void *model_stage_dinput(struct model *m) {
    return m->acts->dres;
}

double model_forward(struct model *m, const int32_t *inputs, const int32_t *targets,
                     float grad_scale, int64_t *count) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    struct model_acts *a = m->acts;
    int B = m->B, T = m->T, N = B * T, C = m->C;
    if (m->first) b->upload(b->ctx, m->tokens, inputs, (size_t)N * sizeof(int32_t));
    if (m->last) b->upload(b->ctx, m->targets, targets, (size_t)N * sizeof(int32_t));
    if (m->lora) lora_set_training(m->lora, grad_scale > 0); /* dropout in training only */

    if (m->first) {
        if (e->hooks.layer_pre_forward) e->hooks.layer_pre_forward(e, e->hooks.user, -1);
        if (m->tp)
            tp_embedding_fwd(m, a->enc, inputs, P(m, m->wte), P(m, m->wpe));
        else
            b->embedding_fwd(b->ctx, a->enc, m->tokens, P(m, m->wte), P(m, m->wpe), B, T, C);
    }
    const void *x = a->enc;
    for (int l = m->l0; l < m->l1; l++) {
        if (e->hooks.layer_pre_forward) e->hooks.layer_pre_forward(e, e->hooks.user, l);
        block_fwd(m, l, x);
        x = a->l[l].r2;
    }
    m->has_grad = grad_scale > 0;
    if (count) *count = 0;
    if (!m->last) return 0;
    if (!m->first && e->hooks.layer_pre_forward) e->hooks.layer_pre_forward(e, e->hooks.user, -1);
    norm_fwd(m, a->nf, a->nf_mean, a->nf_rstd, x, m->nfw, m->nfb);
    if (m->has_grad) b->zero(b->ctx, a->dnf, (size_t)N * C * b->elt_size);
    if (m->tp)
        tp_classifier(m, m->losses, m->has_grad ? a->dnf : NULL, m->has_grad ? G(m, m->head) : NULL,
                      a->nf, P(m, m->head), targets, m->has_grad ? grad_scale : 0.0f);
    else if (m->has_grad)
        b->classifier(b->ctx, m->losses, a->dnf, G(m, m->head), a->nf, P(m, m->head), m->targets, N,
                      C, m->V, m->Vp, grad_scale);
    else
        b->classifier(b->ctx, m->losses, NULL, NULL, a->nf, P(m, m->head), m->targets, N, C, m->V,
                      m->Vp, 0.0f);
    b->download(b->ctx, m->host_losses, m->losses, (size_t)N * sizeof(float));
    double sum = 0;
    int64_t cnt = 0;
    for (int r = 0; r < N; r++)
        if (targets[r] >= 0) {
            sum += m->host_losses[r];
            cnt++;
        }
    if (count) *count = cnt;
    return sum;
}

void model_backward(struct model *m, void (*on_layer)(int layer, void *user), void *user) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    struct model_acts *a = m->acts;
    int B = m->B, T = m->T, N = B * T, C = m->C;
    int swiglu = e->cfg.act == MODEL_ACT_SWIGLU, rope = e->cfg.pos == MODEL_POS_ROPE;
    int fcw = m->F * (swiglu ? 2 : 1), AC = m->NH * m->HD;
    size_t es = b->elt_size;
    if (!m->has_grad) die("model_backward without a forward that computed gradients");

    if (m->last) {
        const void *xlast = m->l1 > m->l0 ? a->l[m->l1 - 1].r2 : a->enc;
        b->zero(b->ctx, a->dres, (size_t)N * C * es);
        norm_bwd(m, a->dres, a->dnf, xlast, m->nfw, m->nfb, a->nf_mean, a->nf_rstd);
    } /* else: the next stage's gradient was written into dres */
    for (int l = m->l1 - 1; l >= m->l0; l--) {
        const struct model_block_idx *k = &m->blk[l];
        struct layer_acts *s = &a->l[l];
        const void *x = l > m->l0 ? a->l[l - 1].r2 : a->enc;
        if (e->hooks.layer_pre_backward) e->hooks.layer_pre_backward(e, e->hooks.user, l);
        nf4_layer(e->nf4, l); /* QLoRA: block l's weights into the scratch (NULL: none) */
        /* Recompute what was not kept (same kernels, same inputs: same bits):
         * the whole block, or its norms' outputs and activation (selective,
         * and the budget mode's kept blocks) */
        int full_l = m->recompute == MODEL_RECOMPUTE_FULL && l - m->l0 >= m->keep;
        int sel_l = m->recompute == MODEL_RECOMPUTE_SELECTIVE ||
                    (m->recompute == MODEL_RECOMPUTE_FULL && !full_l);
        if (full_l) {
            block_fwd(m, l, x);
        } else if (sel_l) {
            norm_fwd(m, s->n2, s->n2_mean, s->n2_rstd, s->r1, k->n2w, k->n2b);
            act_fwd(m, s);
        }
        /* MLP: r2 = r1 + proj(act(fc(norm2(r1)))) */
        b->zero(b->ctx, a->s1, (size_t)N * m->F * es);
        b->matmul_bwd(b->ctx, a->s1, G(m, k->mpw), G(m, k->mpb), a->dres, s->fca, P(m, k->mpw), N,
                      m->F, C);
        if (m->lora) lora_bwd(m->lora, l, LORA_SITE_DOWN, a->s1, a->dres, s->fca);
        b->zero(b->ctx, a->s2, (size_t)N * fcw * es);
        if (swiglu)
            b->swiglu_bwd(b->ctx, a->s2, s->fch, a->s1, N, m->F);
        else
            b->gelu_bwd(b->ctx, a->s2, s->fch, a->s1, (size_t)N * m->F);
        b->zero(b->ctx, a->s1, (size_t)N * C * es);
        b->matmul_bwd(b->ctx, a->s1, G(m, k->fcw), G(m, k->fcb), a->s2, s->n2, P(m, k->fcw), N, C,
                      fcw);
        if (m->lora) lora_bwd(m->lora, l, LORA_SITE_FC, a->s1, a->s2, s->n2);
        tp_allreduce(e, a->s1, (size_t)N * C);
        norm_bwd(m, a->dres, a->s1, s->r1, k->n2w, k->n2b, s->n2_mean, s->n2_rstd);
        if (sel_l) /* n1 shares n2's buffer */
            norm_fwd(m, s->n1, s->n1_mean, s->n1_rstd, x, k->n1w, k->n1b);
        /* attention: r1 = x + proj(attn(qkv(norm1(x)))) */
        b->zero(b->ctx, a->s1, (size_t)N * AC * es);
        b->matmul_bwd(b->ctx, a->s1, G(m, k->aow), G(m, k->aob), a->dres, s->atty, P(m, k->aow), N,
                      AC, C);
        if (m->lora) lora_bwd(m->lora, l, LORA_SITE_O, a->s1, a->dres, s->atty);
        b->zero(b->ctx, a->s2, (size_t)N * m->QKV * es);
        b->attention_bwd(b->ctx, a->s2, a->s1, s->qkv, s->atty, s->lse, B, T, m->NH, m->NKV, m->HD);
        if (rope)
            b->rope_bwd(b->ctx, a->s2, N, T, m->QKV, m->NH + m->NKV, m->HD,
                        (float)e->cfg.rope_theta);
        b->zero(b->ctx, a->s1, (size_t)N * C * es);
        b->matmul_bwd(b->ctx, a->s1, G(m, k->qkvw), G(m, k->qkvb), a->s2, s->n1, P(m, k->qkvw), N,
                      C, m->QKV);
        if (m->lora) lora_bwd(m->lora, l, LORA_SITE_QKV, a->s1, a->s2, s->n1);
        tp_allreduce(e, a->s1, (size_t)N * C);
        norm_bwd(m, a->dres, a->s1, x, k->n1w, k->n1b, s->n1_mean, s->n1_rstd);
        if (on_layer) on_layer(l, user);
    }
    if (!m->first) return; /* dres holds the gradient of this stage's input */
    if (e->hooks.layer_pre_backward) e->hooks.layer_pre_backward(e, e->hooks.user, -1);
    if (m->lora) { /* frozen embeddings: nothing to accumulate */
        if (on_layer) on_layer(-1, user);
        return;
    }
    if (m->tp)
        tp_embedding_bwd(m, G(m, m->wte), G(m, m->wpe), a->dres);
    else if (e->hooks.embedding_bwd)
        e->hooks.embedding_bwd(e, e->hooks.user, G(m, m->wte), G(m, m->wpe), a->dres, m->tokens, B,
                               T, C);
    else
        b->embedding_bwd(b->ctx, G(m, m->wte), G(m, m->wpe), a->dres, m->tokens, B, T, C);
    if (on_layer) on_layer(-1, user);
}
