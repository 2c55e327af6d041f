/* Job-spec parsing, validation and canonical JSON (data-path confinement:
 * jobspec_paths.c).
 *
 * The spec is one table (fields[], one row per field: dotted path, type,
 * offset, default, range, names, help). jobspec_init sets the rows'
 * defaults, parse_object walks each JSON object against the rows under its
 * path, check_rows re-checks ranges and formats on a filled struct, and
 * jobspec_to_json writes the rows back out (the canonical form, also the
 * "spec" that POST /v1/plan echoes). Adding a field is one struct member and
 * one row. Fields whose default depends on others (FL_DERIVED: precision,
 * min_lr, global_batch_tokens, name, lora targets) are resolved after the
 * walk from the rows seen. Cross-field rules live in jobspec_validate, each
 * with its own code, in the order a user would fix them (model, layout,
 * batch, optimizer, device, fine-tuning, data). */
#include "api/jobspec.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int loom_error_set(struct loom_error *e, int status, const char *code, const char *field,
                   const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    snprintf(e->code, sizeof e->code, "%s", code);
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

int loom_err(struct loom_error *e, enum loom_errcode c, const char *field, const char *fmt, ...) {
    if (!e) return -1;
    const struct loom_errdef *d = loom_errdef_of(c);
    e->status = d->status;
    snprintf(e->code, sizeof e->code, "%s", d->code);
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

json_t *loom_error_to_json(const struct loom_error *e) {
    json_t *in = json_pack("{s:s, s:s}", "code", e->code, "message", e->message);
    if (in && e->field[0]) json_object_set_new(in, "field", json_string(e->field));
    return json_pack("{s:o}", "error", in);
}

/* ---- enum names ---- */

static const char *const schedule_names[] = {"cosine", "linear", "constant", NULL};
static const char *const precision_names[] = {"bf16", "fp32", "fp8", NULL};
static const char *const recompute_names[] = {"none", "selective", "full", NULL};
static const char *const device_names[] = {"cuda", "cpu", NULL};
static const char *const family_names[] = {"gpt2", "llama", NULL};
static const char *const format_names[] = {"bin",        "text",       "jsonl", "chat",
                                           "completion", "webdataset", NULL};
/* index 0 is "not set" (FL_ENUM_UNSET): never accepted, never written */
static const char *const chat_template_names[] = {"none", "llama3", "chatml", "mistral", NULL};
static const char *const overlong_names[] = {"truncate", "drop", NULL};
static const char *const loss_on_names[] = {"all", "assistant", "completion", NULL};
static const char *const packing_names[] = {"concat", "document", NULL};
static const char *const quantize_names[] = {"none", "nf4", NULL};
/* LoRA targets per model family, in the order the canonical form lists them */
static const char *const lora_targets_llama[] = {"q", "k", "v", "o", "gate", "up", "down", NULL};
static const char *const lora_targets_gpt2[] = {"attn", "proj", "fc", "fc2", NULL};

static const char *const *lora_targets_of(enum model_family f) {
    return f == MODEL_GPT2 ? lora_targets_gpt2 : lora_targets_llama;
}

/* Position of LoRA target `t` in the family's list, INT_MAX when absent. */
static int target_index(enum model_family f, const char *t) {
    const char *const *names = lora_targets_of(f);
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], t) == 0) return i;
    return INT_MAX;
}

const char *jobspec_schedule_name(enum jobspec_schedule v) {
    return schedule_names[v];
}
const char *jobspec_precision_name(enum jobspec_precision v) {
    return precision_names[v];
}
const char *jobspec_recompute_name(enum jobspec_recompute v) {
    return recompute_names[v];
}
const char *jobspec_device_name(enum jobspec_device v) {
    return device_names[v];
}
const char *jobspec_data_format_name(enum jobspec_data_format v) {
    return format_names[v];
}

/* ---- the field table ---- */

#define F_I32       JOBSPEC_F_I32
#define F_I64       JOBSPEC_F_I64
#define F_U64       JOBSPEC_F_U64
#define F_DBL       JOBSPEC_F_DBL
#define F_BOOL      JOBSPEC_F_BOOL
#define F_STR       JOBSPEC_F_STR
#define F_ENUM      JOBSPEC_F_ENUM
#define F_OBJ       JOBSPEC_F_OBJ
#define F_LABELS    JOBSPEC_F_LABELS
#define F_STRLIST   JOBSPEC_F_STRLIST
#define F_RECOMPUTE JOBSPEC_F_RECOMPUTE
#define F_ARRAY     JOBSPEC_F_ARRAY

#define FL_MIN_EXCL    JOBSPEC_FL_MIN_EXCL
#define FL_MAX_EXCL    JOBSPEC_FL_MAX_EXCL
#define FL_ENUM_UNSET  JOBSPEC_FL_ENUM_UNSET
#define FL_ONE_OR_LIST JOBSPEC_FL_ONE_OR_LIST
#define FL_OMIT        JOBSPEC_FL_OMIT_EMPTY
#define FL_IF_ROPE     JOBSPEC_FL_IF_ROPE
#define FL_IF_LORA     JOBSPEC_FL_IF_LORA
#define FL_INNER       JOBSPEC_FL_INNER
#define FL_DERIVED     JOBSPEC_FL_DERIVED
#define FL_MARK        JOBSPEC_FL_MARK

typedef struct jobspec_field field_t;

static int check_init_from(const char *path, const char *v, struct loom_error *e);
static int check_plain_path(const char *path, const char *v, struct loom_error *e);
static int check_tokenizer(const char *path, const char *v, struct loom_error *e);
static int check_text_key(const char *path, const char *v, struct loom_error *e);
static int check_gpu_type(const char *path, const char *v, struct loom_error *e);
static int check_job_id(const char *path, const char *v, struct loom_error *e);
static int check_pool(const char *path, const char *v, struct loom_error *e);

#define OFF(m)    offsetof(struct loom_spec, m)
#define MSIZE(m)  sizeof(((struct loom_spec *)0)->m)
#define MSIZE0(m) sizeof(((struct loom_spec *)0)->m[0])
/* Row makers, one per kind (designated initializers: the rest is zero). */
#define SECTION(p, fl, h)                                                                          \
    { .path = p, .type = F_OBJ, .flags = fl, .help = h }
#define INT(p, m, d, lo, hi, fl, h)                                                                \
    {                                                                                              \
        .path = p, .type = F_I32, .off = OFF(m), .def = d, .min = lo, .max = hi, .flags = fl,      \
        .help = h                                                                                  \
    }
#define I64(p, m, d, lo, hi, fl, h)                                                                \
    {                                                                                              \
        .path = p, .type = F_I64, .off = OFF(m), .def = d, .min = lo, .max = hi, .flags = fl,      \
        .help = h                                                                                  \
    }
#define U64(p, m, d, lo, hi, fl, h)                                                                \
    {                                                                                              \
        .path = p, .type = F_U64, .off = OFF(m), .def = d, .min = lo, .max = hi, .flags = fl,      \
        .help = h                                                                                  \
    }
#define DBL(p, m, d, lo, hi, fl, h)                                                                \
    {                                                                                              \
        .path = p, .type = F_DBL, .off = OFF(m), .def = d, .min = lo, .max = hi, .flags = fl,      \
        .help = h                                                                                  \
    }
#define BOOL(p, m, d, fl, h)                                                                       \
    { .path = p, .type = F_BOOL, .off = OFF(m), .def = d, .flags = fl, .help = h }
#define STR(p, m, d, chk, fl, h)                                                                   \
    {                                                                                              \
        .path = p, .type = F_STR, .off = OFF(m), .size = MSIZE(m), .def_s = d, .check = chk,       \
        .flags = fl, .help = h                                                                     \
    }
#define ENUM(p, m, nm, d, fl, h)                                                                   \
    { .path = p, .type = F_ENUM, .off = OFF(m), .names = nm, .def = d, .flags = fl, .help = h }
#define LIST(p, m, cnt, chk, fl, h)                                                                \
    {                                                                                              \
        .path = p, .type = F_STRLIST, .off = OFF(m), .size = MSIZE0(m), .count_off = OFF(cnt),     \
        .max_count = (int)(MSIZE(m) / MSIZE0(m)), .check = chk, .flags = fl, .help = h             \
    }

