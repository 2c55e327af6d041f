/* Kernels of generation with a key/value cache and of imported models'
 * RoPE (backend.h "imported models and generation"): rotary embedding at
 * explicit positions or with a table of inverse frequencies (RoPE scaling),
 * and the attention of one new query row per head against a bf16 cache.
 *
 * RoPE: without a table the angle is computed exactly as k_elem.cu's
 * training kernel computes it (fp32 powf, then sincosf of pos * freq), so a
 * row rotated at position p during decoding has the bits the training
 * forward gives row p of a sequence; the scores of a prompt and the keys its
 * decode steps cache agree.
 *
 * Decode attention is split-K ("flash decoding"): the n cached rows are cut
 * into nsplit chunks of at least DEC_MIN_CHUNK rows; block (h, s) runs an
 * online softmax over chunk s for query head h (each of its DEC_WARPS warps
 * takes every DEC_WARPS-th row; the 32 lanes split the head dimension), the
 * warps are merged in shared memory in warp order, and with nsplit > 1 a
 * second kernel merges the chunks in chunk order. Scores, the softmax and the
 * weighted sum are fp32; only the output is rounded to bf16. The split
 * depends on n alone and every sum has a fixed order: the same inputs give
 * the same bits. No atomics. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "worker/cuda/kernels.h"

typedef __nv_bfloat16 bf;

#define DEC_WARPS     4
#define DEC_MAX_E     (LK_DECODE_MAX_HD / 32) /* head elements per lane */
#define DEC_MIN_CHUNK 64

static int dec_grid(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    return (int)(g > 65535 * 8 ? 65535 * 8 : (g ? g : 1));
}

/* One thread per (row, head, pair i < hd/2); row r has position
 * pos0 + (T > 0 ? r % T : r). */
__global__ void rope_ex_kernel(bf *x, int N, int T, int pos0, int H, int hd, int ld, float theta,
                               const float *inv, float sign) {
    int half = hd / 2;
    size_t n = (size_t)N * H * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t rh = idx / half;
        int h = (int)(rh % H);
        size_t row = rh / H;
        int pos = pos0 + (T > 0 ? (int)(row % T) : (int)row);
        /* the same expression as k_elem.cu's rope_kernel when there is no table */
        float freq = inv ? inv[i] : powf(theta, -2.0f * i / hd);
        float sn, cs;
        sincosf(pos * freq, &sn, &cs);
        sn *= sign;
        bf *p = x + row * ld + (size_t)h * hd;
        float a = __bfloat162float(p[i]), b = __bfloat162float(p[i + half]);
        p[i] = __float2bfloat16(a * cs - b * sn);
        p[i + half] = __float2bfloat16(b * cs + a * sn);
    }
}

extern "C" void lk_rope_ex(lbf16 *x, int N, int T, int pos0, int n_heads, int hd, int ld,
                           float theta, const float *inv, int inverse, lcuda_stream s) {
    size_t n = (size_t)N * n_heads * (hd / 2);
    if (!n) return;
    rope_ex_kernel<<<dec_grid(n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)x, N, T, pos0, n_heads, hd, ld, theta, inv, inverse ? -1.f : 1.f);
    CUDA_CHECK_LAUNCH();
}

/* The rows of chunk s: [s * chunk, min(n, (s + 1) * chunk)). */
static void dec_split(int n, int *chunk, int *nsplit) {
    int c = (n + LK_DECODE_MAX_SPLIT - 1) / LK_DECODE_MAX_SPLIT;
    if (c < DEC_MIN_CHUNK) c = DEC_MIN_CHUNK;
    *chunk = c;
    *nsplit = (n + c - 1) / c;
}

