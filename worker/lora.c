/* LoRA adapters: forward / backward at the projection sites through the
 * backend's op table, AdamW, data-parallel sync and ZeRO over the adapter
 * state, checkpoints, PEFT export / import and merging. See lora.h.
 *
 * Every adapter lives in one flat arena (A then B of each adapter, each
 * tensor starting on a 64-element boundary, the gaps zero), so that the
 * optimizer, the gradient norm, the dp all-reduce and the checkpoint each
 * see one contiguous range, as the engine's own flat buffers do.
 *
 * Parallel layouts. Each rank's arena holds the adapters of its pipeline
 * stage's blocks, in its tensor-parallel share, split like the base layer:
 * - column-parallel base (q, k, v, gate, up; gpt2 attn, fc): A [r, in] is
 *   replicated, B holds this rank's output rows of W ([out/tp, r], gpt2's
 *   fused c_attn per q|k|v block as W is);
 * - row-parallel base (o, down; gpt2 proj, fc2): A holds this rank's input
 *   columns of W ([r, in/tp]), B [out, r] is replicated. Each rank adds
 *   scale * B (A_k x_k) from its input slice to its partial output, which the
 *   model's existing all-reduce of the row-parallel output sums into
 *   scale * B (A x): the same result as an all-reduce of the [N, r] product
 *   before B, without a collective of its own in the forward.
 * Gradients: the split pieces' are complete on their rank. The replicated
 * pieces' are partial (A of a column-parallel base gets this rank's output
 * rows' share, B of a row-parallel base this rank's input columns' share),
 * so lora_grad_sync sums them over tp (one all-reduce of all of them, packed)
 * before the dp reduction. The global norm counts replicated pieces once.
 * Export, PEFT import and the initial A work on the full (tp = 1, every
 * block) arena: `full` offsets per adapter; a collective gather over the
 * world assembles it. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/jobspec.h"
#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/comm/comm.h"
#include "worker/lora.h"
#include "worker/model.h"
#include "worker/nf4.h"
#include "worker/safetensors.h"
#include "worker/tp.h"

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
    /* the whole adapter (tp = 1): [r, in_full] and [out_full, r] at fofA /
     * fofB of the full arena; ta / tb describe this rank's share of each as
     * tp_slice sees it (split, parts, shapes) */
    int in_full, out_full;
    size_t fofA, fofB;
    struct model_tensor ta, tb;
    int own;                /* on this rank's stage: an entry of the rank's arena */
    enum model_split split; /* the base weight's (column: B split, row: A split) */
    int parts;
};

