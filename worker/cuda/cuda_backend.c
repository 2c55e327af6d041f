/* The CUDA implementation of struct backend (worker/backend.h): bf16
 * parameters, gradients and activations, fp32 master weights, moments and
 * statistics, all work issued in order on one non-blocking stream.
 *
 * Each table entry maps onto a kernel in kernels.h. Workspaces (cuBLASLt,
 * attention, norm and bias partials, the classifier's logits chunk, token
 * buckets) come from one arena made by reserve(); the engine's own buffers
 * come from alloc() at start-up. Nothing is allocated during a step.
 *
 * The embedding gradient is made deterministic without float atomics by
 * sorting rows by token on the host: embedding_fwd copies the token ids to
 * pinned memory asynchronously, so embedding_bwd normally finds them there
 * without waiting for the device (it falls back to a synchronous download
 * when the ids were rewritten in between).
 *
 * Deferred zeroing: the engine zeroes a gradient buffer and then has one
 * operation accumulate into it. zero() therefore only records the range;
 * when the next call's gradient output is exactly that range, the kernel
 * overwrites instead of adding (no memset, no read of zeros). Every call
 * first issues the memsets of all other recorded ranges, so any other use
 * sees zeros as the contract says.
 *
 * Three more calls are held back one call: matmul_fwd, so that a gelu_fwd of
 * its output runs as the matmul's GELU epilogue (both outputs still written);
 * the input-gradient GEMM of a matmul_bwd that overwrites its output, so
 * that a gelu_bwd reading that output runs as the GEMM's DGELU epilogue
 * (dinp of the gelu written directly; the matmul's own output, a scratch the
 * engine zeroes before every use, is then not written: 2 x N x IC x 2 bytes
 * less traffic, 0.6 ms a GPT-2 124M step); and adamw, so that the engine's
 * adjacent per-decay-group ranges run as one launch. Every other entry point
 * issues held work first, in call order (zero() only records its range and
 * leaves the held GEMM: every memset is issued after it).
 *
 * Optimizer offload (worker/offload.h) copies on two more streams, one per
 * direction (PCIe is full duplex): d2h_async / h2d_async first issue held
 * work, record an event on the compute stream and make the copy stream wait
 * for it, then copy and record a ticket event from a ring. A ticket's event
 * is synchronised before its ring slot is reused, so a ticket older than the
 * ring is complete. copy_fence makes the compute stream wait for both copy
 * streams. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/gpu_types.h"
#include "common/log.h"
#include "worker/backend.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cudnn_attn.h"
#include "worker/cuda/k_fp8.h"
#include "worker/cuda/k_lora.h"
#include "worker/cuda/kernels.h"
#include "worker/tuning.h"

#define MAX_ALLOCS     1024
#define MAX_PENDING    16
#define LOGITS_CAP     ((size_t)2 << 30) /* bytes of bf16 logits per classifier chunk, at most */
#define XENT_CHUNK_MIB 0                 /* the xent-chunk-mib row's default (worker/tuning.c) */
/* the chunk cap when the classifier weight is frozen (backend_limits.frozen_head) and the row is
 * 0: with no dW, more chunks add no traffic (docs/perf.md, "Llama shapes II") */
#define FROZEN_HEAD_MIB 512
#define CUDA_PEAK_BF16  989e12 /* MFU denominator for a device not in api/gpu_types.c */
#ifndef LOOM_CUDA_ARCHS
#define LOOM_CUDA_ARCHS "" /* the build's CMAKE_CUDA_ARCHITECTURES (worker/cuda/CMakeLists.txt) */
#endif
#define COPY_RING 4096 /* ticket events of the async copies */

struct cuda_alloc {
    void *p;
    size_t bytes;
};

struct cuda_range {
    void *p;
    size_t bytes;
};

struct cuda_ctx {
    int device;
    cudaStream_t s;
    struct lcuda_arena ws;
    struct lk_blas *blas;
    struct backend_limits lim;
    int reserved;
    float *attn_scratch, *norm_scratch, *bias_scratch, *sum_scratch;
    lbf16 *logits;
    /* rows per classifier chunk: as many as fit in xent_mib MiB of bf16
     * logits (the xent-chunk-mib row; 0: LOGITS_CAP, or FROZEN_HEAD_MIB for
     * a frozen head), rounded down to 64 */
    int cls_chunk;
    long xent_mib;
    int32_t *d_order, *d_starts, *d_uniq; /* token buckets (device) */
    int32_t *h_tok, *h_buf;               /* pinned host: tokens; order|starts|uniq */
    /* token ids copied to h_tok during embedding_fwd (so embedding_bwd need
     * not wait for the device); valid until something writes tok_ptr */
    const int32_t *tok_ptr;
    int tok_n, tok_valid;
    cudaEvent_t tok_ev, buf_ev; /* tokens landed in h_tok; h_buf free again */
    struct cuda_alloc allocs[MAX_ALLOCS];
    size_t alloc_bytes, alloc_peak;
    struct cuda_range pending[MAX_PENDING]; /* zero() ranges not yet written */
    int npending;
    /* a matmul_fwd held back one call, to fuse a following gelu_fwd */
    struct {
        int on;
        void *out;
        const void *inp, *W, *bias;
        int N, IC, OC;
    } mm;
    /* the input-gradient GEMM of a matmul_bwd held back one call, to fuse a
     * following gelu_bwd of its output (DGELU epilogue); the fuse-dgelu row
     * off (LOOM_FUSE_DGELU=0): never held (A/B) */
    int fuse_off;
    int nf4_scalar; /* the nf4-vec row off: one weight a thread */
    struct {
        int on;
        void *dinp;
        const void *dout, *W;
        int N, IC, OC;
    } mb;
    /* adamw calls over adjacent ranges, launched together */
    struct {
        int on;
        struct backend_adamw a; /* first range; a.n = total so far */
        struct lk_adamw_segs segs;
    } aw;
    /* async host copies (offload): streams d2h, h2d; ticket ring */
    cudaStream_t cs[2];
    cudaEvent_t ev_order; /* compute-stream point a copy waits for */
    cudaEvent_t ev_fence[2];
    cudaEvent_t ring[COPY_RING];
    uint64_t ticket; /* last issued */
    /* attention through cuDNN's fused engines for the reserved shape
     * (the attn-cudnn row, LOOM_ATTN_CUDNN: 1 deterministic, the default; nd nondeterministic;
     * 0 off); NULL: k_attn.cu's kernels */
    int cudnn_mode;
    /* the attn-cudnn-gqa row off (LOOM_ATTN_CUDNN_GQA=0): grouped-query attention
     * (NKV < NH) stays on k_attn.cu */
    int cudnn_gqa_off;
    /* the elem-vec row off (LOOM_ELEM_VEC=0): SwiGLU, RoPE and the gradient
     * norm's sum of squares one element per thread */
    int elem_scalar;
    /* RoPE: scaled inverse frequencies (rope_set_freqs; NULL: theta^(-2i/HD)),
     * and the device tables for the last (T, HD, theta) asked: inverse
     * frequencies in fp64 and fp32 and lk_rope_tab's cos / sin; the tables
     * live in the workspace (lim.T x lim.HD / 2 at most) */
    double *rope_inv;
    int rope_half;
    double *d_rope_inv;
    float *d_rope_inv32, *d_rope_tab;
    int rope_T, rope_HD, rope_valid;
    float rope_theta;
    double rope_h64[512]; /* host sources of the frequency copies */
    float rope_h32[512];
    /* the blas-tune and blas-algo-cache rows, for lk_blas_new in reserve */
    int blas_tune;
    char *blas_cache;
    int cc; /* the device's compute capability x10 (90 = sm_90) */
    struct lcudnn_attn *cda;
    char cda_why[640]; /* why not, when cda is NULL */
    /* imported models and generation (k_decode.cu): rope_set_freqs' inverse
     * frequencies for rope_at at any position (device fp32 [dec_rope_half];
     * NULL: theta^(-2i/HD)) and the decode attention's split scratch, made on
     * first use */
    float *dec_rope_inv;
    int dec_rope_half;
    float *dec_scratch;
    size_t dec_bytes;
    /* documents packed in a row (set_doc_starts): the starts of the last call on the host
     * (doc_h, for the position-embedding gradient's buckets) and the device (d_doc), through
     * pinned h_doc; doc_on until called with NULL; doc_pos: the position buckets (order |
     * starts | uniq, 3N+1) of dwpe, pinned h_pos and device d_pos; the attn-doc-skip row off:
     * doc_noskip */
    int32_t *doc_h, *h_doc, *d_doc, *h_pos, *d_pos;
    int doc_n, doc_cap, doc_on, doc_noskip;
    cudaEvent_t doc_ev, pos_ev; /* h_doc / h_pos free again */
    /* FP8 linear layers (fp8_freeze; docs/engine.md "FP8"): per weight
     * pointer one allocation holding W8 [OC][IC] | W8T [IC][OC] | amax,
     * scale (fp32); q: the per-call E4M3 input / output-gradient buffer
     * (qcap bytes, sized at freeze time for the reserved N); qt, xt: the
     * transposed E4M3 dY and X of a weight gradient (made when a weight is
     * frozen with wgrad); wq: a trained weight's W8 or W8T, made at each use;
     * xs: amax, scale of q / qt, then of xt, then of wq (F8_AMAX, F8_SCALE:
     * each in its own 16-byte slot, as cuBLASLt's scale pointers must be);
     * off: the
     * fp8 tuning row is 0 (every weight stays bf16); fast: the
     * fp8-fast-accum row (cuBLASLt's FP8 fast accumulation); a weight held
     * by handle keeps W8 alone and takes its W8T in wq at each use */
    struct {
        struct fp8_weight *w;
        int n, cap, off, fast;
        uint8_t *q, *qt, *xt, *wq;
        size_t qcap, qtcap, xtcap, wqcap, bytes;
        float *xs;
        long fwd, bwd, wgrad, fallback, dequant;
        uint16_t *deq; /* a handle weight's W8 dequantized for a bf16 GEMM (made on first need) */
        size_t deqcap;
        int n_own;
    } f8;
};

/* The fp32 amax and scale of the per-call E4M3 operand i (0: X or dY, 1: the
 * weight gradient's X^T, 2: a trained weight): each in its own 16-byte slot,
 * because cuBLASLt refuses an FP8 GEMM whose scale pointer
 * (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER) is not 16-byte aligned
 * (CUBLAS_STATUS_NOT_SUPPORTED; cuBLASLt 13.1 on an H200). */
