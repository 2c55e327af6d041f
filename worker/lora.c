/* LoRA adapters: forward / backward at the projection sites through the
 * backend's op table, AdamW, data-parallel sync and ZeRO over the adapter
 * state, checkpoints, PEFT export / import and merging. See lora.h.
 *
 * Every adapter lives in one flat arena (A then B of each adapter, each
 * tensor starting on a 64-element boundary, the gaps zero), so that the
 * optimizer, the gradient norm, the dp all-reduce and the checkpoint each
 * see one contiguous range, as the engine's own flat buffers do. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/comm/comm.h"
#include "worker/lora.h"
#include "worker/model.h"
#include "worker/safetensors.h"

#define LORA_ALIGN 64 /* elements: 128 bytes in bf16, what cuBLASLt likes for its operands */

/* One spec target: where it sits in a block. */
struct lora_target {
    const char *spec;   /* spec name */
    const char *module; /* HF module under the block ("self_attn.q_proj") */
    const char *peft;   /* PEFT target_modules entry */
    enum lora_site site;
};

static const struct lora_target targets_llama[] = {
    {"q", "self_attn.q_proj", "q_proj", LORA_SITE_QKV},
    {"k", "self_attn.k_proj", "k_proj", LORA_SITE_QKV},
    {"v", "self_attn.v_proj", "v_proj", LORA_SITE_QKV},
    {"o", "self_attn.o_proj", "o_proj", LORA_SITE_O},
    {"gate", "mlp.gate_proj", "gate_proj", LORA_SITE_FC},
    {"up", "mlp.up_proj", "up_proj", LORA_SITE_FC},
    {"down", "mlp.down_proj", "down_proj", LORA_SITE_DOWN},
    {NULL, NULL, NULL, 0},
};

static const struct lora_target targets_gpt2[] = {
    {"attn", "attn.c_attn", "c_attn", LORA_SITE_QKV},
    {"proj", "attn.c_proj", "attn.c_proj", LORA_SITE_O},
    {"fc", "mlp.c_fc", "c_fc", LORA_SITE_FC},
    {"fc2", "mlp.c_proj", "mlp.c_proj", LORA_SITE_DOWN},
    {NULL, NULL, NULL, 0},
};

struct lora_ad {
    char base[MODEL_TENSOR_MAX]; /* HF name of the base weight */
    const struct lora_target *tg;
    int layer, tensor; /* base tensor index in the layout */
    int in, out, col;  /* col: first output column of the site this adapter adds to */
    size_t offA, offB; /* element offsets of A [r, in] and B [out, r] in the arena */
    void *u;           /* [N, r] compute dtype: scale * A x of the last forward */
    int gj, gk;        /* its place in its site's group of adapters, the group's size */
    uint64_t key;      /* the adapter's dropout stream (hash of its name) */
};

struct lora {
    struct model *m;
    int r, N, n, gpt2;
    double alpha, scale;
    double dropout;
    int site_w[LORA_NSITES], site_in[LORA_NSITES];
    struct lora_ad *ad; /* [n], layer-major */
    size_t total;       /* arena elements */
    void *p, *g;        /* compute dtype [total]: adapter values and gradients */
    /* fp32 optimizer state of the shard [sh_off, sh_off + sh_n) of the arena
     * (ZeRO 0: everything); master == p + sh_off on an fp32 backend */
    float *master, *mom_m, *mom_v;
    int master_aliased;
    size_t sh_off, sh_n;
    void *gsh;           /* ZeRO >= 1: the reduced gradient shard, compute dtype [sh_n] */
    int zero;            /* adapter ZeRO stage (0..2) */
    struct comm *dp;     /* dp communicator (NULL: one rank) */
    void *tmp;           /* [N, max site width] scratch */
    void *dax;           /* [N, r] scratch */
    void *xd, *yd;       /* [N, max site input] dropout scratch (NULL without dropout) */
    float *acc;          /* fp32 [1] device scalar for the norm */
    size_t bytes[4];     /* params, grads, optimizer, activations: what this holds */
    uint64_t seed;       /* train.seed */
    int64_t step, micro; /* for the dropout masks (lora_begin_micro) */
    int training;
    float *ckpt_h; /* host copy of the shard's state while a checkpoint is written */
};

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(uint64_t s, const char *name) {
    for (const char *p = name; *p; p++)
        s = (s ^ (unsigned char)*p) * 0x100000001b3ull;
    return s;
}