/* Ranges: model sizes as model_config_check allows them; world <= 16384. */
static const field_t fields[] = {
    STR("name", name, "", NULL, FL_DERIVED,
        "[A-Za-z0-9][A-Za-z0-9._-]*; default <family>-<preset> (custom without preset)"),
    {.path = "labels",
     .type = F_LABELS,
     .off = OFF(labels),
     .count_off = OFF(n_labels),
     .max_count = JOBSPEC_LABELS_MAX,
     .help = "up to 32 string labels, keys [A-Za-z0-9._/-]"},
    SECTION("model", 0, "required: family, then a preset and/or explicit sizes"),
    ENUM("model.family", model.family, family_names, 0, 0, "required"),
    STR("model.preset", model.preset, "", NULL, FL_OMIT,
        "a preset of the family; without one n_layer, n_head, d_model, vocab_size, seq_len"),
    INT("model.n_layer", model.n_layer, 0, 1, 1024, 0, "blocks (overrides the preset)"),
    INT("model.n_head", model.n_head, 0, 1, 1024, 0, "attention heads"),
    INT("model.n_kv_head", model.n_kv_head, 0, 1, 1024, FL_DERIVED,
        "key/value heads (grouped-query attention); default n_head"),
    INT("model.d_model", model.d_model, 0, 1, 65536, 0, "width"),
    INT("model.d_ff", model.d_ff, 0, 1, 1048576, FL_DERIVED,
        "MLP hidden size; default 4*d_model (gpt2), 8/3*d_model rounded to 256 (llama)"),
    INT("model.vocab_size", model.vocab_size, 0, 1, 4194304, 0, "tokenizer vocabulary"),
    INT("model.seq_len", model.seq_len, 0, 1, 1048576, 0, "training sequence length"),
    BOOL("model.tied_embeddings", model.tied_embeddings, 0, 0, "lm_head shares the embedding"),
    DBL("model.rope_theta", model.rope_theta, 0, 1, 1e12, FL_IF_ROPE, "RoPE base (llama only)"),
    DBL("model.norm_eps", model.norm_eps, 0, 1e-12, 1e-2, 0, "LayerNorm/RMSNorm epsilon"),
    STR("model.init_from", init_from, "", check_init_from, FL_OMIT,
        "absolute HF model directory, job:<id> or job:<id>@<step>; default random init"),
    STR("model.init_checkpoint", init_checkpoint, "", check_plain_path, FL_OMIT,
        "set by loomd for init_from job:<id>: the checkpoint directory it resolved to"),
    STR("model.init_hf", init_hf, "", check_plain_path, FL_OMIT,
        "set by loomd for init_from job:<id>: the HF directory that job's model came from"),
    SECTION("data", 0, "training data"),
    STR("data.train", data.train, "", NULL, 0,
        "required (not for plan): absolute path, glob in the last component"),
    STR("data.val", data.val, "", NULL, FL_OMIT, "validation data, same rules"),
    ENUM("data.format", data.format, format_names, JOBSPEC_FMT_BIN, 0, "how data.train is read"),
    STR("data.tokenizer", data.tokenizer, "", check_tokenizer, FL_OMIT,
        "tokenizer.json, tokenizer.model or HF dir; default model.init_from's"),
    ENUM("data.chat_template", data.chat_template, chat_template_names, JOBSPEC_CHAT_NONE,
         FL_ENUM_UNSET | FL_OMIT, "chat formatting (format chat)"),
    STR("data.text_key", data.text_key, "text", check_text_key, 0, "jsonl: the text field"),
    DBL("data.val_fraction", data.val_fraction, 0, 0, 0.5, 0,
        "share of train held out for validation"),
    ENUM("data.overlong", data.overlong, overlong_names, JOBSPEC_OVERLONG_TRUNCATE, 0,
         "examples longer than seq_len"),
    SECTION("parallel", 0, "layout; world = dp*tp*pp"),
    INT("parallel.dp", parallel.dp, 1, 1, JOBSPEC_WORLD_MAX, 0, "data-parallel ranks"),
    INT("parallel.tp", parallel.tp, 1, 1, 64, 0, "tensor-parallel ranks (within a node)"),
    INT("parallel.pp", parallel.pp, 1, 1, 1024, 0, "pipeline stages"),
    INT("parallel.zero_stage", parallel.zero_stage, 0, 0, 3, 0, "ZeRO stage"),
    BOOL("parallel.pp_balance", parallel.pp_balance, 0, 0, "split blocks over stages by work"),
    SECTION("train", 0, "optimisation"),
    I64("train.steps", train.steps, 1000, 1, 1e9, 0, "optimizer steps"),
    I64("train.global_batch_tokens", train.global_batch_tokens, 0, 1, 1099511627776.0, FL_DERIVED,
        "tokens per step; default micro_batch*seq_len*dp"),
    INT("train.micro_batch", train.micro_batch, 4, 1, 65536, 0,
        "sequences per micro-step per dp rank"),
    DBL("train.lr", train.lr, 6e-4, 1e-12, 10, 0, "peak learning rate"),
    DBL("train.min_lr", train.min_lr, 6e-5, 0, 10, FL_DERIVED,
        "final learning rate; default lr/10"),
    I64("train.warmup_steps", train.warmup_steps, 0, 0, 1e9, 0, "linear warm-up, <= steps"),
    ENUM("train.schedule", train.schedule, schedule_names, JOBSPEC_SCHED_COSINE, 0, "lr decay"),
    DBL("train.weight_decay", train.weight_decay, 0.1, 0, 10, 0, "AdamW decoupled decay"),
    DBL("train.grad_clip", train.grad_clip, 1.0, 0, 1e6, 0, "global norm clip, 0: off"),
    DBL("train.beta1", train.beta1, 0.9, 0, 0.999999, 0, "AdamW beta1"),
    DBL("train.beta2", train.beta2, 0.95, 0, 0.999999999, 0, "AdamW beta2"),
    DBL("train.eps", train.eps, 1e-8, 1e-30, 1, 0, "AdamW epsilon"),
    U64("train.seed", train.seed, 42, 0, 9007199254740991.0, 0, "data order and init"),
    ENUM("train.precision", train.precision, precision_names, JOBSPEC_PREC_BF16, FL_DERIVED,
         "default bf16 on cuda, fp32 on cpu; fp8 cuda only"),
    {.path = "train.recompute",
     .type = F_RECOMPUTE,
     .off = OFF(train.recompute),
     .names = recompute_names,
     .help = "activation recompute, or {\"budget_gib\": N}"},
    DBL("train.recompute.budget_gib", train.recompute_budget_gib, 0, 0, 1e6,
        FL_INNER | FL_MIN_EXCL | FL_OMIT, "activation memory budget; the planner picks layers"),
    BOOL("train.offload_optimizer", train.offload_optimizer, 0, 0,
         "optimizer state in host memory (cuda)"),
    I64("train.eval_every", train.eval_every, 0, 0, 1e9, 0, "steps between evaluations, 0: off"),
    I64("train.eval_batches", train.eval_batches, 20, 1, 1e6, 0, "micro-batches per evaluation"),
    ENUM("train.loss_on", train.loss_on, loss_on_names, JOBSPEC_LOSS_ALL, 0,
         "tokens that count in the loss"),
    ENUM("train.packing", train.packing, packing_names, JOBSPEC_PACK_CONCAT, 0,
         "concat, or document (no attention across documents)"),
    {.path = "train.lora",
     .type = F_OBJ,
     .count_off = OFF(train.lora.enabled),
     .flags = FL_MARK | FL_IF_LORA,
     .help = "low-rank adapters; absent: full fine-tune"},
    INT("train.lora.rank", train.lora.rank, 16, 1, 1024, FL_IF_LORA, "adapter rank"),
    DBL("train.lora.alpha", train.lora.alpha, 32, 0, 1e6, FL_IF_LORA | FL_MIN_EXCL,
        "scale alpha/rank"),
    DBL("train.lora.dropout", train.lora.dropout, 0, 0, 1, FL_IF_LORA | FL_MAX_EXCL,
        "dropout on the adapter input"),
    LIST("train.lora.targets", train.lora.targets, train.lora.n_targets, NULL,
         FL_IF_LORA | FL_DERIVED,
         "llama q,k,v,o,gate,up,down; gpt2 attn,proj,fc,fc2; default all of the family's"),
    ENUM("train.quantize_base", train.quantize_base, quantize_names, JOBSPEC_QUANT_NONE, 0,
         "frozen base weights in nf4 (needs lora)"),
    SECTION("checkpoint", 0, "checkpoints"),
    I64("checkpoint.every_steps", checkpoint.every_steps, 200, 0, 1e9, 0,
        "steps between checkpoints, 0: only the final one"),
    INT("checkpoint.keep", checkpoint.keep, 3, 1, 1000, 0, "newest checkpoints kept"),
    SECTION("export", 0, "written at the end of the job, listed as artifacts"),
    BOOL("export.hf", export.hf, 0, 0, "an HF model directory"),
    BOOL("export.lora", export.lora, 0, 0, "a PEFT adapter (needs train.lora)"),
    SECTION("resources", 0, "where the job runs"),
    ENUM("resources.device", resources.device, device_names, JOBSPEC_DEV_CUDA, 0, "backend"),
    INT("resources.gpus_per_node", resources.gpus_per_node, 8, 1, 64, 0,
        "most ranks of the job on one node"),
    LIST("resources.gpu_type", resources.gpu_type, resources.n_gpu_types, check_gpu_type,
         FL_ONE_OR_LIST | FL_OMIT, "GPU type name(s) the job may use; default any"),
    BOOL("resources.allow_mixed", resources.allow_mixed, 0, 0, "ranks may span GPU types"),
    STR("resources.pool", resources.pool, "", check_pool, FL_OMIT,
        "run only on nodes an admin put in this pool; default any"),
    {.path = "resources.labels",
     .type = F_LABELS,
     .off = OFF(resources.node_labels),
     .count_off = OFF(resources.n_node_labels),
     .max_count = JOBSPEC_NODE_LABELS_MAX,
     .flags = FL_OMIT,
     .help = "node labels key: value the job's nodes must all carry; default any"},
    INT("priority", priority, 50, 0, 100, 0, "higher runs first"),
    INT("max_retries", max_retries, 3, 0, 100, 0, "failed attempts retried"),
    I64("max_runtime_s", max_runtime_s, 0, 0, 1e9, 0, "wall-clock limit, 0: none"),
    LIST("after", after, n_after, check_job_id, FL_OMIT, "job ids that must succeed first"),
    BOOL("preemptible", preemptible, 0, 0, "may be stopped for higher-priority work"),
    {.path = "array",
     .type = F_ARRAY,
     .flags = FL_OMIT,
     .help = "dotted spec key -> values: one job per combination"},
};
#define N_FIELDS (sizeof fields / sizeof *fields)

