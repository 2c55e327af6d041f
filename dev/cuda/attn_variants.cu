/* Every attention kernel variant that worker/cuda/k_attn.cu had, for the
 * GPU kernel test and bench_attn, which compare them: the shipping file
 * keeps the chosen ones (forward 2, backward 5 below). The device code both
 * use (helpers, the 64-query bodies and kernels, the 128-query forward and
 * dQ kernels) is worker/cuda/k_attn_common.cuh, included here inside the
 * dev_attn namespace; this file adds what only the variants use (the forward
 * at a second register budget, the fused backward) and the entry points
 * (dev_attn_*), the variant passed by the caller instead of read from
 * LOOM_ATTN_FWD_VARIANT / LOOM_ATTN_BWD_VARIANT. Not linked into the
 * product.
 *
 * Causal flash attention (FlashAttention-2 scheme) on bf16 tensor cores
 * (mma.sync m16n8k16, fp32 accumulation), forward and backward, for head
 * dims 32, 64 and 128 and any T that is a multiple of 64. Scores stay in
 * registers (the accumulator layout of one mma is the operand layout of the
 * next), so no T x T matrix ever reaches memory; the forward pass saves only
 * the per-row log-sum-exp. Every variant is bit-reproducible (no float
 * atomics; fixed summation orders).
 *
 * Default scheme (hd <= 64; see tuned_variant for the others):
 * - forward (attn_fwd2_kernel): 128 queries per CTA of 4 warps, each warp two
 *   16-row m-tiles (rows w*16 and 64+w*16) that share every K/V fragment read
 *   from shared memory, 64-key tiles triple-buffered by cp.async with one
 *   barrier a step, exp2 with the 1/sqrt(hd) scale folded into one FMA;
 * - backward, two kernels: dK/dV per 64-key block (4 warps x 16 keys, looping
 *   over the query blocks and the query heads of a grouped kv head), and dQ
 *   per 128-query block (attn_bwd_q2_kernel, the forward's two-m-tile layout,
 *   recomputing P and dP). Recomputing costs two small matmuls against FA2's
 *   atomic dQ and buys determinism.
 * The older 64-query kernels (one m-tile per warp) stay selectable, and so
 * does a fused backward (attn_bwd2_kernel: dQ shares summed in a fixed order
 * through per-query-block counters, 5 matmuls a tile pair instead of 7),
 * which measured slower on H200 at T 1024 (docs/perf.md, Attention kernels
 * III). hd 128 keeps the 64-query kernels (two m-tiles would spill).
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

#include "dev/cuda/dev_kernels.h"
#include "worker/cuda/kernels.h"

/* a namespace: the kernels keep their names without colliding with the
 * product's (k_attn.cu / k_norm.cu are linked beside this) */
