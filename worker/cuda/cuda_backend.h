/* CUDA backend extras beyond struct backend (worker/backend.h): memory
 * figures for the worker's step report. The table itself comes from
 * backend_cuda_new(device). */
#ifndef LOOM_CUDA_BACKEND_H
#define LOOM_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct backend;

/* Bytes held now and at most so far by the backend on the device: the
 * engine's alloc() arenas plus the backend's own workspaces. */
struct cuda_mem_report {
    size_t engine_bytes;    /* alloc() total now */
    size_t engine_peak;     /* alloc() high-water mark */
    size_t workspace_bytes; /* reserve() workspaces (cuBLASLt, attention, logits chunk) */
    size_t logits_bytes;    /* of which the classifier chunk */
    size_t device_used;     /* cudaMemGetInfo: total - free (all processes) */
    size_t device_free;     /* cudaMemGetInfo: free */
    size_t device_total;    /* cudaMemGetInfo: total */
};
/* Fill *r for a backend made by backend_cuda_new; returns 0, or -1 when b is
 * not a CUDA backend. */
int backend_cuda_mem(const struct backend *b, struct cuda_mem_report *r);

/* The tied-embedding gradient in two halves, so that two data-parallel
 * ranks can exchange per-token rows instead of the dense gradient
 * (worker/zero.c): embed_rows writes rows[u][C] = the sum of the dout rows of
 * the u-th distinct token of `tokens` (the device ids embedding_fwd got) and
 * returns the device ids of those tokens, padded with -1 to B*T entries
 * (valid until the next embedding call), *n_uniq their count;
 * embed_scatter adds rows[u] into dwte[uniq[u]] for u < n_rows, skipping
 * ids < 0. Both on the compute stream. */
const int32_t *backend_cuda_embed_rows(struct backend *b, void *rows, int *n_uniq, const void *dout,
                                       const int32_t *tokens, int B, int T, int C);
void backend_cuda_embed_scatter(struct backend *b, void *dwte, const void *rows,
                                const int32_t *uniq, int n_rows, int C);

/* "cudnn" when attention of the reserved shape runs through cuDNN's fused
 * engines (worker/cuda/cudnn_attn.h), else why not (k_attn.cu is used). */
const char *backend_cuda_attn_path(const struct backend *b);

/* The backend's CUDA stream (a cudaStream_t) for timing with events; NULL
 * when b is not a CUDA backend. */
void *backend_cuda_stream(const struct backend *b);

/* Held-back work (see cuda_backend.c): 1 when a matmul_fwd (what = 1) or
 * an AdamW batch (what = 2) is held. backend_cuda_issue_held issues it now.
 * For profiling tools that time each call; training never needs them. */
int backend_cuda_held(const struct backend *b, int what);
void backend_cuda_issue_held(const struct backend *b, int what);

/* Issue all deferred work (held matmul, AdamW batch, recorded zero ranges)
 * to the stream without waiting, so that a fence recorded next (e.g.
 * nccl_order_mark) follows it. No-op when b is not a CUDA backend. */
void backend_cuda_flush(const struct backend *b);

/* FP8 linear layers (backend.h fp8_freeze): how many weights have E4M3
 * copies and their bytes, and how many GEMMs ran in E4M3 so far (forward,
 * input gradient, weight gradient) and fell back to bf16 with an fp8 weight
 * (a shape or pointer the FP8 GEMM does not take, or cuBLASLt refused it).
 * held: the weights held by handle (W8 alone), dequant: the bf16 GEMMs run
 * on such a weight's dequantized W8. -1 when b is not a CUDA backend. */
struct cuda_fp8_stats {
    int weights, held;
    size_t bytes;
    long fwd, bwd, wgrad, fallback, dequant;
};
int backend_cuda_fp8_stats(const struct backend *b, struct cuda_fp8_stats *st);

#endif