const struct jobspec_field *jobspec_fields(size_t *n) {
    *n = N_FIELDS;
    return fields;
}

const struct jobspec_field *jobspec_field_find(const char *path) {
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strcmp(fields[i].path, path) == 0) return &fields[i];
    return NULL;
}

static size_t row_index(const field_t *f) {
    return (size_t)(f - fields);
}

void jobspec_init(struct loom_spec *s) {
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        char *p = (char *)s + f->off;
        switch (f->type) {
        case F_I32:
        case F_BOOL:
        case F_ENUM:
        case F_RECOMPUTE:
            *(int *)p = (int)f->def;
            break;
        case F_I64:
            *(int64_t *)p = (int64_t)f->def;
            break;
        case F_U64:
            *(uint64_t *)p = (uint64_t)f->def;
            break;
        case F_DBL:
            *(double *)p = f->def;
            break;
        case F_STR:
            snprintf(p, f->size, "%s", f->def_s ? f->def_s : "");
            break;
        default: /* sections, labels, lists, array: empty */
            break;
        }
    }
}

static const char *json_type_word(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number with a fraction";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static void join_path(char *out, size_t n, const char *path, const char *key) {
    if (path[0])
        snprintf(out, n, "%s.%s", path, key);
    else
        snprintf(out, n, "%s", key);
}

/* Copy a JSON string into buf: rejects embedded NULs, control characters and
 * over-long values. */
static int take_string(const json_t *v, char *buf, size_t size, const char *path,
                       struct loom_error *e) {
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    if (strlen(s) != len)
        return loom_err(e, LOOM_E_INVALID_VALUE, path, "%s contains a NUL character", path);
    if (len >= size)
        return loom_err(e, LOOM_E_OUT_OF_RANGE, path, "%s is %zu bytes long, at most %zu", path,
                        len, size - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return loom_err(e, LOOM_E_INVALID_VALUE, path,
                            "%s contains a control character at byte %zu", path, i);
    memcpy(buf, s, len + 1);
    return 0;
}

/* A string -> string row (labels, resources.labels) into the jobspec_label
 * array at f->off, its count at f->count_off, sorted by key. */
static int parse_labels(const field_t *f, struct loom_spec *s, const json_t *v,
                        struct loom_error *e) {
    const char *fp = f->path;
    struct jobspec_label *arr = (struct jobspec_label *)((char *)s + f->off);
    int *n = (int *)((char *)s + f->count_off);
    if (!json_is_object(v))
        return loom_err(e, LOOM_E_WRONG_TYPE, fp, "%s must be an object of strings, got %s", fp,
                        json_type_word(v));
    if (json_object_size(v) > (size_t)f->max_count)
        return loom_err(e, LOOM_E_OUT_OF_RANGE, fp, "%s has %zu entries, at most %d", fp,
                        json_object_size(v), f->max_count);
    const char *key;
    json_t *val;
    *n = 0;
    json_object_foreach((json_t *)v, key, val) {
        char path[128];
        join_path(path, sizeof path, fp, key);
        size_t kl = strlen(key);
        int ok = kl > 0 && kl < JOBSPEC_LABEL_KEY_MAX;
        for (size_t i = 0; ok && i < kl; i++) {
            char c = key[i];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-' || c == '/';
        }
        if (!ok)
            return loom_err(e, LOOM_E_INVALID_LABEL, path,
                            "label keys are 1-%d characters of [A-Za-z0-9._/-]",
                            JOBSPEC_LABEL_KEY_MAX - 1);
        if (!json_is_string(val))
            return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be a string, got %s", path,
                            json_type_word(val));
        struct jobspec_label *l = &arr[*n];
        memcpy(l->key, key, kl + 1);
        if (take_string(val, l->value, sizeof l->value, path, e) != 0) return -1;
        (*n)++;
    }
    /* sorted by key so the canonical form does not depend on input order */
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && strcmp(arr[j - 1].key, arr[j].key) > 0; j--) {
            struct jobspec_label t = arr[j];
            arr[j] = arr[j - 1];
            arr[j - 1] = t;
        }
    return 0;
}

/* ---- generic row checks (parse and jobspec_validate) ---- */

static int check_int_range(const field_t *f, long long x, const char *path, struct loom_error *e) {
    if ((double)x < f->min || (double)x > f->max)
        return loom_err(e, LOOM_E_OUT_OF_RANGE, path, "%s=%lld is out of range [%.0f, %.0f]", path,
                        x, f->min, f->max);
    return 0;
}

static int check_dbl_range(const field_t *f, double x, const char *path, struct loom_error *e) {
    int lo_ok = (f->flags & FL_MIN_EXCL) ? x > f->min : x >= f->min;
    int hi_ok = (f->flags & FL_MAX_EXCL) ? x < f->max : x <= f->max;
    if (!(lo_ok && hi_ok))
        return loom_err(e, LOOM_E_OUT_OF_RANGE, path, "%s=%g is out of range %c%g, %g%c", path, x,
                        (f->flags & FL_MIN_EXCL) ? '(' : '[', f->min, f->max,
                        (f->flags & FL_MAX_EXCL) ? ')' : ']');
    return 0;
}

/* "a|b|c": the names a user may give. */
static void enum_names_join(const field_t *f, char *out, size_t n) {
    int first = (f->flags & FL_ENUM_UNSET) ? 1 : 0;
    out[0] = '\0';
    for (int i = first; f->names[i]; i++) {
        size_t l = strlen(out);
        snprintf(out + l, n - l, "%s%s", i > first ? "|" : "", f->names[i]);
    }
}

static int enum_count(const field_t *f) {
    int n = 0;
    while (f->names[n])
        n++;
    return n;
}

/* ---- value formats (field_check) ---- */

static int id_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* 1 when `v` (up to `len` bytes) is a job id: 1-63 of [A-Za-z0-9._-] */
static int is_job_id(const char *v, size_t len) {
    if (len == 0 || len >= JOBSPEC_ID_MAX) return 0;
    for (size_t i = 0; i < len; i++)
        if (!id_char(v[i])) return 0;
    return 1;
}

/* An absolute path without '.'/'..' components or glob characters; NULL
 * when fine, else what is wrong. */
static const char *plain_path_problem(const char *v) {
    if (v[0] != '/') return "must be an absolute path";
    if (strpbrk(v, "*?[")) return "must not contain glob characters";
    for (const char *c = v; *c;) {
        while (*c == '/')
            c++;
        size_t len = strcspn(c, "/");
        if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return "must not have '.' or '..' components";
        c += len;
    }
    return NULL;
}

static int check_init_from(const char *path, const char *v, struct loom_error *e) {
    if (strncmp(v, "job:", 4) == 0) {
        const char *id = v + 4, *at = strchr(id, '@');
        size_t idlen = at ? (size_t)(at - id) : strlen(id);
        int ok = is_job_id(id, idlen);
        if (ok && at) {
            size_t n = strlen(at + 1);
            ok = n > 0 && n <= 18 && strspn(at + 1, "0123456789") == n;
        }
        if (!ok)
            return loom_err(e, LOOM_E_INVALID_INIT_FROM, path,
                            "%s=\"%.200s\" is not job:<id> or job:<id>@<step> (id of "
                            "[A-Za-z0-9._-], step a non-negative integer)",
                            path, v);
        return 0;
    }
    const char *why = plain_path_problem(v);
    if (why)
        return loom_err(e, LOOM_E_INVALID_INIT_FROM, path,
                        "%s=\"%.200s\" %s (an HF model directory, job:<id> or "
                        "job:<id>@<step>)",
                        path, v, why);
    return 0;
}

int jobspec_check_init_from(const char *field, const char *v, struct loom_error *e) {
    return check_init_from(field, v, e);
}

