/* Job-spec parsing, validation, canonical JSON and data-path confinement.
 *
 * Parsing is driven by field tables (name, type, offset, range, enum names):
 * one generic walker checks each JSON object against its table, so adding a
 * field is one row. Fields whose default depends on others (precision,
 * min_lr, global_batch_tokens, name) are resolved after the walk from the
 * `seen` bitmask. Cross-field rules live in jobspec_validate, each with its
 * own code, in the order a user would fix them (model, layout, batch,
 * optimizer, device, data). */
#include "api/jobspec.h"

#include <errno.h>
#include <glob.h>
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

/* ---- field tables ---- */

enum ftype {
    F_I32,
    F_I64,
    F_U64,
    F_DBL,
    F_BOOL,
    F_STR,
    F_ENUM,
    F_OBJ,
    F_LABELS,
    F_STRLIST,   /* array of strings into char[max_count][size], count at count_off */
    F_RECOMPUTE, /* an enum name or {"budget_gib": N} */
    F_ARRAY,     /* dotted spec key -> list of values */
};

#define FL_MIN_EXCL    0x1u /* numbers: min itself is out of range */
#define FL_MAX_EXCL    0x2u /* numbers: max itself is out of range */
#define FL_ENUM_UNSET  0x4u /* F_ENUM: index 0 means "not set", not accepted as input */
#define FL_ONE_OR_LIST 0x8u /* F_STRLIST: a lone string is a list of one */

/* Ids of fields whose presence matters after the walk (bits of `seen`). */
enum seen_id {
    S_NONE = 0,
    S_NAME,
    S_FAMILY,
    S_PRESET,
    S_N_LAYER,
    S_N_HEAD,
    S_N_KV_HEAD,
    S_D_MODEL,
    S_D_FF,
    S_VOCAB,
    S_SEQ,
    S_TIED,
    S_THETA,
    S_EPS,
    S_GBT,
    S_MIN_LR,
    S_PRECISION,
    S_TRAIN_DATA,
    S_LORA,
};

/* A value check beyond type and range (string formats); 0 or -1 with `e`. */
typedef int (*field_check)(const char *path, const char *value, struct loom_error *e);

struct table;
struct field {
    const char *name;
    enum ftype type;
    size_t off;
    double min, max;          /* numbers: inclusive range */
    size_t size;              /* F_STR: buffer size incl. NUL */
    const char *const *names; /* F_ENUM */
    const struct table *sub;  /* F_OBJ */
    enum seen_id id;
    unsigned flags;    /* FL_* */
    size_t count_off;  /* F_STRLIST: offset of the int count */
    int max_count;     /* F_STRLIST: most items */
    field_check check; /* F_STR, F_STRLIST: per value */
};

struct table {
    const struct field *f;
    size_t n;
};

/* Explicit model fields, parsed into this staging struct then resolved
 * against the preset. */
struct model_in {
    int family;
    char preset[MODEL_NAME_MAX];
    int n_layer, n_head, n_kv_head, d_model, d_ff, vocab_size, seq_len;
    int tied;
    double rope_theta, norm_eps;
    char init_from[JOBSPEC_PATH_MAX];
};

static int check_init_from(const char *path, const char *v, struct loom_error *e);
static int check_tokenizer(const char *path, const char *v, struct loom_error *e);
static int check_text_key(const char *path, const char *v, struct loom_error *e);
static int check_gpu_type(const char *path, const char *v, struct loom_error *e);
static int check_job_id(const char *path, const char *v, struct loom_error *e);

#define OFF(m)  offsetof(struct loom_spec, m)
#define MOFF(m) offsetof(struct model_in, m)

static const struct field model_fields[] = {
    {"family", F_ENUM, MOFF(family), 0, 0, 0, family_names, NULL, S_FAMILY, 0, 0, 0, NULL},
    {"preset", F_STR, MOFF(preset), 0, 0, MODEL_NAME_MAX, NULL, NULL, S_PRESET, 0, 0, 0, NULL},
    {"n_layer", F_I32, MOFF(n_layer), 1, 1024, 0, NULL, NULL, S_N_LAYER, 0, 0, 0, NULL},
    {"n_head", F_I32, MOFF(n_head), 1, 1024, 0, NULL, NULL, S_N_HEAD, 0, 0, 0, NULL},
    {"n_kv_head", F_I32, MOFF(n_kv_head), 1, 1024, 0, NULL, NULL, S_N_KV_HEAD, 0, 0, 0, NULL},
    {"d_model", F_I32, MOFF(d_model), 1, 65536, 0, NULL, NULL, S_D_MODEL, 0, 0, 0, NULL},
    {"d_ff", F_I32, MOFF(d_ff), 1, 1048576, 0, NULL, NULL, S_D_FF, 0, 0, 0, NULL},
    {"vocab_size", F_I32, MOFF(vocab_size), 1, 4194304, 0, NULL, NULL, S_VOCAB, 0, 0, 0, NULL},
    {"seq_len", F_I32, MOFF(seq_len), 1, 1048576, 0, NULL, NULL, S_SEQ, 0, 0, 0, NULL},
    {"tied_embeddings", F_BOOL, MOFF(tied), 0, 0, 0, NULL, NULL, S_TIED, 0, 0, 0, NULL},
    {"rope_theta", F_DBL, MOFF(rope_theta), 1, 1e12, 0, NULL, NULL, S_THETA, 0, 0, 0, NULL},
    {"norm_eps", F_DBL, MOFF(norm_eps), 1e-12, 1e-2, 0, NULL, NULL, S_EPS, 0, 0, 0, NULL},
    {.name = "init_from",
     .type = F_STR,
     .off = MOFF(init_from),
     .size = JOBSPEC_PATH_MAX,
     .check = check_init_from},
};