namespace dev_attn {

#include "worker/cuda/k_attn_common.cuh"

/* The 64-query forward at a second register budget (aims at more resident
 * blocks per SM for hd 64); it changes speed only, never results. */
template <int HD>
__global__ void __launch_bounds__(NTHREADS, 4)
    attn_fwd_kernel_b(bf *out, float *lse, const bf *q, const bf *k, const bf *v, int ldq, int ldkv,
                      int ldo, int T, int H, int Hkv, float sl2, const int *ds, int skip) {
    attn_fwd_body<HD>(out, lse, q, k, v, ldq, ldkv, ldo, T, H, Hkv, sl2);
}

/* Loads of the fused backward's per-query-block counters. */
__device__ __forceinline__ int ld_relaxed(const int *p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ int ld_acquire(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Backward in one kernel: the CTA of key block kb (4 warps x 16 keys) loops
 * over the query heads of its kv head and the query blocks qb >= kb,
 * computing S^T, dV += P^T dO, dP^T, dK += dS^T Q as the two-kernel scheme
 * does, and in addition dQ's share dS K (dS staged in shared memory as bf16,
 * the same rounding that dK uses). The shares of a query block are summed in
 * fp32 (dqacc, in the scratch) in a fixed order, highest key block first:
 * key block qb stores, each lower one waits on the query block's counter
 * until the blocks above it have added (ld.acquire), adds, and counts up
 * (fence + atomicAdd on an int, no float atomics); key block 0 adds last and
 * writes dq in bf16. Key block kb+1 reaches each query block one step before
 * kb does, so in steady state nobody waits. Blocks are numbered so that kb+1
 * is launched before kb (blockIdx.x = nkb-1-kb): a waiting CTA only waits
 * for one that is resident or done, never for one that has no slot. */
template <int HD, int WARPSEM>
__device__ __forceinline__ void
attn_bwd2_body(bf *dq, bf *dk, bf *dv, const bf *dout, const float *lse, const float *di,
               float *dqacc, int *sem, const bf *q, const bf *k, const bf *v, int ldq, int ldkv,
               int ldo, int T, int H, int Hkv, float sl2, float scale, int add) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int DC = HD < 64 ? HD : 64;   /* dQ columns per pass (register budget) */
    bf *Qs = (bf *)smem;                    /* [NBUF][64][HD+8] */
    bf *dOs = Qs + NBUF * TS(HD);           /* [NBUF][64][HD+8] */
    bf *Ks = dOs + NBUF * TS(HD);           /* [64][HD+8] */
    bf *dSs = Ks + TS(HD);                  /* [64 keys][64+8 queries] */
    float *lse_s = (float *)(dSs + TS(64)); /* [NBUF][64], times log2 e */
    float *di_s = lse_s + NBUF * BQ;        /* [NBUF][64] */
    int nqb = T / BQ;
    int kb = nqb - 1 - blockIdx.x;
    int bhk = blockIdx.y, b = bhk / Hkv, hk = bhk % Hkv, grp = H / Hkv;
    int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int mi = lane >> 3, r8 = lane & 7;
    int k0 = kb * BK + w * 16;
    int nq = nqb - kb, niter = nq * grp;
#define KV2_ISSUE(it)                                                                              \
    do {                                                                                           \
        int h_ = hk * grp + (it) / nq, qb_ = kb + (it) % nq, buf_ = (it) % NBUF;                   \
        size_t bh_ = (size_t)b * H + h_;                                                           \
        tile_async<HD>(Qs + buf_ * TS(HD), q + ((size_t)b * T + qb_ * BQ) * ldq + h_ * HD, ldq);   \
        tile_async<HD>(dOs + buf_ * TS(HD), dout + ((size_t)b * T + qb_ * BQ) * ldo + h_ * HD,     \
                       ldo);                                                                       \
        if (threadIdx.x < BQ) {                                                                    \
            lse_s[buf_ * BQ + threadIdx.x] = lse[bh_ * T + qb_ * BQ + threadIdx.x] * LOG2E;        \
            di_s[buf_ * BQ + threadIdx.x] = di[bh_ * T + qb_ * BQ + threadIdx.x];                  \
        }                                                                                          \
    } while (0)
    tile_async<HD>(Ks, k + ((size_t)b * T + kb * BK) * ldkv + hk * HD, ldkv);
    KV2_ISSUE(0);
    cp_commit();
    if (niter > 1) KV2_ISSUE(1);
    cp_commit();
    uint32_t kf[HD / 16][4], vf[HD / 16][4];
    load_afrag<HD>(kf, k + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, g, t);
    load_afrag<HD>(vf, v + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, g, t);
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dka[j][e] = dva[j][e] = 0.f;
    int *pend = NULL; /* the counter to raise once this step's dQ share is written */
    for (int it = 0; it < niter; it++) {
        cp_wait<1>();
        __syncthreads(); /* tile it landed; every warp is done with step it-1 */
        if (pend && (WARPSEM ? lane == 0 : threadIdx.x == 0)) {
            __threadfence();
            atomicAdd(pend, 1);
        }
        pend = NULL;
        int h = hk * grp + it / nq, qb = kb + it % nq, buf = it % NBUF;
        size_t bh = (size_t)b * H + h;
        int need = qb - kb; /* shares of key blocks kb+1..qb come first */
        /* WARPSEM: one counter per warp's 16 dQ rows; polled now, used later */
        int *cnt = WARPSEM ? sem + (bh * nqb + qb) * 4 + w : sem + bh * nqb + qb;
        int seen = need;
        if (WARPSEM && lane == 0 && need > 0) seen = ld_relaxed(cnt);
        if (it + 2 < niter) KV2_ISSUE(it + 2);
        cp_commit();
        const bf *Qc = Qs + buf * TS(HD), *dOc = dOs + buf * TS(HD);
        const float *ls = lse_s + buf * BQ, *ds = di_s + buf * BQ;
        float p[8][4], dp[8][4];
        mma_rows<HD>(p, kf, Qc, lane); /* S^T: keys x queries */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qi = j * 8 + 2 * t + (e & 1);
                int key = w * 16 + g + (e >= 2 ? 8 : 0);
                float x = ex2(fmaf(p[j][e], sl2, -ls[qi]));
                p[j][e] = (qb == kb && key > qi) ? 0.f : x;
            }
        mma_acc_t<HD>(dva, p, dOc, lane); /* dV += P^T dO */
        mma_rows<HD>(dp, vf, dOc, lane);  /* dP^T = V dO^T */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dp[j][e] = p[j][e] * (dp[j][e] - ds[j * 8 + 2 * t + (e & 1)]);
        mma_acc_t<HD>(dka, dp, Qc, lane); /* dK += dS^T Q */
        bf *d0 = dSs + (w * 16 + g) * 72 + 2 * t, *d1 = d0 + 8 * 72;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            *(uint32_t *)(d0 + j * 8) = pack2(dp[j][0], dp[j][1]);
            *(uint32_t *)(d1 + j * 8) = pack2(dp[j][2], dp[j][3]);
        }
        if (!WARPSEM && threadIdx.x == 0 && need > 0)
            while (ld_acquire(cnt) < need)
                ;
        __syncthreads(); /* dS complete; (!WARPSEM) the shares before ours are in dqacc */
        if (WARPSEM && need > 0) {
            if (lane == 0 && seen < need)
                while (ld_acquire(cnt) < need)
                    ;
            __syncwarp();
        }
        /* warp w: dQ rows qb*64 + w*16 .. +15 = dS[rows][64 keys] K[64 keys][HD] */
        int qr = qb * BQ + w * 16 + g;
        float *acc0 = dqacc + (bh * T + qr) * HD + 2 * t, *acc1 = acc0 + 8 * HD;
#pragma unroll
        for (int c = 0; c < HD / DC; c++) {
            /* the running sum is loaded first (an L2 round trip) and the
             * share added onto it afterwards: the same fp32 order */
            float dqp[DC / 8][4];
#pragma unroll
            for (int j = 0; j < DC / 8; j++) {
                dqp[j][0] = dqp[j][1] = dqp[j][2] = dqp[j][3] = 0.f;
                if (need > 0) {
                    float2 e0 = __ldcg((const float2 *)(acc0 + c * DC + j * 8));
                    float2 e1 = __ldcg((const float2 *)(acc1 + c * DC + j * 8));
                    dqp[j][0] = e0.x, dqp[j][1] = e0.y, dqp[j][2] = e1.x, dqp[j][3] = e1.y;
                }
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t a[4];
                ldsm_x4_t(a, dSs + (kk * 16 + (mi >> 1) * 8 + r8) * 72 + w * 16 + (mi & 1) * 8);
#pragma unroll
                for (int j2 = 0; j2 < DC / 16; j2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, Ks + (kk * 16 + (mi & 1) * 8 + r8) * (HD + 8) + c * DC +
                                      (j2 * 2 + (mi >> 1)) * 8);
                    mma16816(dqp[2 * j2], a, bb);
                    mma16816(dqp[2 * j2 + 1], a, bb + 2);
                }
            }
#pragma unroll
            for (int jd = 0; jd < DC / 8; jd++) {
                int col = c * DC + jd * 8;
                float2 x = make_float2(dqp[jd][0], dqp[jd][1]);
                float2 y = make_float2(dqp[jd][2], dqp[jd][3]);
                if (kb > 0) {
                    __stcg((float2 *)(acc0 + col), x);
                    __stcg((float2 *)(acc1 + col), y);
                } else {
                    bf *p0 = dq + ((size_t)b * T + qr) * ldq + h * HD + col + 2 * t;
                    bf *p1 = p0 + (size_t)8 * ldq;
                    x.x *= scale, x.y *= scale, y.x *= scale, y.y *= scale;
                    if (add) {
                        float2 e0 = __bfloat1622float2(*(const __nv_bfloat162 *)p0);
                        float2 e1 = __bfloat1622float2(*(const __nv_bfloat162 *)p1);
                        x.x += e0.x, x.y += e0.y, y.x += e1.x, y.y += e1.y;
                    }
                    *(uint32_t *)p0 = pack2(x.x, x.y);
                    *(uint32_t *)p1 = pack2(y.x, y.y);
                }
            }
        }
        if (kb > 0) pend = cnt;
    }
