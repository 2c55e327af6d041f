/* Model configurations, presets and the parameter layout table.
 *
 * One description of a transformer shared by the job-spec parser, the planner
 * and the training engine. The engine allocates its flat parameter buffer by
 * walking model_layout in order, and the planner counts bytes from the same
 * table, so the memory estimate and the real allocation cannot drift apart.
 *
 * Conventions:
 * - Linear weights are stored [out, in] (nn.Linear order, as llm.c does).
 *   Hugging Face GPT-2 keeps its Conv1D weights as [in, out]; an exporter
 *   transposes attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj.
 * - Embedding and lm_head rows are padded_vocab (vocab_size rounded up to a
 *   multiple of 128); the padding rows are zero and never trained toward.
 * - Tensor parallelism (Megatron): column-split tensors are cut along dim 0
 *   (output features), row-split along dim 1 (input features), vocab-split
 *   along dim 0 (vocabulary rows). A fused tensor (`parts` > 1, the GPT-2
 *   c_attn holding q|k|v) is cut per block: rank r holds rows
 *   [r*b/tp, (r+1)*b/tp) of each of the `parts` blocks of b rows, i.e. whole
 *   heads of q, k and v.
 * - Everything here is pure and thread-safe; no globals are written. */
#ifndef LOOM_API_MODEL_H
#define LOOM_API_MODEL_H

#include <stddef.h>
#include <stdint.h>

enum model_family { MODEL_GPT2 = 0, MODEL_LLAMA = 1 };
enum model_norm { MODEL_NORM_LAYERNORM = 0, MODEL_NORM_RMSNORM = 1 };
enum model_act { MODEL_ACT_GELU = 0, MODEL_ACT_SWIGLU = 1 };
enum model_pos { MODEL_POS_LEARNED = 0, MODEL_POS_ROPE = 1 };
enum model_rope_scaling { MODEL_ROPE_SCALE_NONE = 0, MODEL_ROPE_SCALE_LLAMA3 = 1 };

#define MODEL_NAME_MAX   24
#define MODEL_VOCAB_PAD  128
#define MODEL_TENSOR_MAX 64 /* longest tensor name incl. NUL */

struct model_config {
    enum model_family family;
    char preset[MODEL_NAME_MAX]; /* preset it started from, "" for none */
    int n_layer;
    int n_head;
    int n_kv_head; /* == n_head without grouped-query attention */
    int d_model;
    int d_ff;         /* MLP hidden size (per projection for SwiGLU) */
    int vocab_size;   /* tokenizer vocabulary */
    int padded_vocab; /* vocab_size rounded up to MODEL_VOCAB_PAD */
    int seq_len;      /* training sequence length (also max positions for gpt2) */
    int tied_embeddings;
    int bias; /* linear and norm biases (gpt2 yes, llama no) */
    enum model_norm norm;
    enum model_act act;
    enum model_pos pos;
    double rope_theta; /* 0 for learned positions */
    double norm_eps;
    /* Imported Hugging Face architectures (worker/hf.h); 0 for the presets. */
    int qkv_bias; /* llama family: q_proj, k_proj, v_proj carry biases (Qwen2) */
    /* RoPE frequency scaling: MODEL_ROPE_SCALE_NONE, or LLAMA3 (Llama 3.1/3.2:
     * inverse frequencies with wavelength above original_max / low_freq_factor
     * divided by factor, below original_max / high_freq_factor kept, and
     * smoothly interpolated in between; model_rope_inv_freq). */
    int rope_scaling;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    /* Pipeline split (from the spec's parallel.pp_balance; not a model
     * property, but every stage computation reads it here): 0, n_layer/pp
     * blocks a stage; 1, blocks placed so that the stages' work, the head's
     * classifier counted on the last stage, is as even as whole blocks allow
     * (model_stage_layers). */
    int pp_balance;
};

/* Preset table entry; `config` is complete (padded_vocab filled). */
struct model_preset {
    const char *name;
    const char *description;
    struct model_config config;
};

/* The whole preset table (read-only), and its length in *n. */
const struct model_preset *model_presets(size_t *n);
/* Find preset `name` of `family`; NULL if none. */
const struct model_preset *model_preset_find(enum model_family family, const char *name);
/* Family name <-> enum: "gpt2", "llama". Parse returns -1 on unknown names. */
const char *model_family_name(enum model_family f);
int model_family_parse(const char *s);

/* Family defaults (norm, activation, positions, bias, tying, eps, theta) for a
 * config whose sizes are filled in by the caller. */
void model_config_family_defaults(struct model_config *c, enum model_family f);
/* Recompute derived fields (padded_vocab). Call after changing sizes. */
void model_config_finalize(struct model_config *c);
/* Structural sanity: positive sizes, d_model % n_head == 0, n_head % n_kv_head
 * == 0, even head dim for RoPE. Returns 0, or -1 with a message naming the
 * numbers in err. `field` (may be NULL) receives the offending field name,
 * e.g. "n_kv_head". */
int model_config_check(const struct model_config *c, char *err, size_t errlen, const char **field);

/* RoPE inverse frequencies inv[d] = theta^(-2d/HD) for d < HD/2, with the
 * config's frequency scaling applied (Hugging Face's
 * _compute_llama3_parameters for LLAMA3), in double. */
void model_rope_inv_freq(const struct model_config *c, int HD, double *inv);

static inline int model_head_dim(const struct model_config *c) {
    return c->d_model / c->n_head;
}
static inline int model_kv_dim(const struct model_config *c) {
    return c->n_kv_head * (c->d_model / c->n_head);
}

