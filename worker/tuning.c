/* The tuning and debug rows of loom-worker's config table (worker/tuning.h).
 * Names map to the environment as every row does: cpu-isa is LOOM_CPU_ISA. */
#include "worker/tuning.h"

#include <stdlib.h>
#include <string.h>

#include "common/config.h"

#define T     CONFIG_TUNING
#define D     CONFIG_DEBUG
#define AT(f) offsetof(struct worker_tuning, f)

const struct config_entry worker_tuning_rows[] = {
    {"cpu-isa", CONFIG_STR | T, AT(cpu.isa), NULL, 1, 0,
     "CPU kernel set: baseline forces the portable kernels (identical results); default: AVX2 "
     "when the CPU has it"},
    {"cpu-par-min", CONFIG_INT | T, AT(cpu.par_min), "262144", 0, 1e15,
     "CPU backend: elementwise kernels smaller than this run on one thread"},
    {"offload-isa", CONFIG_STR | T, AT(offload.isa), "auto", 1, 0,
     "optimizer offload: the CPU AdamW's kernels, auto (the best), avx512, avx2 or baseline "
     "(portable C; all give identical results)"},
    {"offload-pin", CONFIG_STR | T, AT(offload.pin), "register", 1, 0,
     "optimizer offload: page-lock the transfer buffer by registering pieces from several "
     "threads (register), with one cudaHostAlloc (alloc), or not at all (off)"},
    {"fuse-dgelu", CONFIG_BOOL | T, AT(cuda.fuse_dgelu), "1", 0, 0,
     "CUDA: fuse the GELU backward into the next matmul backward's epilogue"},
    {"attn-cudnn", CONFIG_STR | T, AT(cuda.attn_cudnn), "1", 1, 0,
     "CUDA attention: 1 cuDNN fused engines (deterministic), nd (nondeterministic), 0 the "
     "built-in flash kernels"},
    {"attn-cudnn-gqa", CONFIG_BOOL | T, AT(cuda.attn_cudnn_gqa), "1", 0, 0,
     "CUDA attention: cuDNN's engines also for grouped-query attention (fewer kv heads than "
     "query heads); 0 keeps those on the built-in kernels"},
    {"elem-vec", CONFIG_BOOL | T, AT(cuda.elem_vec), "1", 0, 0,
     "CUDA: 16-byte vector kernels for SwiGLU, RoPE (a cos/sin table) and the gradient norm's "
     "sum of squares; 0 the one-element-per-thread kernels"},
    {"attn-doc-skip", CONFIG_BOOL | T, AT(cuda.attn_doc_skip), "1", 0, 0,
     "CUDA attention with documents packed in a row (train.packing \"document\"): leave out "
     "the key and query tiles wholly outside every row's document; 0 masks them instead"},
    {"blas-tune", CONFIG_BOOL | T, AT(cuda.blas_tune), "0", 0, 0,
     "CUDA: choose cuBLASLt algorithms by timing the candidates of each GEMM shape"},
    {"blas-algo-cache", CONFIG_STR | T, AT(cuda.blas_algo_cache), NULL, 1, 0,
     "CUDA: file of GEMM algorithm choices, read at start and written by blas-tune"},
    {"lora-fused", CONFIG_BOOL | T, AT(cuda.lora_fused), "1", 0, 0,
     "CUDA LoRA: one x.A GEMM per projection group and (xA).B accumulated into the projection "
     "output by the GEMM (beta 1); 0 the per-adapter GEMMs with a separate add pass"},
    {"lora-drop-fused", CONFIG_BOOL | T, AT(cuda.lora_drop_fused), "1", 0, 0,
     "CUDA LoRA with dropout: the mask applied in registers by the adapter's x.A and backward "
     "kernels (backend lora_drop_fwd / lora_drop_bwd); 0 a masked copy of the input, then "
     "cuBLASLt"},
    {"nf4-vec", CONFIG_BOOL | T, AT(cuda.nf4_vec), "1", 0, 0,
     "CUDA QLoRA: dequantize NF4 weights 8 a thread with 16-byte stores; 0 one weight a thread"},
    {"nf4-fast", CONFIG_BOOL | T, AT(nf4.fast), "1", 0, 0,
     "QLoRA: quantize the NF4 base on several threads with branch-free code search (the same "
     "bytes); 0 the serial reference quantizer"},
    {"nf4-threads", CONFIG_INT | T, AT(nf4.threads), "0", 0, 32,
     "QLoRA: threads of the NF4 quantizer; 0: --threads when set, else the node's cores over its "
     "ranks (at most 32)"},
    {"nf4-overlap", CONFIG_BOOL | T, AT(nf4.overlap), "1", 0, 0,
     "QLoRA: upload a tensor's NF4 codes in 16M-weight steps while the next step is quantized; "
     "0 quantize the whole tensor, then upload it"},
    {"xent-chunk-mib", CONFIG_INT | T, AT(cuda.xent_chunk_mib), "0", 0, 2048,
     "CUDA classifier: MiB of bf16 logits per row chunk (logits GEMM, fused softmax / loss / "
     "dlogits, dX and dW GEMMs per chunk); 0: chunks of up to 2 GiB (the full logits of most "
     "shapes)"},
    {"fp8", CONFIG_BOOL | T, AT(cuda.fp8), "1", 0, 0,
     "CUDA, train.precision fp8: the block linear layers in E4M3 GEMMs; 0 keeps them "
     "bf16 (A/B, or to switch a failing fp8 path off)"},
    {"fp8-base-bf16", CONFIG_BOOL | T, AT(cuda.fp8_base_bf16), "0", 0, 0,
     "CUDA, train.precision fp8 with LoRA: keep the bf16 base on the GPU beside its E4M3 W and "
     "W^T (4 bytes a block weight); 0 holds the base as E4M3 W alone (1 byte a weight, W^T "
     "made at each use) with the bf16 values in host memory, on one GPU"},
    {"fp8-fast-accum", CONFIG_BOOL | T, AT(cuda.fp8_fast_accum), "0", 0, 0,
     "CUDA, train.precision fp8: cuBLASLt's FP8 fast accumulation (partial sums not promoted to "
     "fp32 along K: faster, less accurate); 0 the promoting default"},
    {"comm-timeout-ms", CONFIG_INT | T, AT(comm.timeout_ms), "0", 0, 1e9,
     "rendezvous and per-operation timeout (0: 300000)"},
    {"comm-backend", CONFIG_STR | T, AT(comm.backend), NULL, 1, 0,
     "comm backend: auto, local, gloo or nccl (default auto: nccl on cuda, gloo on cpu)"},
    {"comm-order", CONFIG_STR | T, AT(comm.order), NULL, 1, 0,
     "sync: wait on the host before each NCCL call instead of ordering on the stream"},
    {"comm-iface", CONFIG_STR | T, AT(comm.iface), NULL, 1, 0,
     "Gloo: the network interface to listen on"},
    {"comm-host", CONFIG_STR | T, AT(comm.host), NULL, 1, 0,
     "Gloo: the address or name to listen on (default: loopback for a file rendezvous, else the "
     "host name)"},
    {"nccl-stream-priority", CONFIG_STR | T, AT(comm.nccl_stream_priority), "default", 1, 0,
     "NCCL comm stream priority: high or default"},
    {"nccl-cta-policy", CONFIG_STR | T, AT(comm.nccl_cta_policy), "default", 1, 0,
     "NCCL CTA policy: default, efficiency or zero"},
    {"dp-pair", CONFIG_BOOL | T, AT(comm.dp_pair), "1", 0, 0,
     "two dp ranks on cuda (stage 0): sum gradients with the copy engines, not NCCL"},
    {"dp-emb-exchange", CONFIG_BOOL | T, AT(comm.dp_emb_exchange), "1", 0, 0,
     "with dp-pair: exchange the token embedding gradient as per-token rows"},
    {"pair-chunk-kib", CONFIG_INT | T, AT(comm.pair_chunk_kib), "8192", 1, 1 << 22,
     "dp pair transport: chunk size, KiB"},
    {"pair-priority", CONFIG_STR | T, AT(comm.pair_priority), "default", 1, 0,
     "dp pair transport: copy and add stream priority, high or default"},
    {"pair-trace", CONFIG_INT | D, AT(comm.pair_trace), "0", 0, 1e6,
     "dp pair transport: log chunk timings for this many steps"},
    {"tp-stream", CONFIG_BOOL | T, AT(comm.tp_stream), "1", 0, 0,
     "tp all-reduces ordered on the compute stream (0: host sync before each)"},
    {"debug-param-hash", CONFIG_BOOL | D, AT(debug_param_hash), "0", 0, 0,
     "log the FNV-1a hash of the fp32 weights at the end (ranks holding all of them)"},
    {"diag", CONFIG_BOOL | T, AT(diag), "1", 0, 0,
     "diagnosis sampling: the device sync that splits a dp step into compute and exposed "
     "communication, and the rank_step lines of ranks other than 0 (0: neither, for A/B "
     "runs; docs/perf.md \"Diagnosis cost\")"},
    {"diag-ab", CONFIG_INT | D, AT(diag_ab), "0", 0, 1e6,
     "benchmarks: with diag 1, sampling on for this many steps, then off for as many, and so "
     "on (tests/bench/bench_diag.py); 0: always on"},
    /* test knobs: a deliberately slow rank for the straggler diagnosis tests */
    {"debug-slow-rank", CONFIG_INT | D, AT(debug_slow_rank), "-1", -1, 1e6,
     "tests: the rank that sleeps debug-slow-ms in every step (a straggler); -1: none"},
    {"debug-slow-ms", CONFIG_INT | D, AT(debug_slow_ms), "0", 0, 60000,
     "tests: how long debug-slow-rank sleeps per step, counted as compute"},
};
const size_t worker_tuning_nrows = sizeof worker_tuning_rows / sizeof *worker_tuning_rows;

#undef T
#undef D
#undef AT

struct config_entry *worker_config_table(const struct config_entry *base, size_t nbase,
                                         size_t tuning_offset, size_t *n) {
    struct config_entry *t = malloc((nbase + worker_tuning_nrows) * sizeof *t);
    if (!t) return NULL;
    memcpy(t, base, nbase * sizeof *t);
    for (size_t i = 0; i < worker_tuning_nrows; i++) {
        t[nbase + i] = worker_tuning_rows[i];
        t[nbase + i].offset += tuning_offset;
    }
    *n = nbase + worker_tuning_nrows;
    return t;
}

int worker_tuning_from_env(struct worker_tuning *t) {
    memset(t, 0, sizeof *t);
    char *argv[] = {"loom-worker", NULL};
    return config_load(worker_tuning_rows, worker_tuning_nrows, t, "loom-worker", NULL, 1, argv,
                       NULL, NULL);
}

void worker_tuning_free(struct worker_tuning *t) {
    if (t) config_free(worker_tuning_rows, worker_tuning_nrows, t);
}