static const struct field data_fields[] = {
    {"train", F_STR, OFF(data.train), 0, 0, JOBSPEC_PATH_MAX, NULL, NULL, S_TRAIN_DATA, 0, 0, 0,
     NULL},
    {"val", F_STR, OFF(data.val), 0, 0, JOBSPEC_PATH_MAX, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {.name = "format", .type = F_ENUM, .off = OFF(data.format), .names = format_names},
    {.name = "tokenizer",
     .type = F_STR,
     .off = OFF(data.tokenizer),
     .size = JOBSPEC_PATH_MAX,
     .check = check_tokenizer},
    {.name = "chat_template",
     .type = F_ENUM,
     .off = OFF(data.chat_template),
     .names = chat_template_names,
     .flags = FL_ENUM_UNSET},
    {.name = "text_key",
     .type = F_STR,
     .off = OFF(data.text_key),
     .size = JOBSPEC_KEY_MAX,
     .check = check_text_key},
    {.name = "val_fraction", .type = F_DBL, .off = OFF(data.val_fraction), .min = 0, .max = 0.5},
    {.name = "overlong", .type = F_ENUM, .off = OFF(data.overlong), .names = overlong_names},
};

static const struct field parallel_fields[] = {
    {"dp", F_I32, OFF(parallel.dp), 1, JOBSPEC_WORLD_MAX, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"tp", F_I32, OFF(parallel.tp), 1, 64, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"pp", F_I32, OFF(parallel.pp), 1, 1024, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"zero_stage", F_I32, OFF(parallel.zero_stage), 0, 3, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"pp_balance", F_BOOL, OFF(parallel.pp_balance), 0, 0, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
};

static const struct field lora_fields[] = {
    {.name = "rank", .type = F_I32, .off = OFF(train.lora.rank), .min = 1, .max = 1024},
    {.name = "alpha",
     .type = F_DBL,
     .off = OFF(train.lora.alpha),
     .min = 0,
     .max = 1e6,
     .flags = FL_MIN_EXCL},
    {.name = "dropout",
     .type = F_DBL,
     .off = OFF(train.lora.dropout),
     .min = 0,
     .max = 1,
     .flags = FL_MAX_EXCL},
    {.name = "targets",
     .type = F_STRLIST,
     .off = OFF(train.lora.targets),
     .size = sizeof((struct loom_spec *)0)->train.lora.targets[0],
     .count_off = OFF(train.lora.n_targets),
     .max_count = JOBSPEC_LORA_TARGETS_MAX},
};
static const struct table lora_table = {lora_fields, sizeof lora_fields / sizeof *lora_fields};

static const struct field train_fields[] = {
    {"steps", F_I64, OFF(train.steps), 1, 1e9, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"global_batch_tokens", F_I64, OFF(train.global_batch_tokens), 1, 1099511627776.0, 0, NULL,
     NULL, S_GBT, 0, 0, 0, NULL},
    {"micro_batch", F_I32, OFF(train.micro_batch), 1, 65536, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"lr", F_DBL, OFF(train.lr), 1e-12, 10, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"min_lr", F_DBL, OFF(train.min_lr), 0, 10, 0, NULL, NULL, S_MIN_LR, 0, 0, 0, NULL},
    {"warmup_steps", F_I64, OFF(train.warmup_steps), 0, 1e9, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"schedule", F_ENUM, OFF(train.schedule), 0, 0, 0, schedule_names, NULL, S_NONE, 0, 0, 0, NULL},
    {"weight_decay", F_DBL, OFF(train.weight_decay), 0, 10, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"grad_clip", F_DBL, OFF(train.grad_clip), 0, 1e6, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"beta1", F_DBL, OFF(train.beta1), 0, 0.999999, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"beta2", F_DBL, OFF(train.beta2), 0, 0.999999999, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"eps", F_DBL, OFF(train.eps), 1e-30, 1, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"seed", F_U64, OFF(train.seed), 0, 9007199254740991.0, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"precision", F_ENUM, OFF(train.precision), 0, 0, 0, precision_names, NULL, S_PRECISION, 0, 0,
     0, NULL},
    {"recompute", F_RECOMPUTE, OFF(train.recompute), 0, 0, 0, recompute_names, NULL, S_NONE, 0, 0,
     0, NULL},
    {"offload_optimizer", F_BOOL, OFF(train.offload_optimizer), 0, 0, 0, NULL, NULL, S_NONE, 0, 0,
     0, NULL},
    {"eval_every", F_I64, OFF(train.eval_every), 0, 1e9, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"eval_batches", F_I64, OFF(train.eval_batches), 1, 1e6, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {.name = "loss_on", .type = F_ENUM, .off = OFF(train.loss_on), .names = loss_on_names},
    {.name = "packing", .type = F_ENUM, .off = OFF(train.packing), .names = packing_names},
    {.name = "lora", .type = F_OBJ, .sub = &lora_table, .id = S_LORA},
    {.name = "quantize_base",
     .type = F_ENUM,
     .off = OFF(train.quantize_base),
     .names = quantize_names},
};

static const struct field checkpoint_fields[] = {
    {"every_steps", F_I64, OFF(checkpoint.every_steps), 0, 1e9, 0, NULL, NULL, S_NONE, 0, 0, 0,
     NULL},
    {"keep", F_I32, OFF(checkpoint.keep), 1, 1000, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
};

static const struct field resources_fields[] = {
    {"device", F_ENUM, OFF(resources.device), 0, 0, 0, device_names, NULL, S_NONE, 0, 0, 0, NULL},
    {"gpus_per_node", F_I32, OFF(resources.gpus_per_node), 1, 64, 0, NULL, NULL, S_NONE, 0, 0, 0,
     NULL},
    {.name = "gpu_type",
     .type = F_STRLIST,
     .off = OFF(resources.gpu_type),
     .size = JOBSPEC_GPU_TYPE_MAX,
     .count_off = OFF(resources.n_gpu_types),
     .max_count = JOBSPEC_GPU_TYPES_MAX,
     .flags = FL_ONE_OR_LIST,
     .check = check_gpu_type},
    {.name = "allow_mixed", .type = F_BOOL, .off = OFF(resources.allow_mixed)},
};

static const struct field export_fields[] = {
    {.name = "hf", .type = F_BOOL, .off = OFF(export.hf)},
    {.name = "lora", .type = F_BOOL, .off = OFF(export.lora)},
};

#define TABLE(a)                                                                                   \
    { a, sizeof a / sizeof *a }
static const struct table data_table = TABLE(data_fields);
static const struct table parallel_table = TABLE(parallel_fields);
static const struct table train_table = TABLE(train_fields);
static const struct table checkpoint_table = TABLE(checkpoint_fields);
static const struct table resources_table = TABLE(resources_fields);
static const struct table export_table = TABLE(export_fields);
static const struct table model_table = TABLE(model_fields);

/* "model" is handled by the caller (it has its own staging struct). */
static const struct field top_fields[] = {
    {"name", F_STR, OFF(name), 0, 0, JOBSPEC_NAME_MAX, NULL, NULL, S_NAME, 0, 0, 0, NULL},
    {"labels", F_LABELS, 0, 0, 0, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"model", F_OBJ, 0, 0, 0, 0, NULL, &model_table, S_NONE, 0, 0, 0, NULL},
    {"data", F_OBJ, 0, 0, 0, 0, NULL, &data_table, S_NONE, 0, 0, 0, NULL},
    {"parallel", F_OBJ, 0, 0, 0, 0, NULL, &parallel_table, S_NONE, 0, 0, 0, NULL},
    {"train", F_OBJ, 0, 0, 0, 0, NULL, &train_table, S_NONE, 0, 0, 0, NULL},
    {"checkpoint", F_OBJ, 0, 0, 0, 0, NULL, &checkpoint_table, S_NONE, 0, 0, 0, NULL},
    {"resources", F_OBJ, 0, 0, 0, 0, NULL, &resources_table, S_NONE, 0, 0, 0, NULL},
    {"priority", F_I32, OFF(priority), 0, 100, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {"max_retries", F_I32, OFF(max_retries), 0, 100, 0, NULL, NULL, S_NONE, 0, 0, 0, NULL},
    {.name = "export", .type = F_OBJ, .sub = &export_table},
    {.name = "max_runtime_s", .type = F_I64, .off = OFF(max_runtime_s), .min = 0, .max = 1e9},
    {.name = "after",
     .type = F_STRLIST,
     .off = OFF(after),
     .size = JOBSPEC_ID_MAX,
     .count_off = OFF(n_after),
     .max_count = JOBSPEC_AFTER_MAX,
     .check = check_job_id},
    {.name = "preemptible", .type = F_BOOL, .off = OFF(preemptible)},
    {.name = "array", .type = F_ARRAY},
};
static const struct table top_table = TABLE(top_fields);

void jobspec_init(struct loom_spec *s) {
    memset(s, 0, sizeof *s);
    s->parallel.dp = s->parallel.tp = s->parallel.pp = 1;
    s->train.steps = 1000;
    s->train.micro_batch = 4;
    s->train.lr = 6e-4;
    s->train.min_lr = 6e-5;
    s->train.weight_decay = 0.1;
    s->train.grad_clip = 1.0;
    s->train.beta1 = 0.9;
    s->train.beta2 = 0.95;
    s->train.eps = 1e-8;
    s->train.seed = 42;
    s->train.eval_batches = 20;
    s->train.lora.rank = 16;
    s->train.lora.alpha = 32;
    snprintf(s->data.text_key, sizeof s->data.text_key, "text");
    s->checkpoint.every_steps = 200;
    s->checkpoint.keep = 3;
    s->resources.device = JOBSPEC_DEV_CUDA;
    s->resources.gpus_per_node = 8;
    s->priority = 50;
    s->max_retries = 3;
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
        return loom_error_set(e, 422, "INVALID_VALUE", path, "%s contains a NUL character", path);
    if (len >= size)
        return loom_error_set(e, 422, "OUT_OF_RANGE", path, "%s is %zu bytes long, at most %zu",
                              path, len, size - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return loom_error_set(e, 422, "INVALID_VALUE", path,
                                  "%s contains a control character at byte %zu", path, i);
    memcpy(buf, s, len + 1);
    return 0;
}

static int parse_labels(struct loom_spec *s, const json_t *v, struct loom_error *e) {
    if (!json_is_object(v))
        return loom_error_set(e, 422, "WRONG_TYPE", "labels",
                              "labels must be an object of strings, got %s", json_type_word(v));
    if (json_object_size(v) > JOBSPEC_LABELS_MAX)
        return loom_error_set(e, 422, "OUT_OF_RANGE", "labels",
                              "labels has %zu entries, at most %d", json_object_size(v),
                              JOBSPEC_LABELS_MAX);
    const char *key;
    json_t *val;
    s->n_labels = 0;
    json_object_foreach((json_t *)v, key, val) {
        char path[128];
        join_path(path, sizeof path, "labels", key);
        size_t kl = strlen(key);
        int ok = kl > 0 && kl < JOBSPEC_LABEL_KEY_MAX;
        for (size_t i = 0; ok && i < kl; i++) {
            char c = key[i];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-' || c == '/';
        }
        if (!ok)
            return loom_error_set(e, 422, "INVALID_LABEL", path,
                                  "label keys are 1-%d characters of [A-Za-z0-9._/-]",
                                  JOBSPEC_LABEL_KEY_MAX - 1);
        if (!json_is_string(val))
            return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a string, got %s", path,
                                  json_type_word(val));
        struct jobspec_label *l = &s->labels[s->n_labels];
        memcpy(l->key, key, kl + 1);
        if (take_string(val, l->value, sizeof l->value, path, e) != 0) return -1;
        s->n_labels++;
    }
    /* sorted by key so the canonical form does not depend on input order */
    for (int i = 1; i < s->n_labels; i++)
        for (int j = i; j > 0 && strcmp(s->labels[j - 1].key, s->labels[j].key) > 0; j--) {
            struct jobspec_label t = s->labels[j];
            s->labels[j] = s->labels[j - 1];
            s->labels[j - 1] = t;
        }
    return 0;
}

static int parse_value(const struct field *f, const json_t *v, void *base, const char *path,
                       struct loom_error *e);

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
            return loom_error_set(e, 422, "INVALID_INIT_FROM", path,
                                  "%s=\"%.200s\" is not job:<id> or job:<id>@<step> (id of "
                                  "[A-Za-z0-9._-], step a non-negative integer)",
                                  path, v);
        return 0;
    }
    const char *why = plain_path_problem(v);
    if (why)
        return loom_error_set(e, 422, "INVALID_INIT_FROM", path,
                              "%s=\"%.200s\" %s (an HF model directory, job:<id> or "
                              "job:<id>@<step>)",
                              path, v, why);
    return 0;
}

static int check_tokenizer(const char *path, const char *v, struct loom_error *e) {
    const char *why = plain_path_problem(v);
    if (why)
        return loom_error_set(e, 422, "DATA_PATH_INVALID", path,
                              "%s=\"%.200s\" %s (tokenizer.json, tokenizer.model or an HF "
                              "directory)",
                              path, v, why);
    return 0;
}

static int check_text_key(const char *path, const char *v, struct loom_error *e) {
    if (!v[0]) return loom_error_set(e, 422, "INVALID_VALUE", path, "%s must not be empty", path);
    return 0;
}

static int check_gpu_type(const char *path, const char *v, struct loom_error *e) {
    size_t n = strlen(v);
    int ok = n > 0;
    for (size_t i = 0; ok && i < n; i++)
        ok = id_char(v[i]);
    if (!ok)
        return loom_error_set(e, 422, "INVALID_GPU_TYPE", path,
                              "%s=\"%.64s\" is not a GPU type name (1-%d of [A-Za-z0-9._-], "
                              "e.g. H100-SXM)",
                              path, v, JOBSPEC_GPU_TYPE_MAX - 1);
    return 0;
}

static int check_job_id(const char *path, const char *v, struct loom_error *e) {
    if (!is_job_id(v, strlen(v)))
        return loom_error_set(e, 422, "INVALID_JOB_ID", path,
                              "%s=\"%.80s\" is not a job id (1-%d of [A-Za-z0-9._-], e.g. "
                              "j-d1b9522f5b1a)",
                              path, v, JOBSPEC_ID_MAX - 1);
    return 0;
}

/* A list of strings (or, with FL_ONE_OR_LIST, one string) into
 * char[max_count][size] with its count. */
static int parse_strlist(const struct field *f, const json_t *v, void *base, const char *path,
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
        return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be %s, got %s", path,
                              (f->flags & FL_ONE_OR_LIST) ? "a string or a list of strings"
                                                          : "a list of strings",
                              json_type_word(v));
    size_t n = json_array_size(v);
    if (n == 0 || n > (size_t)f->max_count)
        return loom_error_set(e, 422, "OUT_OF_RANGE", path, "%s has %zu entries, give 1-%d", path,
                              n, f->max_count);
    for (size_t i = 0; i < n; i++) {
        char ipath[160];
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        const json_t *it = json_array_get(v, i);
        if (!json_is_string(it))
            return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a string, got %s", ipath,
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

/* train.recompute: "none|selective|full" or {"budget_gib": N} (N > 0: the
 * planner picks the layers to recompute so activations fit N GiB). */
static int parse_recompute(const struct field *f, const json_t *v, void *base, const char *path,
                           struct loom_error *e) {
    struct loom_spec *s = base;
    if (json_is_string(v)) {
        struct field as_enum = *f;
        as_enum.type = F_ENUM;
        s->train.recompute_budget_gib = 0;
        return parse_value(&as_enum, v, base, path, e);
    }
    if (!json_is_object(v))
        return loom_error_set(e, 422, "WRONG_TYPE", path,
                              "%s must be none|selective|full or {\"budget_gib\": N}, got %s", path,
                              json_type_word(v));
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        if (strcmp(key, "budget_gib") != 0) {
            char kpath[160];
            join_path(kpath, sizeof kpath, path, key);
            return loom_error_set(e, 422, "UNKNOWN_FIELD", kpath, "unknown field %s", kpath);
        }
    }
    const json_t *b = json_object_get(v, "budget_gib");
    if (!b)
        return loom_error_set(e, 422, "MISSING_FIELD", path,
                              "%s.budget_gib is required in the "
                              "object form",
                              path);
    static const struct field budget = {.name = "budget_gib",
                                        .type = F_DBL,
                                        .off = OFF(train.recompute_budget_gib),
                                        .min = 0,
                                        .max = 1e6,
                                        .flags = FL_MIN_EXCL};
    char bpath[160];
    join_path(bpath, sizeof bpath, path, "budget_gib");
    s->train.recompute = JOBSPEC_RECOMPUTE_NONE;
    return parse_value(&budget, b, base, bpath, e);
}

static int parse_value(const struct field *f, const json_t *v, void *base, const char *path,
                       struct loom_error *e) {
    char *p = (char *)base + f->off;
    switch (f->type) {
    case F_I32:
    case F_I64:
    case F_U64: {
        if (!json_is_integer(v))
            return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be an integer, got %s", path,
                                  json_type_word(v));
        json_int_t x = json_integer_value(v);
        if ((double)x < f->min || (double)x > f->max)
            return loom_error_set(e, 422, "OUT_OF_RANGE", path,
                                  "%s=%lld is out of range [%.0f, %.0f]", path, (long long)x,
                                  f->min, f->max);
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
            return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a number, got %s", path,
                                  json_type_word(v));
        double x = json_number_value(v);
        int lo_ok = (f->flags & FL_MIN_EXCL) ? x > f->min : x >= f->min;
        int hi_ok = (f->flags & FL_MAX_EXCL) ? x < f->max : x <= f->max;
        if (!(lo_ok && hi_ok))
            return loom_error_set(e, 422, "OUT_OF_RANGE", path, "%s=%g is out of range %c%g, %g%c",
                                  path, x, (f->flags & FL_MIN_EXCL) ? '(' : '[', f->min, f->max,
                                  (f->flags & FL_MAX_EXCL) ? ')' : ']');
        *(double *)p = x;
        return 0;
    }
    case F_BOOL:
        if (!json_is_boolean(v))
            return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be true or false, got %s",
                                  path, json_type_word(v));
        *(int *)p = json_is_true(v);
        return 0;
    case F_STR:
        if (!json_is_string(v))
            return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a string, got %s", path,
                                  json_type_word(v));
        if (take_string(v, p, f->size, path, e) != 0) return -1;
        return f->check ? f->check(path, p, e) : 0;
    case F_STRLIST:
        return parse_strlist(f, v, base, path, e);
    case F_RECOMPUTE:
        return parse_recompute(f, v, base, path, e);
    case F_ENUM: {
        if (!json_is_string(v))
            return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a string, got %s", path,
                                  json_type_word(v));
        const char *s = json_string_value(v);
        char allowed[160] = "";
        int first = (f->flags & FL_ENUM_UNSET) ? 1 : 0;
        for (int i = first; f->names[i]; i++) {
            if (strcmp(s, f->names[i]) == 0 && strlen(s) == json_string_length(v)) {
                *(int *)p = i;
                return 0;
            }
            size_t l = strlen(allowed);
            snprintf(allowed + l, sizeof allowed - l, "%s%s", i > first ? "|" : "", f->names[i]);
        }
        return loom_error_set(e, 422, "INVALID_VALUE", path, "%s=\"%.64s\" is not one of %s", path,
                              s, allowed);
    }
    default:
        return loom_error_set(e, 422, "INVALID_VALUE", path, "%s: unsupported field", path);
    }
}