/* U(-bound, bound) from a stream keyed by (seed, name). */
static void fill_uniform(float *h, size_t n, uint64_t seed, const char *name, double bound) {
    uint64_t s = name_hash(seed ^ 0x6c6f72612d696e69ull, name); /* "lora-ini" */
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
        h[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

static size_t align_up(size_t n) {
    return (n + LORA_ALIGN - 1) / LORA_ALIGN * LORA_ALIGN;
}

/* Device allocation counted in the engine's memory category `cat` and in
 * l->bytes[k] (given back in lora_free). */
static void *lalloc(struct lora *l, int k, size_t bytes) {
    struct engine *e = l->m->e;
    size_t *cat[4] = {&e->mem.params, &e->mem.grads, &e->mem.optimizer, &e->mem.activations};
    bytes = bytes ? bytes : 1;
    void *p = engine_alloc(e, bytes, cat[k]);
    if (p) l->bytes[k] += bytes;
    return p;
}

void lora_free(struct lora *l) {
    if (!l) return;
    struct engine *e = l->m->e;
    struct backend *b = e->be;
    void *bufs[] = {l->p, l->g, l->mom_m, l->mom_v, l->gsh, l->tmp, l->dax, l->xd, l->yd, l->acc};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        b->free(b->ctx, bufs[i]);
    if (!l->master_aliased) b->free(b->ctx, l->master);
    for (int i = 0; l->ad && i < l->n; i++)
        if (l->ad[i].gj == 0) b->free(b->ctx, l->ad[i].u); /* one buffer per group */
    e->mem.params -= l->bytes[0];
    e->mem.grads -= l->bytes[1];
    e->mem.optimizer -= l->bytes[2];
    e->mem.activations -= l->bytes[3];
    free(l->ckpt_h);
    free(l->ad);
    free(l);
}

static void refuse(const char **code, const char *c, char *err, size_t errlen, const char *msg) {
    *code = c;
    snprintf(err, errlen, "%s", msg);
}

/* Why the place or backend cannot carry adapters, or NULL. */
static const char *unsupported(const struct engine *e, const struct lora_opts *o, char *msg,
                               size_t n) {
    const struct backend *b = e->be;
    if (!b->axpy_2d || !b->dropout) {
        snprintf(msg, n, "train.lora: the %s backend has no LoRA operations", b->name);
        return msg;
    }
    if (e->tp != 1 || e->pp != 1 || e->world != e->dp) {
        snprintf(msg, n,
                 "train.lora supports data parallelism only (tp=1 pp=1); this layout has "
                 "world=%d dp=%d tp=%d pp=%d",
                 e->world, e->dp, e->tp, e->pp);
        return msg;
    }
    if (e->offload) {
        snprintf(msg, n,
                 "train.lora does not combine with optimizer offload (the adapters' optimizer "
                 "state is small); turn offload off");
        return msg;
    }
    if (o->zero_stage < 0 || o->zero_stage > 2) {
        snprintf(msg, n,
                 "train.lora with zero_stage %d: the adapter state shards with stages 0-2 (the "
                 "frozen base has no optimizer state to shard)",
                 o->zero_stage);
        return msg;
    }
    if (o->dropout < 0 || o->dropout >= 1) {
        snprintf(msg, n, "train.lora.dropout=%g outside [0, 1)", o->dropout);
        return msg;
    }
    if (o->rank < 1 || o->alpha <= 0 || o->n_targets < 1) {
        snprintf(msg, n, "train.lora: rank=%d alpha=%g targets=%d invalid", o->rank, o->alpha,
                 o->n_targets);
        return msg;
    }
    return NULL;
}

/* The adapters of every block, in table order within a block (so that the
 * adapters of a site are in column order). 0, or -1 with a message. */
static int place_adapters(struct lora *l, const struct lora_opts *o, char *msg, size_t mlen) {
    struct model *m = l->m;
    struct engine *e = m->e;
    const struct lora_target *tab = l->gpt2 ? targets_gpt2 : targets_llama;
    size_t off = 0;
    for (int layer = 0; layer < m->L; layer++) {
        for (const struct lora_target *tg = tab; tg->spec; tg++) {
            int want = 0;
            for (int k = 0; k < o->n_targets; k++)
                want |= strcmp(o->targets[k], tg->spec) == 0;
            if (!want) continue;
            struct lora_ad *a = &l->ad[l->n];
            a->tg = tg;
            a->layer = layer;
            snprintf(a->base, sizeof a->base, "%s.%d.%s.weight",
                     l->gpt2 ? "transformer.h" : "model.layers", layer, tg->module);
            a->tensor = engine_tensor_find(e, a->base);
            if (a->tensor < 0) {
                snprintf(msg, mlen, "train.lora: tensor %s is not in the model", a->base);
                return -1;
            }
            const struct model_tensor *t = &e->layout.t[a->tensor];
            a->in = l->site_in[tg->site];
            a->out = (int)t->shape[0];
            /* the column offset inside the fused output: the tensor's
             * distance from the first tensor of its site (q, gate: 0) */
            a->col = 0;
            if (!l->gpt2 && (tg->site == LORA_SITE_QKV || tg->site == LORA_SITE_FC)) {
                int first = tg->site == LORA_SITE_QKV ? m->blk[layer].qkvw : m->blk[layer].fcw;
                a->col = (int)((t->rank_offset - e->layout.t[first].rank_offset) / (int64_t)a->in);
            }
            if (t->shape[1] != a->in || a->col + a->out > l->site_w[tg->site]) {
                snprintf(msg, mlen, "train.lora: %s has shape [%lld, %lld], expected in=%d",
                         a->base, (long long)t->shape[0], (long long)t->shape[1], a->in);
                return -1;
            }
            a->offA = off;
            off = align_up(off + (size_t)l->r * a->in);
            a->offB = off;
            off = align_up(off + (size_t)a->out * l->r);
            a->key = name_hash(0xcbf29ce484222325ull, a->base);
            l->n++;
        }
    }
    l->total = off;
    return 0;
}

/* The adapters of one (layer, site) sit side by side in the arena: every A
 * of the group, then every B, so that the A of a group is one [k r, in]
 * matrix (each A's r * in elements are a multiple of 64 in practice: no
 * gap) for the grouped x.A GEMM of the fused path (lora_fwd). Sets gj / gk,
 * the offsets and total after place_adapters. */
static void group_arena(struct lora *l) {
    size_t off = 0;
    for (int i = 0; i < l->n;) {
        int k = 1;
        while (i + k < l->n && l->ad[i + k].layer == l->ad[i].layer &&
               l->ad[i + k].tg->site == l->ad[i].tg->site)
            k++;
        for (int j = 0; j < k; j++) {
            struct lora_ad *a = &l->ad[i + j];
            a->gj = j, a->gk = k;
            a->offA = off;
            off = align_up(off + (size_t)l->r * a->in);
        }
        for (int j = 0; j < k; j++) {
            struct lora_ad *a = &l->ad[i + j];
            a->offB = off;
            off = align_up(off + (size_t)a->out * l->r);
        }
        i += k;
    }
    l->total = off;
}

/* The optimizer state of [off, off + n) of the arena, master from p. */
static int alloc_opt(struct lora *l, size_t off, size_t n) {
    struct backend *b = l->m->e->be;
    size_t bytes = (n ? n : 1) * sizeof(float);
    l->sh_off = off;
    l->sh_n = n;
    l->mom_m = lalloc(l, 2, bytes);
    l->mom_v = lalloc(l, 2, bytes);
    if (b->dtype == BACKEND_F32) {
        l->master = (float *)backend_at(b, l->p, off);
        l->master_aliased = 1;
    } else {
        l->master = lalloc(l, 2, bytes);
        if (l->master) b->to_f32(b->ctx, l->master, backend_at(b, l->p, off), n);
    }
    if (!l->mom_m || !l->mom_v || !l->master) return -1;
    b->zero(b->ctx, l->mom_m, bytes);
    b->zero(b->ctx, l->mom_v, bytes);
    return 0;
}

/* A from its stream, B = 0, into p (and the master where it has one). */
static int init_values(struct lora *l, uint64_t seed) {
    float *h = calloc(l->total ? l->total : 1, sizeof *h);
    if (!h) return -1;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        fill_uniform(h + a->offA, (size_t)l->r * a->in, seed, a->base, 1.0 / sqrt((double)a->in));
    }
    int rc = lora_set_values(l, h);
    free(h);
    return rc;
}

struct lora *lora_new(struct model *m, const struct lora_opts *o, const char **code, char *err,
                      size_t errlen) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    char msg[512];
    if (unsupported(e, o, msg, sizeof msg)) {
        refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
        return NULL;
    }
    struct lora *l = calloc(1, sizeof *l);
    if (!l) goto oom;
    l->m = m;
    l->r = o->rank;
    l->N = m->B * m->T;
    l->alpha = o->alpha;
    l->scale = o->alpha / o->rank;
    l->dropout = o->dropout;
    l->seed = o->seed;
    l->gpt2 = e->cfg.family == MODEL_GPT2;
    int swiglu = e->cfg.act == MODEL_ACT_SWIGLU, AC = m->NH * m->HD;
    l->site_w[LORA_SITE_QKV] = m->QKV;
    l->site_in[LORA_SITE_QKV] = m->C;
    l->site_w[LORA_SITE_O] = m->C;
    l->site_in[LORA_SITE_O] = AC;
    l->site_w[LORA_SITE_FC] = m->F * (swiglu ? 2 : 1);
    l->site_in[LORA_SITE_FC] = m->C;
    l->site_w[LORA_SITE_DOWN] = m->C;
    l->site_in[LORA_SITE_DOWN] = m->F;
    l->ad = calloc((size_t)m->L * o->n_targets, sizeof *l->ad);
    if (!l->ad) goto oom;
    if (place_adapters(l, o, msg, sizeof msg) != 0) {
        lora_free(l);
        refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
        return NULL;
    }
    group_arena(l);
    int wmax = 0, imax = 0;
    for (int s = 0; s < LORA_NSITES; s++) {
        if (l->site_w[s] > wmax) wmax = l->site_w[s];
        if (l->site_in[s] > imax) imax = l->site_in[s];
    }
    size_t es = b->elt_size, N = (size_t)l->N;
    l->p = lalloc(l, 0, l->total * es);
    l->g = lalloc(l, 1, l->total * es);
    l->tmp = lalloc(l, 3, N * wmax * es);
    l->dax = lalloc(l, 3, N * l->r * es);
    l->acc = lalloc(l, 2, sizeof(float));
    if (!l->p || !l->g || !l->tmp || !l->dax || !l->acc) goto oom;
    if (l->dropout > 0) {
        l->xd = lalloc(l, 3, N * imax * es);
        l->yd = lalloc(l, 3, N * imax * es);
        if (!l->xd || !l->yd) goto oom;
    }
    for (int i = 0; i < l->n; i++) { /* a group's products in one [N, k r] buffer */
        struct lora_ad *a = &l->ad[i];
        a->u = a->gj == 0 ? lalloc(l, 3, N * l->r * a->gk * es)
                          : backend_at(b, l->ad[i - a->gj].u, N * l->r * a->gj);
        if (!a->u) goto oom;
    }
    b->zero(b->ctx, l->p, l->total * es);
    b->zero(b->ctx, l->g, l->total * es);
    /* ZeRO over the adapter state: this rank's shard of the arena */
    l->dp = o->dp;
    int P = l->dp ? comm_size(l->dp) : 1;
    l->zero = P > 1 ? o->zero_stage : 0;
    size_t off = 0, cnt = l->total;
    if (l->zero >= 1) {
        comm_shard_range(l->total, P, comm_rank(l->dp), &off, &cnt);
        l->gsh = lalloc(l, 1, cnt * es);
        if (!l->gsh) goto oom;
    }
    if (alloc_opt(l, off, cnt) != 0 || init_values(l, o->seed) != 0) goto oom;
    return l;
oom:
    lora_free(l);
    refuse(code, "OUT_OF_MEMORY", err, errlen, "out of memory for the LoRA adapters");
    return NULL;
}

