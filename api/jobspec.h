/* Job spec: the one parser and validator of the declarative training job that
 * loomd (POST /v1/jobs, POST /v1/plan), loomctl and loom-worker share.
 *
 * jobspec_parse() reads a jansson object strictly: unknown fields are
 * rejected by their JSON path ("train.lrr"), every field's type and range is
 * checked, then the cross-field rules of docs/architecture.md run, each
 * with its own stable error code (the table in docs/internals/api.md) and a
 * message that names the numbers. Absent fields take the defaults listed
 * there. jobspec_to_json() writes the canonical form (every field, defaults
 * filled, model sizes explicit), which parses back to the same spec; loomd
 * stores it and the agent hands it to the worker.
 *
 * The struct holds only fixed-size fields (no heap), so it can be copied with
 * `=` and needs no free. All functions are pure and thread-safe except
 * jobspec_check_paths, which reads the filesystem. */
#ifndef LOOM_API_JOBSPEC_H
#define LOOM_API_JOBSPEC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "api/errors.h"
#include "api/model.h"

#define JOBSPEC_NAME_MAX          64   /* job name incl. NUL */
#define JOBSPEC_PATH_MAX          1024 /* data path incl. NUL */
#define JOBSPEC_LABELS_MAX        32
#define JOBSPEC_LABEL_KEY_MAX     64  /* incl. NUL */
#define JOBSPEC_LABEL_VAL_MAX     256 /* incl. NUL */
#define JOBSPEC_POOL_MAX          64  /* resources.pool, incl. NUL */
#define JOBSPEC_NODE_LABELS_MAX   8   /* resources.labels entries */
#define JOBSPEC_WORLD_MAX         16384
#define JOBSPEC_ID_MAX            64 /* job id incl. NUL */
#define JOBSPEC_AFTER_MAX         32 /* jobs in `after` */
#define JOBSPEC_GPU_TYPES_MAX     8
#define JOBSPEC_GPU_TYPE_MAX      32 /* incl. NUL */
#define JOBSPEC_KEY_MAX           64 /* data.text_key, array keys, incl. NUL */
#define JOBSPEC_LORA_TARGETS_MAX  8
#define JOBSPEC_ARRAY_KEYS_MAX    8
#define JOBSPEC_ARRAY_VALUES_MAX  64
#define JOBSPEC_ARRAY_TEXT_MAX    2048 /* one key's values as compact JSON, incl. NUL */
#define JOBSPEC_ARRAY_MEMBERS_MAX 256  /* product of the value counts */

/* One error answer: HTTP status (400 malformed, 422 invalid spec), a stable
 * upper-case code, the JSON path of the offending field ("" when the rule
 * concerns the whole spec) and a message naming the values. */
struct loom_error {
    int status;
    char code[40];
    char field[128];
    char message[1024];
};