#define F8_AMAX(c, i)  ((c)->f8.xs + 8 * (i))
#define F8_SCALE(c, i) ((c)->f8.xs + 8 * (i) + 4)

struct fp8_weight {
    const void *W;
    int OC, IC;
    uint8_t *w8, *w8t; /* NULL for a trained weight (quantized at each use) */
    float *sc;         /* device: amax [0], scale [4] (16-byte slots; NULL for a trained weight) */
    int bad;           /* cuBLASLt refused its GEMM once: bf16 from then on */
    int own;           /* held by handle (fp8_freeze's handle): W is w8's buffer, no W8T kept */
};

#define CX ((struct cuda_ctx *)ctx)
#define ST ((lcuda_stream)CX->s)

/* Launch the held-back matmul (no fusion). */
static void mm_flush(struct cuda_ctx *c) {
    if (!c->mm.on) return;
    c->mm.on = 0;
    lk_linear_fwd(c->blas, c->mm.out, NULL, c->mm.inp, c->mm.W, c->mm.bias, NULL, c->mm.N, c->mm.IC,
                  c->mm.OC, 0);
}

/* Launch the held-back input-gradient GEMM (no fusion; it overwrites). */
static void mb_flush(struct cuda_ctx *c) {
    if (!c->mb.on) return;
    c->mb.on = 0;
    lk_linear_bwd_data(c->blas, c->mb.dinp, c->mb.dout, c->mb.W, NULL, c->mb.N, c->mb.IC, c->mb.OC,
                       0);
}

/* Launch the batched AdamW ranges. */
static void aw_flush(struct cuda_ctx *c) {
    if (!c->aw.on) return;
    c->aw.on = 0;
    const struct backend_adamw *a = &c->aw.a;
    lk_adamw_multi(a->param, a->master, a->grad, a->m, a->v, &c->aw.segs, a->lr, a->beta1, a->beta2,
                   a->eps, a->grad_scale, a->step, (lcuda_stream)c->s);
}

/* Issue all deferred work: the held matmul or AdamW (cu_zero issues those
 * before recording a range, so they precede every recorded zero), then the
 * memsets. */
static void pz_flush(struct cuda_ctx *c) {
    mb_flush(c);
    mm_flush(c);
    aw_flush(c);
    for (int i = 0; i < c->npending; i++)
        CUDA_CHECK(cudaMemsetAsync(c->pending[i].p, 0, c->pending[i].bytes, c->s));
    c->npending = 0;
}

/* 1 when [p, p+bytes) is exactly a recorded zero range: it is dropped (the
 * caller overwrites it); all other ranges are flushed either way. */
static int pz_take(struct cuda_ctx *c, void *p, size_t bytes) {
    int hit = 0;
    mb_flush(c);
    mm_flush(c);
    aw_flush(c);
    for (int i = 0; i < c->npending; i++) {
        if (c->pending[i].p == p && c->pending[i].bytes == bytes) {
            c->pending[i] = c->pending[--c->npending];
            hit = 1;
            break;
        }
    }
    pz_flush(c);
    return hit;
}

#define FLUSH() pz_flush(CX)

static void cu_require(struct cuda_ctx *c, const char *what) {
    if (!c->reserved) {
        fprintf(stderr, "cuda backend: %s called before reserve()\n", what);
        exit(1);
    }
}

static int cudnn_supports(int cc, int hd, char *why, size_t len);

static int cu_reserve(void *ctx, const struct backend_limits *lim) {
    struct cuda_ctx *c = CX;
    if (c->reserved) pz_flush(c);
    if (c->reserved) {
        lk_blas_free(c->blas);
        lcudnn_attn_free(c->cda);
        c->cda = NULL;
        lcuda_arena_free(&c->ws);
        cudaFreeHost(c->h_tok);
        cudaFreeHost(c->h_buf);
        c->blas = NULL;
    }
    c->lim = *lim;
    int N = lim->B * lim->T;
    int C = lim->C, Vp = lim->Vp > 0 ? lim->Vp : 8;
    int qkv = (lim->NH + 2 * lim->NKV) * lim->HD;
    int maxoc = C;
    if (qkv > maxoc) maxoc = qkv;
    if (2 * lim->F > maxoc) maxoc = 2 * lim->F;
    if (Vp > maxoc) maxoc = Vp;
    size_t cap = c->xent_mib > 0    ? (size_t)c->xent_mib << 20
                 : lim->frozen_head ? (size_t)FROZEN_HEAD_MIB << 20
                                    : LOGITS_CAP;
    if (cap > LOGITS_CAP) cap = LOGITS_CAP;
    size_t rows = cap / ((size_t)Vp * 2);
    c->cls_chunk = rows >= (size_t)N ? N : rows >= 64 ? (int)(rows / 64 * 64) : (int)rows;
    if (c->cls_chunk < 1) c->cls_chunk = 1;
    size_t b_attn = lk_attn_scratch_bytes(lim->B, lim->T, lim->NH, lim->NKV, lim->HD);
    size_t b_norm = lk_norm_scratch_bytes(N, C);
    size_t b_bias = lk_bias_scratch_bytes(N, maxoc);
    size_t b_sum = lk_sum_scratch_bytes(0);
    size_t b_logits = (size_t)c->cls_chunk * Vp * 2;
    size_t b_tok = (size_t)(3 * N + 1) * sizeof(int32_t);
    size_t rhalf = lim->HD > 1 ? (size_t)lim->HD / 2 : 1;
    size_t b_rope = rhalf * 12 + (size_t)lim->T * rhalf * 8 + 768;
    size_t total =
        b_attn + b_norm + b_bias + b_sum + b_logits + b_tok + b_rope + (64u << 20) + (8 << 10);
    lcuda_arena_init(&c->ws, "workspace", total);
    c->blas = lk_blas_new((lcuda_stream)c->s, &c->ws, c->blas_tune, c->blas_cache);
    c->attn_scratch = lcuda_arena_alloc(&c->ws, b_attn);
    c->norm_scratch = lcuda_arena_alloc(&c->ws, b_norm);
    c->bias_scratch = lcuda_arena_alloc(&c->ws, b_bias);
    c->sum_scratch = lcuda_arena_alloc(&c->ws, b_sum);
    c->logits = lcuda_arena_alloc(&c->ws, b_logits);
    c->d_order = lcuda_arena_alloc(&c->ws, b_tok);
    c->d_starts = c->d_order + N;
    c->d_uniq = c->d_starts + N + 1;
    c->d_rope_inv = lcuda_arena_alloc(&c->ws, rhalf * 8);
    c->d_rope_inv32 = lcuda_arena_alloc(&c->ws, rhalf * 4);
    c->d_rope_tab = lcuda_arena_alloc(&c->ws, (size_t)lim->T * rhalf * 8);
    c->rope_valid = 0;
    if (cudaMallocHost((void **)&c->h_tok, (size_t)N * sizeof(int32_t)) != cudaSuccess ||
        cudaMallocHost((void **)&c->h_buf, b_tok) != cudaSuccess) {
        log_error("cuda backend: cannot pin %zu bytes of host memory", b_tok);
        return -1;
    }
    if (!c->tok_ev) CUDA_CHECK(cudaEventCreateWithFlags(&c->tok_ev, cudaEventDisableTiming));
    if (!c->buf_ev) CUDA_CHECK(cudaEventCreateWithFlags(&c->buf_ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(c->buf_ev, c->s));
    c->tok_valid = 0;
    c->reserved = 1;
    int gqa = lim->NKV != lim->NH, want = c->cudnn_mode && !(gqa && c->cudnn_gqa_off);
    snprintf(c->cda_why, sizeof c->cda_why, "%s",
             !c->cudnn_mode ? "LOOM_ATTN_CUDNN=0"
                            : "grouped-query attention (NKV < NH) with LOOM_ATTN_CUDNN_GQA=0");
    if (want && !cudnn_supports(c->cc, lim->HD, c->cda_why, sizeof c->cda_why))
        log_info("cuda backend: attention through k_attn.cu (cuDNN: %s)", c->cda_why);
    else if (want) {
        char *why = c->cda_why;
        c->cda = lcudnn_attn_new(c->s, lim->B, lim->T, lim->NH, lim->NKV, lim->HD, qkv,
                                 lim->NH * lim->HD, c->cudnn_mode == 1, why, sizeof c->cda_why);
        if (c->cda) {
            int ef, eb;
            lcudnn_attn_engines(c->cda, &ef, &eb);
            log_info("cuda backend: attention through cuDNN %ld (engines %d/%d, %s, %zu MiB "
                     "workspace)",
                     lcudnn_version(), ef, eb,
                     c->cudnn_mode == 1 ? "deterministic" : "nondeterministic",
                     lcudnn_attn_bytes(c->cda) >> 20);
        } else {
            log_info("cuda backend: attention through k_attn.cu (cuDNN: %s)", why);
        }
    }
    return 0;
}

static void *cu_alloc(void *ctx, size_t bytes) {
    struct cuda_ctx *c = CX;
    void *p = NULL;
    size_t want = bytes ? bytes : 64;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        log_error("cuda backend: out of device memory: asked %zu bytes (%.2f GiB), %zu free "
                  "(%.2f GiB) of %zu",
                  want, want / 1073741824.0, fr, fr / 1073741824.0, tot);
        return NULL;
    }
    int i = 0;
    while (i < MAX_ALLOCS && c->allocs[i].p)
        i++;
    if (i < MAX_ALLOCS) c->allocs[i] = (struct cuda_alloc){p, want};
    c->alloc_bytes += want;
    if (c->alloc_bytes > c->alloc_peak) c->alloc_peak = c->alloc_bytes;
    return p;
}

static void cu_free(void *ctx, void *p) {
    struct cuda_ctx *c = CX;
    if (!p) return;
    pz_flush(c);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (c->allocs[i].p == p) {
            c->alloc_bytes -= c->allocs[i].bytes;
            c->allocs[i].p = NULL;
            break;
        }
    }
    cudaStreamSynchronize(c->s);
    cudaFree(p);
}

/* A write to [p, p+bytes) that overlaps the token ids copied at the last
 * embedding_fwd makes that copy stale. */
static void tok_touch(struct cuda_ctx *c, const void *p, size_t bytes) {
    const char *a = p, *t = (const char *)c->tok_ptr;
    if (c->tok_valid && a < t + (size_t)c->tok_n * 4 && t < a + bytes) c->tok_valid = 0;
}