#undef KV2_ISSUE
    if (pend) {
        if (WARPSEM)
            __syncwarp();
        else
            __syncthreads();
        if (WARPSEM ? lane == 0 : threadIdx.x == 0) {
            __threadfence();
            atomicAdd(pend, 1);
        }
    }
    store_rows<HD>(dk + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, dka, scale, scale, g, t, add);
    store_rows<HD>(dv + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, dva, 1.f, 1.f, g, t, add);
}

/* MINB: resident CTAs per SM the register budget aims at (speed only). */
template <int HD, int MINB, int WARPSEM>
__global__ void __launch_bounds__(NTHREADS, MINB)
    attn_bwd2_kernel(bf *dq, bf *dk, bf *dv, const bf *dout, const float *lse, const float *di,
                     float *dqacc, int *sem, const bf *q, const bf *k, const bf *v, int ldq,
                     int ldkv, int ldo, int T, int H, int Hkv, float sl2, float scale, int add) {
    attn_bwd2_body<HD, WARPSEM>(dq, dk, dv, dout, lse, di, dqacc, sem, q, k, v, ldq, ldkv, ldo, T,
                                H, Hkv, sl2, scale, add);
}

/* Kernel variants (the `var` argument of dev_attn_fwd / dev_attn_bwd), so
 * that one process can A/B them (bench_attn).
 * Forward: 0 and 1 the 64-query kernel at two register budgets (they differ
 * for hd 64 only), 2 and above (default) attn_fwd2_kernel for hd <= 64
 * (hd 128 keeps variant 0: two m-tiles would not fit in registers).
 * Backward: 0 and 1 the two-kernel scheme at two register budgets; 2 the
 * fused kernel with ordered dQ sums, 3 the same at 2 CTAs/SM, 4 the same with
 * per-warp counters polled early; 5 (default) variant 1's dK/dV kernel with
 * attn_bwd_q2_kernel for dQ (hd 128: variant 0). Results differ between
 * variants by rounding only, and each is bit-reproducible. */