static int check_plain_path(const char *path, const char *v, struct loom_error *e) {
    const char *why = plain_path_problem(v);
    if (why) return loom_err(e, LOOM_E_INVALID_INIT_FROM, path, "%s=\"%.200s\" %s", path, v, why);
    return 0;
}

static int check_tokenizer(const char *path, const char *v, struct loom_error *e) {
    const char *why = plain_path_problem(v);
    if (why)
        return loom_err(e, LOOM_E_DATA_PATH_INVALID, path,
                        "%s=\"%.200s\" %s (tokenizer.json, tokenizer.model or an HF "
                        "directory)",
                        path, v, why);
    return 0;
}

static int check_text_key(const char *path, const char *v, struct loom_error *e) {
    if (!v[0]) return loom_err(e, LOOM_E_INVALID_VALUE, path, "%s must not be empty", path);
    return 0;
}

/* resources.pool: a node pool name as PATCH /v1/nodes/{id} takes it. */
static int check_pool(const char *path, const char *v, struct loom_error *e) {
    int ok = 1;
    for (size_t i = 0; ok && v[i]; i++)
        ok = id_char(v[i]);
    if (!ok)
        return loom_err(e, LOOM_E_INVALID_VALUE, path,
                        "%s=\"%.64s\" is not a pool name (1-%d of [A-Za-z0-9._-])", path, v,
                        JOBSPEC_POOL_MAX - 1);
    return 0;
}

static int check_gpu_type(const char *path, const char *v, struct loom_error *e) {
    size_t n = strlen(v);
    int ok = n > 0;
    for (size_t i = 0; ok && i < n; i++)
        ok = id_char(v[i]);
    if (!ok)
        return loom_err(e, LOOM_E_INVALID_GPU_TYPE, path,
                        "%s=\"%.64s\" is not a GPU type name (1-%d of [A-Za-z0-9._-], "
                        "e.g. H100-SXM)",
                        path, v, JOBSPEC_GPU_TYPE_MAX - 1);
    return 0;
}

static int check_job_id(const char *path, const char *v, struct loom_error *e) {
    if (!is_job_id(v, strlen(v)))
        return loom_err(e, LOOM_E_INVALID_JOB_ID, path,
                        "%s=\"%.80s\" is not a job id (1-%d of [A-Za-z0-9._-], e.g. "
                        "j-d1b9522f5b1a)",
                        path, v, JOBSPEC_ID_MAX - 1);
    return 0;
}

/* A list of strings (or, with FL_ONE_OR_LIST, one string) into
 * char[max_count][size] with its count. */
static int parse_strlist(const field_t *f, const json_t *v, void *base, const char *path,
                         struct loom_error *e) {
    char *p = (char *)base + f->off;
    int *count = (int *)((char *)base + f->count_off);
    if (json_is_string(v) && (f->flags & FL_ONE_OR_LIST)) {
        *count = 0;
        if (take_string(v, p, f->size, path, e) != 0) return -1;
        if (f->check && f->check(path, p, e) != 0) return -1;
        *count = 1;
        return 0;
    }
    if (!json_is_array(v))
        return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be %s, got %s", path,
                        (f->flags & FL_ONE_OR_LIST) ? "a string or a list of strings"
                                                    : "a list of strings",
                        json_type_word(v));
    size_t n = json_array_size(v);
    if (n == 0 || n > (size_t)f->max_count)
        return loom_err(e, LOOM_E_OUT_OF_RANGE, path, "%s has %zu entries, give 1-%d", path, n,
                        f->max_count);
    for (size_t i = 0; i < n; i++) {
        char ipath[160];
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        const json_t *it = json_array_get(v, i);
        if (!json_is_string(it))
            return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be a string, got %s", ipath,
                            json_type_word(it));
        char *slot = p + i * f->size;
        if (take_string(it, slot, f->size, path, e) != 0) return -1;
        if (f->check && f->check(ipath, slot, e) != 0) {
            snprintf(e->field, sizeof e->field, "%s", path);
            return -1;
        }
    }
    *count = (int)n;
    return 0;
}

static int parse_value(const field_t *f, const json_t *v, void *base, const char *path,
                       struct loom_error *e);

/* train.recompute: "none|selective|full" or {"budget_gib": N} (N > 0: the
 * planner picks the layers to recompute so activations fit N GiB). The
 * budget is the next row (FL_INNER). */
static int parse_recompute(const field_t *f, const json_t *v, void *base, const char *path,
                           struct loom_error *e) {
    const field_t *budget = f + 1;
    double *b = (double *)((char *)base + budget->off);
    if (json_is_string(v)) {
        field_t as_enum = *f;
        as_enum.type = F_ENUM;
        *b = 0;
        return parse_value(&as_enum, v, base, path, e);
    }
    if (!json_is_object(v))
        return loom_err(e, LOOM_E_WRONG_TYPE, path,
                        "%s must be none|selective|full or {\"budget_gib\": N}, got %s", path,
                        json_type_word(v));
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        char kpath[160];
        join_path(kpath, sizeof kpath, path, key);
        if (strcmp(kpath, budget->path) != 0)
            return loom_err(e, LOOM_E_UNKNOWN_FIELD, kpath, "unknown field %s", kpath);
        *(int *)((char *)base + f->off) = JOBSPEC_RECOMPUTE_NONE;
        return parse_value(budget, x, base, kpath, e);
    }
    return loom_err(e, LOOM_E_MISSING_FIELD, path, "%s.budget_gib is required in the object form",
                    path);
}

static int parse_value(const field_t *f, const json_t *v, void *base, const char *path,
                       struct loom_error *e) {
    char *p = (char *)base + f->off;
    switch (f->type) {
    case F_I32:
    case F_I64:
    case F_U64: {
        if (!json_is_integer(v))
            return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be an integer, got %s", path,
                            json_type_word(v));
        json_int_t x = json_integer_value(v);
        if (check_int_range(f, (long long)x, path, e) != 0) return -1;
        if (f->type == F_I32)
            *(int *)p = (int)x;
        else if (f->type == F_I64)
            *(int64_t *)p = (int64_t)x;
        else
            *(uint64_t *)p = (uint64_t)x;
        return 0;
    }
    case F_DBL: {
        if (!json_is_number(v))
            return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be a number, got %s", path,
                            json_type_word(v));
        double x = json_number_value(v);
        if (check_dbl_range(f, x, path, e) != 0) return -1;
        *(double *)p = x;
        return 0;
    }
    case F_BOOL:
        if (!json_is_boolean(v))
            return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be true or false, got %s", path,
                            json_type_word(v));
        *(int *)p = json_is_true(v);
        return 0;
    case F_STR:
        if (!json_is_string(v))
            return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be a string, got %s", path,
                            json_type_word(v));
        if (take_string(v, p, f->size, path, e) != 0) return -1;
        return f->check ? f->check(path, p, e) : 0;
    case F_STRLIST:
        return parse_strlist(f, v, base, path, e);
    case F_RECOMPUTE:
        return parse_recompute(f, v, base, path, e);
    case F_ENUM: {
        if (!json_is_string(v))
            return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be a string, got %s", path,
                            json_type_word(v));
        const char *s = json_string_value(v);
        int first = (f->flags & FL_ENUM_UNSET) ? 1 : 0;
        for (int i = first; f->names[i]; i++)
            if (strcmp(s, f->names[i]) == 0 && strlen(s) == json_string_length(v)) {
                *(int *)p = i;
                return 0;
            }
        char allowed[160];
        enum_names_join(f, allowed, sizeof allowed);
        return loom_err(e, LOOM_E_INVALID_VALUE, path, "%s=\"%.64s\" is not one of %s", path, s,
                        allowed);
    }
    default:
        return loom_err(e, LOOM_E_INVALID_VALUE, path, "%s: unsupported field", path);
    }
}

static int is_scalar(enum jobspec_ftype t) {
    return t == F_I32 || t == F_I64 || t == F_U64 || t == F_DBL || t == F_BOOL || t == F_STR ||
           t == F_ENUM || t == F_RECOMPUTE;
}

