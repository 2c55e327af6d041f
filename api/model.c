/* Model presets and the parameter layout table (see model.h for the
 * conventions). The layout is built by two table-driven passes: the list of
 * per-block tensors of each family, then the non-block tensors around them.
 * Shapes are expressed in terms of a few symbolic sizes (d_model, d_ff, the
 * q/kv widths, vocab, positions) so one table row describes every layer. */
#include "api/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT2(L, H, C, V, T)                                                                        \
    {                                                                                              \
        .family = MODEL_GPT2, .n_layer = L, .n_head = H, .n_kv_head = H, .d_model = C,             \
        .d_ff = 4 * (C), .vocab_size = V,                                                          \
        .padded_vocab = ((V) + MODEL_VOCAB_PAD - 1) / MODEL_VOCAB_PAD * MODEL_VOCAB_PAD,           \
        .seq_len = T, .tied_embeddings = 1, .bias = 1, .norm = MODEL_NORM_LAYERNORM,               \
        .act = MODEL_ACT_GELU, .pos = MODEL_POS_LEARNED, .rope_theta = 0, .norm_eps = 1e-5         \
    }

#define LLAMA(L, H, KV, C, F, V, T, TIED, THETA)                                                   \
    {                                                                                              \
        .family = MODEL_LLAMA, .n_layer = L, .n_head = H, .n_kv_head = KV, .d_model = C,           \
        .d_ff = F, .vocab_size = V,                                                                \
        .padded_vocab = ((V) + MODEL_VOCAB_PAD - 1) / MODEL_VOCAB_PAD * MODEL_VOCAB_PAD,           \
        .seq_len = T, .tied_embeddings = TIED, .bias = 0, .norm = MODEL_NORM_RMSNORM,              \
        .act = MODEL_ACT_SWIGLU, .pos = MODEL_POS_ROPE, .rope_theta = THETA, .norm_eps = 1e-5      \
    }

/* Shapes follow the published models (GPT-2 paper / HF configs; Llama 2,
 * Code Llama, Llama 3.x model cards). Sequence lengths are training
 * defaults, overridable in the spec. */
static const struct model_preset presets[] = {
    {"124m", "GPT-2 small", GPT2(12, 12, 768, 50257, 1024)},
    {"350m", "GPT-2 medium", GPT2(24, 16, 1024, 50257, 1024)},
    {"774m", "GPT-2 large", GPT2(36, 20, 1280, 50257, 1024)},
    {"1558m", "GPT-2 XL", GPT2(48, 25, 1600, 50257, 1024)},
    {"tiny", "test size: 2 layers, d_model 64", GPT2(2, 4, 64, 512, 64)},
    {"mini", "test size: 4 layers, d_model 128", GPT2(4, 4, 128, 1024, 128)},
    {"1b", "Llama 3.2 1B", LLAMA(16, 32, 8, 2048, 8192, 128256, 4096, 1, 500000.0)},
    {"3b", "Llama 3.2 3B", LLAMA(28, 24, 8, 3072, 8192, 128256, 4096, 1, 500000.0)},
    {"7b", "Llama 2 7B", LLAMA(32, 32, 32, 4096, 11008, 32000, 4096, 0, 10000.0)},
    {"8b", "Llama 3 8B", LLAMA(32, 32, 8, 4096, 14336, 128256, 8192, 0, 500000.0)},
    {"13b", "Llama 2 13B", LLAMA(40, 40, 40, 5120, 13824, 32000, 4096, 0, 10000.0)},
    {"34b", "Code Llama 34B", LLAMA(48, 64, 8, 8192, 22016, 32000, 4096, 0, 1000000.0)},
    {"70b", "Llama 2 70B", LLAMA(80, 64, 8, 8192, 28672, 32000, 4096, 0, 10000.0)},
    {"405b", "Llama 3.1 405B", LLAMA(126, 128, 8, 16384, 53248, 128256, 8192, 0, 500000.0)},
    {"tiny", "test size: 2 layers, d_model 64, GQA 4/2",
     LLAMA(2, 4, 2, 64, 176, 512, 64, 0, 10000.0)},
    {"mini", "test size: 4 layers, d_model 128, GQA 8/4",
     LLAMA(4, 8, 4, 128, 352, 1024, 128, 0, 10000.0)},
};