static void cu_zero(void *ctx, void *p, size_t bytes) {
    struct cuda_ctx *c = CX;
    if (!bytes) return;
    tok_touch(c, p, bytes);
    /* held work was called earlier: issue it before this range is recorded,
     * so recorded zeros always come after everything already issued */
    mm_flush(c);
    aw_flush(c);
    if (c->npending == MAX_PENDING) pz_flush(c);
    c->pending[c->npending++] = (struct cuda_range){p, bytes};
}

static void cu_upload(void *ctx, void *dst, const void *src, size_t bytes) {
    tok_touch(CX, dst, bytes);
    FLUSH();
    /* Synchronous w.r.t. the host buffer: pageable sources may be reused on return. */
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, CX->s));
    CUDA_CHECK(cudaStreamSynchronize(CX->s));
}

static void cu_download(void *ctx, void *dst, const void *src, size_t bytes) {
    FLUSH();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CX->s));
    CUDA_CHECK(cudaStreamSynchronize(CX->s));
}

static void cu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    tok_touch(CX, dst, bytes);
    FLUSH();
    if (dst == src || !bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CX->s));
}

static void cu_from_f32(void *ctx, void *dst, const float *src, size_t n) {
    FLUSH();
    lk_f32_to_bf16(dst, src, n, ST);
}

static void cu_to_f32(void *ctx, float *dst, const void *src, size_t n) {
    FLUSH();
    lk_bf16_to_f32(dst, src, n, ST);
}

static void cu_sync(void *ctx) {
    FLUSH();
    CUDA_CHECK(cudaStreamSynchronize(CX->s));
}

static void cu_destroy(void *ctx) {
    struct cuda_ctx *c = CX;
    if (!c) return;
    if (c->blas) pz_flush(c);
    cudaStreamSynchronize(c->s);
    lk_blas_free(c->blas);
    free(c->blas_cache);
    lcudnn_attn_free(c->cda);
    free(c->rope_inv);
    lcuda_arena_free(&c->ws);
    if (c->h_tok) cudaFreeHost(c->h_tok);
    if (c->h_buf) cudaFreeHost(c->h_buf);
    if (c->tok_ev) cudaEventDestroy(c->tok_ev);
    free(c->doc_h);
    if (c->h_doc) cudaFreeHost(c->h_doc);
    if (c->h_pos) cudaFreeHost(c->h_pos);
    cudaFree(c->d_doc);
    cudaFree(c->d_pos);
    if (c->doc_ev) cudaEventDestroy(c->doc_ev);
    if (c->pos_ev) cudaEventDestroy(c->pos_ev);
    if (c->buf_ev) cudaEventDestroy(c->buf_ev);
    if (c->cs[0]) {
        for (int i = 0; i < 2; i++) {
            cudaStreamSynchronize(c->cs[i]);
            cudaStreamDestroy(c->cs[i]);
            cudaEventDestroy(c->ev_fence[i]);
        }
        cudaEventDestroy(c->ev_order);
        for (int i = 0; i < COPY_RING; i++)
            cudaEventDestroy(c->ring[i]);
    }
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (c->allocs[i].p) cudaFree(c->allocs[i].p);
    cudaFree(c->dec_rope_inv);
    cudaFree(c->dec_scratch);
    free(c->f8.w); /* its buffers are in allocs */
    cudaStreamDestroy(c->s);
    free(c);
}

/* 1 when the rows of a call (N of them) are those set_doc_starts described */
static int doc_rows(const struct cuda_ctx *c, int N) {
    return c->doc_on && N == c->doc_n;
}

/* backend.h set_doc_starts: the starts copied to the device (stream-ordered, through a pinned
 * buffer) and kept on the host; the buffers grow on first use (none unless packing
 * "document"). */
static void cu_set_doc_starts(void *ctx, const int32_t *starts, int N) {
    struct cuda_ctx *c = CX;
    FLUSH();
    c->doc_on = 0;
    if (!starts || N <= 0) return;
    if (N > c->doc_cap) {
        CUDA_CHECK(cudaStreamSynchronize(c->s)); /* nothing still reads the old buffers */
        if (c->doc_ev) CUDA_CHECK(cudaEventSynchronize(c->doc_ev));
        free(c->doc_h);
        cudaFreeHost(c->h_doc);
        cudaFreeHost(c->h_pos);
        cudaFree(c->d_doc);
        cudaFree(c->d_pos);
        c->doc_h = malloc((size_t)N * sizeof(int32_t));
        CUDA_CHECK(cudaMallocHost((void **)&c->h_doc, (size_t)N * sizeof(int32_t)));
        CUDA_CHECK(cudaMallocHost((void **)&c->h_pos, (size_t)(4 * N + 1) * sizeof(int32_t)));
        CUDA_CHECK(cudaMalloc((void **)&c->d_doc, (size_t)N * sizeof(int32_t)));
        CUDA_CHECK(cudaMalloc((void **)&c->d_pos, (size_t)(3 * N + 1) * sizeof(int32_t)));
        if (!c->doc_h) {
            fprintf(stderr, "cuda backend: out of host memory for %d document starts\n", N);
            exit(1);
        }
        c->doc_cap = N;
        if (!c->doc_ev) CUDA_CHECK(cudaEventCreateWithFlags(&c->doc_ev, cudaEventDisableTiming));
        if (!c->pos_ev) CUDA_CHECK(cudaEventCreateWithFlags(&c->pos_ev, cudaEventDisableTiming));
    } else {
        CUDA_CHECK(cudaEventSynchronize(c->doc_ev)); /* the last upload has read h_doc */
    }
    memcpy(c->doc_h, starts, (size_t)N * sizeof(int32_t));
    memcpy(c->h_doc, starts, (size_t)N * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(c->d_doc, c->h_doc, (size_t)N * sizeof(int32_t),
                               cudaMemcpyHostToDevice, c->s));
    CUDA_CHECK(cudaEventRecord(c->doc_ev, c->s));
    c->doc_n = N;
    c->doc_on = 1;
}

static void cu_embedding_fwd(void *ctx, void *out, const int32_t *tokens, const void *wte,
                             const void *wpe, int B, int T, int C) {
    struct cuda_ctx *c = CX;
    FLUSH();
    if (wpe && doc_rows(c, B * T))
        lk_embed_fwd_doc(out, tokens, wte, wpe, c->d_doc, B * T, T, C, ST);
    else
        lk_embed_fwd(out, tokens, wte, wpe, B * T, T, C, ST);
    if (c->reserved && B * T <= c->lim.B * c->lim.T) {
        /* no host reader is left: embedding_bwd is done with h_tok when it
         * returns */
        CUDA_CHECK(cudaMemcpyAsync(c->h_tok, tokens, (size_t)B * T * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, c->s));
        CUDA_CHECK(cudaEventRecord(c->tok_ev, c->s));
        c->tok_ptr = tokens;
        c->tok_n = B * T;
        c->tok_valid = 1;
    }
}

/* The token buckets of the N = B * T tokens (device pointer, as given to
 * embedding_fwd) on the device: order, starts, uniq (uniq padded with -1 to
 * N entries); returns the number of distinct tokens. */
static int embed_buckets(struct cuda_ctx *c, const int32_t *tokens, int N) {
    cu_require(c, "embedding_bwd");
    if (N > c->lim.B * c->lim.T) {
        fprintf(stderr, "cuda backend: embedding_bwd N=%d over reserved %d\n", N,
                c->lim.B * c->lim.T);
        exit(1);
    }
    if (c->tok_valid && c->tok_ptr == tokens && c->tok_n == N) {
        /* copied during the forward: normally long done */
        CUDA_CHECK(cudaEventSynchronize(c->tok_ev));
    } else {
        CUDA_CHECK(cudaMemcpyAsync(c->h_tok, tokens, (size_t)N * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, c->s));
        CUDA_CHECK(cudaStreamSynchronize(c->s));
    }
    c->tok_valid = 0;                            /* h_tok is reused by the next forward */
    CUDA_CHECK(cudaEventSynchronize(c->buf_ev)); /* last bucket upload has read h_buf */
    int32_t *order = c->h_buf, *starts = order + N, *uniq = starts + N + 1;
    int nu = lk_embed_buckets(c->h_tok, N, order, starts, uniq);
    for (int u = nu; u < N; u++)
        uniq[u] = -1;
    CUDA_CHECK(cudaMemcpyAsync(c->d_order, c->h_buf, (size_t)(3 * N + 1) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, c->s));
    CUDA_CHECK(cudaEventRecord(c->buf_ev, c->s));
    return nu;
}

static void cu_embedding_bwd(void *ctx, void *dwte, void *dwpe, const void *dout,
                             const int32_t *tokens, int B, int T, int C) {
    FLUSH();
    struct cuda_ctx *c = CX;
    int N = B * T;
    if (dwte) {
        int nu = embed_buckets(c, tokens, N);
        lk_embed_bwd(dwte, NULL, dout, c->d_order, c->d_starts, c->d_uniq, nu, N, T, C, ST);
    }
    if (dwpe && doc_rows(c, N)) {
        /* rows by position within their document, summed in increasing row order (the
         * token gradient's buckets, keyed by position) */
        CUDA_CHECK(cudaEventSynchronize(c->pos_ev)); /* the last upload has read h_pos */
        int32_t *pos = c->h_pos + 3 * N + 1, *order = c->h_pos, *st = order + N, *uq = st + N + 1;
        for (int r = 0; r < N; r++)
            pos[r] = r % T - c->doc_h[r];
        int nu = lk_embed_buckets(pos, N, order, st, uq);
        CUDA_CHECK(cudaMemcpyAsync(c->d_pos, c->h_pos, (size_t)(3 * N + 1) * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, c->s));
        CUDA_CHECK(cudaEventRecord(c->pos_ev, c->s));
        lk_embed_bwd(dwpe, NULL, dout, c->d_pos, c->d_pos + N, c->d_pos + 2 * N + 1, nu, N, T, C,
                     ST);
    } else if (dwpe) {
        lk_embed_bwd(NULL, dwpe, dout, NULL, NULL, NULL, 0, N, T, C, ST);
    }
}

static void cu_layernorm_fwd(void *ctx, void *out, float *mean, float *rstd, const void *inp,
                             const void *w, const void *b, int N, int C, float eps) {
    FLUSH();
    lk_norm_fwd(out, mean, rstd, inp, w, b, N, C, eps, 0, ST);
}

static void cu_layernorm_bwd(void *ctx, void *dinp, void *dw, void *db, const void *dout,
                             const void *inp, const void *w, const float *mean, const float *rstd,
                             int N, int C) {
    FLUSH();
    cu_require(CX, "layernorm_bwd");
    lk_norm_bwd(dinp, dw, db, CX->norm_scratch, dout, inp, w, mean, rstd, N, C, 0, ST);
}