/* The row of a dotted spec key ("train.lr"), or NULL; *in_model tells
 * that its offset is into struct model_in. */
static const struct field *find_row(const char *dotted, int *in_model) {
    const struct table *t = &top_table;
    *in_model = 0;
    const char *seg = dotted;
    for (;;) {
        size_t len = strcspn(seg, ".");
        const struct field *f = NULL;
        for (size_t i = 0; i < t->n && !f; i++)
            if (strlen(t->f[i].name) == len && strncmp(t->f[i].name, seg, len) == 0) f = &t->f[i];
        if (!f) return NULL;
        if (seg[len] == '\0') return f;
        if (f->type != F_OBJ) return NULL;
        if (f->sub == &model_table) *in_model = 1;
        t = f->sub;
        seg += len + 1;
    }
}

static int is_scalar(enum ftype t) {
    return t == F_I32 || t == F_I64 || t == F_U64 || t == F_DBL || t == F_BOOL || t == F_STR ||
           t == F_ENUM || t == F_RECOMPUTE;
}

/* Staging area the values of an `array` are checked in. */
union array_scratch {
    struct loom_spec spec;
    struct model_in model;
};

static int parse_array_key(struct loom_spec *s, const char *key, const json_t *vals,
                           union array_scratch *scratch, size_t *members, struct loom_error *e) {
    char path[sizeof e->field];
    join_path(path, sizeof path, "array", key);
    int in_model;
    const struct field *row = find_row(key, &in_model);
    if (!row || !is_scalar(row->type) || strlen(key) >= JOBSPEC_KEY_MAX)
        return loom_error_set(e, 422, "INVALID_ARRAY_KEY", path,
                              "array key \"%.80s\" is not a spec field that takes one value "
                              "(e.g. train.lr, train.seed, parallel.dp)",
                              key);
    if (!json_is_array(vals))
        return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be a list of values, got %s",
                              path, json_type_word(vals));
    size_t n = json_array_size(vals);
    if (n == 0 || n > JOBSPEC_ARRAY_VALUES_MAX)
        return loom_error_set(e, 422, "OUT_OF_RANGE", path, "%s has %zu values, give 1-%d", path, n,
                              JOBSPEC_ARRAY_VALUES_MAX);
    for (size_t i = 0; i < n; i++) {
        char ipath[176];
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (parse_value(row, json_array_get(vals, i), in_model ? (void *)&scratch->model : scratch,
                        ipath, e) != 0) {
            snprintf(e->field, sizeof e->field, "%s", path);
            return -1;
        }
    }
    *members *= n;
    if (*members > JOBSPEC_ARRAY_MEMBERS_MAX)
        return loom_error_set(e, 422, "ARRAY_TOO_LARGE", path,
                              "array expands to more than %d jobs (the product of the value "
                              "counts)",
                              JOBSPEC_ARRAY_MEMBERS_MAX);
    struct jobspec_array_key *a = &s->array[s->n_array];
    char *text = json_dumps(vals, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (!text) return loom_error_set(e, 500, "INTERNAL", path, "out of memory");
    size_t tl = strlen(text);
    if (tl >= sizeof a->values) {
        free(text);
        return loom_error_set(e, 422, "OUT_OF_RANGE", path, "%s is %zu bytes of JSON, at most %zu",
                              path, tl, sizeof a->values - 1);
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
        return loom_error_set(e, 422, "WRONG_TYPE", "array",
                              "array must be an object of spec key -> list of values, got %s",
                              json_type_word(v));
    size_t nk = json_object_size(v);
    if (nk == 0 || nk > JOBSPEC_ARRAY_KEYS_MAX)
        return loom_error_set(e, 422, "OUT_OF_RANGE", "array", "array has %zu keys, give 1-%d", nk,
                              JOBSPEC_ARRAY_KEYS_MAX);
    union array_scratch *scratch = calloc(1, sizeof *scratch);
    if (!scratch) return loom_error_set(e, 500, "INTERNAL", "array", "out of memory");
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

static int parse_object(const json_t *obj, const char *path, const struct table *t, void *base,
                        struct loom_spec *spec, struct model_in *min, uint64_t *seen,
                        struct loom_error *e) {
    if (!json_is_object(obj))
        return loom_error_set(e, 422, "WRONG_TYPE", path, "%s must be an object, got %s",
                              path[0] ? path : "the spec", json_type_word(obj));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        char fpath[128];
        join_path(fpath, sizeof fpath, path, key);
        const struct field *f = NULL;
        for (size_t i = 0; i < t->n; i++)
            if (strcmp(t->f[i].name, key) == 0) {
                f = &t->f[i];
                break;
            }
        if (!f) return loom_error_set(e, 422, "UNKNOWN_FIELD", fpath, "unknown field %s", fpath);
        int rc;
        if (f->type == F_OBJ) {
            int is_model = f->sub == &model_table;
            rc = parse_object(v, fpath, f->sub, is_model ? (void *)min : (void *)spec, spec, min,
                              seen, e);
        } else if (f->type == F_LABELS) {
            rc = parse_labels(spec, v, e);
        } else if (f->type == F_ARRAY) {
            rc = parse_array(spec, v, e);
        } else {
            rc = parse_value(f, v, base, fpath, e);
        }
        if (rc != 0) return -1;
        if (f->id != S_NONE) *seen |= 1ull << f->id;
    }
    return 0;
}

#define SEEN(id) ((seen >> (id)) & 1u)

static int llama_default_ff(int d_model) {
    /* Llama: 2/3 of 4*d, rounded up to a multiple of 256 */
    int64_t f = (int64_t)8 * d_model / 3;
    return (int)((f + 255) / 256 * 256);
}

static int resolve_model(struct loom_spec *s, const struct model_in *m, uint64_t seen,
                         int have_model, struct loom_error *e) {
    if (!have_model)
        return loom_error_set(e, 422, "MISSING_FIELD", "model",
                              "model is required (e.g. {\"family\":\"gpt2\",\"preset\":\"124m\"})");
    if (!SEEN(S_FAMILY))
        return loom_error_set(e, 422, "MISSING_FIELD", "model.family",
                              "model.family is required (gpt2|llama)");
    struct model_config *c = &s->model;
    if (SEEN(S_PRESET)) {
        const struct model_preset *p = model_preset_find(m->family, m->preset);
        if (!p) {
            char names[256] = "";
            size_t n;
            const struct model_preset *all = model_presets(&n);
            for (size_t i = 0; i < n; i++) {
                if ((int)all[i].config.family != m->family) continue;
                size_t l = strlen(names);
                snprintf(names + l, sizeof names - l, "%s%s", l ? " " : "", all[i].name);
            }
            return loom_error_set(e, 422, "UNKNOWN_PRESET", "model.preset",
                                  "no %s preset \"%s\"; known: %s", model_family_name(m->family),
                                  m->preset, names);
        }
        *c = p->config;
        snprintf(c->preset, sizeof c->preset, "%s", p->name);
    } else {
        static const struct {
            enum seen_id id;
            const char *name;
        } need[] = {{S_N_LAYER, "n_layer"},
                    {S_N_HEAD, "n_head"},
                    {S_D_MODEL, "d_model"},
                    {S_VOCAB, "vocab_size"},
                    {S_SEQ, "seq_len"}};
        for (size_t i = 0; i < sizeof need / sizeof *need; i++)
            if (!SEEN(need[i].id)) {
                char path[64];
                snprintf(path, sizeof path, "model.%s", need[i].name);
                return loom_error_set(e, 422, "MISSING_FIELD", path,
                                      "%s is required when model.preset is absent", path);
            }
        memset(c, 0, sizeof *c);
        model_config_family_defaults(c, m->family);
    }
    if (SEEN(S_N_LAYER)) c->n_layer = m->n_layer;
    if (SEEN(S_N_HEAD)) c->n_head = m->n_head;
    if (SEEN(S_N_KV_HEAD))
        c->n_kv_head = m->n_kv_head;
    else if (SEEN(S_N_HEAD))
        c->n_kv_head = c->family == MODEL_GPT2 || !SEEN(S_PRESET) ? m->n_head : c->n_kv_head;
    if (SEEN(S_D_MODEL)) c->d_model = m->d_model;
    if (SEEN(S_D_FF))
        c->d_ff = m->d_ff;
    else if (!SEEN(S_PRESET) || SEEN(S_D_MODEL))
        c->d_ff = c->family == MODEL_GPT2 ? 4 * c->d_model : llama_default_ff(c->d_model);
    if (SEEN(S_VOCAB)) c->vocab_size = m->vocab_size;
    if (SEEN(S_SEQ)) c->seq_len = m->seq_len;
    if (SEEN(S_TIED)) c->tied_embeddings = m->tied;
    if (SEEN(S_THETA)) {
        if (c->pos != MODEL_POS_ROPE)
            return loom_error_set(e, 422, "INVALID_VALUE", "model.rope_theta",
                                  "model.rope_theta applies to llama (RoPE) only; gpt2 learns "
                                  "its positions");
        c->rope_theta = m->rope_theta;
    }
    if (SEEN(S_EPS)) c->norm_eps = m->norm_eps;
    if (!SEEN(S_PRESET)) c->preset[0] = '\0';
    model_config_finalize(c);
    return 0;
}

/* Absolute path, no '.'/'..' components, glob characters only in the last
 * component, no empty last component. */
static int path_lexical(const char *p, const char *field, struct loom_error *e) {
    if (p[0] != '/')
        return loom_error_set(e, 422, "DATA_PATH_INVALID", field,
                              "%s=\"%.200s\" must be an absolute path", field, p);
    const char *last = strrchr(p, '/') + 1;
    if (*last == '\0')
        return loom_error_set(e, 422, "DATA_PATH_INVALID", field,
                              "%s=\"%.200s\" names a directory; give a file or a glob such as "
                              "dir/train_*.bin",
                              field, p);
    const char *c = p;
    while (*c) {
        while (*c == '/')
            c++;
        const char *end = strchr(c, '/');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return loom_error_set(e, 422, "DATA_PATH_INVALID", field,
                                  "%s=\"%.200s\" has a '%.*s' component; give a normalised path",
                                  field, p, (int)len, c);
        if (c < last)
            for (size_t i = 0; i < len; i++)
                if (c[i] == '*' || c[i] == '?' || c[i] == '[')
                    return loom_error_set(e, 422, "DATA_PATH_INVALID", field,
                                          "%s=\"%.200s\": glob characters are allowed only in the "
                                          "file name",
                                          field, p);
        c += len;
    }
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
        return loom_error_set(e, 422, "INVALID_LORA_TARGET", "train.lora.targets",
                              "train.lora.targets must name at least one of %s (%s)", allowed, fam);
    for (int i = 0; i < s->train.lora.n_targets; i++) {
        const char *t = s->train.lora.targets[i];
        if (target_index(s->model.family, t) == INT_MAX)
            return loom_error_set(e, 422, "INVALID_LORA_TARGET", "train.lora.targets",
                                  "train.lora.targets: \"%s\" is not a %s target; allowed: %s", t,
                                  fam, allowed);
        for (int k = 0; k < i; k++)
            if (strcmp(s->train.lora.targets[k], t) == 0)
                return loom_error_set(e, 422, "INVALID_LORA_TARGET", "train.lora.targets",
                                      "train.lora.targets lists \"%s\" twice", t);
    }
    return 0;
}

/* Rules of the fine-tuning fields (../shared/ARCHITECTURE.md "Fine-tuning
 * contract"). */
static int finetune_rules(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    if (s->train.lora.enabled && lora_rules(s, e) != 0) return -1;
    if (s->train.quantize_base == JOBSPEC_QUANT_NF4 && !s->train.lora.enabled)
        return loom_error_set(e, 422, "QUANTIZE_WITHOUT_LORA", "train.quantize_base",
                              "train.quantize_base=nf4 needs train.lora (a quantized base is "
                              "frozen; only adapters train)");
    if (s->export.lora && !s->train.lora.enabled)
        return loom_error_set(e, 422, "EXPORT_WITHOUT_LORA", "export.lora",
                              "export.lora=true needs train.lora (there is no adapter to write)");
    static const struct {
        enum jobspec_loss_on loss;
        enum jobspec_data_format format;
    } loss_needs[] = {{JOBSPEC_LOSS_ASSISTANT, JOBSPEC_FMT_CHAT},
                      {JOBSPEC_LOSS_COMPLETION, JOBSPEC_FMT_COMPLETION}};
    for (size_t i = 0; i < sizeof loss_needs / sizeof *loss_needs; i++)
        if (s->train.loss_on == loss_needs[i].loss && s->data.format != loss_needs[i].format)
            return loom_error_set(e, 422, "LOSS_ON_FORMAT", "train.loss_on",
                                  "train.loss_on=%s needs data.format=%s, got data.format=%s",
                                  loss_on_names[s->train.loss_on],
                                  format_names[loss_needs[i].format], format_names[s->data.format]);
    if (s->data.val_fraction > 0 && s->data.val[0])
        return loom_error_set(e, 422, "VAL_SOURCE_CONFLICT", "data.val_fraction",
                              "data.val_fraction=%g and data.val both give a validation set; "
                              "use one",
                              s->data.val_fraction);
    if (!(flags & JOBSPEC_FOR_PLAN) && s->data.format != JOBSPEC_FMT_BIN && !s->data.tokenizer[0] &&
        !s->init_from[0])
        return loom_error_set(e, 422, "MISSING_FIELD", "data.tokenizer",
                              "data.format=%s needs data.tokenizer (or model.init_from, whose "
                              "tokenizer is the default)",
                              format_names[s->data.format]);
    return 0;
}

int jobspec_validate(const struct loom_spec *s, unsigned flags, struct loom_error *e) {
    const struct model_config *m = &s->model;
    char err[256];
    const char *mf = NULL;
    if (model_config_check(m, err, sizeof err, &mf) != 0) {
        char path[64];
        snprintf(path, sizeof path, "model.%s", mf ? mf : "");
        return loom_error_set(e, 422, "INVALID_MODEL", path, "%s", err);
    }
    int dp = s->parallel.dp, tp = s->parallel.tp, pp = s->parallel.pp;
    int64_t world = (int64_t)dp * tp * pp;
    if (world > JOBSPEC_WORLD_MAX)
        return loom_error_set(e, 422, "WORLD_TOO_LARGE", "parallel",
                              "dp*tp*pp = %d*%d*%d = %lld ranks, at most %d", dp, tp, pp,
                              (long long)world, JOBSPEC_WORLD_MAX);
    if (m->n_head % tp != 0)
        return loom_error_set(e, 422, "TP_HEADS", "parallel.tp", "tp=%d does not divide n_head=%d",
                              tp, m->n_head);
    if (m->n_kv_head % tp != 0)
        return loom_error_set(e, 422, "TP_KV_HEADS", "parallel.tp",
                              "tp=%d does not divide n_kv_head=%d", tp, m->n_kv_head);
    if (m->d_ff % tp != 0)
        return loom_error_set(e, 422, "TP_FFN", "parallel.tp", "tp=%d does not divide d_ff=%d", tp,
                              m->d_ff);
    if (tp > s->resources.gpus_per_node)
        return loom_error_set(e, 422, "TP_CROSSES_NODE", "parallel.tp",
                              "tp=%d exceeds resources.gpus_per_node=%d; tensor-parallel groups "
                              "never cross a node",
                              tp, s->resources.gpus_per_node);
    if (!s->parallel.pp_balance && m->n_layer % pp != 0)
        return loom_error_set(e, 422, "PP_LAYERS", "parallel.pp",
                              "pp=%d does not divide n_layer=%d (parallel.pp_balance: true splits "
                              "the blocks unevenly)",
                              pp, m->n_layer);
    if (m->n_layer < pp)
        return loom_error_set(e, 422, "PP_LAYERS", "parallel.pp",
                              "pp=%d exceeds n_layer=%d: every stage needs a block", pp,
                              m->n_layer);
    if (s->parallel.zero_stage >= 2 && pp > 1)
        return loom_error_set(e, 422, "ZERO_WITH_PP", "parallel.zero_stage",
                              "zero_stage=%d with pp=%d is not supported (gradient and parameter "
                              "sharding fight the 1F1B schedule); use zero_stage<=1",
                              s->parallel.zero_stage, pp);
    int64_t unit = (int64_t)s->train.micro_batch * m->seq_len * dp;
    if (s->train.global_batch_tokens % unit != 0)
        return loom_error_set(e, 422, "BATCH_NOT_DIVISIBLE", "train.global_batch_tokens",
                              "global_batch_tokens=%lld is not a multiple of "
                              "micro_batch*seq_len*dp = %d*%d*%d = %lld",
                              (long long)s->train.global_batch_tokens, s->train.micro_batch,
                              m->seq_len, dp, (long long)unit);
    int64_t ga = s->train.global_batch_tokens / unit;
    if (pp > 1 && ga < pp)
        return loom_error_set(e, 422, "PP_TOO_FEW_MICROBATCHES", "train.global_batch_tokens",
                              "1F1B with pp=%d needs at least %d micro-batches per step; "
                              "global_batch_tokens/(micro_batch*seq_len*dp) = %lld/%lld = %lld",
                              pp, pp, (long long)s->train.global_batch_tokens, (long long)unit,
                              (long long)ga);
    if (s->train.global_batch_tokens > ((int64_t)1 << 62) / s->train.steps)
        return loom_error_set(e, 422, "OUT_OF_RANGE", "train.steps",
                              "steps*global_batch_tokens overflows (%lld*%lld)",
                              (long long)s->train.steps, (long long)s->train.global_batch_tokens);
    if (s->train.min_lr > s->train.lr)
        return loom_error_set(e, 422, "LR_ORDER", "train.min_lr", "min_lr=%g exceeds lr=%g",
                              s->train.min_lr, s->train.lr);
    if (s->train.warmup_steps > s->train.steps)
        return loom_error_set(e, 422, "WARMUP_TOO_LONG", "train.warmup_steps",
                              "warmup_steps=%lld exceeds steps=%lld",
                              (long long)s->train.warmup_steps, (long long)s->train.steps);
    if (s->resources.device == JOBSPEC_DEV_CPU && s->train.precision == JOBSPEC_PREC_BF16)
        return loom_error_set(e, 422, "PRECISION_DEVICE", "train.precision",
                              "precision=bf16 needs device=cuda; the cpu backend computes in fp32");
    if (s->resources.device == JOBSPEC_DEV_CPU && s->train.precision == JOBSPEC_PREC_FP8)
        return loom_error_set(e, 422, "PRECISION_DEVICE", "train.precision",
                              "precision=fp8 needs device=cuda; the cpu backend computes in fp32");
    if (s->resources.device == JOBSPEC_DEV_CPU && s->train.offload_optimizer)
        return loom_error_set(e, 422, "OFFLOAD_DEVICE", "train.offload_optimizer",
                              "offload_optimizer needs device=cuda; on cpu the optimizer already "
                              "lives in host memory");
    if (finetune_rules(s, flags, e) != 0) return -1;
    if (!(flags & JOBSPEC_FOR_PLAN)) {
        if (!s->data.train[0])
            return loom_error_set(e, 422, "MISSING_FIELD", "data.train",
                                  "data.train is required (absolute path or glob of .bin shards)");
        if (s->train.eval_every > 0 && !s->data.val[0] && s->data.val_fraction == 0)
            return loom_error_set(e, 422, "EVAL_WITHOUT_VAL", "train.eval_every",
                                  "train.eval_every=%lld needs data.val or data.val_fraction",
                                  (long long)s->train.eval_every);
    }
    if (s->data.train[0] && path_lexical(s->data.train, "data.train", e) != 0) return -1;
    if (s->data.val[0] && path_lexical(s->data.val, "data.val", e) != 0) return -1;
    if (s->name[0]) {
        const char *n = s->name;
        int ok = (n[0] >= 'a' && n[0] <= 'z') || (n[0] >= 'A' && n[0] <= 'Z') ||
                 (n[0] >= '0' && n[0] <= '9');
        for (const char *c = n; ok && *c; c++)
            ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '.' || *c == '_' || *c == '-';
        if (!ok)
            return loom_error_set(e, 422, "INVALID_NAME", "name",
                                  "name=\"%.64s\" must start with a letter or digit and use only "
                                  "[A-Za-z0-9._-]",
                                  n);
    } else {
        return loom_error_set(e, 422, "INVALID_NAME", "name", "name must not be empty");
    }
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
    if (!ms) return loom_error_set(e, 500, "INTERNAL", "array", "out of memory");
    size_t n = jobspec_array_size(s);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *m = jobspec_array_member(s, body, i);
        struct loom_error me;
        memset(&me, 0, sizeof me);
        if (!m) {
            rc = loom_error_set(e, 500, "INTERNAL", "array", "out of memory");
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
        return loom_error_set(e, 400, "INVALID_JSON", "",
                              "the job spec must be a JSON object, got %s",
                              j ? json_type_word(j) : "nothing");
    struct model_in m;
    memset(&m, 0, sizeof m);
    uint64_t seen = 0;
    if (parse_object(j, "", &top_table, s, s, &m, &seen, e) != 0) return -1;
    if (resolve_model(s, &m, seen, json_object_get(j, "model") != NULL, e) != 0) return -1;
    if (!SEEN(S_PRECISION))
        s->train.precision =
            s->resources.device == JOBSPEC_DEV_CPU ? JOBSPEC_PREC_FP32 : JOBSPEC_PREC_BF16;
    if (!SEEN(S_MIN_LR)) s->train.min_lr = s->train.lr / 10;
    s->model.pp_balance = s->parallel.pp_balance; /* every stage computation reads the model */
    if (!SEEN(S_GBT))
        s->train.global_batch_tokens =
            (int64_t)s->train.micro_batch * s->model.seq_len * s->parallel.dp;
    if (!SEEN(S_NAME))
        snprintf(s->name, sizeof s->name, "%s-%s", model_family_name(s->model.family),
                 s->model.preset[0] ? s->model.preset : "custom");
    memcpy(s->init_from, m.init_from, sizeof s->init_from);
    s->train.lora.enabled = SEEN(S_LORA);
    if (s->train.lora.enabled) lora_canonical_targets(s);
    double *reals[] = {&s->train.lr,        &s->train.min_lr,     &s->train.weight_decay,
                       &s->train.grad_clip, &s->train.beta1,      &s->train.beta2,
                       &s->train.eps,       &s->model.rope_theta, &s->model.norm_eps};
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
        *reals[i] = snap15(*reals[i]);
    if (jobspec_validate(s, flags, e) != 0) return -1;
    return s->n_array && (flags & JOBSPEC_ARRAY_MEMBERS) ? check_array_members(s, j, flags, e) : 0;
}

int jobspec_parse_text(struct loom_spec *s, const char *text, size_t len, unsigned flags,
                       struct loom_error *e) {
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        jobspec_init(s);
        return loom_error_set(e, 400, "INVALID_JSON", "", "malformed JSON at line %d column %d: %s",
                              je.line, je.column, je.text);
    }
    int rc = jobspec_parse(s, j, flags, e);
    json_decref(j);
    return rc;
}

json_t *jobspec_to_json(const struct loom_spec *s) {
    const struct model_config *m = &s->model;
    json_t *labels = json_object();
    for (int i = 0; i < s->n_labels; i++)
        json_object_set_new(labels, s->labels[i].key, json_string(s->labels[i].value));
    json_t *model = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f}", "family",
                              model_family_name(m->family), "n_layer", m->n_layer, "n_head",
                              m->n_head, "n_kv_head", m->n_kv_head, "d_model", m->d_model, "d_ff",
                              m->d_ff, "vocab_size", m->vocab_size, "seq_len", m->seq_len,
                              "tied_embeddings", m->tied_embeddings, "norm_eps", m->norm_eps);
    if (m->preset[0]) json_object_set_new(model, "preset", json_string(m->preset));
    if (m->pos == MODEL_POS_ROPE)
        json_object_set_new(model, "rope_theta", json_real(m->rope_theta));
    if (s->init_from[0]) json_object_set_new(model, "init_from", json_string(s->init_from));
    json_t *data =
        json_pack("{s:s, s:s, s:s, s:f, s:s}", "train", s->data.train, "format",
                  format_names[s->data.format], "text_key", s->data.text_key, "val_fraction",
                  s->data.val_fraction, "overlong", overlong_names[s->data.overlong]);
    if (s->data.val[0]) json_object_set_new(data, "val", json_string(s->data.val));
    if (s->data.tokenizer[0])
        json_object_set_new(data, "tokenizer", json_string(s->data.tokenizer));
    if (s->data.chat_template != JOBSPEC_CHAT_NONE)
        json_object_set_new(data, "chat_template",
                            json_string(chat_template_names[s->data.chat_template]));
    json_t *train = json_pack(
        "{s:I, s:I, s:i, s:f, s:f, s:I, s:s, s:f, s:f, s:f, s:f, s:f, s:I, s:s, s:s, s:b, s:I, "
        "s:I}",
        "steps", (json_int_t)s->train.steps, "global_batch_tokens",
        (json_int_t)s->train.global_batch_tokens, "micro_batch", s->train.micro_batch, "lr",
        s->train.lr, "min_lr", s->train.min_lr, "warmup_steps", (json_int_t)s->train.warmup_steps,
        "schedule", jobspec_schedule_name(s->train.schedule), "weight_decay", s->train.weight_decay,
        "grad_clip", s->train.grad_clip, "beta1", s->train.beta1, "beta2", s->train.beta2, "eps",
        s->train.eps, "seed", (json_int_t)s->train.seed, "precision",
        jobspec_precision_name(s->train.precision), "recompute",
        jobspec_recompute_name(s->train.recompute), "offload_optimizer", s->train.offload_optimizer,
        "eval_every", (json_int_t)s->train.eval_every, "eval_batches",
        (json_int_t)s->train.eval_batches);
    json_object_set_new(train, "loss_on", json_string(loss_on_names[s->train.loss_on]));
    json_object_set_new(train, "packing", json_string(packing_names[s->train.packing]));
    json_object_set_new(train, "quantize_base",
                        json_string(quantize_names[s->train.quantize_base]));
    if (s->train.recompute_budget_gib > 0)
        json_object_set_new(train, "recompute",
                            json_pack("{s:f}", "budget_gib", s->train.recompute_budget_gib));
    if (s->train.lora.enabled) {
        json_t *t = json_array();
        for (int i = 0; i < s->train.lora.n_targets; i++)
            json_array_append_new(t, json_string(s->train.lora.targets[i]));
        json_object_set_new(train, "lora",
                            json_pack("{s:i, s:f, s:f, s:o}", "rank", s->train.lora.rank, "alpha",
                                      s->train.lora.alpha, "dropout", s->train.lora.dropout,
                                      "targets", t));
    }
    json_t *resources = json_pack(
        "{s:s, s:i, s:b}", "device", jobspec_device_name(s->resources.device), "gpus_per_node",
        s->resources.gpus_per_node, "allow_mixed", s->resources.allow_mixed);
    if (s->resources.n_gpu_types > 0) {
        json_t *g = json_array();
        for (int i = 0; i < s->resources.n_gpu_types; i++)
            json_array_append_new(g, json_string(s->resources.gpu_type[i]));
        json_object_set_new(resources, "gpu_type", g);
    }
    json_t *out = json_pack(
        "{s:s, s:o, s:o, s:o, s:{s:i, s:i, s:i, s:i, s:b}, s:o, s:{s:I, s:i}, "
        "s:o, s:i, s:i}",
        "name", s->name, "labels", labels, "model", model, "data", data, "parallel", "dp",
        s->parallel.dp, "tp", s->parallel.tp, "pp", s->parallel.pp, "zero_stage",
        s->parallel.zero_stage, "pp_balance", s->parallel.pp_balance, "train", train, "checkpoint",
        "every_steps", (json_int_t)s->checkpoint.every_steps, "keep", s->checkpoint.keep,
        "resources", resources, "priority", s->priority, "max_retries", s->max_retries);
    json_object_set_new(out, "export",
                        json_pack("{s:b, s:b}", "hf", s->export.hf, "lora", s->export.lora));
    json_object_set_new(out, "max_runtime_s", json_integer((json_int_t)s->max_runtime_s));
    json_object_set_new(out, "preemptible", json_boolean(s->preemptible));
    if (s->n_after > 0) {
        json_t *a = json_array();
        for (int i = 0; i < s->n_after; i++)
            json_array_append_new(a, json_string(s->after[i]));
        json_object_set_new(out, "after", a);
    }
    if (s->n_array > 0) {
        json_t *a = json_object();
        for (int i = 0; i < s->n_array; i++)
            json_object_set_new(a, s->array[i].key, json_loads(s->array[i].values, 0, NULL));
        json_object_set_new(out, "array", a);
    }
    return out;
}

