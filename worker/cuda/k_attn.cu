/* Causal flash attention (FlashAttention-2 scheme) on bf16 tensor cores
 * (mma.sync m16n8k16, fp32 accumulation), forward and backward, for head
 * dims 32, 64 and 128 and any T that is a multiple of 64. Scores stay in
 * registers (the accumulator layout of one mma is the operand layout of the
 * next), so no T x T matrix ever reaches memory; the forward pass saves only
 * the per-row log-sum-exp. Every variant is bit-reproducible (no float
 * atomics; fixed summation orders).
 *
 * The scheme (hd <= 64; hd 128 below):
 * - forward (attn_fwd2_kernel): 128 queries per CTA of 4 warps, each warp two
 *   16-row m-tiles (rows w*16 and 64+w*16) that share every K/V fragment read
 *   from shared memory, 64-key tiles triple-buffered by cp.async with one
 *   barrier a step, exp2 with the 1/sqrt(hd) scale folded into one FMA;
 * - backward, two kernels: dK/dV per 64-key block (4 warps x 16 keys, looping
 *   over the query blocks and the query heads of a grouped kv head), and dQ
 *   per 128-query block (attn_bwd_q2_kernel, the forward's two-m-tile layout,
 *   recomputing P and dP). Recomputing costs two small matmuls against FA2's
 *   atomic dQ and buys determinism.
 * hd 128 uses the older 64-query kernels (one m-tile per warp; two m-tiles
 * would spill). The variants that measured slower on H200 at T 1024 (the
 * 64-query kernels for every hd, a fused backward summing dQ shares in a
 * fixed order through per-query-block counters; docs/perf.md, Attention
 * kernels III) live in dev/cuda/attn_variants.cu.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): with g = lane/4 and
 * t = lane%4, A regs {0,1,2,3} hold (row g, k 2t..2t+1), (g+8, 2t), (g, 2t+8),
 * (g+8, 2t+8); B regs {0,1} hold (k 2t..2t+1, n g), (k 2t+8.., n g); C holds
 * (g, 2t..2t+1) and (g+8, 2t..2t+1). All shared tiles are row-major [64][HD]
 * padded by 8 elements a row (ldmatrix rows then fall in distinct banks); B
 * operands come from ldmatrix (.trans where the tile is the k-major side),
 * and the next tile streams in by cp.async while the current one is used. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include "worker/cuda/kernels.h"
#include "worker/cuda/k_attn_common.cuh"

/* The kernels chosen by measurement (docs/perf.md, Attention kernels III):
 * forward attn_fwd2_kernel for hd <= 64 and the 64-query kernel for hd 128
 * (two m-tiles would not fit in registers); backward the two-kernel scheme,
 * its dK/dV kernel at the register budget measured fastest per head dim with
 * attn_bwd_q2_kernel for dQ, and for hd 128 the 64-query dK/dV and dQ
 * kernels. The variants that lost (the 64-query forward at two budgets for
 * every hd, the fused backward attn_bwd2_kernel at three settings) are in
 * dev/cuda/attn_variants.cu with the tests and benches that compare them. */
template <int HD, bool DOC>
static void fwd_launch(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                       int ldq, int ldkv, int ldo, int B, int T, int H, int Hkv, cudaStream_t st,
                       const int *ds, int skip) {
    float sl2 = LOG2E / sqrtf((float)HD);
    dim3 grid(T / BQ, B * H);
    size_t smem = 4 * TS(HD) * sizeof(bf);
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_kernel_a<HD, DOC>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attn_fwd_kernel_a<HD, DOC><<<grid, NTHREADS, smem, st>>>((bf *)out, lse, (const bf *)q,
                                                             (const bf *)k, (const bf *)v, ldq,
                                                             ldkv, ldo, T, H, Hkv, sl2, ds, skip);
    CUDA_CHECK_LAUNCH();
}

template <bool DOC>
static void fwd_any(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                    int ld_q, int ld_kv, int ld_o, int B, int T, int H, int Hkv, int hd,
                    cudaStream_t st, const int *ds, int skip) {
    if (hd == 32)
        fwd2_launch<32, DOC>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st, ds, skip);
    if (hd == 64)
        fwd2_launch<64, DOC>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st, ds, skip);
    if (hd == 128)
        fwd_launch<128, DOC>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st, ds, skip);
}

extern "C" void lk_attn_fwd_doc(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k,
                                const lbf16 *v, int ld_q, int ld_kv, int ld_o, int B, int T, int H,
                                int Hkv, int hd, const int32_t *doc_start, int skip,
                                lcuda_stream s) {
    check_shape(T, H, Hkv, hd);
    cudaStream_t st = (cudaStream_t)s;
    if (doc_start)
        fwd_any<true>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, hd, st, doc_start, skip);
    else
        fwd_any<false>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, hd, st, NULL, 0);
}