static void cu_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *inp, const void *w, int N,
                           int C, float eps) {
    FLUSH();
    lk_norm_fwd(out, NULL, rstd, inp, w, NULL, N, C, eps, 1, ST);
}

static void cu_rmsnorm_bwd(void *ctx, void *dinp, void *dw, const void *dout, const void *inp,
                           const void *w, const float *rstd, int N, int C) {
    FLUSH();
    cu_require(CX, "rmsnorm_bwd");
    lk_norm_bwd(dinp, dw, NULL, CX->norm_scratch, dout, inp, w, NULL, rstd, N, C, 1, ST);
}

/* ---- FP8 linear layers (backend.h fp8_freeze) ---- */

/* The fp8 weight at address W (a bf16 weight, or a handle), any shape; NULL: none */
static struct fp8_weight *fp8_entry(struct cuda_ctx *c, const void *W) {
    for (int i = 0; i < c->f8.n; i++)
        if (c->f8.w[i].W == W) return &c->f8.w[i];
    return NULL;
}

/* ... that the E4M3 path takes for this shape */
static struct fp8_weight *fp8_find(struct cuda_ctx *c, const void *W, int OC, int IC) {
    struct fp8_weight *f = fp8_entry(c, W);
    return f && f->OC == OC && f->IC == IC && !f->bad ? f : NULL;
}

/* *buf at least `want` bytes (made at freeze time, before any step) */
static int fp8_buf(struct cuda_ctx *c, uint8_t **buf, size_t *cap, size_t want) {
    if (want <= *cap) return 0;
    uint8_t *q = cu_alloc(c, want);
    if (!q) return -1;
    cu_free(c, *buf);
    *buf = q;
    *cap = want;
    return 0;
}

/* Room for one more weight [OC, IC]: the array, the scales' slots and the
 * per-call E4M3 buffer q (the widest operand of the reserved micro-batch). */
static int fp8_room(struct cuda_ctx *c, int OC, int IC) {
    if (c->f8.n == c->f8.cap) {
        int cap = c->f8.cap ? 2 * c->f8.cap : 64;
        struct fp8_weight *nwv = realloc(c->f8.w, (size_t)cap * sizeof *nwv);
        if (!nwv) return -1;
        c->f8.w = nwv;
        c->f8.cap = cap;
    }
    if (!c->f8.xs && !(c->f8.xs = cu_alloc(c, 3 * 8 * sizeof(float)))) return -1;
    size_t want = (size_t)c->lim.B * c->lim.T * (size_t)(OC > IC ? OC : IC);
    return fp8_buf(c, &c->f8.q, &c->f8.qcap, want);
}

/* fp8_freeze with a handle: W8 alone in a buffer of the backend's, which is
 * also the weight's address from now on (*handle) */
static int fp8_freeze_own(struct cuda_ctx *c, const void *W, int OC, int IC, void **handle) {
    size_t nw = (size_t)OC * IC;
    struct fp8_weight *f = NULL;
    if (*handle) {
        f = fp8_entry(c, *handle);
        if (!f || !f->own || f->OC != OC || f->IC != IC) {
            log_error("fp8: no weight [%d, %d] held by handle %p", OC, IC, *handle);
            return -1;
        }
    } else {
        if (fp8_room(c, OC, IC) != 0) return -1;
        /* wq: W8T, transposed at each input-gradient GEMM */
        if (fp8_buf(c, &c->f8.wq, &c->f8.wqcap, nw) != 0) return -1;
        uint8_t *buf = cu_alloc(c, nw + 64);
        if (!buf) return -1;
        f = &c->f8.w[c->f8.n++];
        *f = (struct fp8_weight){buf, OC, IC, buf, NULL, (float *)(buf + nw), 0, 1};
        c->f8.bytes += nw;
        c->f8.n_own++;
        *handle = buf;
    }
    lk_fp8_amax(f->sc, W, nw, (lcuda_stream)c->s);
    lk_fp8_quant(f->w8, f->sc + 4, f->sc, W, nw, (lcuda_stream)c->s);
    CUDA_CHECK(cudaStreamSynchronize(c->s)); /* the caller may free W now */
    return 0;
}

/* The compute-dtype weight a bf16 GEMM on W reads: W, or for a weight held
 * by handle its W8 dequantized into the f8.deq workspace (the values its
 * E4M3 GEMMs use). */
static const void *fp8_plain(struct cuda_ctx *c, const void *W) {
    struct fp8_weight *f = c->f8.n_own ? fp8_entry(c, W) : NULL;
    if (!f || !f->own) return W;
    size_t nw = (size_t)f->OC * f->IC;
    if (nw > c->f8.deqcap) {
        cu_free(c, c->f8.deq);
        c->f8.deq = cu_alloc(c, nw * 2);
        if (!c->f8.deq)
            die("fp8: out of memory for the bf16 form of a [%d, %d] weight", f->OC, f->IC);
        c->f8.deqcap = nw;
    }
    lk_fp8_dequant(c->f8.deq, f->w8, f->sc + 4, nw, (lcuda_stream)c->s);
    c->f8.dequant++;
    return c->f8.deq;
}

static int cu_fp8_freeze(void *ctx, const void *W, int OC, int IC, int wgrad, void **handle) {
    struct cuda_ctx *c = CX;
    cu_require(c, "fp8_freeze");
    if (c->cc <
        GPU_FP8_MIN_CC) { /* the scheduler places fp8 jobs elsewhere; a direct run lands here */
        log_error("fp8: this GPU (compute capability %d.%d) has no FP8 tensor cores; "
                  "train.precision fp8 needs %d.%d or newer (Ada, Hopper, Blackwell)",
                  c->cc / 10, c->cc % 10, GPU_FP8_MIN_CC / 10, GPU_FP8_MIN_CC % 10);
        return -1;
    }
    if (c->f8.off || OC <= 0 || IC <= 0 || OC % 16 || IC % 16) return 1;
    FLUSH();
    if (handle) {
        if (wgrad) {
            log_error("fp8: a trained weight cannot be held by handle");
            return -1;
        }
        return fp8_freeze_own(c, W, OC, IC, handle);
    }
    struct fp8_weight *f = fp8_entry(c, W);
    if (f && (f->OC != OC || f->IC != IC)) return 1;
    size_t nw = (size_t)OC * IC;
    if (!f) {
        if (fp8_room(c, OC, IC) != 0) return -1;
        size_t want = (size_t)c->lim.B * c->lim.T * (size_t)(OC > IC ? OC : IC);
        if (wgrad) { /* a trained weight: nothing kept, its E4M3 form made at each use */
            if (fp8_buf(c, &c->f8.qt, &c->f8.qtcap, want) != 0 ||
                fp8_buf(c, &c->f8.xt, &c->f8.xtcap, want) != 0 ||
                fp8_buf(c, &c->f8.wq, &c->f8.wqcap, nw) != 0)
                return -1;
            c->f8.w[c->f8.n++] = (struct fp8_weight){W, OC, IC, NULL, NULL, NULL, 0, 0};
            return 0;
        }
        uint8_t *buf = cu_alloc(c, 2 * nw + 64);
        if (!buf) return -1;
        f = &c->f8.w[c->f8.n++];
        *f = (struct fp8_weight){W, OC, IC, buf, buf + nw, (float *)(buf + 2 * nw), 0, 0};
        c->f8.bytes += 2 * nw;
    }
    if (!f->w8) return 0; /* trained: quantized at each use */
    lk_fp8_amax(f->sc, W, nw, ST);
    lk_fp8_quant(f->w8, f->sc + 4, f->sc, W, nw, ST);
    lk_fp8_quant_t(f->w8t, NULL, f->sc, W, OC, IC, ST);
    return 0;
}

/* x [N][K] (bf16) into the E4M3 buffer with its own scale (F8_SCALE(c, 0)); NULL
 * when it does not fit. */
static const uint8_t *fp8_quant_act(struct cuda_ctx *c, const void *x, int N, int K) {
    size_t n = (size_t)N * K;
    if (n > c->f8.qcap) return NULL;
    lk_fp8_amax(F8_AMAX(c, 0), x, n, (lcuda_stream)c->s);
    lk_fp8_quant(c->f8.q, F8_SCALE(c, 0), F8_AMAX(c, 0), x, n, (lcuda_stream)c->s);
    return c->f8.q;
}

/* out [N][OC] = (acc) + inp . W^T (+ bias) in E4M3; 0, or -1: not taken
 * (the caller runs the bf16 GEMM). Held work must be issued already. */
static int fp8_fwd(struct cuda_ctx *c, void *out, const void *inp, const void *W, const void *bias,
                   const void *acc, int N, int IC, int OC) {
    struct fp8_weight *f = c->f8.n ? fp8_find(c, W, OC, IC) : NULL;
    if (!f) return -1;
    if (!lk_fp8_shape_ok(OC, N, IC, out, acc, bias) || (size_t)N * IC > c->f8.qcap) {
        c->f8.fallback++;
        return -1;
    }
    const uint8_t *w8 = f->w8;
    const float *wsc = f->sc ? f->sc + 4 : NULL;
    if (!w8) { /* a trained weight: W8 from its current values */
        size_t nw = (size_t)OC * IC;
        lk_fp8_amax(F8_AMAX(c, 2), W, nw, (lcuda_stream)c->s);
        lk_fp8_quant(c->f8.wq, F8_SCALE(c, 2), F8_AMAX(c, 2), W, nw, (lcuda_stream)c->s);
        w8 = c->f8.wq, wsc = F8_SCALE(c, 2);
    }
    const uint8_t *q = fp8_quant_act(c, inp, N, IC);
    if (lk_linear_fp8(c->blas, out, acc, bias, w8, wsc, q, F8_SCALE(c, 0), OC, N, IC, c->f8.fast)) {
        f->bad = 1;
        c->f8.fallback++;
        return -1;
    }
    c->f8.fwd++;
    return 0;
}

/* matmul_bwd of an fp8 weight: dinp (+)= dout . W through W8T and, when dW
 * is given, dW += dout^T . inp from the transposed E4M3 dY (one amax for
 * both copies) and X; each GEMM the E4M3 path cannot take runs in bf16, as
 * does dbias always. Returns 0 (everything issued), or -1 before anything was
 * issued (the caller takes the whole bf16 path). */