const struct model_preset *model_presets(size_t *n) {
    *n = sizeof presets / sizeof *presets;
    return presets;
}

const struct model_preset *model_preset_find(enum model_family family, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (presets[i].config.family == family && strcmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}

const char *model_family_name(enum model_family f) {
    return f == MODEL_LLAMA ? "llama" : "gpt2";
}

int model_family_parse(const char *s) {
    if (strcmp(s, "gpt2") == 0) return MODEL_GPT2;
    if (strcmp(s, "llama") == 0) return MODEL_LLAMA;
    return -1;
}

void model_config_family_defaults(struct model_config *c, enum model_family f) {
    c->family = f;
    c->norm_eps = 1e-5;
    if (f == MODEL_GPT2) {
        c->tied_embeddings = 1;
        c->bias = 1;
        c->norm = MODEL_NORM_LAYERNORM;
        c->act = MODEL_ACT_GELU;
        c->pos = MODEL_POS_LEARNED;
        c->rope_theta = 0;
    } else {
        c->tied_embeddings = 0;
        c->bias = 0;
        c->norm = MODEL_NORM_RMSNORM;
        c->act = MODEL_ACT_SWIGLU;
        c->pos = MODEL_POS_ROPE;
        c->rope_theta = 10000.0;
    }
}

void model_config_finalize(struct model_config *c) {
    int64_t v = c->vocab_size > 0 ? c->vocab_size : 0;
    c->padded_vocab = (int)((v + MODEL_VOCAB_PAD - 1) / MODEL_VOCAB_PAD * MODEL_VOCAB_PAD);
}

int model_config_check(const struct model_config *c, char *err, size_t errlen, const char **field) {
    const char *f = NULL;
    if (c->n_layer <= 0 || c->n_layer > 1024)
        f = "n_layer";
    else if (c->n_head <= 0 || c->n_head > 1024)
        f = "n_head";
    else if (c->n_kv_head <= 0 || c->n_kv_head > 1024)
        f = "n_kv_head";
    else if (c->d_model <= 0 || c->d_model > 65536)
        f = "d_model";
    else if (c->d_ff <= 0 || c->d_ff > 1048576)
        f = "d_ff";
    else if (c->vocab_size <= 0 || c->vocab_size > 4194304)
        f = "vocab_size";
    else if (c->seq_len <= 0 || c->seq_len > 1048576)
        f = "seq_len";
    if (f) {
        snprintf(err, errlen, "%s is out of range (sizes must be positive and bounded)", f);
        goto fail;
    }
    if (c->d_model % c->n_head != 0) {
        f = "n_head";
        snprintf(err, errlen, "n_head=%d does not divide d_model=%d", c->n_head, c->d_model);
        goto fail;
    }
    if (c->n_head % c->n_kv_head != 0) {
        f = "n_kv_head";
        snprintf(err, errlen, "n_kv_head=%d does not divide n_head=%d", c->n_kv_head, c->n_head);
        goto fail;
    }
    if (c->pos == MODEL_POS_ROPE && (c->d_model / c->n_head) % 2 != 0) {
        f = "n_head";
        snprintf(err, errlen, "RoPE needs an even head dim; d_model=%d / n_head=%d = %d",
                 c->d_model, c->n_head, c->d_model / c->n_head);
        goto fail;
    }
    if (c->family == MODEL_GPT2 && c->n_kv_head != c->n_head) {
        f = "n_kv_head";
        snprintf(err, errlen, "gpt2 has no grouped-query attention: n_kv_head=%d != n_head=%d",
                 c->n_kv_head, c->n_head);
        goto fail;
    }
    if (field) *field = NULL;
    return 0;
fail:
    if (field) *field = f;
    return -1;
}

void model_rope_inv_freq(const struct model_config *c, int HD, double *inv) {
    const double pi = 3.14159265358979323846;
    for (int d = 0; d < HD / 2; d++) {
        double f = pow(c->rope_theta, -2.0 * d / HD);
        if (c->rope_scaling == MODEL_ROPE_SCALE_LLAMA3) {
            double lo_wl = c->rope_original_max_pos / c->rope_low_freq_factor;
            double hi_wl = c->rope_original_max_pos / c->rope_high_freq_factor;
            double wl = 2 * pi / f;
            if (wl > lo_wl) {
                f /= c->rope_factor;
            } else if (wl >= hi_wl) { /* medium band: interpolate */
                double s = (c->rope_original_max_pos / wl - c->rope_low_freq_factor) /
                           (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - s) * f / c->rope_factor + s * f;
            }
        }
        inv[d] = f;
    }
}

/* ---- layout ---- */

/* Symbolic sizes a table row refers to. */
enum dim_sym { D_NONE, D_C, D_F, D_Q, D_KV, D_QKV, D_V, D_T };

struct row {
    const char *suffix; /* appended to the block prefix */
    enum model_tensor_kind kind;
    enum dim_sym d0, d1; /* d1 == D_NONE: 1-D */
    enum model_split split;
    int parts;
    int need_bias; /* only when config.bias */
};

static const struct row gpt2_block[] = {
    {"ln_1.weight", MODEL_T_NORM_W, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 0},
    {"ln_1.bias", MODEL_T_NORM_B, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 1},
    {"attn.c_attn.weight", MODEL_T_LINEAR_W, D_QKV, D_C, MODEL_SPLIT_COLUMN, 3, 0},
    {"attn.c_attn.bias", MODEL_T_LINEAR_B, D_QKV, D_NONE, MODEL_SPLIT_COLUMN, 3, 1},
    {"attn.c_proj.weight", MODEL_T_LINEAR_W, D_C, D_Q, MODEL_SPLIT_ROW, 1, 0},
    {"attn.c_proj.bias", MODEL_T_LINEAR_B, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 1},
    {"ln_2.weight", MODEL_T_NORM_W, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 0},
    {"ln_2.bias", MODEL_T_NORM_B, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 1},
    {"mlp.c_fc.weight", MODEL_T_LINEAR_W, D_F, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"mlp.c_fc.bias", MODEL_T_LINEAR_B, D_F, D_NONE, MODEL_SPLIT_COLUMN, 1, 1},
    {"mlp.c_proj.weight", MODEL_T_LINEAR_W, D_C, D_F, MODEL_SPLIT_ROW, 1, 0},
    {"mlp.c_proj.bias", MODEL_T_LINEAR_B, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 1},
};

static const struct row llama_block[] = {
    {"input_layernorm.weight", MODEL_T_NORM_W, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 0},
    {"self_attn.q_proj.weight", MODEL_T_LINEAR_W, D_Q, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.k_proj.weight", MODEL_T_LINEAR_W, D_KV, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.v_proj.weight", MODEL_T_LINEAR_W, D_KV, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.o_proj.weight", MODEL_T_LINEAR_W, D_C, D_Q, MODEL_SPLIT_ROW, 1, 0},
    {"post_attention_layernorm.weight", MODEL_T_NORM_W, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 0},
    {"mlp.gate_proj.weight", MODEL_T_LINEAR_W, D_F, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"mlp.up_proj.weight", MODEL_T_LINEAR_W, D_F, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"mlp.down_proj.weight", MODEL_T_LINEAR_W, D_C, D_F, MODEL_SPLIT_ROW, 1, 0},
};

/* Qwen2: the llama block with q/k/v biases, stored after the three weights so
 * that the weights stay adjacent (q|k|v) and so do the biases. */
static const struct row qwen2_block[] = {
    {"input_layernorm.weight", MODEL_T_NORM_W, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 0},
    {"self_attn.q_proj.weight", MODEL_T_LINEAR_W, D_Q, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.k_proj.weight", MODEL_T_LINEAR_W, D_KV, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.v_proj.weight", MODEL_T_LINEAR_W, D_KV, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.q_proj.bias", MODEL_T_LINEAR_B, D_Q, D_NONE, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.k_proj.bias", MODEL_T_LINEAR_B, D_KV, D_NONE, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.v_proj.bias", MODEL_T_LINEAR_B, D_KV, D_NONE, MODEL_SPLIT_COLUMN, 1, 0},
    {"self_attn.o_proj.weight", MODEL_T_LINEAR_W, D_C, D_Q, MODEL_SPLIT_ROW, 1, 0},
    {"post_attention_layernorm.weight", MODEL_T_NORM_W, D_C, D_NONE, MODEL_SPLIT_REPLICATED, 1, 0},
    {"mlp.gate_proj.weight", MODEL_T_LINEAR_W, D_F, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"mlp.up_proj.weight", MODEL_T_LINEAR_W, D_F, D_C, MODEL_SPLIT_COLUMN, 1, 0},
    {"mlp.down_proj.weight", MODEL_T_LINEAR_W, D_C, D_F, MODEL_SPLIT_ROW, 1, 0},
};

static int64_t dim_value(const struct model_config *c, enum dim_sym d) {
    switch (d) {
    case D_C:
        return c->d_model;
    case D_F:
        return c->d_ff;
    case D_Q:
        return (int64_t)c->n_head * model_head_dim(c);
    case D_KV:
        return model_kv_dim(c);
    case D_QKV:
        return (int64_t)c->n_head * model_head_dim(c) + 2 * (int64_t)model_kv_dim(c);
    case D_V:
        return c->padded_vocab;
    case D_T:
        return c->seq_len;
    default:
        return 0;
    }
}

/* Fill shape/rank shape of tensor `t` from the row-like description.
 * Returns -1 when tp does not divide the split dimension. */
static int set_shape(struct model_tensor *t, int64_t d0, int64_t d1, enum model_split split,
                     int parts, int tp) {
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 > 0 ? d1 : 1;
    t->numel = t->shape[0] * t->shape[1];
    t->split = split;
    t->parts = parts;
    t->rank_shape[0] = t->shape[0];
    t->rank_shape[1] = t->shape[1];
    switch (split) {
    case MODEL_SPLIT_COLUMN:
        if (d0 % ((int64_t)parts * tp) != 0) return -1;
        t->rank_shape[0] = d0 / tp;
        break;
    case MODEL_SPLIT_ROW:
        if (d1 % tp != 0) return -1;
        t->rank_shape[1] = d1 / tp;
        break;
    case MODEL_SPLIT_VOCAB:
        t->rank_shape[0] = (d0 + tp - 1) / tp;
        break;
    default:
        break;
    }
    t->rank_numel = t->rank_shape[0] * t->rank_shape[1];
    return 0;
}

static int push(struct model_layout *l, int cap, const char *name, enum model_tensor_kind kind,
                int layer, int64_t d0, int64_t d1, enum model_split split, int parts, int tp) {
    if (l->n >= cap) return -1;
    struct model_tensor *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->layer = layer;
    t->decay = kind == MODEL_T_LINEAR_W || kind == MODEL_T_LM_HEAD;
    if (set_shape(t, d0, d1, split, parts, tp) != 0) return -1;
    t->offset = l->numel;
    t->rank_offset = l->rank_numel;
    l->numel += t->numel;
    l->rank_numel += t->rank_numel;
    l->n++;
    return 0;
}

int model_layout_init(struct model_layout *l, const struct model_config *c, int tp) {
    memset(l, 0, sizeof *l);
    if (tp < 1 || c->n_layer <= 0 || c->n_head <= 0 || c->n_kv_head <= 0 || c->d_model <= 0)
        return -1;
    int gpt2 = c->family == MODEL_GPT2;
    const struct row *blk = gpt2 ? gpt2_block : c->qkv_bias ? qwen2_block : llama_block;
    size_t nblk = gpt2          ? sizeof gpt2_block / sizeof *gpt2_block
                  : c->qkv_bias ? sizeof qwen2_block / sizeof *qwen2_block
                                : sizeof llama_block / sizeof *llama_block;
    int cap = (int)nblk * c->n_layer + 6;
    l->t = calloc((size_t)cap, sizeof *l->t);
    if (!l->t) return -1;
    l->tp = tp;
    char name[MODEL_TENSOR_MAX];
    int rc = 0;

    if (gpt2) {
        rc |= push(l, cap, "transformer.wte.weight", MODEL_T_EMBED, -1, c->padded_vocab, c->d_model,
                   MODEL_SPLIT_VOCAB, 1, tp);
        if (c->pos == MODEL_POS_LEARNED)
            rc |= push(l, cap, "transformer.wpe.weight", MODEL_T_POS, -1, c->seq_len, c->d_model,
                       MODEL_SPLIT_REPLICATED, 1, tp);
    } else {
        rc |= push(l, cap, "model.embed_tokens.weight", MODEL_T_EMBED, -1, c->padded_vocab,
                   c->d_model, MODEL_SPLIT_VOCAB, 1, tp);
    }
    for (int i = 0; i < c->n_layer && rc == 0; i++) {
        for (size_t r = 0; r < nblk; r++) {
            const struct row *w = &blk[r];
            if (w->need_bias && !c->bias) continue;
            snprintf(name, sizeof name, "%s.%d.%s", gpt2 ? "transformer.h" : "model.layers", i,
                     w->suffix);
            rc |= push(l, cap, name, w->kind, i, dim_value(c, w->d0), dim_value(c, w->d1), w->split,
                       w->parts, tp);
        }
    }
    if (gpt2) {
        rc |= push(l, cap, "transformer.ln_f.weight", MODEL_T_NORM_W, -1, c->d_model, 0,
                   MODEL_SPLIT_REPLICATED, 1, tp);
        if (c->bias)
            rc |= push(l, cap, "transformer.ln_f.bias", MODEL_T_NORM_B, -1, c->d_model, 0,
                       MODEL_SPLIT_REPLICATED, 1, tp);
    } else {
        rc |= push(l, cap, "model.norm.weight", MODEL_T_NORM_W, -1, c->d_model, 0,
                   MODEL_SPLIT_REPLICATED, 1, tp);
    }
    if (!c->tied_embeddings)
        rc |= push(l, cap, "lm_head.weight", MODEL_T_LM_HEAD, -1, c->padded_vocab, c->d_model,
                   MODEL_SPLIT_VOCAB, 1, tp);
    if (rc != 0) {
        model_layout_free(l);
        return -1;
    }
    return 0;
}

void model_layout_free(struct model_layout *l) {
    if (!l) return;
    free(l->t);
    memset(l, 0, sizeof *l);
}

void model_stage_layers(const struct model_config *c, int pp, int stage, int *l0, int *l1) {
    int L = c->n_layer;
    if (pp <= 1 || L < pp) {
        *l0 = pp <= 1 || stage == 0 ? 0 : L;
        *l1 = L;
        return;
    }
    if (!c->pp_balance) {
        int per = L / pp;
        *l0 = stage * per;
        *l1 = stage == pp - 1 ? L : *l0 + per;
        return;
    }
    /* block work per token, as the planner counts it (api/planner.c) */
    double C = c->d_model, T = c->seq_len, hd = C / c->n_head;
    double mlp = c->act == MODEL_ACT_SWIGLU ? 3.0 * C * c->d_ff : 2.0 * C * c->d_ff;
    double attn = C * (c->n_head + 2.0 * c->n_kv_head) * hd + C * C;
    double block = 6 * (mlp + attn) + 12 * C * T, head = 6.0 * c->padded_vocab * C;
    enum { MAXPP = 1024 };
    int n[MAXPP];
    double w[MAXPP];
    if (pp > MAXPP) pp = MAXPP;
    for (int s = 0; s < pp; s++) {
        n[s] = 1;
        w[s] = block + (s == pp - 1 ? head : 0);
    }
    for (int k = pp; k < L; k++) {
        int best = 0;
        for (int s = 1; s < pp; s++)
            if (w[s] < w[best]) best = s;
        n[best]++;
        w[best] += block;
    }
    int lo = 0;
    for (int s = 0; s < stage && s < pp; s++)
        lo += n[s];
    *l0 = lo;
    *l1 = stage < pp ? lo + n[stage] : L;
}

int model_tensor_on_stage(const struct model_config *c, const struct model_tensor *t, int pp,
                          int stage) {
    if (pp < 1 || stage < 0 || stage >= pp) return 0;
    if (t->layer >= 0) {
        int l0, l1;
        model_stage_layers(c, pp, stage, &l0, &l1);
        return t->layer >= l0 && t->layer < l1;
    }
    switch (t->kind) {
    case MODEL_T_EMBED:
        return stage == 0 || (c->tied_embeddings && stage == pp - 1);
    case MODEL_T_POS:
        return stage == 0;
    default: /* final norm, lm_head */
        return stage == pp - 1;
    }
}

int64_t model_layout_stage_numel(const struct model_layout *l, const struct model_config *c, int pp,
                                 int stage) {
    int64_t n = 0;
    for (int i = 0; i < l->n; i++)
        if (model_tensor_on_stage(c, &l->t[i], pp, stage)) n += l->t[i].rank_numel;
    return n;
}

/* Totals from a one-block layout (every block has the same tensors), so the
 * cost does not grow with depth; test_model checks them against the full
 * table. */
static int count_params(const struct model_config *c, int64_t *total, int64_t *matmul) {
    struct model_config one = *c;
    one.n_layer = 1;
    struct model_layout l;
    if (c->n_layer <= 0 || model_layout_init(&l, &one, 1) != 0) return -1;
    int64_t outer = 0, block = 0, mm_outer = 0, mm_block = 0;
    for (int i = 0; i < l.n; i++) {
        const struct model_tensor *t = &l.t[i];
        int mm = t->kind == MODEL_T_LINEAR_W || t->kind == MODEL_T_LM_HEAD ||
                 (t->kind == MODEL_T_EMBED && c->tied_embeddings);
        if (t->layer == 0) {
            block += t->numel;
            mm_block += mm ? t->numel : 0;
        } else {
            outer += t->numel;
            mm_outer += mm ? t->numel : 0;
        }
    }
    model_layout_free(&l);
    *total = outer + (int64_t)c->n_layer * block;
    *matmul = mm_outer + (int64_t)c->n_layer * mm_block;
    return 0;
}

int64_t model_n_params(const struct model_config *c) {
    int64_t n, mm;
    return count_params(c, &n, &mm) == 0 ? n : -1;
}

int64_t model_n_matmul_params(const struct model_config *c) {
    int64_t n, mm;
    return count_params(c, &n, &mm) == 0 ? mm : -1;
}

double model_flops_per_token(const struct model_config *c, int T) {
    int64_t n = model_n_matmul_params(c);
    if (n < 0) return 0;
    return 6.0 * (double)n + 12.0 * c->n_layer * (double)c->d_model * T;
}

int model_lora_site(const struct model_config *c, const char *target, int64_t *in, int64_t *out,
                    int *row) {
    int64_t C = c->d_model, hd = c->d_model / c->n_head, F = c->d_ff;
    int64_t q = c->n_head * hd, kv = c->n_kv_head * hd;
    static const struct {
        const char *name;
        int family;  /* enum model_family */
        int in, out; /* 0 C, 1 q, 2 kv, 3 F, 4 q + 2 kv */
    } tab[] = {{"q", MODEL_LLAMA, 0, 1},    {"k", MODEL_LLAMA, 0, 2},    {"v", MODEL_LLAMA, 0, 2},
               {"o", MODEL_LLAMA, 1, 0},    {"gate", MODEL_LLAMA, 0, 3}, {"up", MODEL_LLAMA, 0, 3},
               {"down", MODEL_LLAMA, 3, 0}, {"attn", MODEL_GPT2, 0, 4},  {"proj", MODEL_GPT2, 1, 0},
               {"fc", MODEL_GPT2, 0, 3},    {"fc2", MODEL_GPT2, 3, 0}};
    int64_t dim[5] = {C, q, kv, F, q + 2 * kv};
    for (size_t k = 0; k < sizeof tab / sizeof *tab; k++)
        if ((int)c->family == tab[k].family && strcmp(target, tab[k].name) == 0) {
            *in = dim[tab[k].in];
            *out = dim[tab[k].out];
            *row = tab[k].out == 0;
            return 0;
        }
    return -1;
}

int64_t model_lora_params(const struct model_config *c, int rank, const char *const *targets,
                          int n_targets) {
    int64_t n = 0, in, out;
    int row;
    for (int i = 0; i < n_targets; i++) {
        if (model_lora_site(c, targets[i], &in, &out, &row) != 0) return -1;
        n += (int64_t)rank * (in + out);
    }
    return n * c->n_layer;
}

double model_lora_flops_per_token(const struct model_config *c, int T, int64_t n_adapter) {
    int64_t n = model_n_matmul_params(c);
    if (n < 0 || n_adapter < 0) return 0;
    return 4.0 * (double)n + 6.0 * (double)n_adapter + 12.0 * c->n_layer * (double)c->d_model * T;
}