int lora_set_values(struct lora *l, const float *h) {
    struct backend *b = l->m->e->be;
    size_t n = l->total;
    if (b->dtype == BACKEND_F32) { /* p is the master */
        b->upload(b->ctx, l->p, h, n * sizeof(float));
        return 0;
    }
    float *f = b->alloc(b->ctx, (n ? n : 1) * sizeof(float));
    if (!f) return -1;
    b->upload(b->ctx, f, h, n * sizeof(float));
    b->from_f32(b->ctx, l->p, f, n);
    if (l->master) b->copy(b->ctx, l->master, f + l->sh_off, l->sh_n * sizeof(float));
    b->sync(b->ctx);
    b->free(b->ctx, f);
    return 0;
}

/* The arena as fp32 on the host (h[total]): the fp32 master where it holds
 * the whole arena, else the compute-dtype values. */
static int get_values(struct lora *l, float *h) {
    struct backend *b = l->m->e->be;
    size_t n = l->total;
    if (l->master && l->sh_n == n) {
        b->download(b->ctx, h, l->master, n * sizeof(float));
        return 0;
    }
    if (b->dtype == BACKEND_F32) {
        b->download(b->ctx, h, l->p, n * sizeof(float));
        return 0;
    }
    float *f = b->alloc(b->ctx, (n ? n : 1) * sizeof(float));
    if (!f) return -1;
    b->to_f32(b->ctx, f, l->p, n);
    b->download(b->ctx, h, f, n * sizeof(float));
    b->free(b->ctx, f);
    return 0;
}