char *jobspec_dumps(const struct loom_spec *s) {
    json_t *j = jobspec_to_json(s);
    if (!j) return NULL;
    char *out = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    json_decref(j);
    return out;
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
    d->flops_per_token = model_flops_per_token(&s->model, s->model.seq_len);
}

json_t *jobspec_derived_to_json(const struct jobspec_derived *d) {
    return json_pack("{s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "world", d->world, "nodes",
                     d->nodes, "tokens_per_micro_batch", (json_int_t)d->tokens_per_micro,
                     "grad_accum", (json_int_t)d->grad_accum, "tokens_per_step",
                     (json_int_t)d->tokens_per_step, "sequences_per_step",
                     (json_int_t)d->sequences_per_step, "tokens_total", (json_int_t)d->tokens_total,
                     "n_params", (json_int_t)d->n_params, "flops_per_token", d->flops_per_token);
}

/* ---- data-path confinement ---- */

/* 1 when `p` equals `root` or lies below it (both resolved, no trailing '/'
 * except for "/" itself). */
static int under_root(const char *p, const char *root) {
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/')
        rl--;
    if (rl == 1 && root[0] == '/') return p[0] == '/';
    return strncmp(p, root, rl) == 0 && (p[rl] == '\0' || p[rl] == '/');
}

