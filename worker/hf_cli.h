/* loom-worker's model modes: --init-from, --score-tokens, --generate-tokens,
 * --export-hf (ARCHITECTURE.md "Fine-tuning contract"), run in one process
 * instead of training.
 *
 * The weights come from an HF directory (--init-from DIR) or from a run
 * directory (--spec S --out RUN: the newest checkpoint under RUN, else the
 * spec's model.init_from, else refused). JSON lines on stdout: first
 *   {"type":"model","architecture","dtype","params","seq_len","weights","device"}
 * then one per mode asked for:
 *   {"type":"score","logprobs":[null, lp1, ...]}
 *   {"type":"generate","tokens":[...]}            (new tokens only)
 *   {"type":"export","dir":"...","dtype":"BF16"}
 * Errors: one {"type":"error","code","message"} line; exit 2 for bad input,
 * 1 otherwise. */
#ifndef LOOM_WORKER_HF_CLI_H
#define LOOM_WORKER_HF_CLI_H

#include <jansson.h>

struct hf_cli_opts {
    char *init_from, *score, *generate, *export_hf;
    long max_new, seed;
    int recompute; /* debug: generate without the KV cache (the CUDA path) */
    double temperature, top_p, shard_mb;
    /* from the worker's own flags */
    const char *spec, *out, *device;
    long threads;
};

/* 1 when any of the model modes was asked for. */
int hf_cli_wanted(const struct hf_cli_opts *o);
/* Run the modes asked for (score, then generate, then export); returns the
 * process exit code. */
int hf_cli_run(const struct hf_cli_opts *o);

/* loom-worker's stdout protocol, used by the model modes and by training
 * (worker/main.c): one {"type":"error","code","message"} line on stdout and
 * the same text on stderr; one JSON line on stdout (takes the reference to
 * j; NULL writes nothing). Both flush stdout. */
void hf_cli_error(const char *code, const char *msg);
void hf_cli_emit(json_t *j);

#endif