void lora_begin_micro(struct lora *l, int64_t step, int64_t micro) {
    l->step = step;
    l->micro = micro;
}

void lora_set_training(struct lora *l, int training) {
    l->training = training;
}

/* The dropout seed of adapter a in the current micro-step. */
static uint64_t drop_seed(const struct lora *l, const struct lora_ad *a) {
    uint64_t s = l->seed ^ 0x6c6f72612d64726full; /* "lora-dro" */
    s ^= a->key;
    s = splitmix(&s) ^ (uint64_t)l->step;
    s = splitmix(&s) ^ (uint64_t)l->micro;
    return splitmix(&s);
}

static int dropping(const struct lora *l) {
    return l->dropout > 0 && l->training;
}

/* The first adapter of (layer, site), or -1. */
static int group_first(const struct lora *l, int layer, enum lora_site site) {
    for (int i = 0; i < l->n; i++)
        if (l->ad[i].layer == layer && l->ad[i].tg->site == site) return i;
    return -1;
}

/* The fused path for the group starting at i0 (backend lora_gemm, the
 * lora-fused tuning row): its [N, k r] product gradient fits the scratch,
 * and, without dropout, the group's A is one matrix (with dropout each
 * adapter has its own mask, so each its own x.A GEMM). */
static int fused(const struct lora *l, int i0) {
    const struct lora_ad *a = &l->ad[i0];
    if (!l->m->e->be->lora_gemm || a->gk * l->r > l->site_w[a->tg->site]) return 0;
    for (int j = 1; j < a->gk && !dropping(l); j++)
        if (a[j].offA != a->offA + (size_t)j * l->r * a->in) return 0;
    return 1;
}

/* Fused forward: U [N, k r] = scale * x A_group^T in one GEMM (row j r.. of
 * U is adapter j's product), then out[:, col_j ..] += U_j B_j^T per adapter,
 * accumulated by the GEMM (beta 1) in the projection's columns in place. */
static void fwd_fused(struct lora *l, int i0, int W, void *out, const void *inp) {
    struct backend *b = l->m->e->be;
    struct lora_ad *a0 = &l->ad[i0];
    int r = l->r, N = l->N, kr = a0->gk * r, in = a0->in;
    if (!dropping(l)) {
        b->lora_gemm(b->ctx, 0, 1, N, kr, in, (float)l->scale, inp, in,
                     backend_at(b, l->p, a0->offA), in, 0.0f, a0->u, kr);
    } else { /* each adapter's masked input: its own columns of U */
        for (int j = 0; j < a0->gk; j++) {
            b->dropout(b->ctx, l->xd, inp, (size_t)N * in, (float)l->dropout, drop_seed(l, &a0[j]));
            b->lora_gemm(b->ctx, 0, 1, N, r, in, (float)l->scale, l->xd, in,
                         backend_at(b, l->p, a0[j].offA), in, 0.0f,
                         backend_at(b, a0->u, (size_t)j * r), kr);
        }
    }
    for (int j = 0; j < a0->gk; j++) {
        const struct lora_ad *a = &a0[j];
        b->lora_gemm(b->ctx, 0, 1, N, a->out, r, 1.0f, backend_at(b, a0->u, (size_t)j * r), kr,
                     backend_at(b, l->p, a->offB), r, 1.0f, backend_at(b, out, (size_t)a->col), W);
    }
}

