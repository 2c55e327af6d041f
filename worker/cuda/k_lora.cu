/* LoRA kernels: the strided column axpy (an adapter's product added into its
 * column range of a fused projection output, or that range gathered for the
 * backward), the adapter-input dropout with the mask of worker/lora_mask.h,
 * and that dropout fused into the adapter's x.A products (below). The first two are memory-bound
 * elementwise passes over [rows, cols] / n values; grid-stride loops, one element per thread step,
 * deterministic. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "worker/cuda/k_lora.h"
#include "worker/lora_drop.h"
#include "worker/lora_mask.h"

typedef __nv_bfloat16 bf;

static int lora_grid(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    return (int)(g > 65535 * 8 ? 65535 * 8 : (g ? g : 1));
}

__global__ void lora_axpy_2d_kernel(bf *dst, int ldd, const bf *src, int lds, int rows, int cols,
                                    float alpha, int beta) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, c = i % cols;
        bf *d = dst + r * ldd + c;
        float v = alpha * __bfloat162float(src[r * lds + c]);
        if (beta) v += __bfloat162float(*d);
        *d = __float2bfloat16(v);
    }
}

extern "C" void lk_lora_axpy_2d(uint16_t *dst, int ldd, const uint16_t *src, int lds, int rows,
                                int cols, float alpha, int beta, lcuda_stream s) {
    size_t n = (size_t)rows * cols;
    if (!n) return;
    lora_axpy_2d_kernel<<<lora_grid(n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)dst, ldd, (const bf *)src, lds, rows, cols, alpha, beta);
    CUDA_CHECK_LAUNCH();
}

__global__ void lora_dropout_kernel(bf *out, const bf *inp, size_t n, uint32_t thr, float k,
                                    uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = __bfloat162float(inp[i]);
        out[i] = __float2bfloat16(lora_keep(seed, i, thr) ? v * k : 0.0f);
    }
}

extern "C" void lk_lora_dropout(uint16_t *out, const uint16_t *inp, size_t n, float p,
                                uint64_t seed, lcuda_stream s) {
    if (!n) return;
    lora_dropout_kernel<<<lora_grid(n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)out, (const bf *)inp, n, lora_drop_threshold(p), 1.0f / (1.0f - p), seed);
    CUDA_CHECK_LAUNCH();
}

/* ---- dropout fused into the adapter's x.A products (backend.h lora_drop_*)
 *
 * Both kernels read the adapter input x once and apply the mask in
 * registers as they stage it in shared memory: element (n, c) is kept when
 * lora_keep(seed, n * mld + moff + c, thr), kept values are scaled by
 * k = 1 / (1 - p). fp32 arithmetic on CUDA cores (K = in for the forward,
 * r <= 64 for the backward's input gradient: memory-bound, not worth the
 * tensor cores' staging), bf16 in and out. RP: r rounded up to 8, 16, 32 or
 * 64 (the rows past r of the staged A are zero). */

#define LD_THREADS 256
#define LD_KC      64           /* forward: input columns per step (128-byte rows of x) */
#define LD_BM      LORA_DROP_BM /* rows per block (forward) and per step (backward) */
#define LD_CT      LORA_DROP_CT /* backward: input columns per block (worker/lora_drop.h) */

__device__ static inline float ld_masked(const bf *x, int ldx, int n, int c, uint64_t mld,
                                         uint64_t moff, uint64_t seed, uint32_t thr, float k) {
    float v = __bfloat162float(x[(size_t)n * ldx + c]);
    return lora_keep(seed, (uint64_t)n * mld + moff + (uint64_t)c, thr) ? v * k : 0.0f;
}

/* H[n, j] = alpha * sum_c drop(x)[n, c] A[j, c]: one block per LD_BM rows;
 * thread (rg, cg) holds rows rg + i RG (i < TM) and columns cg + q CG
 * (q < TJ) of the block's [LD_BM, RP] tile, summed over c in order. */
