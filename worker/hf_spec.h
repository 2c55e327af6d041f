/* The job spec's side of fine-tuning: model.init_from (an HF directory whose
 * weights start the run) and export.hf (write RUN/export/hf at the end).
 *
 * The spec parser (api/jobspec.c) checks init_from and export but still
 * wants the model's family and sizes; with an HF directory they are the
 * directory's, so hf_spec_prepare hands the parser a spec whose "model"
 * holds them explicitly (family, n_layer, ..., seq_len: the spec's, else the
 * directory's positions capped at HF_SPEC_SEQ_DEFAULT), and hf_spec_apply
 * puts back what the spec format cannot express (Qwen2 biases, RoPE
 * scaling, the exact eps). GPT-2 keeps its n_positions learned positions, so
 * its seq_len must equal n_positions. Sizes the spec states must agree with
 * the directory's (INIT_FROM_MISMATCH; api/hf_config.h, shared with loomd).
 *
 * "job:<id>[@<step>]" (a fork) is resolved by the coordinator before a
 * worker starts (daemon/initfrom.h): it adds model.init_checkpoint (the
 * checkpoint directory) and, when the parent's model came from an HF
 * directory, model.init_hf (opened here like init_from for its settings and
 * export files). The run starts from the checkpoint's parameters with zeroed
 * AdamW moments at step 0. A worker given a job: reference without
 * init_checkpoint refuses it (INIT_FROM_UNRESOLVED).
 *
 * A run starts from init_from only when OUT has no complete checkpoint: a
 * retried attempt resumes from its own newest checkpoint. */
#ifndef LOOM_WORKER_HF_SPEC_H
#define LOOM_WORKER_HF_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "api/hf_config.h" /* HF_SPEC_SEQ_DEFAULT, jobspec_model_from */
#include "api/jobspec.h"
#include "worker/engine.h"

struct hf_model;
struct zero;
struct par;

struct hf_spec {
    struct hf_model *hf; /* model.init_from (or a fork's init_hf), opened; NULL without */
    int export_hf;       /* export.hf */
    char init_checkpoint[JOBSPEC_PATH_MAX]; /* a fork's checkpoint (hf_spec_apply), or "" */
};

/* Rewrite the spec text *text (malloc'ed, *len bytes) as described above
 * when model.init_from is an absolute path; *text may be replaced (the old
 * buffer freed). 0, or -1 with e filled (bad JSON is left to the parser). */
int hf_spec_prepare(char **text, size_t *len, struct hf_spec *hs, struct loom_error *e);
/* After jobspec_parse: the directory's settings the parsed spec cannot
 * hold, into s->model; export.hf into hs. 0 or -1 (an unresolved job:
 * reference) with e filled. */
int hf_spec_apply(struct hf_spec *hs, struct loom_spec *s, struct loom_error *e);
/* Read, prepare and parse the spec file at path (for the worker's model
 * modes). 0 or -1 with e filled. */
int hf_spec_load(const char *path, struct loom_spec *s, struct hf_spec *hs, struct loom_error *e);
/* After the weights were initialised: load init_from's weights (or a
 * fork's checkpoint parameters, moments zeroed) into e unless out_dir has a
 * complete checkpoint. 0 or -1 with e filled. */
int hf_spec_init(struct hf_spec *hs, struct engine *e, const char *out_dir, struct loom_error *err);
void hf_spec_free(struct hf_spec *hs);

/* Export the engine's weights as an HF directory `dir` (collective when z
 * or par is set: every rank gathers, rank 0 writes). src (may be NULL) is
 * the directory the model came from: its dtype, config and tokenizer files
 * are used. One {"type":"export"} line on rank 0. 0 or -1 with err filled. */
int hf_export_engine(struct engine *e, struct zero *z, struct par *par, const char *dir,
                     const struct hf_model *src, uint64_t shard_bytes, struct loom_error *err);

#endif