struct lora {
    struct model *m;
    int r, N, n, gpt2;
    double alpha, scale;
    double dropout;
    int site_w[LORA_NSITES], site_in[LORA_NSITES];
    struct lora_ad *ad;  /* [n], layer-major: this stage's adapters */
    struct lora_ad *fad; /* [nf]: every block's adapters (the full arena's order) */
    int nf;
    size_t full_total; /* elements of the full (tp = 1, every stage) arena */
    size_t total;      /* arena elements */
    void *p, *g;       /* compute dtype [total]: adapter values and gradients */
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
    void *xf;            /* tp > 1 with dropout: [N, max whole row-parallel input] (drop) */
    void *dws;           /* dropout in the x.A kernels (drop_fused): their backward's workspace */
    float *acc;          /* fp32 [1] device scalar for the norm */
    size_t bytes[4];     /* params, grads, optimizer, activations: what this holds */
    uint64_t seed;       /* train.seed */
    int64_t step, micro; /* for the dropout masks (lora_begin_micro) */
    int training;
    float *ckpt_h; /* host copy of the shard's state while a checkpoint is written */
    /* tp / pp (lora_opts): the tp group sums the replicated pieces'
     * gradients (packed into rep, rep_n elements); the world assembles the
     * full arena and the norm */
    struct comm *tpc, *world;
    int tp, tp_idx, dp_idx, pp;
    void *rep;
    size_t rep_n;
    /* pipeline slots: [nslots][n] saved products (slot 0: each ad[i].u) */
    void **us;
    int nslots;
    /* QLoRA's merged export: the adapter values (host fp32 [total]) that
     * merge_delta adds as nf4_read dequantizes each weight (lora_merge) */
    float *merge_h;
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
    void *bufs[] = {l->p,   l->g,  l->mom_m, l->mom_v, l->gsh, l->tmp,
                    l->dax, l->xd, l->yd,    l->xf,    l->acc, l->dws};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        b->free(b->ctx, bufs[i]);
    if (!l->master_aliased) b->free(b->ctx, l->master);
    b->free(b->ctx, l->rep);
    /* one buffer per group of a site's adapters (lora_new, lora_reserve_slots) */
    if (l->us) /* every slot's products, slot 0's included */
        for (int i = 0; i < l->nslots * l->n; i++)
            if (l->ad[i % l->n].gj == 0) b->free(b->ctx, l->us[i]);
    for (int i = 0; !l->us && l->ad && i < l->n; i++)
        if (l->ad[i].gj == 0) b->free(b->ctx, l->ad[i].u);
    free(l->us);
    free(l->fad);
    if (e->nf4 && l->merge_h) nf4_set_delta(e->nf4, NULL, NULL);
    free(l->merge_h);
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
    if (e->world != e->dp * e->tp * e->pp || (e->world > 1 && !o->world) ||
        (e->tp > 1 && !e->tp_group)) {
        snprintf(msg, n, "train.lora: layout world=%d dp=%d tp=%d pp=%d without its communicators",
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

/* How tp_slice cuts an adapter piece: a [d0, d1] tensor of this rank's
 * [r0, r1] share, split like `split` in `parts` blocks. */
static struct model_tensor piece(int64_t d0, int64_t d1, int64_t r0, int64_t r1,
                                 enum model_split split, int parts) {
    struct model_tensor t = {.ndim = 2,
                             .shape = {d0, d1},
                             .numel = d0 * d1,
                             .split = split,
                             .parts = parts,
                             .rank_shape = {r0, r1},
                             .rank_numel = r0 * r1};
    return t;
}

/* The adapters of every block, in table order within a block (so that the
 * adapters of a site are in column order): all of them in l->fad (full
 * shapes and offsets), this stage's in l->ad (this rank's shares). 0, or -1
 * with a message. */
static int place_adapters(struct lora *l, const struct lora_opts *o, char *msg, size_t mlen) {
    struct model *m = l->m;
    struct engine *e = m->e;
    const struct lora_target *tab = l->gpt2 ? targets_gpt2 : targets_llama;
    size_t off = 0, foff = 0;
    for (int layer = 0; layer < m->L; layer++) {
        for (const struct lora_target *tg = tab; tg->spec; tg++) {
            int want = 0;
            for (int k = 0; k < o->n_targets; k++)
                want |= strcmp(o->targets[k], tg->spec) == 0;
            if (!want) continue;
            struct lora_ad *f = &l->fad[l->nf++];
            f->tg = tg;
            f->layer = layer;
            snprintf(f->base, sizeof f->base, "%s.%d.%s.weight",
                     l->gpt2 ? "transformer.h" : "model.layers", layer, tg->module);
            f->tensor = engine_tensor_find(e, f->base);
            if (f->tensor < 0) {
                snprintf(msg, mlen, "train.lora: tensor %s is not in the model", f->base);
                return -1;
            }
            const struct model_tensor *t = &e->layout.t[f->tensor];
            f->in_full = f->in = (int)t->shape[1];
            f->out_full = f->out = (int)t->shape[0];
            f->fofA = foff;
            foff = align_up(foff + (size_t)l->r * f->in_full);
            f->fofB = foff;
            foff = align_up(foff + (size_t)f->out_full * l->r);
            f->key = name_hash(0xcbf29ce484222325ull, f->base);
            f->split = t->split;
            f->parts = t->parts;
            f->own = layer >= m->l0 && layer < m->l1;
            if (!f->own) continue;
            struct lora_ad *a = &l->ad[l->n];
            *a = *f;
            a->in = l->site_in[tg->site];
            a->out = (int)t->rank_shape[0];
            /* the column offset inside the fused output: the tensor's
             * distance from the first tensor of its site (q, gate: 0) */
            a->col = 0;
            if (!l->gpt2 && (tg->site == LORA_SITE_QKV || tg->site == LORA_SITE_FC)) {
                int first = tg->site == LORA_SITE_QKV ? m->blk[layer].qkvw : m->blk[layer].fcw;
                a->col = (int)((t->rank_offset - e->layout.t[first].rank_offset) / (int64_t)a->in);
            }
            if (t->rank_shape[1] != a->in || a->col + a->out > l->site_w[tg->site]) {
                snprintf(msg, mlen, "train.lora: %s has shape [%lld, %lld], expected in=%d",
                         a->base, (long long)t->rank_shape[0], (long long)t->rank_shape[1], a->in);
                return -1;
            }
            int row = t->split == MODEL_SPLIT_ROW, col = t->split == MODEL_SPLIT_COLUMN;
            a->ta = piece(l->r, a->in_full, l->r, a->in,
                          row ? MODEL_SPLIT_ROW : MODEL_SPLIT_REPLICATED, 1);
            a->tb = piece(a->out_full, l->r, a->out, l->r,
                          col ? MODEL_SPLIT_COLUMN : MODEL_SPLIT_REPLICATED, col ? t->parts : 1);
            a->offA = off;
            off = align_up(off + (size_t)l->r * a->in);
            a->offB = off;
            off = align_up(off + (size_t)a->out * l->r);
            /* tp > 1: the replicated pieces' gradients are summed over tp */
            if (l->tp > 1)
                l->rep_n += (row ? 0 : (size_t)l->r * a->in) + (col ? 0 : (size_t)a->out * l->r);
            l->n++;
        }
    }
    l->total = off;
    l->full_total = foff;
    return 0;
}

/* The adapters of one (layer, site) sit side by side in the arena: every A
 * of the group, then every B, so that the A of a group is one [k r, in]
 * matrix (each A's r * in elements are a multiple of 64 in practice: no
 * gap) for the grouped x.A GEMM of the fused path (lora_fwd). Sets gj / gk,
 * the offsets and total after place_adapters; layout_offsets places another
 * layout's arena the same way. */
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

static int drop_fused(const struct lora *l);

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
/* This rank's shares (the arena, host fp32 h[total]) of the full arena
 * full[full_total]. */
static void full_to_local(const struct lora *l, const float *full, float *h) {
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        tp_slice(&a->ta, l->tp, l->tp_idx, full + a->fofA, h + a->offA);
        tp_slice(&a->tb, l->tp, l->tp_idx, full + a->fofB, h + a->offB);
    }
}

/* The inverse, into a zeroed full: with `once`, a replicated piece only from
 * tp rank 0 (so that a sum over the tp group leaves it whole). */
static void local_to_full(const struct lora *l, const float *h, float *full, int once) {
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        int skip = once && l->tp_idx != 0;
        if (!skip || a->ta.split != MODEL_SPLIT_REPLICATED)
            tp_unslice(&a->ta, l->tp, l->tp_idx, h + a->offA, full + a->fofA);
        if (!skip || a->tb.split != MODEL_SPLIT_REPLICATED)
            tp_unslice(&a->tb, l->tp, l->tp_idx, h + a->offB, full + a->fofB);
    }
}

/* A from its stream (the whole [r, in_full] A, as at tp = 1, then this
 * rank's share), B = 0, into p (and the master where it has one). */
static int init_values(struct lora *l, uint64_t seed) {
    float *h = calloc(l->total ? l->total : 1, sizeof *h);
    float *full = calloc(l->full_total ? l->full_total : 1, sizeof *full);
    int rc = -1;
    if (!h || !full) goto out;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        fill_uniform(full + a->fofA, (size_t)l->r * a->in_full, seed, a->base,
                     1.0 / sqrt((double)a->in_full));
    }
    full_to_local(l, full, h);
    rc = lora_set_values(l, h);
out:
    free(h);
    free(full);
    return rc;
}