template <int RP, int TM, int TJ>
__global__ void __launch_bounds__(LD_THREADS)
    lora_drop_fwd_kernel(bf *H, int ldh, const bf *x, int ldx, const bf *A, int N, int in, int r,
                         float alpha, uint64_t mld, uint64_t moff, uint64_t seed, uint32_t thr,
                         float k) {
    constexpr int CG = RP / TJ, RG = LD_THREADS / CG;
    static_assert(RG * TM == LD_BM, "tile shape");
    __shared__ float xs[LD_BM][LD_KC + 1];
    __shared__ float as[RP][LD_KC + 1];
    int t = threadIdx.x, cg = t % CG, rg = t / CG, row0 = blockIdx.x * LD_BM;
    float acc[TM][TJ];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int q = 0; q < TJ; q++)
            acc[i][q] = 0.0f;
    for (int k0 = 0; k0 < in; k0 += LD_KC) {
        for (int e = t; e < RP * LD_KC; e += LD_THREADS) {
            int j = e / LD_KC, c = e % LD_KC;
            as[j][c] = j < r && k0 + c < in ? __bfloat162float(A[(size_t)j * in + k0 + c]) : 0.0f;
        }
        for (int e = t; e < LD_BM * LD_KC; e += LD_THREADS) {
            int m = e / LD_KC, c = e % LD_KC, n = row0 + m;
            xs[m][c] =
                n < N && k0 + c < in ? ld_masked(x, ldx, n, k0 + c, mld, moff, seed, thr, k) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int c = 0; c < LD_KC; c++) {
            float xv[TM], av[TJ];
#pragma unroll
            for (int i = 0; i < TM; i++)
                xv[i] = xs[rg + i * RG][c];
#pragma unroll
            for (int q = 0; q < TJ; q++)
                av[q] = as[cg + q * CG][c];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int q = 0; q < TJ; q++)
                    acc[i][q] = fmaf(xv[i], av[q], acc[i][q]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int q = 0; q < TJ; q++) {
            int n = row0 + rg + i * RG, j = cg + q * CG;
            if (n < N && j < r) H[(size_t)n * ldh + j] = __float2bfloat16(alpha * acc[i][q]);
        }
}

/* One block: input columns c0 .. c0 + LD_CT of one chunk of rows, in steps
 * of LD_BM rows. part[chunk][j][c] = sum over the chunk's rows, in order, of
 * dH[n, j] drop(x)[n, c]; dx[n, c] += keep(n, c) k sum_j dH[n, j] A[j, c]. */
template <int RP>
__global__ void __launch_bounds__(LD_THREADS)
    lora_drop_bwd_kernel(float *part, bf *dx, int lddx, const bf *dH, int ldh, const bf *x, int ldx,
                         const bf *A, int N, int in, int r, int rows, uint64_t mld, uint64_t moff,
                         uint64_t seed, uint32_t thr, float k) {
    constexpr int JQ = RP / 4; /* dA rows per thread: j = jg + 4 q (jg < 4) */
    static_assert(LD_THREADS / LD_CT == 4, "four row groups");
    __shared__ float as[RP][LD_CT + 1];
    __shared__ float xs[LD_BM][LD_CT + 1];
    __shared__ float hs[LD_BM][RP + 1];
    __shared__ unsigned char ks[LD_BM][LD_CT];
    int t = threadIdx.x, c = t % LD_CT, jg = t / LD_CT;
    int c0 = blockIdx.x * LD_CT, chunk = blockIdx.y;
    int n0 = chunk * rows, n1 = n0 + rows < N ? n0 + rows : N;
    for (int e = t; e < RP * LD_CT; e += LD_THREADS) {
        int j = e / LD_CT, cc = e % LD_CT;
        as[j][cc] = j < r && c0 + cc < in ? __bfloat162float(A[(size_t)j * in + c0 + cc]) : 0.0f;
    }
    float acc[JQ];
#pragma unroll
    for (int q = 0; q < JQ; q++)
        acc[q] = 0.0f;
    for (int s0 = n0; s0 < n1; s0 += LD_BM) {
        for (int e = t; e < LD_BM * RP; e += LD_THREADS) {
            int m = e / RP, j = e % RP, n = s0 + m;
            hs[m][j] = n < n1 && j < r ? __bfloat162float(dH[(size_t)n * ldh + j]) : 0.0f;
        }
        for (int e = t; e < LD_BM * LD_CT; e += LD_THREADS) {
            int m = e / LD_CT, cc = e % LD_CT, n = s0 + m;
            float v = 0.0f;
            unsigned char keep = 0;
            if (n < n1 && c0 + cc < in) {
                v = __bfloat162float(x[(size_t)n * ldx + c0 + cc]);
                keep = (unsigned char)lora_keep(
                    seed, (uint64_t)n * mld + moff + (uint64_t)(c0 + cc), thr);
                v = keep ? v * k : 0.0f;
            }
            xs[m][cc] = v;
            ks[m][cc] = keep;
        }
        __syncthreads();
#pragma unroll 4
        for (int m = 0; m < LD_BM; m++) {
            float xv = xs[m][c];
#pragma unroll
            for (int q = 0; q < JQ; q++)
                acc[q] = fmaf(hs[m][jg + 4 * q], xv, acc[q]);
        }
        if (dx && c0 + c < in) {
            for (int m = jg; m < LD_BM; m += LD_THREADS / LD_CT) {
                int n = s0 + m;
                if (n >= n1) break;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < RP; j++)
                    s = fmaf(hs[m][j], as[j][c], s);
                bf *d = dx + (size_t)n * lddx + c0 + c;
                if (ks[m][c]) *d = __float2bfloat16(__bfloat162float(*d) + k * s);
            }
        }
        __syncthreads();
    }
    if (c0 + c < in)
