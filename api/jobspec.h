/* Job spec: the one parser and validator of the declarative training job that
 * loomd (POST /v1/jobs, POST /v1/plan), loomctl and loom-worker share.
 *
 * jobspec_parse() reads a jansson object strictly: unknown fields are
 * rejected by their JSON path ("train.lrr"), every field's type and range is
 * checked, then the cross-field rules of ../shared/ARCHITECTURE.md run, each
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

#include "api/model.h"

#define JOBSPEC_NAME_MAX      64   /* job name incl. NUL */
#define JOBSPEC_PATH_MAX      1024 /* data path incl. NUL */
#define JOBSPEC_LABELS_MAX    32
#define JOBSPEC_LABEL_KEY_MAX 64  /* incl. NUL */
#define JOBSPEC_LABEL_VAL_MAX 256 /* incl. NUL */
#define JOBSPEC_WORLD_MAX     16384

/* One error answer: HTTP status (400 malformed, 422 invalid spec), a stable
 * upper-case code, the JSON path of the offending field ("" when the rule
 * concerns the whole spec) and a message naming the values. */
struct loom_error {
    int status;
    char code[40];
    char field[128];
    char message[512];
};

/* Fill an error; returns -1 so callers can `return loom_error_set(...)`. */
int loom_error_set(struct loom_error *e, int status, const char *code, const char *field,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* {"error":{"code":..,"message":..,"field":..}} (field omitted when empty).
 * New reference, caller owns. */
json_t *loom_error_to_json(const struct loom_error *e);

enum jobspec_schedule { JOBSPEC_SCHED_COSINE = 0, JOBSPEC_SCHED_LINEAR, JOBSPEC_SCHED_CONSTANT };
enum jobspec_precision { JOBSPEC_PREC_BF16 = 0, JOBSPEC_PREC_FP32 };
enum jobspec_recompute {
    JOBSPEC_RECOMPUTE_NONE = 0,
    JOBSPEC_RECOMPUTE_SELECTIVE,
    JOBSPEC_RECOMPUTE_FULL
};
enum jobspec_device { JOBSPEC_DEV_CUDA = 0, JOBSPEC_DEV_CPU };

struct jobspec_label {
    char key[JOBSPEC_LABEL_KEY_MAX];
    char value[JOBSPEC_LABEL_VAL_MAX];
};

struct loom_spec {
    char name[JOBSPEC_NAME_MAX];
    int n_labels;
    struct jobspec_label labels[JOBSPEC_LABELS_MAX]; /* sorted by key */

    /* model.family, model.preset ("" when sizes are all explicit) and the
     * resolved sizes (preset, then explicit overrides). */
    struct model_config model;

    struct {
        char train[JOBSPEC_PATH_MAX]; /* absolute; glob allowed in the last component */
        char val[JOBSPEC_PATH_MAX];   /* "" when absent */
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
        int64_t eval_every;   /* steps between evaluations, 0: off */
        int64_t eval_batches; /* micro-batches per evaluation */
    } train;

    struct {
        int64_t every_steps; /* 0: only the final checkpoint */
        int keep;
    } checkpoint;

    struct {
        enum jobspec_device device;
        int gpus_per_node; /* most ranks of this job on one node */
    } resources;

    int priority; /* 0..100, higher first */
    int max_retries;
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

/* Flags for jobspec_parse. */
#define JOBSPEC_FOR_PLAN 0x1u /* data paths optional (POST /v1/plan, loomctl plan) */

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

void jobspec_derive(const struct loom_spec *s, struct jobspec_derived *d);
/* {"world":..,"nodes":..,"grad_accum":..,...}. New reference. */
json_t *jobspec_derived_to_json(const struct jobspec_derived *d);

/* Names of the enums as they appear in JSON. */
const char *jobspec_schedule_name(enum jobspec_schedule v);
const char *jobspec_precision_name(enum jobspec_precision v);
const char *jobspec_recompute_name(enum jobspec_recompute v);
const char *jobspec_device_name(enum jobspec_device v);

/* ---- data-path confinement ---- */

#define JOBSPEC_PATH_MUST_EXIST 0x1u /* at least one file must match */

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