/* Fused backward: per adapter dB_j += G_j^T U_j and dU_j = scale * G_j B_j
 * straight from its columns G_j of dout (no gather pass), into dU [N, k r]
 * (the tmp scratch); then one GEMM each for dA_group += dU^T x and dinp +=
 * dU A_group (with dropout: per adapter, over its masked input, and its
 * input gradient masked and added). */
static void bwd_fused(struct lora *l, int i0, int W, void *dinp, const void *dout,
                      const void *inp) {
    struct backend *b = l->m->e->be;
    struct lora_ad *a0 = &l->ad[i0];
    int r = l->r, N = l->N, kr = a0->gk * r, in = a0->in;
    for (int j = 0; j < a0->gk; j++) {
        const struct lora_ad *a = &a0[j];
        const void *G = backend_at(b, dout, (size_t)a->col);
        b->lora_gemm(b->ctx, 1, 0, a->out, r, N, 1.0f, G, W, backend_at(b, a0->u, (size_t)j * r),
                     kr, 1.0f, backend_at(b, l->g, a->offB), r);
        b->lora_gemm(b->ctx, 0, 0, N, r, a->out, (float)l->scale, G, W,
                     backend_at(b, l->p, a->offB), r, 0.0f, backend_at(b, l->tmp, (size_t)j * r),
                     kr);
    }
    if (dropping(l)) { /* per adapter: its mask again on the input and its gradient */
        size_t n = (size_t)N * in;
        for (int j = 0; j < a0->gk; j++) {
            uint64_t ds = drop_seed(l, &a0[j]);
            const void *dU = backend_at(b, l->tmp, (size_t)j * r);
            b->dropout(b->ctx, l->xd, inp, n, (float)l->dropout, ds);
            b->lora_gemm(b->ctx, 1, 0, r, in, N, 1.0f, dU, kr, l->xd, in, 1.0f,
                         backend_at(b, l->g, a0[j].offA), in);
            if (!dinp) continue;
            b->lora_gemm(b->ctx, 0, 0, N, in, r, 1.0f, dU, kr, backend_at(b, l->p, a0[j].offA), in,
                         0.0f, l->yd, in);
            b->dropout(b->ctx, l->yd, l->yd, n, (float)l->dropout, ds);
            b->accumulate(b->ctx, dinp, l->yd, n);
        }
        return;
    }
    b->lora_gemm(b->ctx, 1, 0, kr, in, N, 1.0f, l->tmp, kr, inp, in, 1.0f,
                 backend_at(b, l->g, a0->offA), in);
    if (dinp)
        b->lora_gemm(b->ctx, 0, 0, N, in, kr, 1.0f, l->tmp, kr, backend_at(b, l->p, a0->offA), in,
                     1.0f, dinp, in);
}

void lora_fwd(struct lora *l, int layer, enum lora_site site, void *out, const void *inp) {
    struct backend *b = l->m->e->be;
    int r = l->r, N = l->N, W = l->site_w[site];
    int i0 = group_first(l, layer, site);
    if (i0 < 0) return;
    if (fused(l, i0)) {
        fwd_fused(l, i0, W, out, inp);
        return;
    }
    for (int i = i0; i < l->n; i++) {
        struct lora_ad *a = &l->ad[i];
        if (a->layer != layer || a->tg->site != site) continue;
        const void *x = inp;
        if (dropping(l)) {
            b->dropout(b->ctx, l->xd, inp, (size_t)N * a->in, (float)l->dropout, drop_seed(l, a));
            x = l->xd;
        }
        /* u = scale * A x, kept for the backward */
        b->matmul_fwd(b->ctx, a->u, x, backend_at(b, l->p, a->offA), NULL, N, a->in, r);
        b->scale(b->ctx, a->u, (size_t)N * r, (float)l->scale);
        void *y = backend_at(b, out, (size_t)a->col);
        if (a->out == W && b->matmul_residual_fwd) { /* the whole width: add in the GEMM */
            b->matmul_residual_fwd(b->ctx, out, a->u, backend_at(b, l->p, a->offB), NULL, out, N, r,
                                   W);
        } else {
            b->matmul_fwd(b->ctx, l->tmp, a->u, backend_at(b, l->p, a->offB), NULL, N, r, a->out);
            b->axpy_2d(b->ctx, y, W, l->tmp, a->out, N, a->out, 1.0f, 1);
        }
    }
}