int lora_precision_check(const struct loom_spec *s, const char *device, char *err, size_t len) {
    if (s->train.precision != JOBSPEC_PREC_FP8) return 0;
    if (s->train.lora.enabled && s->train.quantize_base == JOBSPEC_QUANT_NF4) {
        snprintf(err, len,
                 "train.precision fp8 does not run with train.quantize_base nf4 (this spec has "
                 "precision=fp8, quantize_base=nf4): use precision bf16 with nf4, or fp8 with "
                 "quantize_base none");
        return -1;
    }
    if (!device || strcmp(device, "cuda") != 0) {
        snprintf(err, len,
                 "train.precision fp8 needs the cuda device (this worker runs device=%s): use "
                 "precision fp32 on cpu",
                 device ? device : "(none)");
        return -1;
    }
    if (!s->train.lora.enabled && s->parallel.zero_stage > 2) {
        /* the backend keys a weight's E4M3 path by its resident pointer;
         * ZeRO-3 gathers each block's weights into shared windows */
        snprintf(err, len,
                 "train.precision fp8 for full fine-tuning needs resident weights (this spec has "
                 "precision=fp8, zero_stage=%d, which gathers them into per-block windows): use "
                 "zero_stage 0-2, or precision bf16",
                 s->parallel.zero_stage);
        return -1;
    }
    return 0;
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
    l->tp = e->tp;
    l->tp_idx = e->tp_idx;
    l->dp_idx = e->dp_idx;
    l->pp = e->pp;
    l->tpc = e->tp > 1 ? e->tp_group : NULL;
    l->world = o->world;
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
    l->fad = calloc((size_t)m->L * o->n_targets, sizeof *l->fad);
    if (!l->ad || !l->fad) goto oom;
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
    if (l->rep_n && !(l->rep = lalloc(l, 1, l->rep_n * es))) goto oom;
    if (l->dropout > 0 && drop_fused(l)) { /* no masked copies: the kernels' workspace */
        size_t ws = 0;
        for (int i = 0; i < l->n; i++) {
            size_t w = b->lora_drop_ws(b->ctx, l->N, l->ad[i].in, l->r);
            ws = w > ws ? w : ws;
        }
        if (!(l->dws = lalloc(l, 3, ws))) goto oom;
    } else if (l->dropout > 0) {
        l->xd = lalloc(l, 3, N * imax * es);
        l->yd = lalloc(l, 3, N * imax * es);
        if (!l->xd || !l->yd) goto oom;
        size_t fmax = 0;
        for (int i = 0; l->tp > 1 && i < l->n; i++)
            if (l->ad[i].ta.split == MODEL_SPLIT_ROW && (size_t)l->ad[i].in_full > fmax)
                fmax = (size_t)l->ad[i].in_full;
        if (fmax) {
            if (!(l->xf = lalloc(l, 3, N * fmax * es))) goto oom;
            b->zero(b->ctx, l->xf, N * fmax * es);
        }
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

/* The full arena (every stage's adapters, whole tensors, tp = 1 offsets) as
 * host fp32 full[full_total]. Collective over the world when tp or pp > 1
 * (each piece from one rank: tp rank 0 for replicated pieces, dp rank 0;
 * the others add zeros, so the sum is exact); else local. 0 or -1. */
static int get_full(struct lora *l, float *full) {
    struct backend *b = l->m->e->be;
    int rc = -1;
    float *h = malloc((l->total ? l->total : 1) * sizeof *h), *d = NULL;
    if (!h || get_values(l, h) != 0) goto out;
    memset(full, 0, l->full_total * sizeof *full);
    int par = l->tp > 1 || l->pp > 1;
    if (!par || l->dp_idx == 0) local_to_full(l, h, full, par);
    if (par && l->world) {
        /* the comm reads backend memory (device buffers on cuda) */
        size_t bytes = (l->full_total ? l->full_total : 1) * sizeof(float);
        d = b->alloc(b->ctx, bytes);
        if (!d) goto out;
        b->upload(b->ctx, d, full, l->full_total * sizeof(float));
        b->sync(b->ctx);
        if (comm_allreduce(l->world, d, l->full_total, COMM_F32, COMM_SUM, NULL) != 0) {
            log_error("lora: gathering the adapters failed: %s", comm_error(l->world));
            goto out;
        }
        b->download(b->ctx, full, d, l->full_total * sizeof(float));
    }
    rc = 0;
out:
    if (d) b->free(b->ctx, d);
    free(h);
    return rc;
}

int lora_reserve_slots(struct lora *l, int n) {
    struct backend *b = l->m->e->be;
    if (n <= l->nslots || (n <= 1 && !l->us)) return 0;
    void **us = realloc(l->us, (size_t)n * l->n * sizeof *us);
    if (!us) return -1;
    l->us = us;
    if (l->nslots == 0) { /* slot 0: the products lora_new made */
        for (int i = 0; i < l->n; i++)
            us[i] = l->ad[i].u;
        l->nslots = 1;
    }
    for (; l->nslots < n; l->nslots++)
        for (int i = 0; i < l->n; i++) { /* per group, as lora_new */
            const struct lora_ad *a = &l->ad[i];
            void **u = &us[(size_t)l->nslots * l->n + i];
            size_t nr = (size_t)l->N * l->r;
            *u = a->gj == 0 ? lalloc(l, 3, nr * a->gk * b->elt_size)
                            : backend_at(b, us[(size_t)l->nslots * l->n + i - a->gj], nr * a->gj);
            if (!*u) {
                for (int j = 0; j < i; j++) /* this slot's, so that nslots stays true */
                    if (l->ad[j].gj == 0) b->free(b->ctx, us[(size_t)l->nslots * l->n + j]);
                return -1;
            }
        }
    return 0;
}

void lora_use_slot(struct lora *l, int slot) {
    if (!l->us || slot < 0 || slot >= l->nslots) return;
    for (int i = 0; i < l->n; i++)
        l->ad[i].u = l->us[(size_t)slot * l->n + i];
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

/* Dropout applied inside the x.A kernels (backend lora_drop_fwd / _bwd, the
 * lora-drop-fused row): no masked copy of the input is written. */
static int drop_fused(const struct lora *l) {
    const struct backend *b = l->m->e->be;
    return b->lora_drop_fwd && b->lora_drop_bwd && b->lora_drop_ws &&
           l->r <= BACKEND_LORA_DROP_RMAX;
}

/* The mask's index of element (n, c) of adapter a's input is n * mld +
 * moff + c (drop's: a row-parallel slice at tp > 1 sits at its columns of
 * the whole input). */
static void drop_index(const struct lora *l, const struct lora_ad *a, size_t *mld, size_t *moff) {
    int slice = a->ta.split == MODEL_SPLIT_ROW && l->tp > 1;
    *mld = slice ? (size_t)a->in_full : (size_t)a->in;
    *moff = slice ? (size_t)l->tp_idx * a->in : 0;
}

/* H [N, r] (row stride ldh) = alpha * dropout(x) A^T, the mask in the
 * kernel. */
static void drop_fwd(struct lora *l, const struct lora_ad *a, void *H, int ldh, const void *x,
                     float alpha) {
    struct backend *b = l->m->e->be;
    size_t mld, moff;
    drop_index(l, a, &mld, &moff);
    b->lora_drop_fwd(b->ctx, H, ldh, x, a->in, backend_at(b, l->p, a->offA), l->N, a->in, l->r,
                     alpha, (float)l->dropout, drop_seed(l, a), mld, moff, l->dws);
}

/* dA += dH^T dropout(x); dx (NULL: none) += mask o (dH A) / (1 - p). */
static void drop_bwd(struct lora *l, const struct lora_ad *a, void *dx, const void *dH, int ldh,
                     const void *x) {
    struct backend *b = l->m->e->be;
    size_t mld, moff;
    drop_index(l, a, &mld, &moff);
    b->lora_drop_bwd(b->ctx, backend_at(b, l->g, a->offA), dx, a->in, dH, ldh, x, a->in,
                     backend_at(b, l->p, a->offA), l->N, a->in, l->r, (float)l->dropout,
                     drop_seed(l, a), mld, moff, l->dws);
}

/* dst = dropout(src) [N, a->in] with the mask of tp = 1. A row-parallel
 * base's input is this rank's column slice of the whole [N, in_full] input,
 * and the mask is a function of the element's index in the whole input: the
 * slice goes into its columns of a full-width scratch (the other columns
 * stay zero), is masked there, and comes back. dst may equal src. */
static void drop(struct lora *l, const struct lora_ad *a, void *dst, const void *src) {
    struct backend *b = l->m->e->be;
    int N = l->N;
    uint64_t seed = drop_seed(l, a);
    if (a->ta.split != MODEL_SPLIT_ROW || l->tp == 1) {
        b->dropout(b->ctx, dst, src, (size_t)N * a->in, (float)l->dropout, seed);
        return;
    }
    void *cols = backend_at(b, l->xf, (size_t)l->tp_idx * a->in);
    b->axpy_2d(b->ctx, cols, a->in_full, src, a->in, N, a->in, 1.0f, 0);
    b->dropout(b->ctx, l->xf, l->xf, (size_t)N * a->in_full, (float)l->dropout, seed);
    b->axpy_2d(b->ctx, dst, a->in, cols, a->in_full, N, a->in, 1.0f, 0);
}

/* The first adapter of (layer, site), or -1. */
static int group_first(const struct lora *l, int layer, enum lora_site site) {
    for (int i = 0; i < l->n; i++)
        if (l->ad[i].layer == layer && l->ad[i].tg->site == site) return i;
    return -1;
}

/* The fused path for the group starting at i0 (backend lora_gemm, the
 * lora-fused tuning row): its [N, k r] product gradient fits the scratch,
 * its strides are multiples of 8, and, without dropout, the group's A is one
 * matrix (with dropout each
 * adapter has its own mask, so each its own x.A GEMM). */
static int fused(const struct lora *l, int i0) {
    const struct lora_ad *a = &l->ad[i0];
    int W = l->site_w[a->tg->site];
    if (!l->m->e->be->lora_gemm || a->gk * l->r > W) return 0;
    /* every operand row and column range on a 16-byte (8-element) boundary,
     * where cuBLASLt's bf16 kernels are sure to run */
    if (l->r % 8 || a->in % 8 || W % 8) return 0;
    for (int j = 0; j < a->gk; j++)
        if (a[j].col % 8 || a[j].out % 8) return 0;
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
    } else if (drop_fused(l)) { /* each adapter's mask in its kernel: its columns of U */
        for (int j = 0; j < a0->gk; j++)
            drop_fwd(l, &a0[j], backend_at(b, a0->u, (size_t)j * r), kr, inp, (float)l->scale);
    } else { /* each adapter's masked input: its own columns of U */
        for (int j = 0; j < a0->gk; j++) {
            drop(l, &a0[j], l->xd, inp);
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
    if (dropping(l) && drop_fused(l)) { /* per adapter: dA and dinp in one masked pass */
        for (int j = 0; j < a0->gk; j++)
            drop_bwd(l, &a0[j], dinp, backend_at(b, l->tmp, (size_t)j * r), kr, inp);
        return;
    }
    if (dropping(l)) { /* per adapter: its mask again on the input and its gradient */
        for (int j = 0; j < a0->gk; j++) {
            const void *dU = backend_at(b, l->tmp, (size_t)j * r);
            drop(l, &a0[j], l->xd, inp);
            b->lora_gemm(b->ctx, 1, 0, r, in, N, 1.0f, dU, kr, l->xd, in, 1.0f,
                         backend_at(b, l->g, a0[j].offA), in);
            if (!dinp) continue;
            b->lora_gemm(b->ctx, 0, 0, N, in, r, 1.0f, dU, kr, backend_at(b, l->p, a0[j].offA), in,
                         0.0f, l->yd, in);
            drop(l, &a0[j], l->yd, l->yd);
            b->accumulate(b->ctx, dinp, l->yd, (size_t)N * in);
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
        if (dropping(l) && drop_fused(l)) {
            drop_fwd(l, a, a->u, r, inp, (float)l->scale);
        } else {
            if (dropping(l)) {
                drop(l, a, l->xd, inp);
                x = l->xd;
            }
            /* u = scale * A x, kept for the backward */
            b->matmul_fwd(b->ctx, a->u, x, backend_at(b, l->p, a->offA), NULL, N, a->in, r);
            b->scale(b->ctx, a->u, (size_t)N * r, (float)l->scale);
        }
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
        if (drop_fused(l)) { /* the mask in the kernel, on the input and its gradient */
            drop_bwd(l, a, dinp, l->dax, r, inp);
            continue;
        }
        /* dropout: the forward's mask again, on the input and on its gradient */
        size_t n = (size_t)N * a->in;
        drop(l, a, l->xd, inp);
        b->zero(b->ctx, l->yd, n * es);
        b->matmul_bwd(b->ctx, l->yd, dA, NULL, l->dax, l->xd, A, N, a->in, r);
        drop(l, a, l->yd, l->yd);
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

/* tp > 1: sum the replicated pieces' partial gradients over the tp group,
 * packed into one buffer (one all-reduce instead of one per piece). */
static int tp_sync(struct lora *l) {
    struct backend *b = l->m->e->be;
    size_t es = b->elt_size, at = 0;
    if (!l->rep_n) return 0;
    for (int pass = 0; pass < 2; pass++) {
        at = 0;
        for (int i = 0; i < l->n; i++) {
            const struct lora_ad *a = &l->ad[i];
            size_t offs[2] = {a->offA, a->offB},
                   ns[2] = {(size_t)l->r * a->in, (size_t)a->out * l->r};
            int rep[2] = {a->ta.split == MODEL_SPLIT_REPLICATED,
                          a->tb.split == MODEL_SPLIT_REPLICATED};
            for (int k = 0; k < 2; k++) {
                if (!rep[k]) continue;
                void *g = backend_at(b, l->g, offs[k]), *r = backend_at(b, l->rep, at);
                if (pass == 0)
                    b->copy(b->ctx, r, g, ns[k] * es);
                else
                    b->copy(b->ctx, g, r, ns[k] * es);
                at += ns[k];
            }
        }
        if (pass > 0) break;
        b->sync(b->ctx);
        if (comm_allreduce(l->tpc, l->rep, l->rep_n, cdtype(b), COMM_SUM, NULL) != 0) {
            log_error("lora: gradient sum over tp failed: %s", comm_error(l->tpc));
            return -1;
        }
    }
    return 0;
}

int lora_grad_sync(struct lora *l) {
    struct backend *b = l->m->e->be;
    if (tp_sync(l) != 0) return -1;
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

/* tp or pp > 1: every piece once over the world: this rank's shard of its
 * pieces, a replicated piece from tp rank 0 only, and (ZeRO 0, where every
 * dp rank holds the same shard) from dp rank 0 only; summed over the world. */
static double norm_par(const struct lora *l) {
    struct backend *b = l->m->e->be;
    const void *g = shard_grad(l);
    size_t s0 = l->sh_off, s1 = l->sh_off + l->sh_n;
    float h = 0;
    b->zero(b->ctx, l->acc, sizeof(float));
    for (int i = 0; i < l->n && (l->zero >= 1 || l->dp_idx == 0); i++) {
        const struct lora_ad *a = &l->ad[i];
        size_t offs[2] = {a->offA, a->offB}, ns[2] = {(size_t)l->r * a->in, (size_t)a->out * l->r};
        int rep[2] = {a->ta.split == MODEL_SPLIT_REPLICATED, a->tb.split == MODEL_SPLIT_REPLICATED};
        for (int k = 0; k < 2; k++) {
            if (rep[k] && l->tp_idx != 0) continue;
            size_t lo = offs[k] > s0 ? offs[k] : s0,
                   hi = offs[k] + ns[k] < s1 ? offs[k] + ns[k] : s1;
            if (hi > lo) b->sumsq(b->ctx, l->acc, backend_at(b, g, lo - s0), hi - lo);
        }
    }
    b->download(b->ctx, &h, l->acc, sizeof h);
    double v = h;
    if (l->world && comm_allreduce(l->world, &v, 1, COMM_F64, COMM_SUM, NULL) != 0)
        die("lora: gradient norm all-reduce failed: %s", comm_error(l->world));
    return v;
}

double lora_grad_norm_sq(const struct lora *l) {
    struct engine *e = l->m->e;
    struct backend *b = e->be;
    float h = 0;
    if (l->tp > 1 || l->pp > 1) return norm_par(l);
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
    return json_pack("{s:I, s:I, s:I, s:i, s:i, s:f, s:i, s:i}", "total", (json_int_t)l->total,
                     "offset", (json_int_t)l->sh_off, "count", (json_int_t)l->sh_n, "zero_stage",
                     l->zero, "rank", l->r, "alpha", l->alpha, "tp", l->tp, "pp", l->pp);
}

/* This rank's shard state h[3][sh_n] (master, m, v) into the device (and
 * the values, all-gathered over dp with ZeRO). 0 or -1. */
static int put_state(struct lora *l, const float *h, const char *dir, char *err, size_t errlen) {
    struct backend *b = l->m->e->be;
    size_t n = l->sh_n;
    b->upload(b->ctx, l->mom_m, h + n, n * sizeof(float));
    b->upload(b->ctx, l->mom_v, h + 2 * n, n * sizeof(float));
    b->upload(b->ctx, l->master, h, n * sizeof(float));
    if (!l->master_aliased) b->from_f32(b->ctx, backend_at(b, l->p, l->sh_off), l->master, n);
    b->sync(b->ctx);
    if (l->zero >= 1 && comm_all_gather(l->dp, backend_at(b, l->p, l->sh_off), l->p, l->total,
                                        cdtype(b), NULL) != 0) {
        snprintf(err, errlen, "%s: all-gather of the adapters failed: %s", dir, comm_error(l->dp));
        return -1;
    }
    return 0;
}

/* The arena offsets and this-rank shapes of every adapter of stage `st` at
 * layout (tp, pp), as place_adapters places them there (A at offA, B at offB
 * for fad[i] on the stage, else (size_t)-1); returns the arena's size. */
static size_t layout_offsets(const struct lora *l, int tp, int pp, int st, size_t *offA,
                             size_t *offB) {
    int l0, l1;
    size_t off = 0;
    model_stage_layers(&l->m->e->cfg, pp, st, &l0, &l1);
    for (int i = 0; i < l->nf; i++)
        offA[i] = offB[i] = (size_t)-1;
    /* grouped by (layer, site) as group_arena: every A of a group, then every B */
    for (int i = 0; i < l->nf;) {
        const struct lora_ad *f = &l->fad[i];
        int k = 1;
        while (i + k < l->nf && l->fad[i + k].layer == f->layer &&
               l->fad[i + k].tg->site == f->tg->site)
            k++;
        if (f->layer >= l0 && f->layer < l1) {
            for (int j = i; j < i + k; j++) {
                const struct lora_ad *g = &l->fad[j];
                size_t in = (size_t)g->in_full / (g->split == MODEL_SPLIT_ROW ? (size_t)tp : 1);
                offA[j] = off;
                off = align_up(off + (size_t)l->r * in);
            }
            for (int j = i; j < i + k; j++) {
                const struct lora_ad *g = &l->fad[j];
                size_t out =
                    (size_t)g->out_full / (g->split == MODEL_SPLIT_COLUMN ? (size_t)tp : 1);
                offB[j] = off;
                off = align_up(off + out * (size_t)l->r);
            }
        }
        i += k;
    }
    return off;
}

/* A checkpoint of another layout (dp, tp, pp, ZeRO stage or world): every
 * rank reads every rank's shard, assembles each (tp, pp) arena of the old
 * layout, places its pieces in the full arena (tp_unslice, as at export),
 * then takes its own shares and shard (the same values at any layout, as
 * the optimizer is elementwise). 0 or -1. */
static int load_resharded(struct lora *l, const char *dir, int world, int otp, int opp, char *err,
                          size_t errlen) {
    size_t F = l->full_total ? l->full_total : 1, n = l->sh_n;
    size_t *offA = calloc((size_t)l->nf + 1, sizeof *offA);
    size_t *offB = calloc((size_t)l->nf + 1, sizeof *offB);
    float *full = calloc(3 * F, sizeof *full), *src = NULL, *tmp = NULL;
    float *loc = malloc(3 * (l->total ? l->total : 1) * sizeof *loc);
    float *h = malloc((n ? n : 1) * 3 * sizeof *h);
    char *seen = NULL;
    struct ckpt_reader *r = NULL;
    int rc = -1;
    static const char *const names[3] = {"lora_master", "lora_adam_m", "lora_adam_v"};
    if (!offA || !offB || !full || !loc || !h) goto nomem;
    for (int t = 0; t < otp; t++)
        for (int st = 0; st < opp; st++) {
            size_t T = layout_offsets(l, otp, opp, st, offA, offB);
            free(src);
            free(seen);
            src = malloc(3 * (T ? T : 1) * sizeof *src);
            seen = calloc(T ? T : 1, 1);
            if (!src || !seen) goto nomem;
            for (int k = 0; k < world; k++) {
                if (ckpt_open(dir, k, &r, err, errlen) != 0) goto out;
                const json_t *rm = ckpt_rank_meta(r), *meta = json_object_get(rm, "lora");
                size_t off = (size_t)json_integer_value(json_object_get(meta, "offset"));
                size_t cnt = (size_t)json_integer_value(json_object_get(meta, "count"));
                size_t tot = (size_t)json_integer_value(json_object_get(meta, "total"));
                if (json_integer_value(json_object_get(rm, "tp")) != t ||
                    json_integer_value(json_object_get(rm, "pp")) != st) {
                    ckpt_close(r);
                    r = NULL;
                    continue;
                }
                if (tot != T || off + cnt > T) {
                    snprintf(err, errlen,
                             "%s rank %d holds LoRA adapter state total=%zu [%zu, %zu), but "
                             "train.lora at tp=%d pp=%d places %zu (resume with the same "
                             "train.lora)",
                             dir, k, tot, off, off + cnt, otp, opp, T);
                    goto out;
                }
                free(tmp);
                if (!(tmp = malloc((cnt ? cnt : 1) * sizeof *tmp))) goto nomem;
                for (int q = 0; q < 3; q++) {
                    if (ckpt_read_f32(r, names[q], tmp, cnt, err, errlen) != 0) goto out;
                    memcpy(src + (size_t)q * T + off, tmp, cnt * sizeof *tmp);
                }
                memset(seen + off, 1, cnt);
                ckpt_close(r);
                r = NULL;
            }
            for (int i = 0; i < l->nf; i++) {
                const struct lora_ad *f = &l->fad[i];
                if (offA[i] == (size_t)-1) continue;
                int row = f->split == MODEL_SPLIT_ROW, col = f->split == MODEL_SPLIT_COLUMN;
                struct model_tensor ta = piece(l->r, f->in_full, l->r, f->in_full / (row ? otp : 1),
                                               row ? MODEL_SPLIT_ROW : MODEL_SPLIT_REPLICATED, 1);
                struct model_tensor tb =
                    piece(f->out_full, l->r, f->out_full / (col ? otp : 1), l->r,
                          col ? MODEL_SPLIT_COLUMN : MODEL_SPLIT_REPLICATED, col ? f->parts : 1);
                if (!seen[offA[i]] || !seen[offB[i]]) {
                    snprintf(err, errlen, "%s: the adapter of %s (tp rank %d) is in no shard", dir,
                             f->base, t);
                    goto out;
                }
                for (int q = 0; q < 3; q++) {
                    tp_unslice(&ta, otp, t, src + (size_t)q * T + offA[i],
                               full + (size_t)q * F + f->fofA);
                    tp_unslice(&tb, otp, t, src + (size_t)q * T + offB[i],
                               full + (size_t)q * F + f->fofB);
                }
            }
        }
    for (int q = 0; q < 3; q++) {
        full_to_local(l, full + (size_t)q * F, loc);
        memcpy(h + (size_t)q * n, loc + l->sh_off, n * sizeof *h);
    }
    rc = put_state(l, h, dir, err, errlen);
    goto out;
nomem:
    snprintf(err, errlen, "out of memory reading %s", dir);
out:
    ckpt_close(r);
    free(offA);
    free(offB);
    free(full);
    free(src);
    free(tmp);
    free(loc);
    free(h);
    free(seen);
    return rc;
}

int lora_ckpt_load(struct lora *l, const char *dir, int rank, char *err, size_t errlen) {
    struct ckpt_reader *r = NULL;
    int rc = -1;
    size_t n = l->sh_n;
    float *h = malloc((n ? n : 1) * 3 * sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* rank 0's record says which layout wrote it */
    if (ckpt_open(dir, 0, &r, err, errlen) != 0) goto out;
    const json_t *m0 = json_object_get(ckpt_rank_meta(r), "lora");
    const json_t *lay = json_object_get(ckpt_manifest(r), "layout");
    int world = ckpt_world(r);
    int otp = json_object_get(m0, "tp") ? (int)json_integer_value(json_object_get(m0, "tp")) : 1;
    int opp = json_object_get(m0, "pp") ? (int)json_integer_value(json_object_get(m0, "pp")) : 1;
    int same = world == l->m->e->world && otp == l->tp && opp == l->pp &&
               json_integer_value(json_object_get(lay, "dp")) == l->m->e->dp &&
               json_integer_value(json_object_get(m0, "zero_stage")) == l->zero;
    if (m0 &&
        (json_integer_value(json_object_get(m0, "rank")) != l->r ||
         fabs(json_number_value(json_object_get(m0, "alpha")) - l->alpha) > 1e-9 * l->alpha)) {
        snprintf(err, errlen,
                 "%s holds LoRA adapters of rank %lld alpha %g, but train.lora has rank=%d "
                 "alpha=%g (resume with the same train.lora)",
                 dir, (long long)json_integer_value(json_object_get(m0, "rank")),
                 json_number_value(json_object_get(m0, "alpha")), l->r, l->alpha);
        goto out;
    }
    int have = m0 != NULL;
    ckpt_close(r); /* m0 pointed into r */
    r = NULL;
    if (have && !same) {
        rc = load_resharded(l, dir, world, otp, opp, err, errlen);
        goto out;
    }
    if (ckpt_open(dir, rank, &r, err, errlen) != 0) goto out;
    const json_t *meta = json_object_get(ckpt_rank_meta(r), "lora");
    json_int_t total = json_integer_value(json_object_get(meta, "total"));
    json_int_t off = json_integer_value(json_object_get(meta, "offset"));
    json_int_t cnt = json_integer_value(json_object_get(meta, "count"));
    /* tp / pp: written since the adapters split over them (absent: 1) */
    const json_t *jtp = json_object_get(meta, "tp"), *jpp = json_object_get(meta, "pp");
    int ctp = jtp ? (int)json_integer_value(jtp) : 1, cpp = jpp ? (int)json_integer_value(jpp) : 1;
    if (meta && (ctp != l->tp || cpp != l->pp)) {
        snprintf(err, errlen,
                 "%s holds LoRA adapter shares of tp=%d pp=%d, but this run has tp=%d pp=%d "
                 "(resume with the same layout, or continue from its PEFT export)",
                 dir, ctp, cpp, l->tp, l->pp);
        goto out;
    }
    if (!meta || (size_t)total != l->total || (size_t)off != l->sh_off || (size_t)cnt != n) {
        snprintf(err, errlen,
                 "%s holds LoRA adapter state total=%lld offset=%lld count=%lld for rank %d, but "
                 "this run's adapters have total=%zu offset=%zu count=%zu (resume with the same "
                 "train.lora, dp, tp, pp and zero_stage, or continue from its PEFT export)",
                 dir, (long long)total, (long long)off, (long long)cnt, rank, l->total, l->sh_off,
                 n);
        goto out;
    }
    if (ckpt_read_f32(r, "lora_master", h, n, err, errlen) != 0 ||
        ckpt_read_f32(r, "lora_adam_m", h + n, n, err, errlen) != 0 ||
        ckpt_read_f32(r, "lora_adam_v", h + 2 * n, n, err, errlen) != 0)
        goto out;
    rc = put_state(l, h, dir, err, errlen);
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
    struct st_tensor *ts = calloc((size_t)l->nf * 2 + 1, sizeof *ts);
    char(*names)[MODEL_TENSOR_MAX + 48] = calloc((size_t)l->nf * 2 + 1, sizeof *names);
    float *h = malloc((l->full_total ? l->full_total : 1) * sizeof *h);
    json_t *cfg = NULL, *mods = NULL;
    if (!ts || !names || !h || get_full(l, h) != 0) {
        snprintf(err, errlen, "out of memory or a failed gather of the adapters");
        goto out;
    }
    if (l->m->e->rank != 0) { /* the gather is collective; rank 0 writes */
        rc = 0;
        goto out;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        goto out;
    }
    for (int i = 0; i < l->nf; i++) {
        const struct lora_ad *a = &l->fad[i];
        peft_name(names[2 * i], sizeof names[0], a->base, "lora_A");
        peft_name(names[2 * i + 1], sizeof names[0], a->base, "lora_B");
        ts[2 * i] = (struct st_tensor){.name = names[2 * i],
                                       .dtype = ST_F32,
                                       .src_dtype = ST_F32,
                                       .ndim = 2,
                                       .shape = {l->r, a->in_full},
                                       .data = h + a->fofA};
        ts[2 * i + 1] = (struct st_tensor){.name = names[2 * i + 1],
                                           .dtype = ST_F32,
                                           .src_dtype = ST_F32,
                                           .ndim = 2,
                                           .shape = {a->out_full, l->r},
                                           .data = h + a->fofB};
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (st_write(path, ts, (size_t)l->nf * 2, NULL, NULL, NULL, err, errlen) != 0) goto out;
    mods = json_array();
    const struct lora_target *tab = l->gpt2 ? targets_gpt2 : targets_llama;
    for (const struct lora_target *tg = tab; tg->spec; tg++)
        for (int i = 0; i < l->nf; i++)
            if (l->fad[i].tg == tg) {
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
    float *full = calloc(l->full_total ? l->full_total : 1, sizeof *full);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *cfg = json_load_file(path, 0, &je);
    if (!h || !full) {
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
    /* whole tensors (every rank reads the file), then this rank's shares */
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        char na[MODEL_TENSOR_MAX + 48], nb[MODEL_TENSOR_MAX + 48];
        peft_name(na, sizeof na, a->base, "lora_A");
        peft_name(nb, sizeof nb, a->base, "lora_B");
        if (peft_tensor(path, sf, na, l->r, a->in_full, full + a->fofA, err, errlen) != 0 ||
            peft_tensor(path, sf, nb, a->out_full, l->r, full + a->fofB, err, errlen) != 0)
            goto out;
    }
    full_to_local(l, full, h);
    if (lora_set_values(l, h) != 0) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    rc = 0;
out:
    st_close(sf);
    json_decref(cfg);
    free(h);
    free(full);
    return rc;
}

/* w[out x in] += (alpha/r) B A of adapter a, B and A from the host values h
 * (accumulated in double). */
static void add_delta(const struct lora *l, const struct lora_ad *a, const float *h, float *w) {
    const float *A = h + a->offA, *B = h + a->offB;
    for (int o = 0; o < a->out; o++)
        for (int c = 0; c < a->in; c++) {
            double acc = 0;
            for (int j = 0; j < l->r; j++)
                acc += (double)B[(size_t)o * l->r + j] * A[(size_t)j * a->in + c];
            w[(size_t)o * a->in + c] += (float)(l->scale * acc);
        }
}

/* nf4_set_delta's hook: the adapter of `tensor`, if any, onto its
 * dequantized weight w. */
static void merge_delta(void *user, int tensor, float *w) {
    const struct lora *l = user;
    for (int i = 0; i < l->n; i++)
        if (l->ad[i].tensor == tensor) add_delta(l, &l->ad[i], l->merge_h, w);
}

int lora_merge(struct lora *l) {
    struct engine *e = l->m->e;
    int rc = -1;
    size_t maxn = 1;
    for (int i = 0; i < l->n; i++) {
        size_t n = (size_t)l->ad[i].out * l->ad[i].in;
        if (n > maxn) maxn = n;
    }
    float *w = NULL;
    float *h = malloc((l->total ? l->total : 1) * sizeof *h);
    if (!h || get_values(l, h) != 0) goto out;
    if (e->nf4) {
        /* QLoRA: an NF4 weight's dequant(base) + (alpha/r) B A is computed as
         * the exporter reads it (worker/nf4.h nf4_set_delta), not quantized
         * again; the values stay for that */
        free(l->merge_h);
        l->merge_h = h;
        h = NULL;
        nf4_set_delta(e->nf4, merge_delta, l);
    }
    const float *vals = e->nf4 ? l->merge_h : h;
    if (!(w = malloc(maxn * sizeof *w))) goto out;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        const struct model_tensor *t = &e->layout.t[a->tensor];
        size_t off = (size_t)t->rank_offset, n = (size_t)a->out * a->in;
        if (e->nf4 && nf4_is_quantized(e, a->tensor)) continue; /* merge_delta's */
        engine_opt_read(e, ENGINE_OPT_MASTER, w, off - e->shard_off, n);
        add_delta(l, a, vals, w);
        if (engine_params_from_host(e, off, w, n) != 0) goto out;
    }
    rc = 0;
out:
    free(w);
    free(h);
    return rc;
}