static int parse_array_key(struct loom_spec *s, const char *key, const json_t *vals,
                           struct loom_spec *scratch, size_t *members, struct loom_error *e) {
    char path[sizeof e->field];
    join_path(path, sizeof path, "array", key);
    const field_t *row = jobspec_field_find(key);
    if (!row || !is_scalar(row->type) || (row->flags & FL_INNER) || strlen(key) >= JOBSPEC_KEY_MAX)
        return loom_err(e, LOOM_E_INVALID_ARRAY_KEY, path,
                        "array key \"%.80s\" is not a spec field that takes one value "
                        "(e.g. train.lr, train.seed, parallel.dp)",
                        key);
    if (!json_is_array(vals))
        return loom_err(e, LOOM_E_WRONG_TYPE, path, "%s must be a list of values, got %s", path,
                        json_type_word(vals));
    size_t n = json_array_size(vals);
    if (n == 0 || n > JOBSPEC_ARRAY_VALUES_MAX)
        return loom_err(e, LOOM_E_OUT_OF_RANGE, path, "%s has %zu values, give 1-%d", path, n,
                        JOBSPEC_ARRAY_VALUES_MAX);
    for (size_t i = 0; i < n; i++) {
        char ipath[176];
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (parse_value(row, json_array_get(vals, i), scratch, ipath, e) != 0) {
            snprintf(e->field, sizeof e->field, "%s", path);
            return -1;
        }
    }
    *members *= n;
    if (*members > JOBSPEC_ARRAY_MEMBERS_MAX)
        return loom_err(e, LOOM_E_ARRAY_TOO_LARGE, path,
                        "array expands to more than %d jobs (the product of the value "
                        "counts)",
                        JOBSPEC_ARRAY_MEMBERS_MAX);
    struct jobspec_array_key *a = &s->array[s->n_array];
    char *text = json_dumps(vals, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (!text) return loom_err(e, LOOM_E_INTERNAL, path, "out of memory");
    size_t tl = strlen(text);
    if (tl >= sizeof a->values) {
        free(text);
        return loom_err(e, LOOM_E_OUT_OF_RANGE, path, "%s is %zu bytes of JSON, at most %zu", path,
                        tl, sizeof a->values - 1);
    }
    memcpy(a->values, text, tl + 1);
    free(text);
    snprintf(a->key, sizeof a->key, "%s", key);
    a->n_values = (int)n;
    s->n_array++;
    return 0;
}

/* array: {"train.lr": [1e-4, 3e-4], ...}; keys sorted so the member order
 * does not depend on the input's key order. */
static int parse_array(struct loom_spec *s, const json_t *v, struct loom_error *e) {
    if (!json_is_object(v))
        return loom_err(e, LOOM_E_WRONG_TYPE, "array",
                        "array must be an object of spec key -> list of values, got %s",
                        json_type_word(v));
    size_t nk = json_object_size(v);
    if (nk == 0 || nk > JOBSPEC_ARRAY_KEYS_MAX)
        return loom_err(e, LOOM_E_OUT_OF_RANGE, "array", "array has %zu keys, give 1-%d", nk,
                        JOBSPEC_ARRAY_KEYS_MAX);
    struct loom_spec *scratch = calloc(1, sizeof *scratch);
    if (!scratch) return loom_err(e, LOOM_E_INTERNAL, "array", "out of memory");
    s->n_array = 0;
    size_t members = 1;
    const char *key;
    json_t *vals;
    int rc = 0;
    json_object_foreach((json_t *)v, key, vals) {
        if ((rc = parse_array_key(s, key, vals, scratch, &members, e)) != 0) break;
    }
    free(scratch);
    for (int i = 1; i < s->n_array; i++)
        for (int j = i; j > 0 && strcmp(s->array[j - 1].key, s->array[j].key) > 0; j--) {
            struct jobspec_array_key t = s->array[j];
            s->array[j] = s->array[j - 1];
            s->array[j - 1] = t;
        }
    return rc;
}

size_t jobspec_array_size(const struct loom_spec *s) {
    size_t n = 1;
    for (int i = 0; i < s->n_array; i++)
        n *= (size_t)s->array[i].n_values;
    return n;
}

/* obj[a][b]... = val for the dotted key "a.b...", creating objects on the
 * way; steals `val`. */
static int set_dotted(json_t *obj, const char *dotted, json_t *val) {
    char buf[JOBSPEC_KEY_MAX];
    snprintf(buf, sizeof buf, "%s", dotted);
    char *seg = buf;
    for (char *dot; (dot = strchr(seg, '.')); seg = dot + 1) {
        *dot = '\0';
        json_t *child = json_object_get(obj, seg);
        if (!json_is_object(child)) {
            child = json_object();
            if (json_object_set_new(obj, seg, child) != 0) {
                json_decref(val);
                return -1;
            }
        }
        obj = child;
    }
    return json_object_set_new(obj, seg, val);
}

/* obj[a][b]... for the dotted key "a.b...", or NULL. Borrowed. */
static const json_t *get_dotted(const json_t *obj, const char *dotted) {
    for (const char *seg = dotted; obj;) {
        size_t len = strcspn(seg, ".");
        char key[JOBSPEC_KEY_MAX];
        snprintf(key, sizeof key, "%.*s", (int)len, seg);
        obj = json_object_get(obj, key);
        if (seg[len] == '\0') break;
        seg += len + 1;
    }
    return obj;
}

json_t *jobspec_array_member(const struct loom_spec *s, const json_t *body, size_t i) {
    if (i >= jobspec_array_size(s) || !json_is_object(body)) return NULL;
    json_t *m = json_deep_copy(body);
    if (!m) return NULL;
    json_object_del(m, "array");
    for (int k = s->n_array - 1; k >= 0; k--) {
        const struct jobspec_array_key *a = &s->array[k];
        size_t idx = i % (size_t)a->n_values;
        i /= (size_t)a->n_values;
        json_t *vals = json_loads(a->values, 0, NULL);
        json_t *val = json_array_get(vals, idx);
        int rc = val ? set_dotted(m, a->key, json_incref(val)) : -1;
        json_decref(vals);
        if (rc != 0) {
            json_decref(m);
            return NULL;
        }
    }
    return m;
}

/* Edit distance of two short keys (bounded: longer keys count as far). */
static int key_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40) return 99;
    int d[41][41];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

/* UNKNOWN_FIELD, with the nearest row of the same section when one is a
 * typo away ("train.lrr": did you mean train.lr, peak learning rate?). */
static int unknown_field(const char *path, struct loom_error *e) {
    const char *dot = strrchr(path, '.');
    size_t plen = dot ? (size_t)(dot - path) + 1 : 0;
    const field_t *best = NULL;
    int bd = 3; /* at most 2 edits */
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        if (strncmp(f->path, path, plen) != 0 || strchr(f->path + plen, '.') ||
            (f->flags & FL_INNER))
            continue;
        int dd = key_distance(f->path + plen, path + plen);
        if (dd < bd) {
            bd = dd;
            best = f;
        }
    }
    if (best)
        return loom_err(e, LOOM_E_UNKNOWN_FIELD, path, "unknown field %s; did you mean %s (%s)?",
                        path, best->path, best->help);
    return loom_err(e, LOOM_E_UNKNOWN_FIELD, path, "unknown field %s", path);
}

/* State of one parse: which rows the input set. */
struct parse_ctx {
    struct loom_spec *s;
    unsigned char seen[N_FIELDS];
};

static int seen(const struct parse_ctx *c, const char *path) {
    const field_t *f = jobspec_field_find(path);
    return f && c->seen[row_index(f)];
}

/* Walk one JSON object whose rows are `prefix`.KEY ("" at the top). */
static int parse_object(struct parse_ctx *c, const json_t *obj, const char *prefix,
                        struct loom_error *e) {
    if (!json_is_object(obj))
        return loom_err(e, LOOM_E_WRONG_TYPE, prefix, "%s must be an object, got %s",
                        prefix[0] ? prefix : "the spec", json_type_word(obj));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        char path[128];
        join_path(path, sizeof path, prefix, key);
        /* a key with a dot would name a row of a deeper section */
        const field_t *f = strchr(key, '.') ? NULL : jobspec_field_find(path);
        if (!f || (f->flags & FL_INNER)) return unknown_field(path, e);
        int rc;
        if (f->type == F_OBJ) {
            rc = parse_object(c, v, path, e);
            if (rc == 0 && (f->flags & FL_MARK)) *(int *)((char *)c->s + f->count_off) = 1;
        } else if (f->type == F_LABELS) {
            rc = parse_labels(f, c->s, v, e);
        } else if (f->type == F_ARRAY) {
            rc = parse_array(c->s, v, e);
        } else {
            rc = parse_value(f, v, c->s, path, e);
        }
        if (rc != 0) return -1;
        c->seen[row_index(f)] = 1;
    }
    return 0;
}

static int llama_default_ff(int d_model) {
    /* Llama: 2/3 of 4*d, rounded up to a multiple of 256 */
    int64_t f = (int64_t)8 * d_model / 3;
    return (int)((f + 255) / 256 * 256);
}

/* model.preset (or the family's defaults), then the sizes given explicitly
 * (parsed into s->model, kept aside while the preset is loaded). */