void lora_bwd(struct lora *l, int layer, enum lora_site site, void *dinp, const void *dout,
              const void *inp) {
    struct backend *b = l->m->e->be;
    int r = l->r, N = l->N, W = l->site_w[site];
    size_t es = b->elt_size;
    int i0 = group_first(l, layer, site);
    if (i0 < 0) return;
    if (fused(l, i0)) {
        bwd_fused(l, i0, W, dinp, dout, inp);
        return;
    }
    for (int i = i0; i < l->n; i++) {
        struct lora_ad *a = &l->ad[i];
        if (a->layer != layer || a->tg->site != site) continue;
        /* g: the adapter's columns of dout */
        const void *g = dout;
        if (a->out != W) {
            b->axpy_2d(b->ctx, l->tmp, a->out, backend_at(b, dout, (size_t)a->col), W, N, a->out,
                       1.0f, 0);
            g = l->tmp;
        }
        /* d u = g B, dB += g^T u; then d(A x) = scale * d u */
        b->zero(b->ctx, l->dax, (size_t)N * r * es);
        b->matmul_bwd(b->ctx, l->dax, backend_at(b, l->g, a->offB), NULL, g, a->u,
                      backend_at(b, l->p, a->offB), N, r, a->out);
        b->scale(b->ctx, l->dax, (size_t)N * r, (float)l->scale);
        void *dA = backend_at(b, l->g, a->offA);
        const void *A = backend_at(b, l->p, a->offA);
        if (!dropping(l)) {
            b->matmul_bwd(b->ctx, dinp, dA, NULL, l->dax, inp, A, N, a->in, r);
            continue;
        }
        /* dropout: the forward's mask again, on the input and on its gradient */
        uint64_t ds = drop_seed(l, a);
        size_t n = (size_t)N * a->in;
        b->dropout(b->ctx, l->xd, inp, n, (float)l->dropout, ds);
        b->zero(b->ctx, l->yd, n * es);
        b->matmul_bwd(b->ctx, l->yd, dA, NULL, l->dax, l->xd, A, N, a->in, r);
        b->dropout(b->ctx, l->yd, l->yd, n, (float)l->dropout, ds);
        b->accumulate(b->ctx, dinp, l->yd, n);
    }
}

void lora_zero_grads(struct lora *l) {
    struct backend *b = l->m->e->be;
    b->zero(b->ctx, l->g, l->total * b->elt_size);
}

static enum comm_dtype cdtype(const struct backend *b) {
    return b->dtype == BACKEND_BF16 ? COMM_BF16 : COMM_F32;
}

int lora_grad_sync(struct lora *l) {
    struct backend *b = l->m->e->be;
    if (!l->dp || comm_size(l->dp) == 1) return 0;
    b->sync(b->ctx); /* the backward is done before the comm reads the gradients */
    int rc = l->zero >= 1
                 ? comm_reduce_scatter(l->dp, l->g, l->gsh, l->total, cdtype(b), COMM_SUM, NULL)
                 : comm_allreduce(l->dp, l->g, l->total, cdtype(b), COMM_SUM, NULL);
    if (rc != 0) log_error("lora: gradient sync over dp failed: %s", comm_error(l->dp));
    return rc;
}

/* The gradient of this rank's shard. */
static const void *shard_grad(const struct lora *l) {
    struct backend *b = l->m->e->be;
    return l->zero >= 1 ? l->gsh : backend_at(b, l->g, l->sh_off);
}

double lora_grad_norm_sq(const struct lora *l) {
    struct engine *e = l->m->e;
    struct backend *b = e->be;
    float h = 0;
    b->zero(b->ctx, l->acc, sizeof(float));
    b->sumsq(b->ctx, l->acc, shard_grad(l), l->sh_n);
    b->download(b->ctx, &h, l->acc, sizeof h);
    double s = h;
    if (l->zero >= 1 && e->hooks.allreduce_sum) e->hooks.allreduce_sum(e, e->hooks.user, &s, 1);
    return s;
}

int lora_adamw(struct lora *l, const struct optim_cfg *c, double lr, double grad_scale,
               int64_t step) {
    struct backend *b = l->m->e->be;
    struct backend_adamw a = {.param = backend_at(b, l->p, l->sh_off),
                              .master = l->master,
                              .grad = shard_grad(l),
                              .m = l->mom_m,
                              .v = l->mom_v,
                              .n = l->sh_n,
                              .lr = (float)lr,
                              .beta1 = (float)c->beta1,
                              .beta2 = (float)c->beta2,
                              .eps = (float)c->eps,
                              .weight_decay = (float)c->weight_decay,
                              .grad_scale = (float)grad_scale,
                              .step = (int)step};
    b->adamw(b->ctx, &a);
    if (l->zero < 1) return 0;
    b->sync(b->ctx);
    int rc =
        comm_all_gather(l->dp, backend_at(b, l->p, l->sh_off), l->p, l->total, cdtype(b), NULL);
    if (rc != 0) log_error("lora: parameter all-gather over dp failed: %s", comm_error(l->dp));
    return rc;
}

int lora_count(const struct lora *l) {
    return l->n;
}

int lora_rank(const struct lora *l) {
    return l->r;
}

double lora_scale(const struct lora *l) {
    return l->scale;
}

size_t lora_numel(const struct lora *l) {
    size_t n = 0;
    for (int i = 0; i < l->n; i++)
        n += (size_t)l->r * (l->ad[i].in + l->ad[i].out);
    return n;
}

void lora_view(const struct lora *l, int i, struct lora_view *v) {
    const struct lora_ad *a = &l->ad[i];
    struct backend *b = l->m->e->be;
    *v = (struct lora_view){.base = a->base,
                            .layer = a->layer,
                            .in = a->in,
                            .out = a->out,
                            .A = backend_at(b, l->p, a->offA),
                            .B = backend_at(b, l->p, a->offB),
                            .dA = backend_at(b, l->g, a->offA),
                            .dB = backend_at(b, l->g, a->offB)};
}

/* ---- checkpoints: this rank's optimizer shard of the arena ---- */

