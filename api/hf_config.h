/* Hugging Face config.json -> model_config, and a job spec's "model" object
 * for a model whose shape comes from elsewhere (an HF directory or, for a
 * fork, another job's spec).
 *
 * Shared by loomd (daemon/initfrom.c: model.init_from resolved at submit, so
 * the stored spec and the memory check have the sizes) and the worker
 * (worker/hf.c opens the directory, worker/hf_spec.c rewrites the spec), so
 * both derive the same family and sizes from the same file.
 *
 * Supported architectures (config.json "architectures"[0], else
 * "model_type"): LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
 * GPT2LMHeadModel. Errors fill a struct loom_error (status 422) with a code
 * of api/errors.h and a message naming the file and the values:
 * HF_CONFIG_MISSING, HF_CONFIG_INVALID, UNSUPPORTED_ARCHITECTURE (naming it
 * and listing the supported ones), HF_CONFIG_UNSUPPORTED, INIT_FROM_MISMATCH.
 * Pure apart from reading the file; thread-safe. */
#ifndef LOOM_API_HF_CONFIG_H
#define LOOM_API_HF_CONFIG_H

#include <jansson.h>

#include "api/jobspec.h"
#include "api/model.h"

enum hf_arch { HF_ARCH_LLAMA = 0, HF_ARCH_MISTRAL, HF_ARCH_QWEN2, HF_ARCH_GPT2, HF_NARCH };

/* "LlamaForCausalLM", ... ("?" out of range). */
const char *hf_arch_name(enum hf_arch a);

/* Parse the config.json at `path` into *c (seq_len = max_position_embeddings,
 * or Mistral's sliding_window when smaller; preset "") and *arch. With json
 * non-NULL *json gets the parsed file (caller decrefs). 0 or -1 with err. */
int hf_config_read(const char *path, json_t **json, struct model_config *c, enum hf_arch *arch,
                   struct loom_error *err);
/* hf_config_read without the JSON (for tests and tools). */
int hf_config_parse(const char *path, struct model_config *c, enum hf_arch *arch,
                    struct loom_error *err);

/* Where a model's shape comes from, for jobspec_model_from. */
struct hf_model_source {
    const struct model_config *cfg; /* the shape */
    const char *what;               /* for messages: "/m/llama/config.json", "job j-1" */
    int max_seq;                    /* most positions (HF: cfg->seq_len); 0: no limit (RoPE fork) */
    int exact_seq;                  /* learned positions: seq_len must equal cfg->seq_len (gpt2) */
    int def_seq;                    /* seq_len when the spec gives none */
    /* the code of a seq_len the source cannot take: HF_CONFIG_UNSUPPORTED
     * (a directory's positions), INIT_FROM_MISMATCH (a parent job's) */
    enum loom_errcode seq_code;
};

/* The explicit spec "model" object (family, n_layer, n_head, n_kv_head,
 * d_model, d_ff, vocab_size, seq_len, tied_embeddings, norm_eps, rope_theta
 * for RoPE models) for shape src, with seq_len from spec_model when it has
 * one. Every size spec_model states itself (family, a preset's sizes, the
 * explicit rows) must equal the source's: INIT_FROM_MISMATCH naming the
 * field and both values. spec_model's other keys are copied (a preset that
 * agrees; a misspelt key, for the parser to report), except init_from,
 * init_checkpoint and init_hf (the caller sets what it resolved). New
 * reference, or NULL with e filled. */
json_t *jobspec_model_from(const struct hf_model_source *src, const json_t *spec_model,
                           struct loom_error *e);

/* HF_SPEC_SEQ_DEFAULT: an HF model's seq_len when the spec gives none is its
 * positions, at most this many (gpt2: always its n_positions). */
#define HF_SPEC_SEQ_DEFAULT 4096

/* The source for an HF directory's config `c` (read from `path`). */
void hf_model_source_init(struct hf_model_source *src, const struct model_config *c,
                          const char *path);

#endif
