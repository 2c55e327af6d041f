/* Scoring and generation with a loaded model (the worker's --score-tokens
 * and --generate-tokens modes; ARCHITECTURE.md "Fine-tuning contract").
 *
 * Scoring runs the training forward over the tokens as one sequence and
 * turns the per-token losses into log-probabilities. Generation keeps a
 * key/value cache per block (device memory, [max_len, 2 * n_kv_head *
 * head_dim]) and runs one token at a time through the blocks with the
 * backend's rope_at and attention_decode (backend.h): the prompt is fed
 * token by token too, so every position sees exactly the keys before it.
 * Both backends have them (cpu fp32, cuda bf16 cache: worker/cuda/
 * k_decode.cu); a backend without them would generate by re-running the
 * training forward over the sequence for every token instead. One process
 * (tp = pp = 1). Only the engine thread calls these. */
#ifndef LOOM_WORKER_HF_GENERATE_H
#define LOOM_WORKER_HF_GENERATE_H

#include <stdint.h>

#include "worker/model.h"

/* lp[0] = NAN (no context), lp[i] = log p(tokens[i] | tokens[0..i)) for
 * 0 < i < n. m must have been built with B = 1 and T >= n. 0 or -1. */
int hf_score(struct model *m, const int32_t *tokens, int n, double *lp);

#define HF_MAX_EOS 8

struct hf_sample_opts {
    int max_new;         /* tokens to generate */
    double temperature;  /* 0: greedy (argmax, lowest id on ties) */
    double top_p;        /* nucleus: keep the most likely tokens up to this mass; 1: all */
    uint64_t seed;       /* sampling stream (splitmix64) */
    int eos[HF_MAX_EOS]; /* stop after generating one of these ids */
    int n_eos;
};

/* Generate up to o->max_new tokens after prompt[0..n) into out (capacity
 * o->max_new); returns the number generated, or -1 (message logged: tp/pp
 * > 1, n + max_new beyond seq_len, out of memory). With the backend's
 * decode operations and recompute = 0 through the KV cache; otherwise
 * (recompute = 1 to check one path against the other, or a backend
 * without them)
 * by re-running the whole forward for every new token, which needs m built
 * with B = 1 and T >= n + max_new. The same seed draws the same stream on
 * both paths. */
int hf_generate(struct model *m, const int32_t *prompt, int n, const struct hf_sample_opts *o,
                int recompute, int32_t *out);

#endif