static int fp8_bwd(struct cuda_ctx *c, struct fp8_weight *f, void *dinp, void *dW, void *dbias,
                   const void *dout, const void *inp, int N, int IC, int OC, int accumulate) {
    lcuda_stream st = (lcuda_stream)c->s;
    const void *C = accumulate ? dinp : NULL;
    size_t ny = (size_t)N * OC, nx = (size_t)N * IC;
    int d_ok = dinp && lk_fp8_shape_ok(IC, N, OC, dinp, C, NULL) && ny <= c->f8.qcap;
    int w_ok =
        dW && lk_fp8_shape_ok(IC, OC, N, dW, dW, NULL) && ny <= c->f8.qtcap && nx <= c->f8.xtcap;
    if (!d_ok && !w_ok) {
        c->f8.fallback++;
        return -1;
    }
    lk_fp8_amax(F8_AMAX(c, 0), dout, ny, st);
    if (d_ok) {
        const uint8_t *w8t = f->w8t;
        const float *wsc = f->sc ? f->sc + 4 : NULL;
        if (f->own) { /* held by handle: W8T from W8 */
            lk_fp8_transpose(c->f8.wq, f->w8, OC, IC, st);
            w8t = c->f8.wq;
        } else if (!w8t) { /* a trained weight: W8T from its current values */
            lk_fp8_amax(F8_AMAX(c, 2), f->W, (size_t)OC * IC, st);
            lk_fp8_quant_t(c->f8.wq, F8_SCALE(c, 2), F8_AMAX(c, 2), f->W, OC, IC, st);
            w8t = c->f8.wq, wsc = F8_SCALE(c, 2);
        }
        lk_fp8_quant(c->f8.q, F8_SCALE(c, 0), F8_AMAX(c, 0), dout, ny, st);
        if (lk_linear_fp8(c->blas, dinp, C, NULL, w8t, wsc, c->f8.q, F8_SCALE(c, 0), IC, N, OC,
                          c->f8.fast) == 0)
            c->f8.bwd++;
        else
            d_ok = 0, f->bad = 1;
    }
    if (dinp && !d_ok) {
        c->f8.fallback++;
        lk_linear_bwd_data(c->blas, dinp, dout, fp8_plain(c, f->W), NULL, N, IC, OC, accumulate);
    }
    if (w_ok) {
        lk_fp8_quant_t(c->f8.qt, F8_SCALE(c, 0), F8_AMAX(c, 0), dout, N, OC, st); /* dY^T [OC][N] */
        lk_fp8_amax(F8_AMAX(c, 1), inp, nx, st);
        lk_fp8_quant_t(c->f8.xt, F8_SCALE(c, 1), F8_AMAX(c, 1), inp, N, IC, st); /* X^T [IC][N] */
        if (lk_linear_fp8(c->blas, dW, dW, NULL, c->f8.xt, F8_SCALE(c, 1), c->f8.qt, F8_SCALE(c, 0),
                          IC, OC, N, c->f8.fast) == 0)
            c->f8.wgrad++;
        else
            w_ok = 0, f->bad = 1;
    }
    if (dW && !w_ok) c->f8.fallback++;
    if ((dW && !w_ok) || dbias)
        lk_linear_bwd_weight(c->blas, w_ok ? NULL : dW, dbias, c->bias_scratch, dout, inp, N, IC,
                             OC);
    return 0;
}

static void cu_matmul_fwd(void *ctx, void *out, const void *inp, const void *W, const void *bias,
                          int N, int IC, int OC) {
    struct cuda_ctx *c = CX;
    FLUSH();
    cu_require(c, "matmul_fwd");
    /* an fp8 weight runs at once (no GELU epilogue on the E4M3 GEMM) */
    if (c->f8.n && fp8_fwd(c, out, inp, W, bias, NULL, N, IC, OC) == 0) return;
    const void *Wp = fp8_plain(c, W);
    if (Wp != W) { /* a handle weight in bf16: at once, while the workspace holds it */
        lk_linear_fwd(c->blas, out, NULL, inp, Wp, bias, NULL, N, IC, OC, 0);
        return;
    }
    c->mm.on = 1;
    c->mm.out = out, c->mm.inp = inp, c->mm.W = W, c->mm.bias = bias;
    c->mm.N = N, c->mm.IC = IC, c->mm.OC = OC;
}

static void cu_matmul_bwd(void *ctx, void *dinp, void *dW, void *dbias, const void *dout,
                          const void *inp, const void *W, int N, int IC, int OC) {
    struct cuda_ctx *c = CX;
    cu_require(c, "matmul_bwd");
    int fresh = dinp && pz_take(c, dinp, (size_t)N * IC * 2);
    if (!dinp) FLUSH();
    /* an fp8 weight: its GEMMs in E4M3 (never held for DGELU) */
    struct fp8_weight *f8 = c->f8.n && (dinp || dW) ? fp8_find(c, W, OC, IC) : NULL;
    if (f8 && fp8_bwd(c, f8, dinp, dW, dbias, dout, inp, N, IC, OC, dinp && !fresh) == 0) return;
    const void *Wp = fp8_plain(c, W);
    /* an overwriting input-gradient GEMM waits one call for a gelu_bwd of
     * its output (DGELU needs IC % 8 == 0 for the bf16 auxiliary rows); not
     * a handle weight's, whose bf16 form is only in the workspace now */
    int hold = dinp && fresh && IC % 8 == 0 && !c->fuse_off && Wp == W;
    W = Wp;
    if (dinp && !hold) lk_linear_bwd_data(c->blas, dinp, dout, W, NULL, N, IC, OC, !fresh);
    if (dW || dbias)
        lk_linear_bwd_weight(c->blas, dW, dbias, c->bias_scratch, dout, inp, N, IC, OC);
    if (hold) {
        c->mb.on = 1;
        c->mb.dinp = dinp;
        c->mb.dout = dout;
        c->mb.W = W;
        c->mb.N = N;
        c->mb.IC = IC;
        c->mb.OC = OC;
    }
}

static void cu_gelu_fwd(void *ctx, void *out, const void *inp, size_t n) {
    struct cuda_ctx *c = CX;
    if (c->mm.on && c->mm.out == inp && n == (size_t)c->mm.N * c->mm.OC && out != inp &&
        c->mm.OC % 8 == 0) {
        /* matmul + GELU in one cuBLASLt call: inp (the matmul's output) is
         * written as the epilogue's pre-activation, out as gelu(inp) */
        c->mm.on = 0;
        pz_flush(c);
        lk_linear_fwd(c->blas, out, (void *)inp, c->mm.inp, c->mm.W, c->mm.bias, NULL, c->mm.N,
                      c->mm.IC, c->mm.OC, 1);
        return;
    }
    FLUSH();
    lk_gelu_fwd(out, inp, n, ST);
}

static void cu_gelu_bwd(void *ctx, void *dinp, const void *inp, const void *dout, size_t n) {
    struct cuda_ctx *c = CX;
    if (c->mb.on && c->mb.dinp == dout && n == (size_t)c->mb.N * c->mb.IC && dinp != dout &&
        dinp != inp) {
        /* dout is the held GEMM's output. When dinp is the only range zeroed
         * since (so it is overwritten, and no memset can move ahead of what
         * the GEMM reads), compute dinp = (dout_mb . W) * gelu'(inp) in the
         * GEMM's epilogue; the held output itself is left unwritten (see the
         * top comment). Otherwise issue the GEMM as it was and go on. */
        if (c->npending == 1 && c->pending[0].p == dinp && c->pending[0].bytes == n * 2) {
            c->mb.on = 0;
            c->npending = 0;
            lk_linear_bwd_data(c->blas, dinp, c->mb.dout, c->mb.W, inp, c->mb.N, c->mb.IC, c->mb.OC,
                               0);
            return;
        }
        mb_flush(c);
    }
    int fresh = pz_take(c, dinp, n * 2);
    lk_gelu_bwd(dinp, inp, dout, n, !fresh, ST);
}

static void cu_swiglu_fwd(void *ctx, void *out, const void *inp, int N, int F) {
    FLUSH();
    const lbf16 *in = inp;
    lk_swiglu_fwd(out, in, in + F, N, F, 2 * F, !CX->elem_scalar, ST);
}

static void cu_swiglu_bwd(void *ctx, void *dinp, const void *inp, const void *dout, int N, int F) {
    const lbf16 *in = inp;
    lbf16 *d = dinp;
    int fresh = pz_take(CX, dinp, (size_t)N * 2 * F * 2);
    lk_swiglu_bwd(d, d + F, dout, in, in + F, N, F, 2 * F, !fresh, !CX->elem_scalar, ST);
}

static int cu_rope_set_freqs(void *ctx, const double *inv, int half) {
    struct cuda_ctx *c = CX;
    free(c->rope_inv);
    c->rope_inv = NULL;
    c->rope_half = 0;
    c->rope_valid = 0;
    FLUSH();
    CUDA_CHECK(cudaStreamSynchronize(c->s)); /* no kernel still reads the old decode table */
    cudaFree(c->dec_rope_inv);
    c->dec_rope_inv = NULL;
    c->dec_rope_half = 0;
    if (!inv) return 0;
    c->rope_inv = malloc((size_t)(half > 0 ? half : 1) * sizeof *c->rope_inv);
    if (!c->rope_inv) return -1;
    memcpy(c->rope_inv, inv, (size_t)half * sizeof *inv);
    c->rope_half = half;
    /* rope_at (generation) reads an fp32 copy at any position, outside the
     * reserved shape's tables */
    float h[512];
    if (half < 1 || half > 512) return 0;
    for (int i = 0; i < half; i++)
        h[i] = (float)inv[i];
    if (cudaMalloc((void **)&c->dec_rope_inv, (size_t)half * sizeof *h) != cudaSuccess) {
        cudaGetLastError();
        c->dec_rope_inv = NULL;
        log_error("cuda backend: out of device memory for %d RoPE frequencies", half);
        return -1;
    }
    CUDA_CHECK(cudaMemcpy(c->dec_rope_inv, h, (size_t)half * sizeof *h, cudaMemcpyHostToDevice));
    c->dec_rope_half = half;
    return 0;
}

/* Brings the device tables to (T, HD, theta): 1 when they hold it, 0 when
 * the shape is past the reserved one (then only the unscaled scalar kernel
 * can run it). The inverse frequencies are computed here in fp64 and copied
 * from a host buffer that stays alive (the copy is stream-ordered). */