/* realpath of the longest existing prefix of `dir` followed by the rest of
 * `dir` (which has no '.' or '..' components). */
static int resolve_prefix(const char *dir, char *out, size_t n) {
    char *work = strdup(dir);
    if (!work) return -1;
    char *real = NULL;
    for (;;) {
        real = realpath(work, NULL);
        if (real) break;
        char *slash = strrchr(work, '/');
        if (!slash || slash == work) {
            real = realpath("/", NULL);
            work[0] = '\0';
            break;
        }
        *slash = '\0';
    }
    size_t used = strlen(work);
    const char *rest = dir + used;
    int rc = 0;
    if (!real)
        rc = -1;
    else if ((size_t)snprintf(out, n, "%s%s", strcmp(real, "/") == 0 && rest[0] == '/' ? "" : real,
                              rest) >= n)
        rc = -1;
    free(real);
    free(work);
    return rc;
}

static int has_glob(const char *s) {
    return strpbrk(s, "*?[") != NULL;
}

int jobspec_path_confined(const char *pattern, const char *const *roots, size_t nroots,
                          unsigned flags, const char *field, struct loom_error *e) {
    if (path_lexical(pattern, field, e) != 0) return -1;
    if (nroots == 0)
        return loom_error_set(e, 422, "DATA_PATH_FORBIDDEN", field,
                              "%s=\"%.200s\": no data roots are allowed for this tenant", field,
                              pattern);
    int rc = -1;
    char **rr = calloc(nroots, sizeof *rr);
    char *dir = strdup(pattern);
    char *dreal = NULL;
    glob_t g;
    int have_glob = 0;
    if (!rr || !dir) {
        loom_error_set(e, 500, "INTERNAL", field, "out of memory");
        goto out;
    }
    /* Resolve the roots themselves; a root that does not exist here is kept
     * as written (lexical comparison only). */
    for (size_t i = 0; i < nroots; i++) {
        char *r = realpath(roots[i], NULL);
        if (!r) {
            r = strdup(roots[i]);
            if (!r) {
                loom_error_set(e, 500, "INTERNAL", field, "out of memory");
                goto out;
            }
            size_t l = strlen(r);
            while (l > 1 && r[l - 1] == '/')
                r[--l] = '\0';
        }
        rr[i] = r;
    }
    char *slash = strrchr(dir, '/');
    const char *base = pattern + (slash - dir) + 1;
    if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    dreal = realpath(dir, NULL);
    if (!dreal) {
        if (flags & JOBSPEC_PATH_MUST_EXIST) {
            loom_error_set(e, 422, "DATA_PATH_NOT_FOUND", field,
                           "%s=\"%.200s\": directory %.200s does not exist (%s)", field, pattern,
                           dir, strerror(errno));
            goto out;
        }
        /* Resolve the longest existing prefix and append the rest: a symlink
         * higher up that points outside is still caught. */
        char cand[PATH_MAX + JOBSPEC_PATH_MAX];
        if (resolve_prefix(dir, cand, sizeof cand) != 0) {
            loom_error_set(e, 422, "DATA_PATH_INVALID", field, "%s=\"%.200s\" cannot be resolved",
                           field, pattern);
            goto out;
        }
        for (size_t i = 0; i < nroots; i++)
            if (under_root(cand, rr[i])) {
                rc = 0;
                goto out;
            }
        loom_error_set(e, 422, "DATA_PATH_FORBIDDEN", field,
                       "%s=\"%.200s\" resolves to %.200s, outside the allowed data roots", field,
                       pattern, cand);
        goto out;
    }
    size_t root = nroots;
    for (size_t i = 0; i < nroots && root == nroots; i++)
        if (under_root(dreal, rr[i])) root = i;
    if (root == nroots) {
        loom_error_set(e, 422, "DATA_PATH_FORBIDDEN", field,
                       "%s=\"%.200s\" resolves to %.200s, outside the allowed data roots", field,
                       pattern, dreal);
        goto out;
    }
    char full[PATH_MAX + JOBSPEC_PATH_MAX];
    snprintf(full, sizeof full, "%s/%s", strcmp(dreal, "/") == 0 ? "" : dreal, base);
    int grc = glob(full, has_glob(base) ? 0 : GLOB_NOESCAPE, NULL, &g);
    have_glob = grc == 0;
    if (grc != 0 && grc != GLOB_NOMATCH) {
        loom_error_set(e, 422, "DATA_PATH_NOT_FOUND", field, "%s=\"%.200s\": cannot list %.200s",
                       field, pattern, dreal);
        goto out;
    }
    size_t nmatch = have_glob ? g.gl_pathc : 0;
    for (size_t i = 0; i < nmatch; i++) {
        char *fr = realpath(g.gl_pathv[i], NULL);
        if (!fr) {
            loom_error_set(e, 422, "DATA_PATH_NOT_FOUND", field,
                           "%s: %.200s cannot be resolved (%s)", field, g.gl_pathv[i],
                           strerror(errno));
            goto out;
        }
        int ok = 0;
        for (size_t k = 0; k < nroots && !ok; k++)
            ok = under_root(fr, rr[k]);
        if (!ok) {
            loom_error_set(e, 422, "DATA_PATH_FORBIDDEN", field,
                           "%s: %.200s resolves to %.200s, outside the allowed data roots", field,
                           g.gl_pathv[i], fr);
            free(fr);
            goto out;
        }
        free(fr);
    }
    if (nmatch == 0 && (flags & JOBSPEC_PATH_MUST_EXIST)) {
        loom_error_set(e, 422, "DATA_PATH_NOT_FOUND", field, "%s=\"%.200s\" matches no file", field,
                       pattern);
        goto out;
    }
    rc = 0;
out:
    if (have_glob) globfree(&g);
    free(dreal);
    free(dir);
    if (rr)
        for (size_t i = 0; i < nroots; i++)
            free(rr[i]);
    free(rr);
    return rc;
}

int jobspec_check_paths(const struct loom_spec *s, const char *const *roots, size_t nroots,
                        unsigned flags, struct loom_error *e) {
    if (s->data.train[0] &&
        jobspec_path_confined(s->data.train, roots, nroots, flags, "data.train", e) != 0)
        return -1;
    if (s->data.val[0] &&
        jobspec_path_confined(s->data.val, roots, nroots, flags, "data.val", e) != 0)
        return -1;
    if (s->data.tokenizer[0] &&
        jobspec_path_confined(s->data.tokenizer, roots, nroots, flags, "data.tokenizer", e) != 0)
        return -1;
    if (s->init_from[0] == '/' &&
        jobspec_path_confined(s->init_from, roots, nroots, flags, "model.init_from", e) != 0)
        return -1;
    return 0;
}