/* ---- parameter layout table ---- */

enum model_split {
    MODEL_SPLIT_REPLICATED = 0, /* whole tensor on every tp rank */
    MODEL_SPLIT_COLUMN = 1,     /* dim 0 (output features) cut across tp */
    MODEL_SPLIT_ROW = 2,        /* dim 1 (input features) cut across tp */
    MODEL_SPLIT_VOCAB = 3,      /* dim 0 (vocabulary rows) cut across tp */
};

enum model_tensor_kind {
    MODEL_T_EMBED = 0,  /* token embedding (wte / embed_tokens) */
    MODEL_T_POS = 1,    /* learned position embedding (wpe) */
    MODEL_T_NORM_W = 2, /* LayerNorm / RMSNorm scale */
    MODEL_T_NORM_B = 3, /* LayerNorm shift */
    MODEL_T_LINEAR_W = 4,
    MODEL_T_LINEAR_B = 5,
    MODEL_T_LM_HEAD = 6, /* untied output projection */
};

struct model_tensor {
    char name[MODEL_TENSOR_MAX]; /* Hugging Face name */
    enum model_tensor_kind kind;
    int layer; /* block index, -1 for embeddings, final norm, lm_head */
    int ndim;  /* 1 or 2 */
    int64_t shape[2];
    int64_t numel;
    int decay; /* AdamW weight decay applies (2-D linear weights and lm_head) */
    enum model_split split;
    int parts; /* fused blocks along the split dim (3 for gpt2 c_attn), else 1 */
    /* Shape and size held by one tp rank. Vocab-split rows are
     * ceil(padded_vocab / tp) (the last rank holds padding when tp does not
     * divide padded_vocab); other splits need exact division (the spec
     * validator enforces it). */
    int64_t rank_shape[2];
    int64_t rank_numel;
    int64_t offset;      /* element offset in the full (tp=1) flat buffer */
    int64_t rank_offset; /* element offset in one tp rank's flat buffer */
};

struct model_layout {
    int tp;
    int n;                  /* number of tensors */
    struct model_tensor *t; /* n entries in fixed order; owned by the layout */
    int64_t numel;          /* sum of numel (the model's parameter count) */
    int64_t rank_numel;     /* sum of rank_numel (one tp rank, all stages) */
};

/* Build the layout for config `c` and tensor-parallel degree tp (>= 1).
 * Order: embeddings, then per layer 0..L-1 its tensors, then final norm and
 * lm_head. Returns 0, or -1 if tp does not divide the split dimensions or on
 * allocation failure (l is then zeroed). Free with model_layout_free. */
int model_layout_init(struct model_layout *l, const struct model_config *c, int tp);
void model_layout_free(struct model_layout *l); /* accepts NULL / zeroed */

/* Blocks [*l0, *l1) of pipeline stage `stage` (0 <= stage < pp <= n_layer).
 * c->pp_balance == 0: n_layer/pp each (pp divides n_layer; the spec
 * validator checks it). 1: every stage gets at least one block, and the rest
 * go one at a time to the stage whose work is smallest so far (ties: the
 * earlier stage), with a block's work 6*N_block + 12*C*T FLOPs per token and
 * the last stage starting at the classifier's 6*padded_vocab*C (the
 * planner's figures): the most even split whole blocks allow. The stages
 * are contiguous in block order. */
void model_stage_layers(const struct model_config *c, int pp, int stage, int *l0, int *l1);

/* Pipeline placement: blocks by model_stage_layers. Embeddings live on stage
 * 0; final norm and lm_head on the last stage; a tied embedding with pp > 1
 * also has a copy on the last stage (its gradient is all-reduced between the
 * two). Returns 1 when tensor `t` is held by `stage`. */
int model_tensor_on_stage(const struct model_config *c, const struct model_tensor *t, int pp,
                          int stage);
/* Elements one (tp rank, pp stage) holds, from l->t[i].rank_numel. */
int64_t model_layout_stage_numel(const struct model_layout *l, const struct model_config *c, int pp,
                                 int stage);

/* Parameter count (tp = 1, tied embedding counted once). */
int64_t model_n_params(const struct model_config *c);
/* Parameters that take part in matrix multiplies: all 2-D linear weights
 * plus the output projection (the tied embedding counts once, as lm_head);
 * excludes position embeddings and an untied input embedding, which are
 * look-ups. */
int64_t model_n_matmul_params(const struct model_config *c);
/* Training FLOPs per token at sequence length T (forward + backward):
 * 6 * N_matmul + 12 * n_layer * d_model * T (attention scores and values). */
double model_flops_per_token(const struct model_config *c, int T);

/* A LoRA target's base projection (train.lora.targets: q k v o gate up down
 * for Llama, attn proj fc fc2 for GPT-2): its input and output widths (tp 1)
 * and whether the base is row-parallel under tp (o, down, proj, fc2: the
 * input is split). Returns 0, or -1 for a name the family does not have. */
int model_lora_site(const struct model_config *c, const char *target, int64_t *in, int64_t *out,
                    int *row);
/* Adapter parameters of the whole model: rank x (in + out) per target per
 * block (what PEFT reports as trainable), or -1 for an unknown target. */
int64_t model_lora_params(const struct model_config *c, int rank, const char *const *targets,
                          int n_targets);
/* LoRA training FLOPs per token: the frozen base's forward and input
 * gradient (4 * N_matmul, no weight gradients), the adapters' forward and
 * backward (6 * n_adapter) and attention (12 * n_layer * d_model * T). */
double model_lora_flops_per_token(const struct model_config *c, int T, int64_t n_adapter);

#endif