static int rope_tables(struct cuda_ctx *c, int T, int HD, float theta) {
    int half = HD / 2;
    if (!c->reserved || HD != c->lim.HD || T > c->lim.T || half < 1) return 0;
    if (c->rope_valid && c->rope_T == T && c->rope_HD == HD && c->rope_theta == theta) return 1;
    double *h64 = c->rope_h64;
    float *h32 = c->rope_h32;
    if (half > 512) return 0;
    int scaled = c->rope_inv && c->rope_half == half;
    for (int i = 0; i < half; i++) {
        h64[i] = scaled ? c->rope_inv[i] : pow((double)theta, -2.0 * i / HD);
        h32[i] = (float)h64[i];
    }
    CUDA_CHECK(cudaMemcpyAsync(c->d_rope_inv, h64, (size_t)half * 8, cudaMemcpyHostToDevice, c->s));
    CUDA_CHECK(
        cudaMemcpyAsync(c->d_rope_inv32, h32, (size_t)half * 4, cudaMemcpyHostToDevice, c->s));
    lk_rope_table(c->d_rope_tab, c->d_rope_inv, T, half, (lcuda_stream)c->s);
    c->rope_T = T, c->rope_HD = HD, c->rope_theta = theta, c->rope_valid = 1;
    return 1;
}

/* the table kernel (16-byte vectors) where the elem-vec row, the shape and
 * alignment allow it; else one pair per thread, with the scaled fp32
 * frequencies when rope_set_freqs set them */
static void rope_apply(struct cuda_ctx *c, void *x, int N, int T, int stride, int n_heads, int HD,
                       float theta, int inverse) {
    int tabs = rope_tables(c, T, HD, theta);
    if (doc_rows(c, N)) { /* positions within documents (rows of the reserved shape) */
        lk_rope_doc(x, tabs ? c->d_rope_tab : NULL, c->rope_inv ? c->dec_rope_inv : NULL, theta,
                    c->d_doc, N, T, n_heads, HD, stride, inverse, (lcuda_stream)c->s);
        return;
    }
    if (tabs && !c->elem_scalar &&
        lk_rope_tab(x, c->d_rope_tab, N, T, n_heads, HD, stride, inverse, (lcuda_stream)c->s) == 0)
        return;
    const float *inv = tabs && c->rope_inv ? c->d_rope_inv32 : NULL;
    if (!inv && c->rope_inv) {
        /* past the reserved shape (generation's longer sequences): the fp32 copy
         * rope_set_freqs made for rope_at serves any length */
        if (!c->dec_rope_inv || c->dec_rope_half != HD / 2) {
            fprintf(stderr,
                    "cuda backend: RoPE with scaled frequencies for head size %d, set for %d\n", HD,
                    2 * c->rope_half);
            exit(1);
        }
        lk_rope_ex(x, N, T, 0, n_heads, HD, stride, theta, c->dec_rope_inv, inverse,
                   (lcuda_stream)c->s);
        return;
    }
    lk_rope(x, N, T, n_heads, HD, stride, theta, inv, inverse, (lcuda_stream)c->s);
}

static void cu_rope_fwd(void *ctx, void *x, int N, int T, int stride, int n_heads, int HD,
                        float theta) {
    FLUSH();
    rope_apply(CX, x, N, T, stride, n_heads, HD, theta, 0);
}

static void cu_rope_bwd(void *ctx, void *dx, int N, int T, int stride, int n_heads, int HD,
                        float theta) {
    FLUSH();
    rope_apply(CX, dx, N, T, stride, n_heads, HD, theta, 1);
}

/* the cuDNN plans are for the reserved shape only */
static int cda_fits(const struct cuda_ctx *c, int B, int T, int NH, int NKV, int HD) {
    return B == c->lim.B && T == c->lim.T && NH == c->lim.NH && NKV == c->lim.NKV &&
           HD == c->lim.HD;
}

static void cu_attention_fwd(void *ctx, void *out, float *lse, const void *qkv, int B, int T,
                             int NH, int NKV, int HD) {
    FLUSH();
    const lbf16 *q = qkv;
    int ld = (NH + 2 * NKV) * HD;
    if (doc_rows(CX, B * T)) { /* documents packed in a row: k_attn.cu's kernels, not cuDNN */
        lk_attn_fwd_doc(out, lse, q, q + NH * HD, q + (NH + NKV) * HD, ld, ld, NH * HD, B, T, NH,
                        NKV, HD, CX->d_doc, !CX->doc_noskip, ST);
        return;
    }
    if (CX->cda && cda_fits(CX, B, T, NH, NKV, HD) && lcudnn_attn_fwd(CX->cda, out, lse, qkv) == 0)
        return;
    lk_attn_fwd(out, lse, q, q + NH * HD, q + (NH + NKV) * HD, ld, ld, NH * HD, B, T, NH, NKV, HD,
                ST);
}

static void cu_attention_bwd(void *ctx, void *dqkv, const void *dout, const void *qkv,
                             const void *out, const float *lse, int B, int T, int NH, int NKV,
                             int HD) {
    cu_require(CX, "attention_bwd");
    const lbf16 *q = qkv;
    lbf16 *dq = dqkv;
    int ld = (NH + 2 * NKV) * HD;
    int fresh = pz_take(CX, dqkv, (size_t)B * T * ld * 2);
    if (doc_rows(CX, B * T)) {
        lk_attn_bwd_doc(dq, dq + NH * HD, dq + (NH + NKV) * HD, CX->attn_scratch, dout, out, lse, q,
                        q + NH * HD, q + (NH + NKV) * HD, ld, ld, NH * HD, B, T, NH, NKV, HD,
                        !fresh, CX->d_doc, !CX->doc_noskip, ST);
        return;
    }
    if (fresh && CX->cda && cda_fits(CX, B, T, NH, NKV, HD) &&
        lcudnn_attn_bwd(CX->cda, dqkv, dout, out, lse, qkv) == 0)
        return;
    lk_attn_bwd(dq, dq + NH * HD, dq + (NH + NKV) * HD, CX->attn_scratch, dout, out, lse, q,
                q + NH * HD, q + (NH + NKV) * HD, ld, ld, NH * HD, B, T, NH, NKV, HD, !fresh, ST);
}

static void cu_residual_fwd(void *ctx, void *out, const void *a, const void *b, size_t n) {
    FLUSH();
    lk_add(out, a, b, n, ST);
}

static void cu_accumulate(void *ctx, void *dst, const void *src, size_t n) {
    FLUSH();
    lk_accumulate(dst, src, n, ST);
}

static void cu_classifier(void *ctx, float *losses, void *dinp, void *dW, const void *inp,
                          const void *W, const int32_t *targets, int N, int C, int V, int Vp,
                          float grad_scale) {
    struct cuda_ctx *c = CX;
    cu_require(c, "classifier");
    const lbf16 *x = inp;
    lbf16 *dx = dinp;
    int fresh = dx && pz_take(c, dx, (size_t)N * C * 2);
    if (!dx) pz_flush(c);
    for (int r0 = 0; r0 < N; r0 += c->cls_chunk) {
        int rows = N - r0 < c->cls_chunk ? N - r0 : c->cls_chunk;
        lk_linear_fwd(c->blas, c->logits, NULL, x + (size_t)r0 * C, W, NULL, NULL, rows, C, Vp, 0);
        lk_xent_fwd_bwd(c->logits, losses + r0, targets + r0, rows, V, Vp, grad_scale, ST);
        if (dx)
            lk_linear_bwd_data(c->blas, dx + (size_t)r0 * C, c->logits, W, NULL, rows, C, Vp,
                               !fresh);
        if (dW)
            lk_linear_bwd_weight(c->blas, dW, NULL, NULL, c->logits, x + (size_t)r0 * C, rows, C,
                                 Vp);
    }
}

/* out = residual + inp . W^T + bias through the GEMM's C operand (beta 1):
 * the product is rounded to bf16 once, after the add. */
static void cu_matmul_residual_fwd(void *ctx, void *out, const void *inp, const void *W,
                                   const void *bias, const void *residual, int N, int IC, int OC) {
    FLUSH();
    if (CX->f8.n && fp8_fwd(CX, out, inp, W, bias, residual, N, IC, OC) == 0) return;
    lk_linear_fwd(CX->blas, out, NULL, inp, fp8_plain(CX, W), bias, residual, N, IC, OC, 0);
}

/* Vocabulary-parallel classifier (backend.h classifier_vp), in the same row
 * chunks as cu_classifier over the reserved logits workspace (sized for
 * lim.Vp = this rank's rows). Statistics pass when lse_in is NULL, else the
 * gradient pass. */
static void cu_classifier_vp(void *ctx, float *lse, float *tl, void *dinp, void *dW,
                             const void *inp, const void *W, const int32_t *targets,
                             const float *lse_in, int N, int C, int Vv, int Vr, float grad_scale) {
    struct cuda_ctx *c = CX;
    cu_require(c, "classifier_vp");
    if (Vr > c->lim.Vp) {
        fprintf(stderr, "cuda backend: classifier_vp with %d rows > reserved Vp %d\n", Vr,
                c->lim.Vp);
        exit(1);
    }
    const lbf16 *x = inp;
    lbf16 *dx = lse_in ? dinp : NULL;
    int fresh = dx && pz_take(c, dx, (size_t)N * C * 2);
    if (!dx) pz_flush(c);
    for (int r0 = 0; r0 < N; r0 += c->cls_chunk) {
        int rows = N - r0 < c->cls_chunk ? N - r0 : c->cls_chunk;
        lk_linear_fwd(c->blas, c->logits, NULL, x + (size_t)r0 * C, W, NULL, NULL, rows, C, Vr, 0);
        if (!lse_in) {
            lk_xent_vp_stats(c->logits, lse + r0, tl + r0, targets + r0, rows, Vv, Vr, ST);
            continue;
        }
        lk_xent_vp_grad(c->logits, lse_in + r0, targets + r0, rows, Vv, Vr, grad_scale, ST);
        if (dx)
            lk_linear_bwd_data(c->blas, dx + (size_t)r0 * C, c->logits, W, NULL, rows, C, Vr,
                               !fresh);
        if (dW)
            lk_linear_bwd_weight(c->blas, dW, NULL, NULL, c->logits, x + (size_t)r0 * C, rows, C,
                                 Vr);
    }
}

/* Ranges arrive one run of tensors at a time; adjacent ones with the same
 * hyper-parameters (weight decay aside) are merged into one launch. */
