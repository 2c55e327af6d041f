/* Hugging Face model directories: import and export.
 *
 * A directory holds config.json, the weights as model.safetensors or as
 * shards listed by model.safetensors.index.json ({"weight_map": {tensor:
 * file}}), and tokenizer files. Supported architectures (config.json
 * "architectures"[0]): LlamaForCausalLM (Llama 2, 3, 3.1, 3.2 incl.
 * rope_scaling type "llama3"), MistralForCausalLM, Qwen2ForCausalLM (q/k/v
 * biases) and GPT2LMHeadModel (Conv1D weights stored [in, out], transposed on
 * the way in and out). Tensor names are Loom's (api/model.h uses the HF
 * names); docs/engine.md has the table.
 *
 * Weights are read through read-only mappings of the safetensors files
 * (st_data): each rank converts only the tensors, and the rows of them, that
 * its parameter window and views hold (its tp / pp / ZeRO-3 share), so the
 * whole model is never in host memory. BF16, F16 and F32 are converted to
 * fp32 and then to the engine's compute dtype; export writes the dtype of
 * the source (a bf16 / fp16 value is exact in fp32, so an untrained round
 * trip is bit-identical).
 *
 * Errors fill a struct loom_error (status 422 for bad input) with a stable
 * code and a message naming the file and the values:
 *   HF_CONFIG_MISSING, HF_CONFIG_INVALID (unreadable JSON, a size missing or
 *   out of range), UNSUPPORTED_ARCHITECTURE, HF_CONFIG_UNSUPPORTED (a feature
 *   of a supported architecture Loom does not implement, e.g. rope_scaling
 *   "yarn", head_dim != hidden_size / num_attention_heads),
 *   HF_WEIGHTS_MISSING, SAFETENSORS_HEADER (truncated, oversized or
 *   malformed header), HF_DTYPE (a dtype other than BF16, F16, F32),
 *   HF_TENSOR_MISSING, HF_SHAPE_MISMATCH, HF_IO.
 * Objects are used by one thread. */
#ifndef LOOM_WORKER_HF_H
#define LOOM_WORKER_HF_H

#include <stdint.h>

#include "api/hf_config.h" /* enum hf_arch, hf_config_parse */
#include "api/jobspec.h"
#include "api/model.h"
#include "worker/engine.h"
#include "worker/safetensors.h"

struct hf_model;

/* Open directory `dir`: parse config.json into a model config and check
 * every weight the config implies (present, dtype, shape) without reading
 * any tensor data. *out is owned by the caller (hf_free). */
int hf_open(const char *dir, struct hf_model **out, struct loom_error *err);
void hf_free(struct hf_model *h); /* NULL ok */

/* The model config (seq_len = max_position_embeddings, or Mistral's
 * sliding_window when smaller; borrowed). */
const struct model_config *hf_config(const struct hf_model *h);
enum hf_arch hf_model_arch(const struct hf_model *h);
/* dtype of the weights (the token embedding's). */
enum st_dtype hf_model_dtype(const struct hf_model *h);
const char *hf_model_dir(const struct hf_model *h);
/* config.json's eos_token_id (a number or a list, as Llama 3 has) into
 * ids[0..max); returns how many. */
int hf_eos_tokens(const struct hf_model *h, int *ids, int max);

/* Write this rank's share of the weights into engine `e` (whose config must
 * have the sizes of hf_config; seq_len may be smaller for llama-family
 * models, not for gpt2, whose wpe has max_position rows): only tensors or
 * rows that meet e's parameter window or views are read. Padded vocabulary
 * rows are zero. Logs the bytes read. */
int hf_load(struct hf_model *h, struct engine *e, struct loom_error *err);
/* Bytes of tensor data hf_load read so far (for tests and logs). */
uint64_t hf_bytes_read(const struct hf_model *h);

struct hf_export_opts {
    const char *dir;      /* created if missing */
    const char *src_dir;  /* HF directory the model came from (config, generation config and
                             tokenizer files are taken from it), or NULL */
    enum st_dtype dtype;  /* F32, BF16 or F16 */
    uint64_t shard_bytes; /* most tensor bytes per file; 0: 5 GB */
};

/* Export full (tp = 1) fp32 parameters `params` laid out by `full` for
 * config `c`: shards model-0000K-of-0000N.safetensors (model.safetensors
 * when N = 1) and model.safetensors.index.json, config.json (the source's,
 * with torch_dtype set, or one written for c), generation_config.json and
 * the source's tokenizer files. */
int hf_export(const struct hf_export_opts *o, const struct model_config *c,
              const struct model_layout *full, const float *params, struct loom_error *err);

/* The HF "torch_dtype" name of a dtype ("bfloat16", "float16", "float32"). */
const char *hf_torch_dtype(enum st_dtype d);

#endif