static int resolve_model(struct parse_ctx *c, int have_model, struct loom_error *e) {
    struct loom_spec *s = c->s;
    const struct model_config m = s->model; /* as parsed */
    if (!have_model)
        return loom_err(e, LOOM_E_MISSING_FIELD, "model",
                        "model is required (e.g. {\"family\":\"gpt2\",\"preset\":\"124m\"})");
    if (!seen(c, "model.family"))
        return loom_err(e, LOOM_E_MISSING_FIELD, "model.family",
                        "model.family is required (gpt2|llama)");
    struct model_config *cfg = &s->model;
    int preset = seen(c, "model.preset");
    if (preset) {
        const struct model_preset *p = model_preset_find(m.family, m.preset);
        if (!p) {
            char names[256] = "";
            size_t n;
            const struct model_preset *all = model_presets(&n);
            for (size_t i = 0; i < n; i++) {
                if (all[i].config.family != m.family) continue;
                size_t l = strlen(names);
                snprintf(names + l, sizeof names - l, "%s%s", l ? " " : "", all[i].name);
            }
            return loom_err(e, LOOM_E_UNKNOWN_PRESET, "model.preset",
                            "no %s preset \"%s\"; known: %s", model_family_name(m.family), m.preset,
                            names);
        }
        *cfg = p->config;
        snprintf(cfg->preset, sizeof cfg->preset, "%s", p->name);
    } else {
        static const char *const need[] = {"model.n_layer", "model.n_head", "model.d_model",
                                           "model.vocab_size", "model.seq_len"};
        for (size_t i = 0; i < sizeof need / sizeof *need; i++)
            if (!seen(c, need[i]))
                return loom_err(e, LOOM_E_MISSING_FIELD, need[i],
                                "%s is required when model.preset is absent", need[i]);
        memset(cfg, 0, sizeof *cfg);
        model_config_family_defaults(cfg, m.family);
    }
    /* explicit sizes override the preset: copy every seen model row back */
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        size_t mo = OFF(model), ms = sizeof s->model;
        if (!c->seen[i] || f->off < mo || f->off >= mo + ms || f->type == F_OBJ ||
            strcmp(f->path, "model.family") == 0 || strcmp(f->path, "model.preset") == 0)
            continue;
        size_t sz = f->type == F_DBL ? sizeof(double) : sizeof(int);
        memcpy((char *)s + f->off, (const char *)&m + (f->off - mo), sz);
    }
    if (!seen(c, "model.n_kv_head") && seen(c, "model.n_head"))
        cfg->n_kv_head = cfg->family == MODEL_GPT2 || !preset ? m.n_head : cfg->n_kv_head;
    if (!seen(c, "model.d_ff") && (!preset || seen(c, "model.d_model")))
        cfg->d_ff = cfg->family == MODEL_GPT2 ? 4 * cfg->d_model : llama_default_ff(cfg->d_model);
    if (seen(c, "model.rope_theta") && cfg->pos != MODEL_POS_ROPE)
        return loom_err(e, LOOM_E_INVALID_VALUE, "model.rope_theta",
                        "model.rope_theta applies to llama (RoPE) only; gpt2 learns "
                        "its positions");
    if (!preset) cfg->preset[0] = '\0';
    model_config_finalize(cfg);
    return 0;
}

static int lora_rules(const struct loom_spec *s, struct loom_error *e) {
    const char *const *names = lora_targets_of(s->model.family);
    char allowed[96] = "";
    for (int i = 0; names[i]; i++) {
        size_t l = strlen(allowed);
        snprintf(allowed + l, sizeof allowed - l, "%s%s", i ? "," : "", names[i]);
    }
    const char *fam = model_family_name(s->model.family);
    if (s->train.lora.n_targets < 1)
        return loom_err(e, LOOM_E_INVALID_LORA_TARGET, "train.lora.targets",
                        "train.lora.targets must name at least one of %s (%s)", allowed, fam);
    for (int i = 0; i < s->train.lora.n_targets; i++) {
        const char *t = s->train.lora.targets[i];
        if (target_index(s->model.family, t) == INT_MAX)
            return loom_err(e, LOOM_E_INVALID_LORA_TARGET, "train.lora.targets",
                            "train.lora.targets: \"%s\" is not a %s target; allowed: %s", t, fam,
                            allowed);
        for (int k = 0; k < i; k++)
            if (strcmp(s->train.lora.targets[k], t) == 0)
                return loom_err(e, LOOM_E_INVALID_LORA_TARGET, "train.lora.targets",
                                "train.lora.targets lists \"%s\" twice", t);
    }
    return 0;
}

/* Rules of the fine-tuning fields (docs/architecture.md "Fine-tuning
 * contract"). */
static int finetune_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    if (s->train.lora.enabled && lora_rules(s, e) != 0) return -1;
    if (s->train.quantize_base == JOBSPEC_QUANT_NF4 && !s->train.lora.enabled)
        return loom_err(e, LOOM_E_QUANTIZE_WITHOUT_LORA, "train.quantize_base",
                        "train.quantize_base=nf4 needs train.lora (a quantized base is "
                        "frozen; only adapters train)");
    if (s->export.lora && !s->train.lora.enabled)
        return loom_err(e, LOOM_E_EXPORT_WITHOUT_LORA, "export.lora",
                        "export.lora=true needs train.lora (there is no adapter to write)");
    static const struct {
        enum jobspec_loss_on loss;
        enum jobspec_data_format format;
    } loss_needs[] = {{JOBSPEC_LOSS_ASSISTANT, JOBSPEC_FMT_CHAT},
                      {JOBSPEC_LOSS_COMPLETION, JOBSPEC_FMT_COMPLETION}};
    for (size_t i = 0; i < sizeof loss_needs / sizeof *loss_needs; i++)
        if (s->train.loss_on == loss_needs[i].loss && s->data.format != loss_needs[i].format)
            return loom_err(e, LOOM_E_LOSS_ON_FORMAT, "train.loss_on",
                            "train.loss_on=%s needs data.format=%s, got data.format=%s",
                            loss_on_names[s->train.loss_on], format_names[loss_needs[i].format],
                            format_names[s->data.format]);
    if (s->data.val_fraction > 0 && s->data.val[0])
        return loom_err(e, LOOM_E_VAL_SOURCE_CONFLICT, "data.val_fraction",
                        "data.val_fraction=%g and data.val both give a validation set; "
                        "use one",
                        s->data.val_fraction);
    if (!(flags & JOBSPEC_FOR_PLAN) && s->data.format != JOBSPEC_FMT_BIN && !s->data.tokenizer[0] &&
        !s->init_from[0])
        return loom_err(e, LOOM_E_MISSING_FIELD, "data.tokenizer",
                        "data.format=%s needs data.tokenizer (or model.init_from, whose "
                        "tokenizer is the default)",
                        format_names[s->data.format]);
    return 0;
}

static int check_rows(const struct loom_spec *s, struct loom_error *e);

/* ---- cross-field rules, in the order a user would fix them ---- */

static int model_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    (void)flags;
    const struct model_config *m = &s->model;
    char err[256];
    const char *mf = NULL;
    if (model_config_check(m, err, sizeof err, &mf) != 0) {
        char path[64];
        snprintf(path, sizeof path, "model.%s", mf ? mf : "");
        return loom_err(e, LOOM_E_INVALID_MODEL, path, "%s", err);
    }
    return 0;
}

static int layout_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    (void)flags;
    const struct model_config *m = &s->model;
    int dp = s->parallel.dp, tp = s->parallel.tp, pp = s->parallel.pp;
    int64_t world = (int64_t)dp * tp * pp;
    if (world > JOBSPEC_WORLD_MAX)
        return loom_err(e, LOOM_E_WORLD_TOO_LARGE, "parallel",
                        "dp*tp*pp = %d*%d*%d = %lld ranks, at most %d", dp, tp, pp,
                        (long long)world, JOBSPEC_WORLD_MAX);
    if (m->n_head % tp != 0)
        return loom_err(e, LOOM_E_TP_HEADS, "parallel.tp", "tp=%d does not divide n_head=%d", tp,
                        m->n_head);
    if (m->n_kv_head % tp != 0)
        return loom_err(e, LOOM_E_TP_KV_HEADS, "parallel.tp", "tp=%d does not divide n_kv_head=%d",
                        tp, m->n_kv_head);
    if (m->d_ff % tp != 0)
        return loom_err(e, LOOM_E_TP_FFN, "parallel.tp", "tp=%d does not divide d_ff=%d", tp,
                        m->d_ff);
    if (tp > s->resources.gpus_per_node)
        return loom_err(e, LOOM_E_TP_CROSSES_NODE, "parallel.tp",
                        "tp=%d exceeds resources.gpus_per_node=%d; tensor-parallel groups "
                        "never cross a node",
                        tp, s->resources.gpus_per_node);
    if (!s->parallel.pp_balance && m->n_layer % pp != 0)
        return loom_err(e, LOOM_E_PP_LAYERS, "parallel.pp",
                        "pp=%d does not divide n_layer=%d (parallel.pp_balance: true splits "
                        "the blocks unevenly)",
                        pp, m->n_layer);
    if (m->n_layer < pp)
        return loom_err(e, LOOM_E_PP_LAYERS, "parallel.pp",
                        "pp=%d exceeds n_layer=%d: every stage needs a block", pp, m->n_layer);
    if (s->parallel.zero_stage >= 2 && pp > 1)
        return loom_err(e, LOOM_E_ZERO_WITH_PP, "parallel.zero_stage",
                        "zero_stage=%d with pp=%d is not supported (gradient and parameter "
                        "sharding fight the 1F1B schedule); use zero_stage<=1",
                        s->parallel.zero_stage, pp);
    return 0;
}