static void cu_adamw(void *ctx, const struct backend_adamw *a) {
    struct cuda_ctx *c = CX;
    if (!a->n) return;
    if (c->aw.on) {
        const struct backend_adamw *p = &c->aw.a;
        size_t off = p->n;
        int adj = (char *)a->param == (char *)p->param + off * 2 && a->master == p->master + off &&
                  (const char *)a->grad == (const char *)p->grad + off * 2 && a->m == p->m + off &&
                  a->v == p->v + off && a->lr == p->lr && a->beta1 == p->beta1 &&
                  a->beta2 == p->beta2 && a->eps == p->eps && a->grad_scale == p->grad_scale &&
                  a->step == p->step && c->aw.segs.n < LK_ADAMW_MAXSEG;
        if (adj) {
            c->aw.a.n += a->n;
            c->aw.segs.end[c->aw.segs.n] = (int64_t)c->aw.a.n;
            c->aw.segs.wd[c->aw.segs.n] = a->weight_decay;
            c->aw.segs.n++;
            return;
        }
    }
    FLUSH();
    c->aw.on = 1;
    c->aw.a = *a;
    c->aw.segs.n = 1;
    c->aw.segs.end[0] = (int64_t)a->n;
    c->aw.segs.wd[0] = a->weight_decay;
}

static void cu_sumsq(void *ctx, float *acc, const void *grad, size_t n) {
    FLUSH();
    cu_require(CX, "sumsq");
    lk_sumsq_acc(acc, grad, n, CX->sum_scratch, !CX->elem_scalar, ST);
}

static void cu_scale(void *ctx, void *x, size_t n, float s) {
    FLUSH();
    lk_scale(x, n, s, ST);
}

/* ---- LoRA helpers (optional members; worker/cuda/k_lora.cu) */

static void cu_axpy_2d(void *ctx, void *dst, int ldd, const void *src, int lds, int rows, int cols,
                       float alpha, int beta) {
    FLUSH();
    lk_lora_axpy_2d(dst, ldd, src, lds, rows, cols, alpha, beta, ST);
}

static void cu_dropout(void *ctx, void *out, const void *inp, size_t n, float p, uint64_t seed) {
    FLUSH();
    lk_lora_dropout(out, inp, n, p, seed, ST);
}

static void cu_lora_drop_fwd(void *ctx, void *H, int ldh, const void *x, int ldx, const void *A,
                             int N, int in, int r, float alpha, float p, uint64_t seed, size_t mld,
                             size_t moff, void *ws) {
    FLUSH();
    lk_lora_drop_fwd(H, ldh, x, ldx, A, N, in, r, alpha, p, seed, mld, moff, ws, 1, ST);
}

static void cu_lora_drop_bwd(void *ctx, void *dA, void *dx, int lddx, const void *dH, int ldh,
                             const void *x, int ldx, const void *A, int N, int in, int r, float p,
                             uint64_t seed, size_t mld, size_t moff, void *ws) {
    FLUSH();
    lk_lora_drop_bwd(dA, dx, lddx, dH, ldh, x, ldx, A, N, in, r, p, seed, mld, moff, ws, 1, ST);
}

static size_t cu_lora_drop_ws(void *ctx, int N, int in, int r) {
    (void)ctx;
    return lk_lora_drop_ws_bytes(N, in, r);
}

static void cu_nf4_dequant(void *ctx, void *out, const void *q, size_t n) {
    FLUSH(); /* a held GEMM may still read the scratch this overwrites */
    lk_nf4_dequant(out, q, n, !CX->nf4_scalar, ST);
}

static void cu_nf4_dequant_absmax(void *ctx, void *out, const void *q, size_t n) {
    FLUSH(); /* as cu_nf4_dequant */
    lk_nf4_dequant_absmax(out, q, n, !CX->nf4_scalar, ST);
}

static void cu_lora_gemm(void *ctx, int ta, int tb, int m, int n, int k, float alpha, const void *A,
                         int lda, const void *B, int ldb, float beta, void *C, int ldc) {
    FLUSH();
    cu_require(CX, "lora_gemm"); /* the cuBLASLt handle comes with reserve() */
    lk_gemm_rm(CX->blas, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- imported models and generation (optional members; k_decode.cu) */

static void cu_rope_at(void *ctx, void *x, int N, int stride, int n_heads, int HD, int pos0,
                       float theta) {
    FLUSH();
    const float *inv = CX->dec_rope_inv && CX->dec_rope_half == HD / 2 ? CX->dec_rope_inv : NULL;
    lk_rope_ex(x, N, 0, pos0, n_heads, HD, stride, theta, inv, 0, ST);
}

/* The split scratch grows on first use for a shape: generation runs outside
 * the training step, whose memory reserve() fixes. */
static void cu_attention_decode(void *ctx, void *out, const void *q, const void *kv, int n, int NH,
                                int NKV, int HD) {
    struct cuda_ctx *c = CX;
    FLUSH();
    if (n < 1 || NKV < 1 || NH % NKV != 0 || HD < 1 || HD > LK_DECODE_MAX_HD) {
        fprintf(stderr,
                "cuda backend: attention_decode needs n >= 1, NH %% NKV == 0 and HD <= %d "
                "(n=%d NH=%d NKV=%d HD=%d)\n",
                LK_DECODE_MAX_HD, n, NH, NKV, HD);
        exit(1);
    }
    size_t need = lk_attn_decode_scratch_bytes(NH, HD);
    if (need > c->dec_bytes) {
        CUDA_CHECK(cudaStreamSynchronize(c->s));
        cudaFree(c->dec_scratch);
        c->dec_scratch = NULL;
        c->dec_bytes = 0;
        CUDA_CHECK(cudaMalloc((void **)&c->dec_scratch, need));
        c->dec_bytes = need;
    }
    lk_attn_decode(out, c->dec_scratch, q, kv, n, NH, NKV, HD, ST);
}

/* ---- async host copies (optional members; worker/offload.h) */

static void *cu_host_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    (void)ctx;
    if (cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        log_error("cuda backend: cannot pin %zu bytes (%.2f GiB) of host memory", bytes,
                  bytes / 1073741824.0);
        return NULL;
    }
    return p;
}

static void cu_host_free(void *ctx, void *p) {
    (void)ctx;
    if (p) cudaFreeHost(p);
}

/* Called from the offload's pool threads too: the device first, so that a
 * thread's first CUDA call does not make a context on device 0. */
static int cu_host_register(void *ctx, void *p, size_t bytes) {
    struct cuda_ctx *c = ctx;
    if (cudaSetDevice(c->device) != cudaSuccess ||
        cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
        cudaGetLastError();
        log_error("cuda backend: cannot page-lock %zu bytes (%.2f GiB) of host memory", bytes,
                  bytes / 1073741824.0);
        return -1;
    }
    return 0;
}

static void cu_host_unregister(void *ctx, void *p) {
    struct cuda_ctx *c = ctx;
    if (!p) return;
    if (cudaSetDevice(c->device) != cudaSuccess || cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError(); /* not sticky: leave no error for later checks */
}

/* Streams and events on first use: a run without offload creates none. */
static void copies_init(struct cuda_ctx *c) {
    if (c->cs[0]) return;
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&c->cs[i], cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&c->ev_fence[i], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&c->ev_order, cudaEventDisableTiming));
    for (int i = 0; i < COPY_RING; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->ring[i], cudaEventDisableTiming));
}

static uint64_t copy_async(struct cuda_ctx *c, int dir, void *dst, const void *src, size_t bytes) {
    copies_init(c);
    pz_flush(c); /* held work belongs before the copy */
    cudaStream_t cs = c->cs[dir];
    CUDA_CHECK(cudaEventRecord(c->ev_order, c->s));
    CUDA_CHECK(cudaStreamWaitEvent(cs, c->ev_order, 0));
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                   dir == 0 ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, cs));
    uint64_t t = ++c->ticket;
    cudaEvent_t ev = c->ring[t % COPY_RING];
    if (t > COPY_RING) CUDA_CHECK(cudaEventSynchronize(ev)); /* ticket t - COPY_RING is done */
    CUDA_CHECK(cudaEventRecord(ev, cs));
    return t;
}

static uint64_t cu_d2h_async(void *ctx, void *dst_host, const void *src_dev, size_t bytes) {
    return copy_async(CX, 0, dst_host, src_dev, bytes);
}

static uint64_t cu_h2d_async(void *ctx, void *dst_dev, const void *src_host, size_t bytes) {
    tok_touch(CX, dst_dev, bytes);
    return copy_async(CX, 1, dst_dev, src_host, bytes);
}

static void cu_wait(void *ctx, uint64_t t) {
    struct cuda_ctx *c = CX;
    if (!t || t > c->ticket || t + COPY_RING <= c->ticket) return; /* none / recycled: done */
    CUDA_CHECK(cudaEventSynchronize(c->ring[t % COPY_RING]));
}

static void cu_copy_fence(void *ctx) {
    struct cuda_ctx *c = CX;
    if (!c->cs[0]) return;
    pz_flush(c);
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaEventRecord(c->ev_fence[i], c->cs[i]));
        CUDA_CHECK(cudaStreamWaitEvent(c->s, c->ev_fence[i], 0));
    }
}

/* cuDNN's fused attention per architecture family (cuDNN's SDPA support matrix,
 * docs/planner.md "GPU types"): the oldest cuDNN that runs it and the largest head
 * dimension of its backward. Graph finalization stays the final word (a shape the
 * engines reject falls back to k_attn.cu). */
static const struct {
    int cc_lo, cc_hi; /* compute capability x10, inclusive */
    long min_version; /* cudnnGetVersion() */
    int max_hd_bwd;
} cudnn_sdpa[] = {
    {80, 89, 90000, 128},   /* Ampere, Ada */
    {90, 99, 90000, 256},   /* Hopper */
    {100, 109, 90700, 256}, /* Blackwell B200 / B300 */
    {120, 129, 90800, 128}, /* Blackwell RTX */
};

static int cudnn_supports(int cc, int hd, char *why, size_t len) {
    long v = lcudnn_version();
    for (size_t i = 0; i < sizeof cudnn_sdpa / sizeof *cudnn_sdpa; i++) {
        if (cc < cudnn_sdpa[i].cc_lo || cc > cudnn_sdpa[i].cc_hi) continue;
        if (v && v < cudnn_sdpa[i].min_version) {
            snprintf(why, len, "cuDNN %ld does not run fused attention on sm_%d (needs %ld)", v, cc,
                     cudnn_sdpa[i].min_version);
            return 0;
        }
        if (hd > cudnn_sdpa[i].max_hd_bwd) {
            snprintf(why, len, "head dim %d exceeds cuDNN's %d on sm_%d", hd,
                     cudnn_sdpa[i].max_hd_bwd, cc);
            return 0;
        }
        return 1;
    }
    snprintf(why, len, "no cuDNN fused attention known for sm_%d", cc);
    return 0;
}