int lora_ckpt_add(struct lora *l, struct ckpt_writer *cw) {
    struct backend *b = l->m->e->be;
    size_t n = l->sh_n;
    /* the writer reads the arrays until ckpt_commit: kept until the next
     * checkpoint or lora_free */
    free(l->ckpt_h);
    float *h = l->ckpt_h = malloc((n ? n : 1) * 3 * sizeof *h);
    if (!h) return -1;
    b->download(b->ctx, h, l->master, n * sizeof(float));
    b->download(b->ctx, h + n, l->mom_m, n * sizeof(float));
    b->download(b->ctx, h + 2 * n, l->mom_v, n * sizeof(float));
    int rc = ckpt_add_f32(cw, "lora_master", h, n) != 0 ||
                     ckpt_add_f32(cw, "lora_adam_m", h + n, n) != 0 ||
                     ckpt_add_f32(cw, "lora_adam_v", h + 2 * n, n) != 0
                 ? -1
                 : 0;
    return rc;
}

json_t *lora_ckpt_meta(const struct lora *l) {
    return json_pack("{s:I, s:I, s:I, s:i, s:i, s:f}", "total", (json_int_t)l->total, "offset",
                     (json_int_t)l->sh_off, "count", (json_int_t)l->sh_n, "zero_stage", l->zero,
                     "rank", l->r, "alpha", l->alpha);
}

int lora_ckpt_load(struct lora *l, const char *dir, int rank, char *err, size_t errlen) {
    struct backend *b = l->m->e->be;
    struct ckpt_reader *r = NULL;
    int rc = -1;
    size_t n = l->sh_n;
    float *h = malloc((n ? n : 1) * 3 * sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (ckpt_open(dir, rank, &r, err, errlen) != 0) goto out;
    const json_t *meta = json_object_get(ckpt_rank_meta(r), "lora");
    json_int_t total = json_integer_value(json_object_get(meta, "total"));
    json_int_t off = json_integer_value(json_object_get(meta, "offset"));
    json_int_t cnt = json_integer_value(json_object_get(meta, "count"));
    if (!meta || (size_t)total != l->total || (size_t)off != l->sh_off || (size_t)cnt != n) {
        snprintf(err, errlen,
                 "%s holds LoRA adapter state total=%lld offset=%lld count=%lld for rank %d, but "
                 "this run's adapters have total=%zu offset=%zu count=%zu (resume with the same "
                 "train.lora, dp and zero_stage)",
                 dir, (long long)total, (long long)off, (long long)cnt, rank, l->total, l->sh_off,
                 n);
        goto out;
    }
    if (ckpt_read_f32(r, "lora_master", h, n, err, errlen) != 0 ||
        ckpt_read_f32(r, "lora_adam_m", h + n, n, err, errlen) != 0 ||
        ckpt_read_f32(r, "lora_adam_v", h + 2 * n, n, err, errlen) != 0)
        goto out;
    b->upload(b->ctx, l->mom_m, h + n, n * sizeof(float));
    b->upload(b->ctx, l->mom_v, h + 2 * n, n * sizeof(float));
    if (l->master_aliased) {
        b->upload(b->ctx, l->master, h, n * sizeof(float));
    } else {
        b->upload(b->ctx, l->master, h, n * sizeof(float));
        b->from_f32(b->ctx, backend_at(b, l->p, l->sh_off), l->master, n);
    }
    b->sync(b->ctx);
    if (l->zero >= 1 && comm_all_gather(l->dp, backend_at(b, l->p, l->sh_off), l->p, l->total,
                                        cdtype(b), NULL) != 0) {
        snprintf(err, errlen, "all-gather of the adapters failed: %s", comm_error(l->dp));
        goto out;
    }
    rc = 0;
out:
    ckpt_close(r);
    free(h);
    return rc;
}

/* ---- PEFT ---- */

/* "base_model.model.<module>.lora_X.weight" from the base weight's name. */
static void peft_name(char *dst, size_t n, const char *base, const char *which) {
    size_t len = strlen(base);
    int cut = len > 7 && strcmp(base + len - 7, ".weight") == 0 ? (int)(len - 7) : (int)len;
    snprintf(dst, n, "base_model.model.%.*s.%s.weight", cut, base, which);
}

int lora_export_peft(struct lora *l, const char *dir, const char *base_name, char *err,
                     size_t errlen) {
    int rc = -1;
    char path[1200];
    struct st_tensor *ts = calloc((size_t)l->n * 2 + 1, sizeof *ts);
    char(*names)[MODEL_TENSOR_MAX + 48] = calloc((size_t)l->n * 2 + 1, sizeof *names);
    float *h = malloc((l->total ? l->total : 1) * sizeof *h);
    json_t *cfg = NULL, *mods = NULL;
    if (!ts || !names || !h || get_values(l, h) != 0) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        goto out;
    }
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        peft_name(names[2 * i], sizeof names[0], a->base, "lora_A");
        peft_name(names[2 * i + 1], sizeof names[0], a->base, "lora_B");
        ts[2 * i] = (struct st_tensor){.name = names[2 * i],
                                       .dtype = ST_F32,
                                       .src_dtype = ST_F32,
                                       .ndim = 2,
                                       .shape = {l->r, a->in},
                                       .data = h + a->offA};
        ts[2 * i + 1] = (struct st_tensor){.name = names[2 * i + 1],
                                           .dtype = ST_F32,
                                           .src_dtype = ST_F32,
                                           .ndim = 2,
                                           .shape = {a->out, l->r},
                                           .data = h + a->offB};
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (st_write(path, ts, (size_t)l->n * 2, NULL, NULL, NULL, err, errlen) != 0) goto out;
    mods = json_array();
    const struct lora_target *tab = l->gpt2 ? targets_gpt2 : targets_llama;
    for (const struct lora_target *tg = tab; tg->spec; tg++)
        for (int i = 0; i < l->n; i++)
            if (l->ad[i].tg == tg) {
                json_array_append_new(mods, json_string(tg->peft));
                break;
            }
    cfg = json_pack("{s:s, s:s, s:i, s:f, s:f, s:o, s:s, s:s, s:b, s:b, s:b}", "peft_type", "LORA",
                    "task_type", "CAUSAL_LM", "r", l->r, "lora_alpha", l->alpha, "lora_dropout",
                    (double)l->dropout, "target_modules", mods, "base_model_name_or_path",
                    base_name ? base_name : "", "bias", "none", "fan_in_fan_out", l->gpt2,
                    "inference_mode", 1, "use_rslora", 0);
    mods = NULL; /* cfg's */
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (!cfg || json_dump_file(cfg, path, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) != 0) {
        snprintf(err, errlen, "cannot write %s", path);
        goto out;
    }
    rc = 0;
out:
    json_decref(cfg);
    json_decref(mods);
    free(ts);
    free(names);
    free(h);
    return rc;
}