extern "C" void lk_attn_fwd(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                            int ld_q, int ld_kv, int ld_o, int B, int T, int H, int Hkv, int hd,
                            lcuda_stream s) {
    lk_attn_fwd_doc(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, hd, NULL, 0, s);
}

/* Scratch: di [B][H][T] fp32, then room for the fused backward's dQ sums
 * [B][H][T][hd] fp32 and counters [B][H][T/64][4 warps] int: that backward
 * lives in dev/cuda now, but the size stays the one the planner's memory
 * terms and the memory reports were measured with. */
extern "C" size_t lk_attn_scratch_bytes(int B, int T, int H, int Hkv, int hd) {
    (void)Hkv;
    size_t bht = (size_t)B * H * T;
    return bht * sizeof(float) * (1 + (size_t)hd) + (size_t)B * H * (T / 64) * 4 * sizeof(int);
}

template <bool DOC>
static void bwd_any(lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch, const lbf16 *dout,
                    const float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v, int ld_q,
                    int ld_kv, int ld_o, int B, int T, int H, int Hkv, int hd, int accumulate,
                    cudaStream_t st, const int *ds, int skip) {
#define BWD_ARGS                                                                                   \
    dq, dk, dv, scratch, dout, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, accumulate, st, ds,  \
        skip
#define BWD_ARGS_KV                                                                                \
    NULL, dk, dv, scratch, dout, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, accumulate, st,    \
        ds, skip
#define BWD_ARGS_Q2                                                                                \
    (bf *)dq, (const bf *)dout, lse, scratch, (const bf *)q, (const bf *)k, (const bf *)v, ld_q,   \
        ld_kv, ld_o, T, H, Hkv, sl2, scale, accumulate, ds, skip
    if (hd <= 64) {
        float scale = 1.f / sqrtf((float)hd), sl2 = LOG2E * scale;
        if (hd == 32) bwd_launch<32, 0, DOC>(BWD_ARGS_KV);
        if (hd == 64) bwd_launch<64, 1, DOC>(BWD_ARGS_KV);
        size_t smem = 2 * NBUF * TS(64) * sizeof(bf);
        dim3 grid((T + 127) / 128, B * H);
        if (hd == 32) {
            CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_q2_kernel<32, DOC>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem));
            attn_bwd_q2_kernel<32, DOC><<<grid, NTHREADS, smem, st>>>(BWD_ARGS_Q2);
        } else {
            CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_q2_kernel<64, DOC>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem));
            attn_bwd_q2_kernel<64, DOC><<<grid, NTHREADS, smem, st>>>(BWD_ARGS_Q2);
        }
        CUDA_CHECK_LAUNCH();
    } else { /* hd 128: the two-kernel scheme */
        bwd_launch<128, 0, DOC>(BWD_ARGS);
    }
#undef BWD_ARGS
#undef BWD_ARGS_KV
#undef BWD_ARGS_Q2
}

extern "C" void lk_attn_bwd_doc(lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch, const lbf16 *dout,
                                const lbf16 *out, const float *lse, const lbf16 *q, const lbf16 *k,
                                const lbf16 *v, int ld_q, int ld_kv, int ld_o, int B, int T, int H,
                                int Hkv, int hd, int accumulate, const int32_t *doc_start, int skip,
                                lcuda_stream s) {
    check_shape(T, H, Hkv, hd);
    cudaStream_t st = (cudaStream_t)s;
    int N = B * T;
    int *sem = (int *)(scratch + (size_t)N * H * (1 + (size_t)hd));
    int nblk = (N * H + 7) / 8;
    /* no counters to clear: those are the fused backward's (dev/cuda) */
    attn_bwd_pre_kernel<<<nblk, 256, 0, st>>>(scratch, sem, 0, (const bf *)dout, (const bf *)out,
                                              ld_o, N, T, H, hd);
    CUDA_CHECK_LAUNCH();
    if (doc_start)
        bwd_any<true>(dq, dk, dv, scratch, dout, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, hd,
                      accumulate, st, doc_start, skip);
    else
        bwd_any<false>(dq, dk, dv, scratch, dout, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, hd,
                       accumulate, st, NULL, 0);
}

extern "C" void lk_attn_bwd(lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch, const lbf16 *dout,
                            const lbf16 *out, const float *lse, const lbf16 *q, const lbf16 *k,
                            const lbf16 *v, int ld_q, int ld_kv, int ld_o, int B, int T, int H,
                            int Hkv, int hd, int accumulate, lcuda_stream s) {
    lk_attn_bwd_doc(dq, dk, dv, scratch, dout, out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv,
                    hd, accumulate, NULL, 0, s);
}