/* Block (h = blockIdx.x, s = blockIdx.y), DEC_WARPS warps. With one chunk
 * the output row of head h is written; otherwise the chunk's unnormalised
 * sum, its max and its sum of weights go to part[(h * nsplit + s) *
 * (HD + 2) ...]. */
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attn_decode_kernel(bf *out, float *part, const bf *q, const bf *kv, int n, int NH, int NKV,
                       int HD, int chunk, float scale) {
    __shared__ float s_m[DEC_WARPS], s_l[DEC_WARPS];
    __shared__ float s_acc[DEC_WARPS][LK_DECODE_MAX_HD];
    int h = blockIdx.x, sp = blockIdx.y, nsplit = gridDim.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = h / (NH / NKV);
    size_t S = (size_t)2 * NKV * HD;
    const bf *kb = kv + (size_t)g * HD, *vb = kv + (size_t)(NKV + g) * HD;
    float qf[DEC_MAX_E], acc[DEC_MAX_E];
#pragma unroll
    for (int e = 0; e < DEC_MAX_E; e++) {
        int d = lane + 32 * e;
        qf[e] = d < HD ? __bfloat162float(q[(size_t)h * HD + d]) : 0.f;
        acc[e] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    int t0 = sp * chunk, t1 = t0 + chunk < n ? t0 + chunk : n;
    for (int t = t0 + warp; t < t1; t += DEC_WARPS) {
        const bf *kr = kb + (size_t)t * S, *vr = vb + (size_t)t * S;
        float sc = 0.f;
#pragma unroll
        for (int e = 0; e < DEC_MAX_E; e++) {
            int d = lane + 32 * e;
            if (d < HD) sc += qf[e] * __bfloat162float(kr[d]);
        }
        /* a tree to lane 0, then lane 0's value to all: every lane uses the
         * same score (a butterfly would give lanes differently rounded sums) */
        for (int o = 16; o > 0; o >>= 1)
            sc += __shfl_down_sync(0xffffffffu, sc, o);
        sc = __shfl_sync(0xffffffffu, sc, 0) * scale;
        float mn = fmaxf(m, sc);
        float corr = expf(m - mn), p = expf(sc - mn);
        l = l * corr + p;
#pragma unroll
        for (int e = 0; e < DEC_MAX_E; e++) {
            int d = lane + 32 * e;
            float v = d < HD ? __bfloat162float(vr[d]) : 0.f;
            acc[e] = acc[e] * corr + p * v;
        }
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < DEC_MAX_E; e++) {
        int d = lane + 32 * e;
        if (d < HD) s_acc[warp][d] = acc[e];
    }
    __syncthreads();
    float M = s_m[0];
    for (int w = 1; w < DEC_WARPS; w++)
        M = fmaxf(M, s_m[w]);
    /* a warp without rows has m = -inf: its factor is exp(-inf) = 0 (M is
     * finite: every chunk has at least one row) */
    float f[DEC_WARPS], L = 0.f;
    for (int w = 0; w < DEC_WARPS; w++) {
        f[w] = expf(s_m[w] - M);
        L += s_l[w] * f[w];
    }
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < DEC_WARPS; w++)
            a += s_acc[w][d] * f[w];
        if (nsplit == 1)
            out[(size_t)h * HD + d] = __float2bfloat16(a / L);
        else
            part[((size_t)h * nsplit + sp) * (HD + 2) + d] = a;
    }
    if (nsplit > 1 && threadIdx.x == 0) {
        part[((size_t)h * nsplit + sp) * (HD + 2) + HD] = M;
        part[((size_t)h * nsplit + sp) * (HD + 2) + HD + 1] = L;
    }
}

/* Block h merges head h's nsplit chunks in chunk order. */
__global__ void attn_decode_merge(bf *out, const float *part, int HD, int nsplit) {
    int h = blockIdx.x;
    const float *p = part + (size_t)h * nsplit * (HD + 2);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++)
        M = fmaxf(M, p[(size_t)s * (HD + 2) + HD]);
    float L = 0.f;
    for (int s = 0; s < nsplit; s++)
        L += p[(size_t)s * (HD + 2) + HD + 1] * expf(p[(size_t)s * (HD + 2) + HD] - M);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < nsplit; s++)
            a += p[(size_t)s * (HD + 2) + d] * expf(p[(size_t)s * (HD + 2) + HD] - M);
        out[(size_t)h * HD + d] = __float2bfloat16(a / L);
    }
}

extern "C" size_t lk_attn_decode_scratch_bytes(int NH, int HD) {
    return (size_t)NH * LK_DECODE_MAX_SPLIT * (size_t)(HD + 2) * sizeof(float);
}

extern "C" void lk_attn_decode(lbf16 *out, float *scratch, const lbf16 *q, const lbf16 *kv, int n,
                               int NH, int NKV, int HD, lcuda_stream s) {
    int chunk, nsplit;
    dec_split(n, &chunk, &nsplit);
    dim3 grid((unsigned)NH, (unsigned)nsplit);
    attn_decode_kernel<<<grid, DEC_WARPS * 32, 0, (cudaStream_t)s>>>(
        (bf *)out, scratch, (const bf *)q, (const bf *)kv, n, NH, NKV, HD, chunk,
        1.0f / sqrtf((float)HD));
    CUDA_CHECK_LAUNCH();
    if (nsplit > 1) {
        int threads = HD < 128 ? 64 : 128;
        attn_decode_merge<<<NH, threads, 0, (cudaStream_t)s>>>((bf *)out, scratch, HD, nsplit);
        CUDA_CHECK_LAUNCH();
    }
}