static int batch_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    (void)flags;
    int dp = s->parallel.dp, pp = s->parallel.pp, seq = s->model.seq_len;
    int64_t unit = (int64_t)s->train.micro_batch * seq * dp;
    if (s->train.global_batch_tokens % unit != 0)
        return loom_err(e, LOOM_E_BATCH_NOT_DIVISIBLE, "train.global_batch_tokens",
                        "global_batch_tokens=%lld is not a multiple of "
                        "micro_batch*seq_len*dp = %d*%d*%d = %lld",
                        (long long)s->train.global_batch_tokens, s->train.micro_batch, seq, dp,
                        (long long)unit);
    int64_t ga = s->train.global_batch_tokens / unit;
    if (pp > 1 && ga < pp)
        return loom_err(e, LOOM_E_PP_TOO_FEW_MICROBATCHES, "train.global_batch_tokens",
                        "1F1B with pp=%d needs at least %d micro-batches per step; "
                        "global_batch_tokens/(micro_batch*seq_len*dp) = %lld/%lld = %lld",
                        pp, pp, (long long)s->train.global_batch_tokens, (long long)unit,
                        (long long)ga);
    if (s->train.global_batch_tokens > ((int64_t)1 << 62) / s->train.steps)
        return loom_err(e, LOOM_E_OUT_OF_RANGE, "train.steps",
                        "steps*global_batch_tokens overflows (%lld*%lld)",
                        (long long)s->train.steps, (long long)s->train.global_batch_tokens);
    return 0;
}

static int optimizer_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    (void)flags;
    if (s->train.min_lr > s->train.lr)
        return loom_err(e, LOOM_E_LR_ORDER, "train.min_lr", "min_lr=%g exceeds lr=%g",
                        s->train.min_lr, s->train.lr);
    if (s->train.warmup_steps > s->train.steps)
        return loom_err(e, LOOM_E_WARMUP_TOO_LONG, "train.warmup_steps",
                        "warmup_steps=%lld exceeds steps=%lld", (long long)s->train.warmup_steps,
                        (long long)s->train.steps);
    return 0;
}

static int device_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    (void)flags;
    if (s->resources.device == JOBSPEC_DEV_CPU && s->train.precision == JOBSPEC_PREC_BF16)
        return loom_err(e, LOOM_E_PRECISION_DEVICE, "train.precision",
                        "precision=bf16 needs device=cuda; the cpu backend computes in fp32");
    if (s->resources.device == JOBSPEC_DEV_CPU && s->train.precision == JOBSPEC_PREC_FP8)
        return loom_err(e, LOOM_E_PRECISION_DEVICE, "train.precision",
                        "precision=fp8 needs device=cuda; the cpu backend computes in fp32");
    if (s->resources.device == JOBSPEC_DEV_CPU && s->train.offload_optimizer)
        return loom_err(e, LOOM_E_OFFLOAD_DEVICE, "train.offload_optimizer",
                        "offload_optimizer needs device=cuda; on cpu the optimizer already "
                        "lives in host memory");
    return 0;
}

static int data_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    if (!(flags & JOBSPEC_FOR_PLAN)) {
        if (!s->data.train[0])
            return loom_err(e, LOOM_E_MISSING_FIELD, "data.train",
                            "data.train is required (absolute path or glob of .bin shards)");
        if (s->train.eval_every > 0 && !s->data.val[0] && s->data.val_fraction == 0)
            return loom_err(e, LOOM_E_EVAL_WITHOUT_VAL, "train.eval_every",
                            "train.eval_every=%lld needs data.val or data.val_fraction",
                            (long long)s->train.eval_every);
    }
    if (s->data.train[0] && jobspec_path_lexical(s->data.train, "data.train", e) != 0) return -1;
    if (s->data.val[0] && jobspec_path_lexical(s->data.val, "data.val", e) != 0) return -1;
    return 0;
}

static int name_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    (void)flags;
    if (s->name[0]) {
        const char *n = s->name;
        int ok = (n[0] >= 'a' && n[0] <= 'z') || (n[0] >= 'A' && n[0] <= 'Z') ||
                 (n[0] >= '0' && n[0] <= '9');
        for (const char *c = n; ok && *c; c++)
            ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '.' || *c == '_' || *c == '-';
        if (!ok)
            return loom_err(e, LOOM_E_INVALID_NAME, "name",
                            "name=\"%.64s\" must start with a letter or digit and use only "
                            "[A-Za-z0-9._-]",
                            n);
    } else {
        return loom_err(e, LOOM_E_INVALID_NAME, "name", "name must not be empty");
    }
    return 0;
}

static int rows_rule(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    (void)flags;
    return check_rows(s, e);
}

int jobspec_validate(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    static int (*const rules[])(const struct loom_spec *, unsigned, struct loom_error *) = {
        rows_rule,    model_rules,    layout_rules, batch_rules, optimizer_rules,
        device_rules, finetune_rules, data_rules,   name_rules,
    };
    for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
        if (rules[i](s, flags, e) != 0) return -1;
    return 0;
}

/* Keep reals to 15 significant digits, so the canonical text is short
 * ("0.0006", not "0.00059999999999999995") and parses back to the same
 * double. */
static double snap15(double v) {
    char b[40];
    snprintf(b, sizeof b, "%.15g", v);
    return strtod(b, NULL);
}

/* No targets: all of the family's; else the family's order (unknown names
 * last, for jobspec_validate to report). */
static void lora_canonical_targets(struct loom_spec *s) {
    struct {
        char (*t)[8];
        int n;
    } l = {s->train.lora.targets, s->train.lora.n_targets};
    if (l.n == 0) {
        const char *const *names = lora_targets_of(s->model.family);
        for (; names[l.n] && l.n < JOBSPEC_LORA_TARGETS_MAX; l.n++)
            snprintf(l.t[l.n], sizeof l.t[l.n], "%s", names[l.n]);
        s->train.lora.n_targets = l.n;
        return;
    }
    for (int i = 1; i < l.n; i++)
        for (int j = i; j > 0 && target_index(s->model.family, l.t[j - 1]) >
                                     target_index(s->model.family, l.t[j]);
             j--) {
            char tmp[8];
            memcpy(tmp, l.t[j], sizeof tmp);
            memcpy(l.t[j], l.t[j - 1], sizeof tmp);
            memcpy(l.t[j - 1], tmp, sizeof tmp);
        }
}

/* Every member of an `array` submission must be a valid spec on its own. */
static int check_array_members(const struct loom_spec *s, const json_t *body, unsigned flags,
                               struct loom_error *e) {
    struct loom_spec *ms = malloc(sizeof *ms);
    if (!ms) return loom_err(e, LOOM_E_INTERNAL, "array", "out of memory");
    size_t n = jobspec_array_size(s);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *m = jobspec_array_member(s, body, i);
        struct loom_error me;
        memset(&me, 0, sizeof me);
        if (!m) {
            rc = loom_err(e, LOOM_E_INTERNAL, "array", "out of memory");
        } else if (jobspec_parse(ms, m, flags, &me) != 0) {
            char what[256] = "";
            for (int k = 0; k < s->n_array; k++) {
                char *vt = json_dumps(get_dotted(m, s->array[k].key),
                                      JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
                size_t l = strlen(what);
                snprintf(what + l, sizeof what - l, "%s%s=%s", k ? ", " : "", s->array[k].key,
                         vt ? vt : "?");
                free(vt);
            }
            rc = loom_error_set(e, me.status, me.code, me.field, "array member %zu (%s): %s", i,
                                what, me.message);
        }
        json_decref(m);
    }
    free(ms);
    return rc;
}

int jobspec_parse(struct loom_spec *s, const json_t *j, unsigned flags, struct loom_error *e) {
    jobspec_init(s);
    if (!json_is_object(j))
        return loom_err(e, LOOM_E_INVALID_JSON, "", "the job spec must be a JSON object, got %s",
                        j ? json_type_word(j) : "nothing");
    struct parse_ctx c = {.s = s};
    if (parse_object(&c, j, "", e) != 0) return -1;
    if (resolve_model(&c, json_object_get(j, "model") != NULL, e) != 0) return -1;
    /* the defaults that depend on other fields (FL_DERIVED rows) */
    if (!seen(&c, "train.precision"))
        s->train.precision =
            s->resources.device == JOBSPEC_DEV_CPU ? JOBSPEC_PREC_FP32 : JOBSPEC_PREC_BF16;
    if (!seen(&c, "train.min_lr")) s->train.min_lr = s->train.lr / 10;
    s->model.pp_balance = s->parallel.pp_balance; /* every stage computation reads the model */
    if (!seen(&c, "train.global_batch_tokens"))
        s->train.global_batch_tokens =
            (int64_t)s->train.micro_batch * s->model.seq_len * s->parallel.dp;
    if (!seen(&c, "name"))
        snprintf(s->name, sizeof s->name, "%s-%s", model_family_name(s->model.family),
                 s->model.preset[0] ? s->model.preset : "custom");
    if (s->train.lora.enabled) lora_canonical_targets(s);
    for (size_t i = 0; i < N_FIELDS; i++)
        if (fields[i].type == F_DBL) {
            double *x = (double *)((char *)s + fields[i].off);
            *x = snap15(*x);
        }
    if (jobspec_validate(s, flags, e) != 0) return -1;
    return s->n_array && (flags & JOBSPEC_ARRAY_MEMBERS) ? check_array_members(s, j, flags, e) : 0;
}