/* One PEFT tensor by name into h (fp32), shape-checked. */
static int peft_tensor(const char *path, struct st_file *sf, const char *name, int64_t d0,
                       int64_t d1, float *h, char *err, size_t errlen) {
    const struct st_info *t = st_find(sf, name);
    if (!t) {
        snprintf(err, errlen, "%s has no tensor %s", path, name);
        return -1;
    }
    if (t->ndim != 2 || t->shape[0] != d0 || t->shape[1] != d1) {
        snprintf(err, errlen, "%s: %s has shape [%lld, %lld], expected [%lld, %lld]", path, name,
                 t->ndim > 0 ? (long long)t->shape[0] : -1LL,
                 t->ndim > 1 ? (long long)t->shape[1] : -1LL, (long long)d0, (long long)d1);
        return -1;
    }
    return st_read(sf, name, ST_F32, h, (size_t)(d0 * d1) * sizeof(float), err, errlen);
}

int lora_load_peft(struct lora *l, const char *dir, char *err, size_t errlen) {
    char path[1200];
    int rc = -1;
    json_error_t je;
    struct st_file *sf = NULL;
    float *h = calloc(l->total ? l->total : 1, sizeof *h);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *cfg = json_load_file(path, 0, &je);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (!cfg) {
        snprintf(err, errlen, "cannot read %s: %s", path, je.text);
        goto out;
    }
    json_int_t r = json_integer_value(json_object_get(cfg, "r"));
    double alpha = json_number_value(json_object_get(cfg, "lora_alpha"));
    const char *pt = json_string_value(json_object_get(cfg, "peft_type"));
    if (!pt || strcmp(pt, "LORA") != 0 || r != l->r || fabs(alpha - l->alpha) > 1e-9 * l->alpha ||
        json_is_true(json_object_get(cfg, "use_rslora"))) {
        snprintf(err, errlen,
                 "%s: peft_type=%s r=%lld lora_alpha=%g use_rslora=%s, but train.lora has rank=%d "
                 "alpha=%g (a LORA adapter of the same rank and alpha, without rslora, is needed)",
                 path, pt ? pt : "(none)", (long long)r, alpha,
                 json_is_true(json_object_get(cfg, "use_rslora")) ? "true" : "false", l->r,
                 l->alpha);
        goto out;
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (st_open(path, &sf, err, errlen) != 0) goto out;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        char na[MODEL_TENSOR_MAX + 48], nb[MODEL_TENSOR_MAX + 48];
        peft_name(na, sizeof na, a->base, "lora_A");
        peft_name(nb, sizeof nb, a->base, "lora_B");
        if (peft_tensor(path, sf, na, l->r, a->in, h + a->offA, err, errlen) != 0 ||
            peft_tensor(path, sf, nb, a->out, l->r, h + a->offB, err, errlen) != 0)
            goto out;
    }
    if (lora_set_values(l, h) != 0) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    rc = 0;
out:
    st_close(sf);
    json_decref(cfg);
    free(h);
    return rc;
}

int lora_merge(struct lora *l) {
    struct engine *e = l->m->e;
    int rc = -1;
    size_t maxn = 1;
    for (int i = 0; i < l->n; i++) {
        size_t n = (size_t)l->ad[i].out * l->ad[i].in;
        if (n > maxn) maxn = n;
    }
    float *w = malloc(maxn * sizeof *w);
    float *h = malloc((l->total ? l->total : 1) * sizeof *h);
    if (!w || !h || get_values(l, h) != 0) goto out;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        const struct model_tensor *t = &e->layout.t[a->tensor];
        const float *A = h + a->offA, *B = h + a->offB;
        size_t off = (size_t)t->rank_offset, n = (size_t)a->out * a->in;
        engine_opt_read(e, ENGINE_OPT_MASTER, w, off - e->shard_off, n);
        for (int o = 0; o < a->out; o++)
            for (int c = 0; c < a->in; c++) {
                double acc = 0;
                for (int j = 0; j < l->r; j++)
                    acc += (double)B[(size_t)o * l->r + j] * A[(size_t)j * a->in + c];
                w[(size_t)o * a->in + c] += (float)(l->scale * acc);
            }
        if (engine_params_from_host(e, off, w, n) != 0) goto out;
    }
    rc = 0;
out:
    free(w);
    free(h);
    return rc;
}