#pragma unroll
        for (int q = 0; q < JQ; q++) {
            int j = jg + 4 * q;
            if (j < r) part[((size_t)chunk * r + j) * in + c0 + c] = acc[q];
        }
}

/* dA[e] += sum over chunks, in order, of part[chunk][e] (e < r in). */
__global__ void lora_drop_sum_kernel(bf *dA, const float *part, size_t n, int chunks) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int ch = 0; ch < chunks; ch++)
            s += part[(size_t)ch * n + e];
        dA[e] = __float2bfloat16(__bfloat162float(dA[e]) + s);
    }
}

static int ld_rp(int r) {
    return r <= 8 ? 8 : r <= 16 ? 16 : r <= 32 ? 32 : 64;
}

extern "C" size_t lk_lora_drop_ws_bytes(int N, int in, int r) {
    return lora_drop_ws_bytes(N, in, r);
}

extern "C" void lk_lora_drop_fwd(uint16_t *H, int ldh, const uint16_t *x, int ldx,
                                 const uint16_t *A, int N, int in, int r, float alpha, float p,
                                 uint64_t seed, uint64_t mld, uint64_t moff, lcuda_stream s) {
    if (N < 1 || r < 1) return;
    dim3 grid((N + LD_BM - 1) / LD_BM);
    cudaStream_t st = (cudaStream_t)s;
    uint32_t thr = lora_drop_threshold(p);
    float k = 1.0f / (1.0f - p);
    bf *h = (bf *)H;
    const bf *xx = (const bf *)x, *a = (const bf *)A;
    switch (ld_rp(r)) {
    case 8:
        lora_drop_fwd_kernel<8, 1, 1><<<grid, LD_THREADS, 0, st>>>(h, ldh, xx, ldx, a, N, in, r,
                                                                   alpha, mld, moff, seed, thr, k);
        break;
    case 16:
        lora_drop_fwd_kernel<16, 2, 1><<<grid, LD_THREADS, 0, st>>>(h, ldh, xx, ldx, a, N, in, r,
                                                                    alpha, mld, moff, seed, thr, k);
        break;
    case 32:
        lora_drop_fwd_kernel<32, 2, 2><<<grid, LD_THREADS, 0, st>>>(h, ldh, xx, ldx, a, N, in, r,
                                                                    alpha, mld, moff, seed, thr, k);
        break;
    default:
        lora_drop_fwd_kernel<64, 2, 4><<<grid, LD_THREADS, 0, st>>>(h, ldh, xx, ldx, a, N, in, r,
                                                                    alpha, mld, moff, seed, thr, k);
        break;
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_lora_drop_bwd(uint16_t *dA, uint16_t *dx, int lddx, const uint16_t *dH, int ldh,
                                 const uint16_t *x, int ldx, const uint16_t *A, int N, int in,
                                 int r, float p, uint64_t seed, uint64_t mld, uint64_t moff,
                                 float *ws, lcuda_stream s) {
    if (N < 1 || in < 1 || r < 1) return;
    int chunks, rows;
    lora_drop_grid(N, in, &chunks, &rows);
    dim3 grid((in + LD_CT - 1) / LD_CT, chunks);
    cudaStream_t st = (cudaStream_t)s;
    uint32_t thr = lora_drop_threshold(p);
    float k = 1.0f / (1.0f - p);
    bf *d = (bf *)dx;
    const bf *h = (const bf *)dH, *xx = (const bf *)x, *a = (const bf *)A;
    switch (ld_rp(r)) {
    case 8:
        lora_drop_bwd_kernel<8><<<grid, LD_THREADS, 0, st>>>(ws, d, lddx, h, ldh, xx, ldx, a, N, in,
                                                             r, rows, mld, moff, seed, thr, k);
        break;
    case 16:
        lora_drop_bwd_kernel<16><<<grid, LD_THREADS, 0, st>>>(ws, d, lddx, h, ldh, xx, ldx, a, N,
                                                              in, r, rows, mld, moff, seed, thr, k);
        break;
    case 32:
        lora_drop_bwd_kernel<32><<<grid, LD_THREADS, 0, st>>>(ws, d, lddx, h, ldh, xx, ldx, a, N,
                                                              in, r, rows, mld, moff, seed, thr, k);
        break;
    default:
        lora_drop_bwd_kernel<64><<<grid, LD_THREADS, 0, st>>>(ws, d, lddx, h, ldh, xx, ldx, a, N,
                                                              in, r, rows, mld, moff, seed, thr, k);
        break;
    }
    CUDA_CHECK_LAUNCH();
    size_t n = (size_t)r * in;
    lora_drop_sum_kernel<<<lora_grid(n, 256), 256, 0, st>>>((bf *)dA, ws, n, chunks);
    CUDA_CHECK_LAUNCH();
}