int jobspec_parse_text(struct loom_spec *s, const char *text, size_t len, unsigned flags,
                       struct loom_error *e) {
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        jobspec_init(s);
        return loom_err(e, LOOM_E_INVALID_JSON, "", "malformed JSON at line %d column %d: %s",
                        je.line, je.column, je.text);
    }
    int rc = jobspec_parse(s, j, flags, e);
    json_decref(j);
    return rc;
}

/* Whether a row is part of this spec (the canonical form lists it, the
 * range checks look at it). */
static int row_present(const field_t *f, const struct loom_spec *s) {
    const char *p = (const char *)s + f->off;
    if ((f->flags & FL_IF_ROPE) && s->model.pos != MODEL_POS_ROPE) return 0;
    if ((f->flags & FL_IF_LORA) && !s->train.lora.enabled) return 0;
    if (!(f->flags & FL_OMIT)) return 1;
    switch (f->type) {
    case F_STR:
        return p[0] != '\0';
    case F_STRLIST:
        return *(const int *)((const char *)s + f->count_off) > 0;
    case F_ENUM:
        return *(const int *)p != 0;
    case F_DBL:
        return *(const double *)p != 0;
    case F_ARRAY:
        return s->n_array > 0;
    case F_LABELS:
        return *(const int *)((const char *)s + f->count_off) > 0;
    default:
        return 1;
    }
}

/* The JSON value of one (non-section) row. New reference. */
static json_t *row_to_json(const field_t *f, const struct loom_spec *s) {
    const char *p = (const char *)s + f->off;
    switch (f->type) {
    case F_I32:
        return json_integer(*(const int *)p);
    case F_I64:
        return json_integer((json_int_t) * (const int64_t *)p);
    case F_U64:
        return json_integer((json_int_t) * (const uint64_t *)p);
    case F_DBL:
        return json_real(*(const double *)p);
    case F_BOOL:
        return json_boolean(*(const int *)p);
    case F_STR:
        return json_string(p);
    case F_ENUM:
        return json_string(f->names[*(const int *)p]);
    case F_RECOMPUTE: {
        const field_t *budget = f + 1;
        if (row_present(budget, s)) {
            json_t *o = json_object();
            json_object_set_new(o, "budget_gib", row_to_json(budget, s));
            return o;
        }
        return json_string(f->names[*(const int *)p]);
    }
    case F_STRLIST: {
        json_t *a = json_array();
        int n = *(const int *)((const char *)s + f->count_off);
        for (int i = 0; i < n; i++)
            json_array_append_new(a, json_string(p + (size_t)i * f->size));
        return a;
    }
    case F_LABELS: {
        json_t *o = json_object();
        const struct jobspec_label *l = (const struct jobspec_label *)p;
        int n = *(const int *)((const char *)s + f->count_off);
        for (int i = 0; i < n; i++)
            json_object_set_new(o, l[i].key, json_string(l[i].value));
        return o;
    }
    case F_ARRAY: {
        json_t *o = json_object();
        for (int i = 0; i < s->n_array; i++)
            json_object_set_new(o, s->array[i].key, json_loads(s->array[i].values, 0, NULL));
        return o;
    }
    default:
        return json_object();
    }
}

json_t *jobspec_to_json(const struct loom_spec *s) {
    json_t *root = json_object();
    if (!root) return NULL;
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        if ((f->flags & FL_INNER) || !row_present(f, s)) continue;
        /* the section objects come before their rows in the table */
        json_t *parent = root;
        const char *leaf = f->path;
        for (const char *dot; (dot = strchr(leaf, '.')); leaf = dot + 1) {
            char key[JOBSPEC_KEY_MAX];
            snprintf(key, sizeof key, "%.*s", (int)(dot - leaf), leaf);
            parent = json_object_get(parent, key);
        }
        if (!parent) continue; /* its section is absent (train.lora off) */
        json_object_set_new(parent, leaf, f->type == F_OBJ ? json_object() : row_to_json(f, s));
    }
    return root;
}

/* Every present row's value within its row's range, names and format: a
 * spec filled by hand (the planner's layouts) meets the parser's rules. */
static int check_rows(const struct loom_spec *s, struct loom_error *e) {
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        const char *p = (const char *)s + f->off;
        if (!row_present(f, s)) continue;
        int rc = 0;
        switch (f->type) {
        case F_I32:
            rc = check_int_range(f, *(const int *)p, f->path, e);
            break;
        case F_I64:
            rc = check_int_range(f, (long long)*(const int64_t *)p, f->path, e);
            break;
        case F_U64:
            rc =
                (double)*(const uint64_t *)p > f->max
                    ? loom_err(e, LOOM_E_OUT_OF_RANGE, f->path, "%s is above %.0f", f->path, f->max)
                    : 0;
            break;
        case F_DBL:
            rc = check_dbl_range(f, *(const double *)p, f->path, e);
            break;
        case F_ENUM:
        case F_RECOMPUTE: {
            int v = *(const int *)p, lo = (f->flags & FL_ENUM_UNSET) && !(f->flags & FL_OMIT);
            if (v < lo || v >= enum_count(f))
                rc = loom_err(e, LOOM_E_INVALID_VALUE, f->path, "%s=%d is not a known value",
                              f->path, v);
            break;
        }
        case F_STR:
            rc = f->check ? f->check(f->path, p, e) : 0; /* empty FL_OMIT rows are absent */
            break;
        case F_STRLIST: {
            int n = *(const int *)((const char *)s + f->count_off);
            if (n < 0 || n > f->max_count)
                rc = loom_err(e, LOOM_E_OUT_OF_RANGE, f->path, "%s has %d entries, at most %d",
                              f->path, n, f->max_count);
            for (int k = 0; rc == 0 && f->check && k < n; k++)
                rc = f->check(f->path, p + (size_t)k * f->size, e);
            break;
        }
        default:
            break;
        }
        if (rc != 0) return -1;
    }
    return 0;
}

char *jobspec_dumps(const struct loom_spec *s) {
    json_t *j = jobspec_to_json(s);
    if (!j) return NULL;
    char *out = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    json_decref(j);
    return out;
}

int64_t jobspec_lora_params(const struct loom_spec *s) {
    if (!s->train.lora.enabled) return 0;
    const char *t[JOBSPEC_LORA_TARGETS_MAX];
    for (int i = 0; i < s->train.lora.n_targets; i++)
        t[i] = s->train.lora.targets[i];
    int64_t n = model_lora_params(&s->model, s->train.lora.rank, t, s->train.lora.n_targets);
    return n > 0 ? n : 0;
}

void jobspec_derive(const struct loom_spec *s, struct jobspec_derived *d) {
    memset(d, 0, sizeof *d);
    d->world = s->parallel.dp * s->parallel.tp * s->parallel.pp;
    int gpn = s->resources.gpus_per_node > 0 ? s->resources.gpus_per_node : 1;
    d->nodes = (d->world + gpn - 1) / gpn;
    d->tokens_per_micro = (int64_t)s->train.micro_batch * s->model.seq_len;
    int64_t unit = d->tokens_per_micro * s->parallel.dp;
    d->grad_accum = unit > 0 ? s->train.global_batch_tokens / unit : 0;
    d->tokens_per_step = s->train.global_batch_tokens;
    d->sequences_per_step =
        s->model.seq_len > 0 ? s->train.global_batch_tokens / s->model.seq_len : 0;
    d->tokens_total = s->train.steps * s->train.global_batch_tokens;
    d->n_params = model_n_params(&s->model);
    /* LoRA: the frozen base has no weight gradients (the MFU a LoRA job
     * reports counts the work it does) */
    d->flops_per_token =
        s->train.lora.enabled
            ? model_lora_flops_per_token(&s->model, s->model.seq_len, jobspec_lora_params(s))
            : model_flops_per_token(&s->model, s->model.seq_len);
}

json_t *jobspec_derived_to_json(const struct jobspec_derived *d) {
    return json_pack("{s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "world", d->world, "nodes",
                     d->nodes, "tokens_per_micro_batch", (json_int_t)d->tokens_per_micro,
                     "grad_accum", (json_int_t)d->grad_accum, "tokens_per_step",
                     (json_int_t)d->tokens_per_step, "sequences_per_step",
                     (json_int_t)d->sequences_per_step, "tokens_total", (json_int_t)d->tokens_total,
                     "n_params", (json_int_t)d->n_params, "flops_per_token", d->flops_per_token);
}