template <int HD, int MINB>
static void fwd_launch(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                       int ldq, int ldkv, int ldo, int B, int T, int H, int Hkv, cudaStream_t st) {
    float sl2 = LOG2E / sqrtf((float)HD);
    dim3 grid(T / BQ, B * H);
    size_t smem = 4 * TS(HD) * sizeof(bf);
    CUDA_CHECK(cudaFuncSetAttribute((MINB ? attn_fwd_kernel_b<HD> : attn_fwd_kernel_a<HD>),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    (MINB ? attn_fwd_kernel_b<HD> : attn_fwd_kernel_a<HD>)<<<grid, NTHREADS, smem, st>>>(
        (bf *)out, lse, (const bf *)q, (const bf *)k, (const bf *)v, ldq, ldkv, ldo, T, H, Hkv, sl2,
        nullptr, 0);
    CUDA_CHECK_LAUNCH();
}

extern "C" void dev_attn_fwd(int var, lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k,
                             const lbf16 *v, int ld_q, int ld_kv, int ld_o, int B, int T, int H,
                             int Hkv, int hd, lcuda_stream s) {
    check_shape(T, H, Hkv, hd);
    cudaStream_t st = (cudaStream_t)s;
    if (hd == 32 && var >= 2)
        fwd2_launch<32>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st);
    else if (hd == 32)
        fwd_launch<32, 0>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st);
    if (hd == 64 && var >= 2)
        fwd2_launch<64>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st);
    else if (hd == 64 && var == 1)
        fwd_launch<64, 1>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st);
    else if (hd == 64)
        fwd_launch<64, 0>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st);
    if (hd == 128) fwd_launch<128, 0>(out, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, st);
}

/* Scratch: di [B][H][T] fp32, then scheme 2's dQ sums [B][H][T][hd] fp32
 * and counters [B][H][T/64][4 warps] int. */
extern "C" size_t dev_attn_scratch_bytes(int B, int T, int H, int Hkv, int hd) {
    (void)Hkv;
    size_t bht = (size_t)B * H * T;
    return bht * sizeof(float) * (1 + (size_t)hd) + (size_t)B * H * (T / 64) * 4 * sizeof(int);
}

template <int HD, int MINB, int WARPSEM>
static void bwd2_launch(lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch, const lbf16 *dout,
                        const float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v, int ldq,
                        int ldkv, int ldo, int B, int T, int H, int Hkv, int add, cudaStream_t st) {
    float scale = 1.f / sqrtf((float)HD), sl2 = LOG2E * scale;
    size_t bht = (size_t)B * H * T;
    float *di = scratch, *dqacc = scratch + bht;
    int *sem = (int *)(dqacc + bht * HD);
    size_t smem =
        (2 * NBUF * TS(HD) + TS(HD) + TS(64)) * sizeof(bf) + 2 * NBUF * BQ * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd2_kernel<HD, MINB, WARPSEM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attn_bwd2_kernel<HD, MINB, WARPSEM><<<dim3(T / BK, B * Hkv), NTHREADS, smem, st>>>(
        (bf *)dq, (bf *)dk, (bf *)dv, (const bf *)dout, lse, di, dqacc, sem, (const bf *)q,
        (const bf *)k, (const bf *)v, ldq, ldkv, ldo, T, H, Hkv, sl2, scale, add);
    CUDA_CHECK_LAUNCH();
}

