/* Tuning and debug knobs of the worker: performance switches that were
 * measured (docs/perf.md) and diagnostic switches for tests. They are rows
 * of loom-worker's config table (flag --NAME, env LOOM_<NAME>, config file),
 * flagged CONFIG_TUNING / CONFIG_DEBUG so that --help leaves them out and
 * --help-all lists them (common/config.h). main.c parses them once at
 * start-up into struct worker_tuning and hands each part to the code that
 * uses it (backends, comm layer, pair transport, tensor parallelism); no
 * code below main reads these variables. docs/internals/engine.md has the
 * table with every knob, its default and where it acts.
 *
 * The variables of the agent-to-worker contract (LOOM_RANK, LOOM_WORLD,
 * LOOM_LOCAL_RANK, LOOM_RDZV, LOOM_RDZV_TOKEN, ...) are not knobs and are not
 * here (ARCHITECTURE.md, "Fine-tuning contract"). */
#ifndef LOOM_WORKER_TUNING_H
#define LOOM_WORKER_TUNING_H

#include <stddef.h>

#include "common/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CPU backend (worker/cpu/). */
struct cpu_tuning {
    char *isa;    /* cpu-isa: "baseline" forces the portable kernels; NULL: the best */
    long par_min; /* cpu-par-min: elements below which a kernel runs single-threaded */
};

/* CUDA backend (worker/cuda/). */
struct cuda_tuning {
    int fuse_dgelu;   /* fuse-dgelu: GELU backward fused into the matmul backward */
    char *attn_cudnn; /* attn-cudnn: "1" cuDNN (deterministic), "nd" (nondeterministic), "0" off */
    int attn_cudnn_gqa;    /* attn-cudnn-gqa: cuDNN also for grouped-query attention */
    int elem_vec;          /* elem-vec: 16-byte SwiGLU / RoPE / sum-of-squares kernels */
    int attn_doc_skip;     /* attn-doc-skip: packed documents skip tiles outside them */
    int blas_tune;         /* blas-tune: GEMM algorithms chosen by timing */
    char *blas_algo_cache; /* blas-algo-cache: file of recorded GEMM choices; NULL: none */
    int lora_fused;        /* lora-fused: grouped, strided adapter GEMMs (backend lora_gemm) */
    int lora_drop_fused;   /* lora-drop-fused: dropout applied inside the x.A kernels */
    int nf4_vec;           /* nf4-vec: NF4 dequantization 8 weights a thread */
    long xent_chunk_mib;   /* xent-chunk-mib: bf16 logits per classifier chunk; 0: 2 GiB */
    int fp8;               /* fp8: train.precision fp8 runs E4M3 GEMMs (0: bf16, for A/B) */
    int fp8_fast_accum;    /* fp8-fast-accum: cuBLASLt's FP8 fast accumulation */
    int fp8_base_bf16;     /* fp8-base-bf16: a frozen base keeps bf16 + E4M3 copies on the GPU */
};

/* Communication: comm layer, NCCL/Gloo backends, dp pair transport, tp. */
struct comm_tuning {
    long timeout_ms;            /* comm-timeout-ms: 0: COMM_DEFAULT_TIMEOUT_MS */
    char *backend;              /* comm-backend: auto|local|gloo|nccl; NULL: auto */
    char *order;                /* comm-order: "sync" keeps the host sync before NCCL */
    int dp_pair;                /* dp-pair: two dp ranks sum gradients by copy engines */
    int dp_emb_exchange;        /* dp-emb-exchange: token embedding as per-token rows */
    int tp_stream;              /* tp-stream: tp all-reduces ordered on the compute stream */
    char *iface, *host;         /* comm-iface, comm-host: where Gloo listens */
    char *nccl_stream_priority; /* nccl-stream-priority: "high" or "default" */
    char *nccl_cta_policy;      /* nccl-cta-policy: "default", "efficiency" or "zero" */
    long pair_chunk_kib;        /* pair-chunk-kib: pair transport chunk */
    long pair_trace;            /* pair-trace: log chunk timings of this many steps */
    char *pair_priority;        /* pair-priority: "high" or "default" */
};

/* Optimizer offload (worker/offload.c). */
struct offload_tuning {
    char *isa; /* offload-isa: auto|avx512|avx2|baseline, the CPU AdamW's kernels */
    char *pin; /* offload-pin: register|alloc|off, how the transfer buffer is page-locked */
};

/* The NF4 quantizer of QLoRA's base (worker/nf4.c, struct nf4_opts). */
struct nf4_tuning {
    int fast;     /* nf4-fast: threaded, branch-free quantizer; 0 the serial reference */
    long threads; /* nf4-threads: its threads; 0: --threads, else cores / ranks */
    int overlap;  /* nf4-overlap: upload codes while the next step is quantized */
};

struct worker_tuning {
    struct cpu_tuning cpu;
    struct offload_tuning offload;
    struct cuda_tuning cuda;
    struct comm_tuning comm;
    struct nf4_tuning nf4;
    int debug_param_hash; /* debug-param-hash: log the FNV-1a hash of the weights */
    int diag;             /* diag: diagnosis sampling (timing sync, rank_step lines); 0: off */
    long diag_ab;         /* diag-ab: sampling on N steps, off N steps, ... (benchmarks) */
    long debug_slow_rank; /* debug-slow-rank: this rank (-1: none) sleeps ... */
    long debug_slow_ms;   /* debug-slow-ms: ... this long in every step's compute (tests) */
};

/* The rows, with offsets into struct worker_tuning; worker_config_table adds
 * them to a program's own rows. */
extern const struct config_entry worker_tuning_rows[];
extern const size_t worker_tuning_nrows;

/* A table of base[0..nbase) followed by the tuning rows shifted by
 * tuning_offset (offsetof the struct worker_tuning in the program's options
 * struct). The caller frees the result with free(). NULL when out of memory. */
struct config_entry *worker_config_table(const struct config_entry *base, size_t nbase,
                                         size_t tuning_offset, size_t *n);

/* Defaults < environment, through the same rows: for the constructors that
 * tests and benches call without a loom-worker command line
 * (backend_cpu_new, backend_cuda_new). 0, or -1 after printing a message
 * naming the bad variable. worker_tuning_free releases the strings. */
int worker_tuning_from_env(struct worker_tuning *t);
void worker_tuning_free(struct worker_tuning *t);

#ifdef __cplusplus
}
#endif

#endif