/* Fill an error; returns -1 so callers can `return loom_error_set(...)`. */
int loom_error_set(struct loom_error *e, int status, const char *code, const char *field,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* loom_error_set with the code and status of a row of api/errors.h. */
int loom_err(struct loom_error *e, enum loom_errcode c, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* {"error":{"code":..,"message":..,"field":..}} (field omitted when empty).
 * New reference, caller owns. */
json_t *loom_error_to_json(const struct loom_error *e);

enum jobspec_schedule { JOBSPEC_SCHED_COSINE = 0, JOBSPEC_SCHED_LINEAR, JOBSPEC_SCHED_CONSTANT };
enum jobspec_precision { JOBSPEC_PREC_BF16 = 0, JOBSPEC_PREC_FP32, JOBSPEC_PREC_FP8 };
enum jobspec_recompute {
    JOBSPEC_RECOMPUTE_NONE = 0,
    JOBSPEC_RECOMPUTE_SELECTIVE,
    JOBSPEC_RECOMPUTE_FULL
};
enum jobspec_device { JOBSPEC_DEV_CUDA = 0, JOBSPEC_DEV_CPU };
/* Fine-tuning contract (docs/architecture.md "Fine-tuning contract"). */
enum jobspec_data_format {
    JOBSPEC_FMT_BIN = 0, /* token shards (.bin) */
    JOBSPEC_FMT_TEXT,
    JOBSPEC_FMT_JSONL,
    JOBSPEC_FMT_CHAT,
    JOBSPEC_FMT_COMPLETION,
    JOBSPEC_FMT_WEBDATASET
};
/* JOBSPEC_CHAT_NONE: not set (the field is absent from the canonical form). */
enum jobspec_chat_template {
    JOBSPEC_CHAT_NONE = 0,
    JOBSPEC_CHAT_LLAMA3,
    JOBSPEC_CHAT_CHATML,
    JOBSPEC_CHAT_MISTRAL
};
enum jobspec_overlong { JOBSPEC_OVERLONG_TRUNCATE = 0, JOBSPEC_OVERLONG_DROP };
enum jobspec_loss_on { JOBSPEC_LOSS_ALL = 0, JOBSPEC_LOSS_ASSISTANT, JOBSPEC_LOSS_COMPLETION };
enum jobspec_packing { JOBSPEC_PACK_CONCAT = 0, JOBSPEC_PACK_DOCUMENT };
enum jobspec_quantize { JOBSPEC_QUANT_NONE = 0, JOBSPEC_QUANT_NF4 };

struct jobspec_label {
    char key[JOBSPEC_LABEL_KEY_MAX];
    char value[JOBSPEC_LABEL_VAL_MAX];
};

/* One `array` entry: a dotted spec key and the values it takes, kept as
 * their compact JSON array text (each value checked against the key's row). */
struct jobspec_array_key {
    char key[JOBSPEC_KEY_MAX];
    int n_values;
    char values[JOBSPEC_ARRAY_TEXT_MAX];
};

struct loom_spec {
    char name[JOBSPEC_NAME_MAX];
    int n_labels;
    struct jobspec_label labels[JOBSPEC_LABELS_MAX]; /* sorted by key */

    /* model.family, model.preset ("" when sizes are all explicit) and the
     * resolved sizes (preset, then explicit overrides). */
    struct model_config model;
    /* model.init_from: "" (random init), an absolute HF directory, "job:<id>"
     * (that job's newest checkpoint) or "job:<id>@<step>". */
    char init_from[JOBSPEC_PATH_MAX];
    /* Set by loomd when init_from names a job (daemon/initfrom.h): the
     * checkpoint directory it resolved to, and the HF directory that job's
     * model came from ("" when none: its architecture settings and the
     * export's source files). A worker starts from init_checkpoint's weights
     * with a fresh optimizer at step 0. */
    char init_checkpoint[JOBSPEC_PATH_MAX];
    char init_hf[JOBSPEC_PATH_MAX];

    struct {
        char train[JOBSPEC_PATH_MAX]; /* absolute; glob allowed in the last component */
        char val[JOBSPEC_PATH_MAX];   /* "" when absent */
        enum jobspec_data_format format;
        char tokenizer[JOBSPEC_PATH_MAX]; /* "": the tokenizer of model.init_from */
        enum jobspec_chat_template chat_template;
        char text_key[JOBSPEC_KEY_MAX]; /* jsonl: the field holding the text */
        double val_fraction;            /* 0..0.5 of train held out, 0: none */
        enum jobspec_overlong overlong;
    } data;

    struct {
        int dp, tp, pp;
        int zero_stage; /* 0..3 */
        int pp_balance; /* 1: blocks split by work, the head on the last stage (model.h) */
    } parallel;

    struct {
        int64_t steps;
        int64_t global_batch_tokens;
        int micro_batch; /* sequences per micro-step per dp rank */
        double lr, min_lr;
        int64_t warmup_steps;
        enum jobspec_schedule schedule;
        double weight_decay, grad_clip; /* grad_clip 0: off */
        double beta1, beta2, eps;       /* AdamW */
        uint64_t seed;
        enum jobspec_precision precision;
        enum jobspec_recompute recompute;
        int offload_optimizer;
        int64_t eval_every;          /* steps between evaluations, 0: off */
        int64_t eval_batches;        /* micro-batches per evaluation */
        double recompute_budget_gib; /* > 0: recompute as {"budget_gib": N} (recompute unused) */
        enum jobspec_loss_on loss_on;
        enum jobspec_packing packing;
        struct {
            int enabled; /* train.lora present */
            int rank;
            double alpha, dropout;
            int n_targets;
            /* validated against the family's list, kept in that list's order */
            char targets[JOBSPEC_LORA_TARGETS_MAX][8];
        } lora;
        enum jobspec_quantize quantize_base;
    } train;

    struct {
        int64_t every_steps; /* 0: only the final checkpoint */
        int keep;
    } checkpoint;

    struct {
        int hf;   /* write an HF directory at the end */
        int lora; /* write a PEFT adapter at the end (needs train.lora) */
    } export;

    struct {
        enum jobspec_device device;
        int gpus_per_node; /* most ranks of this job on one node */
        int n_gpu_types;   /* 0: any GPU type */
        char gpu_type[JOBSPEC_GPU_TYPES_MAX][JOBSPEC_GPU_TYPE_MAX];
        int allow_mixed; /* ranks may land on different GPU types */
        /* node selectors (docs/scheduling.md): the admin-set pool and labels a
         * node must carry; "" / none: any node */
        char pool[JOBSPEC_POOL_MAX];
        int n_node_labels;
        struct jobspec_label node_labels[JOBSPEC_NODE_LABELS_MAX]; /* sorted by key */
    } resources;

    int priority; /* 0..100, higher first */
    int max_retries;
    int64_t max_runtime_s; /* 0: no limit */
    int n_after;
    char after[JOBSPEC_AFTER_MAX][JOBSPEC_ID_MAX]; /* job ids that must succeed first */
    int preemptible;
    int n_array;
    struct jobspec_array_key array[JOBSPEC_ARRAY_KEYS_MAX];
};

/* Derived numbers (pure functions of a valid spec). */
struct jobspec_derived {
    int world;                  /* dp * tp * pp */
    int nodes;                  /* ceil(world / gpus_per_node): fewest nodes it can use */
    int64_t tokens_per_micro;   /* micro_batch * seq_len (one rank, one micro-step) */
    int64_t grad_accum;         /* micro-steps per step = gbt / (micro_batch*seq_len*dp) */
    int64_t tokens_per_step;    /* global_batch_tokens */
    int64_t sequences_per_step; /* global_batch_tokens / seq_len */
    int64_t tokens_total;       /* steps * global_batch_tokens */
    int64_t n_params;           /* model_n_params */
    double flops_per_token;     /* model_flops_per_token(seq_len) */
};

/* ---- the field table ----
 * Every spec field is one row: its dotted JSON path, type, place in struct
 * loom_spec, default, range or names, and a line of help. Defaults
 * (jobspec_init), parsing, the range checks of jobspec_validate and the
 * canonical JSON (jobspec_to_json) all walk it; a test checks that
 * api/openapi.yaml's JobSpec schema lists the same fields. */
enum jobspec_ftype {
    JOBSPEC_F_I32,
    JOBSPEC_F_I64,
    JOBSPEC_F_U64,
    JOBSPEC_F_DBL,
    JOBSPEC_F_BOOL,
    JOBSPEC_F_STR,
    JOBSPEC_F_ENUM,
    JOBSPEC_F_OBJ,       /* a section ("train", "train.lora"): its rows follow */
    JOBSPEC_F_LABELS,    /* string -> string */
    JOBSPEC_F_STRLIST,   /* strings into char[max_count][size], count at count_off */
    JOBSPEC_F_RECOMPUTE, /* an enum name or {"budget_gib": N} (the next row) */
    JOBSPEC_F_ARRAY,     /* dotted spec key -> list of values */
};

#define JOBSPEC_FL_MIN_EXCL    0x001u /* numbers: min itself is out of range */
#define JOBSPEC_FL_MAX_EXCL    0x002u /* numbers: max itself is out of range */
#define JOBSPEC_FL_ENUM_UNSET  0x004u /* enum index 0 is "not set", not a name to give */
#define JOBSPEC_FL_ONE_OR_LIST 0x008u /* strlist: a lone string is a list of one */
#define JOBSPEC_FL_OMIT_EMPTY  0x010u /* absent from the canonical form when ""/0/none */
#define JOBSPEC_FL_IF_ROPE     0x020u /* only for RoPE models (llama) */
#define JOBSPEC_FL_IF_LORA     0x040u /* only with train.lora */
#define JOBSPEC_FL_INNER       0x080u /* read and written by the row before it */
#define JOBSPEC_FL_DERIVED     0x100u /* default computed from other fields (help says how) */
#define JOBSPEC_FL_MARK        0x200u /* obj: count_off is an int set to 1 when present */

struct jobspec_field {
    const char *path; /* "train.lr" */
    enum jobspec_ftype type;
    size_t off;               /* into struct loom_spec */
    size_t size;              /* str: buffer incl. NUL; strlist: one item */
    double def;               /* numbers, bools, enum index */
    const char *def_s;        /* str */
    double min, max;          /* numbers: range (see the EXCL flags) */
    const char *const *names; /* enum, recompute: NULL-terminated */
    unsigned flags;           /* JOBSPEC_FL_* */
    size_t count_off;         /* strlist: int count; obj with MARK: int flag */
    int max_count;            /* strlist */
    /* str, strlist: a format check of one value (0, or -1 with `e`) */
    int (*check)(const char *path, const char *value, struct loom_error *e);
    const char *help;
};

/* The table, sections before their rows. Static storage. */
const struct jobspec_field *jobspec_fields(size_t *n);
/* The row of a dotted path ("train.lora.rank"), or NULL. */
const struct jobspec_field *jobspec_field_find(const char *path);

/* Flags for jobspec_parse. */
#define JOBSPEC_FOR_PLAN 0x1u /* data paths optional (POST /v1/plan, loomctl plan) */
/* Also parse every member of an `array` (jobspec_array_member of `j`) and
 * refuse the spec when one is invalid (POST /v1/jobs). Apply it to the body
 * as submitted: the canonical form fills defaults derived from other fields
 * (global_batch_tokens from dp), which an array may then contradict. */
#define JOBSPEC_ARRAY_MEMBERS 0x2u

/* Set every field to its default (no model, no data). */
void jobspec_init(struct loom_spec *s);

/* Parse and validate `j` (borrowed) into `s`. Returns 0, or -1 with `e`
 * filled (status 422, or 400 when `j` is not an object). On error `s` holds
 * a partial spec and must not be used. */
int jobspec_parse(struct loom_spec *s, const json_t *j, unsigned flags, struct loom_error *e);
/* Same from text; malformed JSON answers 400 INVALID_JSON with the line and
 * column. */
int jobspec_parse_text(struct loom_spec *s, const char *text, size_t len, unsigned flags,
                       struct loom_error *e);
/* Re-run the cross-field rules on a filled spec (jobspec_parse calls it). */
int jobspec_validate(const struct loom_spec *s, unsigned flags, struct loom_error *e);

/* Canonical JSON (every field, model sizes explicit). New reference. */
json_t *jobspec_to_json(const struct loom_spec *s);
/* Canonical text: compact, keys sorted, reals with 15 significant digits
 * (the parser keeps reals to 15 digits, so this is exact). Caller frees with
 * free(). */
char *jobspec_dumps(const struct loom_spec *s);

/* Adapter parameters of a train.lora spec (model_lora_params over its
 * targets), 0 without train.lora. */
int64_t jobspec_lora_params(const struct loom_spec *s);

void jobspec_derive(const struct loom_spec *s, struct jobspec_derived *d);
/* {"world":..,"nodes":..,"grad_accum":..,...}. New reference. */
json_t *jobspec_derived_to_json(const struct jobspec_derived *d);

/* Names of the enums as they appear in JSON. */
const char *jobspec_schedule_name(enum jobspec_schedule v);
const char *jobspec_precision_name(enum jobspec_precision v);
const char *jobspec_recompute_name(enum jobspec_recompute v);
const char *jobspec_device_name(enum jobspec_device v);
const char *jobspec_data_format_name(enum jobspec_data_format v);

/* Number of jobs the spec's `array` expands to (1 without `array`). */
size_t jobspec_array_size(const struct loom_spec *s);
/* Member `i` (0 <= i < jobspec_array_size) of an array submission: a deep
 * copy of `body` (the spec as submitted, borrowed) without "array", with
 * each array key set to its value for this member (the last key varies
 * fastest). New reference, or NULL when out of memory or `i` is out of
 * range. jobspec_parse already checked that every member is a valid spec. */
json_t *jobspec_array_member(const struct loom_spec *s, const json_t *body, size_t i);

/* model.init_from's format: an absolute path without '.', '..' or glob
 * characters, "job:<id>" or "job:<id>@<step>". 0, or -1 with
 * INVALID_INIT_FROM naming `field`. */
int jobspec_check_init_from(const char *field, const char *v, struct loom_error *e);

/* ---- data-path confinement ---- */

#define JOBSPEC_PATH_MUST_EXIST 0x1u /* at least one file must match */

/* The lexical rules of a data path (api/jobspec_paths.c): absolute, no '.'
 * or '..' components, glob characters only in the last component, no empty
 * last component. 0, or -1 with DATA_PATH_INVALID naming `field`. */
int jobspec_path_lexical(const char *p, const char *field, struct loom_error *e);

/* Check that `pattern` (absolute; '*', '?' and '[...]' allowed only in the
 * last component) stays under one of `roots` after resolving symlinks:
 * no '.' or '..' components, the directory's realpath lies under a root's
 * realpath, and every file the pattern matches resolves under that root too
 * (a symlink pointing outside is refused). When the directory does not exist
 * here the lexical check alone applies, unless JOBSPEC_PATH_MUST_EXIST.
 * `field` names the JSON path for the error. nroots == 0 refuses everything.
 * Codes: DATA_PATH_INVALID, DATA_PATH_FORBIDDEN, DATA_PATH_NOT_FOUND. */
int jobspec_path_confined(const char *pattern, const char *const *roots, size_t nroots,
                          unsigned flags, const char *field, struct loom_error *e);
/* jobspec_path_confined on data.train and data.val (when set). */
int jobspec_check_paths(const struct loom_spec *s, const char *const *roots, size_t nroots,
                        unsigned flags, struct loom_error *e);

#endif