extern "C" void dev_attn_bwd(int var, lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch,
                             const lbf16 *dout, const lbf16 *out, const float *lse, const lbf16 *q,
                             const lbf16 *k, const lbf16 *v, int ld_q, int ld_kv, int ld_o, int B,
                             int T, int H, int Hkv, int hd, int accumulate, lcuda_stream s) {
    check_shape(T, H, Hkv, hd);
    cudaStream_t st = (cudaStream_t)s;
    int N = B * T;
    int nsem = var >= 2 && var <= 4 ? B * H * (T / 64) * 4 : 0; /* the fused kernel's */
    int *sem = (int *)(scratch + (size_t)N * H * (1 + (size_t)hd));
    int nblk = (N * H + 7) / 8;
    if (nblk < (nsem + 255) / 256) nblk = (nsem + 255) / 256;
    attn_bwd_pre_kernel<<<nblk, 256, 0, st>>>(scratch, sem, nsem, (const bf *)dout, (const bf *)out,
                                              ld_o, N, T, H, hd);
    CUDA_CHECK_LAUNCH();
#define BWD_ARGS                                                                                   \
    dq, dk, dv, scratch, dout, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, accumulate, st
#define BWD_ARGS_KV                                                                                \
    NULL, dk, dv, scratch, dout, lse, q, k, v, ld_q, ld_kv, ld_o, B, T, H, Hkv, accumulate, st
#define BWD_ARGS_Q2                                                                                \
    (bf *)dq, (const bf *)dout, lse, scratch, (const bf *)q, (const bf *)k, (const bf *)v, ld_q,   \
        ld_kv, ld_o, T, H, Hkv, sl2, scale, accumulate, nullptr, 0
    if (var == 5 && hd <= 64) {
        float scale = 1.f / sqrtf((float)hd), sl2 = LOG2E * scale;
        if (hd == 32) bwd_launch<32, 0>(BWD_ARGS_KV);
        if (hd == 64) bwd_launch<64, 1>(BWD_ARGS_KV);
        size_t smem = 2 * NBUF * TS(64) * sizeof(bf);
        dim3 grid((T + 127) / 128, B * H);
        if (hd == 32) {
            CUDA_CHECK(cudaFuncSetAttribute(
                attn_bwd_q2_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            attn_bwd_q2_kernel<32><<<grid, NTHREADS, smem, st>>>(BWD_ARGS_Q2);
        } else {
            CUDA_CHECK(cudaFuncSetAttribute(
                attn_bwd_q2_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            attn_bwd_q2_kernel<64><<<grid, NTHREADS, smem, st>>>(BWD_ARGS_Q2);
        }
        CUDA_CHECK_LAUNCH();
    } else if (var == 5) { /* hd 128: the two-kernel scheme as before */
        bwd_launch<128, 0>(BWD_ARGS);
    } else if (var == 4) {
        if (hd == 32) bwd2_launch<32, 3, 1>(BWD_ARGS);
        if (hd == 64) bwd2_launch<64, 3, 1>(BWD_ARGS);
        if (hd == 128) bwd2_launch<128, 2, 1>(BWD_ARGS);
    } else if (var >= 2) {
        if (hd == 32) bwd2_launch<32, 3, 0>(BWD_ARGS);
        if (hd == 64 && var == 3) bwd2_launch<64, 2, 0>(BWD_ARGS);
        if (hd == 64 && var != 3) bwd2_launch<64, 3, 0>(BWD_ARGS);
        if (hd == 128) bwd2_launch<128, 2, 0>(BWD_ARGS);
    } else {
        if (hd == 32) bwd_launch<32, 0>(BWD_ARGS);
        if (hd == 64 && var == 1) bwd_launch<64, 1>(BWD_ARGS);
        if (hd == 64 && var != 1) bwd_launch<64, 0>(BWD_ARGS);
        if (hd == 128) bwd_launch<128, 0>(BWD_ARGS);
    }
#undef BWD_ARGS
#undef BWD_ARGS_KV
#undef BWD_ARGS_Q2
}

} // namespace dev_attn