/* The start-up gate: 0 when device `device` can run Loom's kernels (sm_80 or newer and
 * code for it in this build), else -1 with a GPU_UNSUPPORTED line naming the GPU.
 * Loom's kernels use bf16 mma.sync, ldmatrix and cp.async (sm_80) and nothing
 * sm_90-only, so one code path serves every supported device. */
static int device_gate(int device, struct cudaDeviceProp *p) {
    if (cudaGetDeviceProperties(p, device) != cudaSuccess) {
        cudaGetLastError();
        log_error("cuda backend: cannot read the properties of device %d", device);
        return -1;
    }
    int cc = p->major * 10 + p->minor;
    if (cc < 80) {
        log_error("GPU_UNSUPPORTED: device %d is %s with compute capability %d.%d; Loom's CUDA "
                  "backend needs 8.0 or newer (A100, A10, L40S, L4, RTX 3090/4090, H100, H20, "
                  "H200); use --device cpu or another node",
                  device, p->name, p->major, p->minor);
        return -1;
    }
    if (!gpu_build_runs_on(LOOM_CUDA_ARCHS, cc)) {
        log_error("GPU_UNSUPPORTED: device %d is %s with compute capability %d.%d, but this "
                  "loom-worker was built for CUDA architectures \"%s\" only; rebuild with "
                  "-DCMAKE_CUDA_ARCHITECTURES including %d-real (or a PTX %d-virtual at or "
                  "below it)",
                  device, p->name, p->major, p->minor, LOOM_CUDA_ARCHS, cc, cc);
        return -1;
    }
    return 0;
}

static void cu_flush(void *ctx) {
    pz_flush(CX);
}

/* b was made here (the backend_cuda_* extras accept any backend) */
static int is_cuda(const struct backend *b) {
    return b && b->destroy == cu_destroy;
}

struct backend *backend_cuda_new_tuned(int device, const struct cuda_tuning *t) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= device) {
        cudaGetLastError();
        log_error("cuda backend: device %d not available (%d CUDA devices)", device, n);
        return NULL;
    }
    struct cudaDeviceProp prop;
    if (device_gate(device, &prop) != 0) return NULL;
    CUDA_CHECK(cudaSetDevice(device));
    struct backend *b = calloc(1, sizeof *b);
    struct cuda_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        log_error("cuda backend: out of host memory");
        return NULL;
    }
    c->device = device;
    c->cc = prop.major * 10 + prop.minor;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking));
    /* NULL: the rows' defaults (worker/tuning.c) */
    const char *ac = t ? t->attn_cudnn : NULL;
    c->fuse_off = t && !t->fuse_dgelu;
    c->cudnn_gqa_off = t && !t->attn_cudnn_gqa;
    c->elem_scalar = t && !t->elem_vec;
    c->doc_noskip = t && !t->attn_doc_skip;
    c->nf4_scalar = t && !t->nf4_vec;
    c->f8.off = t && !t->fp8;
    c->f8.fast = t && t->fp8_fast_accum;
    c->cudnn_mode = !ac || !*ac ? 1 : strcmp(ac, "0") == 0 ? 0 : strcmp(ac, "nd") == 0 ? 2 : 1;
    c->blas_tune = t && t->blas_tune;
    c->blas_cache = t && t->blas_algo_cache ? strdup(t->blas_algo_cache) : NULL;
    c->xent_mib = t ? t->xent_chunk_mib : XENT_CHUNK_MIB;
    b->name = "cuda";
    /* k_attn.cu works on 64-position tiles (cuDNN's engines take any count) */
    b->caps = (struct backend_caps){
        .pair_transport = 1, .device_collectives = 1, .attn_pos_multiple = 64};
    b->flush = cu_flush;
    b->dtype = BACKEND_BF16;
    b->elt_size = 2;
    b->ctx = c;
    const struct gpu_type *gt = gpu_type_normalize(prop.name, (double)prop.totalGlobalMem);
    b->peak_flops = gt ? gt->bf16_tflops * 1e12 : CUDA_PEAK_BF16;
    log_info("cuda backend: device %d %s (sm_%d, %d SMs, %.1f GiB), gpu_type %s", device, prop.name,
             c->cc, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), gt ? gt->name : "unknown");
    b->reserve = cu_reserve;
    b->alloc = cu_alloc;
    b->free = cu_free;
    b->zero = cu_zero;
    b->upload = cu_upload;
    b->download = cu_download;
    b->copy = cu_copy;
    b->from_f32 = cu_from_f32;
    b->to_f32 = cu_to_f32;
    b->sync = cu_sync;
    b->destroy = cu_destroy;
    b->embedding_fwd = cu_embedding_fwd;
    b->embedding_bwd = cu_embedding_bwd;
    b->layernorm_fwd = cu_layernorm_fwd;
    b->layernorm_bwd = cu_layernorm_bwd;
    b->rmsnorm_fwd = cu_rmsnorm_fwd;
    b->rmsnorm_bwd = cu_rmsnorm_bwd;
    b->matmul_fwd = cu_matmul_fwd;
    b->matmul_bwd = cu_matmul_bwd;
    b->gelu_fwd = cu_gelu_fwd;
    b->gelu_bwd = cu_gelu_bwd;
    b->swiglu_fwd = cu_swiglu_fwd;
    b->swiglu_bwd = cu_swiglu_bwd;
    b->rope_fwd = cu_rope_fwd;
    b->rope_bwd = cu_rope_bwd;
    b->rope_set_freqs = cu_rope_set_freqs;
    b->attention_fwd = cu_attention_fwd;
    b->attention_bwd = cu_attention_bwd;
    b->set_doc_starts = cu_set_doc_starts;
    b->residual_fwd = cu_residual_fwd;
    b->accumulate = cu_accumulate;
    b->classifier = cu_classifier;
    b->classifier_vp = cu_classifier_vp;
    b->matmul_residual_fwd = cu_matmul_residual_fwd;
    b->rope_at = cu_rope_at;
    b->attention_decode = cu_attention_decode;
    b->adamw = cu_adamw;
    b->sumsq = cu_sumsq;
    b->scale = cu_scale;
    b->host_alloc = cu_host_alloc;
    b->host_free = cu_host_free;
    b->d2h_async = cu_d2h_async;
    b->h2d_async = cu_h2d_async;
    b->wait = cu_wait;
    b->copy_fence = cu_copy_fence;
    b->host_register = cu_host_register;
    b->host_unregister = cu_host_unregister;
    b->axpy_2d = cu_axpy_2d;
    b->dropout = cu_dropout;
    /* the lora-fused row off: lora.c's per-adapter path */
    if (!t || t->lora_fused) b->lora_gemm = cu_lora_gemm;
    /* the lora-drop-fused row off: a masked copy of the input, then cuBLASLt */
    if (!t || t->lora_drop_fused) {
        b->lora_drop_fwd = cu_lora_drop_fwd;
        b->lora_drop_bwd = cu_lora_drop_bwd;
        b->lora_drop_ws = cu_lora_drop_ws;
    }
    b->nf4_dequant = cu_nf4_dequant;
    b->nf4_dequant_absmax = cu_nf4_dequant_absmax;
    b->fp8_freeze = cu_fp8_freeze;
    return b;
}

int backend_cuda_mem(const struct backend *b, struct cuda_mem_report *r) {
    if (!is_cuda(b)) return -1;
    const struct cuda_ctx *c = b->ctx;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    r->engine_bytes = c->alloc_bytes;
    r->engine_peak = c->alloc_peak;
    r->workspace_bytes = c->ws.size + (c->cda ? lcudnn_attn_bytes(c->cda) : 0);
    r->logits_bytes = (size_t)c->cls_chunk * (size_t)(c->lim.Vp > 0 ? c->lim.Vp : 8) * 2;
    r->device_used = tot - fr;
    r->device_free = fr;
    r->device_total = tot;
    return 0;
}

const int32_t *backend_cuda_embed_rows(struct backend *b, void *rows, int *n_uniq, const void *dout,
                                       const int32_t *tokens, int B, int T, int C) {
    struct cuda_ctx *c = b->ctx;
    pz_flush(c);
    *n_uniq = embed_buckets(c, tokens, B * T);
    lk_embed_rows(rows, dout, c->d_order, c->d_starts, *n_uniq, C, (lcuda_stream)c->s);
    return c->d_uniq;
}

void backend_cuda_embed_scatter(struct backend *b, void *dwte, const void *rows,
                                const int32_t *uniq, int n_rows, int C) {
    struct cuda_ctx *c = b->ctx;
    pz_flush(c);
    lk_embed_scatter_add(dwte, rows, uniq, n_rows, C, (lcuda_stream)c->s);
}

const char *backend_cuda_attn_path(const struct backend *b) {
    if (!is_cuda(b)) return "not a CUDA backend";
    const struct cuda_ctx *c = b->ctx;
    return c->cda ? "cudnn" : c->cda_why;
}

void *backend_cuda_stream(const struct backend *b) {
    if (!is_cuda(b)) return NULL;
    return ((const struct cuda_ctx *)b->ctx)->s;
}

int backend_cuda_held(const struct backend *b, int what) {
    if (!is_cuda(b)) return 0;
    const struct cuda_ctx *c = b->ctx;
    return what == 1 ? c->mm.on : what == 2 ? c->aw.on : what == 3 ? c->mb.on : 0;
}

void backend_cuda_issue_held(const struct backend *b, int what) {
    if (!is_cuda(b)) return;
    struct cuda_ctx *c = b->ctx;
    if (what == 1) mm_flush(c);
    if (what == 2) aw_flush(c);
    if (what == 3) mb_flush(c);
}

void backend_cuda_flush(const struct backend *b) {
    if (!is_cuda(b)) return;
    pz_flush(b->ctx);
}

int backend_cuda_fp8_stats(const struct backend *b, struct cuda_fp8_stats *st) {
    if (!is_cuda(b)) return -1;
    const struct cuda_ctx *c = b->ctx;
    *st = (struct cuda_fp8_stats){.weights = c->f8.n,
                                  .bytes = c->f8.bytes,
                                  .fwd = c->f8.fwd,
                                  .bwd = c->f8.bwd,
                                  .wgrad = c->f8.wgrad,
                                  .fallback = c->f8.fallback,
                                  .held = c->f8.n_own,
                                  .dequant = c->f8.dequant};
    return 0;
}
