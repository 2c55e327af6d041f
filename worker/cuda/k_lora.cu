/* LoRA kernels: the strided column axpy (an adapter's product added into its
 * column range of a fused projection output, or that range gathered for the
 * backward), the adapter-input dropout with the mask of worker/lora_mask.h,
 * and that dropout fused into the adapter's x.A products (below). The first two are memory-bound
 * elementwise passes over [rows, cols] / n values; grid-stride loops, one element per thread step,
 * deterministic. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

#include "worker/cuda/k_lora.h"
#include "worker/lora_drop.h"
#include "worker/lora_mask.h"

typedef __nv_bfloat16 bf;
using namespace nvcuda;

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

/* ---- the same products on the tensor cores (WMMA m16n16k16, bf16 operands,
 * fp32 accumulation; sm_80 and later, every architecture Loom builds for).
 * The masked x is staged as bf16 (x / (1 - p) rounded once, as the copy path
 * rounds it), so the x.A and dA products cost the CUDA cores nothing but
 * the staging and the mask; the CUDA-core kernels above remain (tc = 0).
 * Each warp owns fixed output tiles and a fixed share of K, and shares are
 * added in warp order: deterministic. */

#define TC_THREADS 256 /* 8 warps */
#define TC_LDB                                                                                     \
    (LD_KC + 8)            /* bf16 row stride of the staged tiles (16-byte rows, fewer conflicts)  \
                            */
#define TC_LDF (LD_KC + 4) /* fp32 row stride of the staged results */

/* Staging in two phases, loads into registers first and the shared-memory
 * stores after them: a store through shared memory between two global loads
 * would order them (the compiler cannot tell the pointers apart), and the
 * loads of a step are then one memory latency, not one each. The next
 * step's loads are issued before this step's products (the registers as a
 * prefetch buffer). */
#define TC_QX (LD_BM * LD_KC / TC_THREADS) /* x elements a thread stages per step */

/* Rows s0 .. s0 + LD_BM (below n1), columns k0 .. k0 + LD_KC (below in) of
 * x into registers (zero outside). Thread t holds column t % LD_KC of rows
 * t / LD_KC + q TC_THREADS / LD_KC. */
__device__ static inline void tc_load_x(bf (&rx)[TC_QX], const bf *x, int ldx, int s0, int n1,
                                        int k0, int in) {
    int c = threadIdx.x % LD_KC, m0 = threadIdx.x / LD_KC;
#pragma unroll
    for (int q = 0; q < TC_QX; q++) {
        int n = s0 + m0 + q * (TC_THREADS / LD_KC);
        rx[q] = n < n1 && k0 + c < in ? x[(size_t)n * ldx + k0 + c] : __float2bfloat16(0.0f);
    }
}

/* drop() of the loaded values as bf16 into xs (row stride TC_LDB); the keep
 * bits into ks when not NULL. */
__device__ static inline void tc_put_x(bf *xs, unsigned char *ks, const bf (&rx)[TC_QX], int s0,
                                       int n1, int k0, int in, uint64_t mld, uint64_t moff,
                                       uint64_t seed, uint32_t thr, float k) {
    int c = threadIdx.x % LD_KC, m0 = threadIdx.x / LD_KC;
#pragma unroll
    for (int q = 0; q < TC_QX; q++) {
        int m = m0 + q * (TC_THREADS / LD_KC), n = s0 + m;
        int keep = n < n1 && k0 + c < in &&
                   lora_keep(seed, (uint64_t)n * mld + moff + (uint64_t)(k0 + c), thr);
        xs[m * TC_LDB + c] = __float2bfloat16(keep ? __bfloat162float(rx[q]) * k : 0.0f);
        if (ks) ks[m * LD_KC + c] = (unsigned char)keep;
    }
}

/* Rows 0 .. RP of A's columns k0 .. k0 + LD_KC (zero past r and in): into
 * registers, then into as (row stride TC_LDB). */
template <int RP>
__device__ static inline void tc_load_a(bf (&ra)[RP * LD_KC / TC_THREADS], const bf *A, int r,
                                        int k0, int in) {
    int c = threadIdx.x % LD_KC, j0 = threadIdx.x / LD_KC;
#pragma unroll
    for (int q = 0; q < RP * LD_KC / TC_THREADS; q++) {
        int j = j0 + q * (TC_THREADS / LD_KC);
        ra[q] = j < r && k0 + c < in ? A[(size_t)j * in + k0 + c] : __float2bfloat16(0.0f);
    }
}

template <int RP>
__device__ static inline void tc_put_a(bf *as, const bf (&ra)[RP * LD_KC / TC_THREADS]) {
    int c = threadIdx.x % LD_KC, j0 = threadIdx.x / LD_KC;
#pragma unroll
    for (int q = 0; q < RP * LD_KC / TC_THREADS; q++)
        as[(j0 + q * (TC_THREADS / LD_KC)) * TC_LDB + c] = ra[q];
}

/* H = alpha drop(x) A^T for LD_BM rows a block over input columns
 * blockIdx.y cols .. + cols: NT = 2 (RP / 16) output tiles; warp w computes
 * tile w % NT over the K sub-steps w / NT, w / NT + KS, ... of each LD_KC
 * step (KS = 8 / NT), and the KS shares are added in order at the end. One
 * range (gridDim.y 1): H in bf16; several: the range's fp32 partial into
 * part [gridDim.y][N][r], summed by lora_drop_hsum_kernel. */
template <int RP>
__global__ void __launch_bounds__(TC_THREADS)
    lora_drop_fwd_tc(bf *H, int ldh, float *part, int cols, const bf *x, int ldx, const bf *A,
                     int N, int in, int r, float alpha, uint64_t mld, uint64_t moff, uint64_t seed,
                     uint32_t thr, float k) {
    constexpr int NT = (LD_BM / 16) * (RP / 16), KS = 8 / NT, LDR = RP + 4;
    static_assert(NT * KS == 8, "8 warps");
    __shared__ __align__(32) bf xs[LD_BM * TC_LDB];
    __shared__ __align__(32) bf as[RP * TC_LDB];
    __shared__ __align__(32) float res[KS * LD_BM * LDR];
    int w = threadIdx.x / 32, tile = w % NT, kg = w / NT;
    int tm = tile / (RP / 16), tj = tile % (RP / 16), row0 = blockIdx.x * LD_BM;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    bf rx[TC_QX], ra[RP * LD_KC / TC_THREADS];
    int kb = blockIdx.y * cols, ke = kb + cols < in ? kb + cols : in;
    tc_load_x(rx, x, ldx, row0, N, kb, in);
    tc_load_a<RP>(ra, A, r, kb, in);
    for (int k0 = kb; k0 < ke; k0 += LD_KC) {
        tc_put_x(xs, NULL, rx, row0, N, k0, in, mld, moff, seed, thr, k);
        tc_put_a<RP>(as, ra);
        __syncthreads();
        if (k0 + LD_KC < ke) { /* the next step's loads, in flight during the products */
            tc_load_x(rx, x, ldx, row0, N, k0 + LD_KC, in);
            tc_load_a<RP>(ra, A, r, k0 + LD_KC, in);
        }
        for (int kk = kg; kk < LD_KC / 16; kk += KS) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::col_major> fb;
            wmma::load_matrix_sync(fa, xs + tm * 16 * TC_LDB + kk * 16, TC_LDB);
            wmma::load_matrix_sync(fb, as + tj * 16 * TC_LDB + kk * 16, TC_LDB);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(res + kg * LD_BM * LDR + tm * 16 * LDR + tj * 16, acc, LDR,
                            wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < LD_BM * RP; e += TC_THREADS) {
        int m = e / RP, j = e % RP, n = row0 + m;
        if (n >= N || j >= r) continue;
        float v = 0.0f;
#pragma unroll
        for (int g = 0; g < KS; g++)
            v += res[g * LD_BM * LDR + m * LDR + j];
        if (gridDim.y == 1)
            H[(size_t)n * ldh + j] = __float2bfloat16(alpha * v);
        else
            part[((size_t)blockIdx.y * N + n) * r + j] = v;
    }
}

/* H[n*ldh + j] = alpha * the sum over the K ranges, in order, of part. */
__global__ void lora_drop_hsum_kernel(bf *H, int ldh, const float *part, int N, int r, int splits,
                                      float alpha) {
    size_t n = (size_t)N * r;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < splits; s++)
            v += part[(size_t)s * n + e];
        H[(e / r) * ldh + e % r] = __float2bfloat16(alpha * v);
    }
}

/* The backward for input columns c0 .. c0 + LD_CT of one chunk of rows, in
 * steps of LD_BM rows. dA partial [RP, LD_CT] = dH^T drop(x) over the
 * chunk: NA = (RP / 16) * 4 tiles; with NA <= 8 warp w takes tile w % NA and
 * the row sub-steps w / NA, w / NA + KA, ... (KA = 8 / NA), with NA = 16
 * tiles w and w + 8; the KA shares added in order at the end. dx [LD_BM,
 * LD_CT] = dH A: 8 tiles, one a warp, through res to the masked add. A
 * step's x, dH and dx are loaded together (registers) before its stores. */
template <int RP>
__global__ void __launch_bounds__(TC_THREADS, 2)
    lora_drop_bwd_tc(float *part, bf *dx, int lddx, const bf *dH, int ldh, const bf *x, int ldx,
                     const bf *A, int N, int in, int r, int rows, uint64_t mld, uint64_t moff,
                     uint64_t seed, uint32_t thr, float k) {
    static_assert(LD_KC == LD_CT, "one staged tile shape");
    constexpr int NA = (RP / 16) * (LD_CT / 16), KA = NA >= 8 ? 1 : 8 / NA;
    constexpr int FA = NA > 8 ? NA / 8 : 1, LDH = RP + 8, QH = LD_BM * RP / TC_THREADS;
    static_assert(FA * 8 == NA * KA, "8 warps");
    __shared__ __align__(32) bf as[RP * TC_LDB];
    __shared__ __align__(32) bf xs[LD_BM * TC_LDB];
    __shared__ __align__(32) bf hs[LD_BM * LDH];
    __shared__ unsigned char ks[LD_BM * LD_CT];
    __shared__ __align__(32) float res[LD_BM * TC_LDF];
    __shared__ __align__(32) float pa[KA * RP * TC_LDF];
    int w = threadIdx.x / 32, c0 = blockIdx.x * LD_CT, chunk = blockIdx.y;
    int n0 = chunk * rows, n1 = n0 + rows < N ? n0 + rows : N;
    int kg = NA >= 8 ? 0 : w / NA;
    {
        bf ra[RP * LD_KC / TC_THREADS];
        tc_load_a<RP>(ra, A, r, c0, in);
        tc_put_a<RP>(as, ra);
    }
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FA];
#pragma unroll
    for (int f = 0; f < FA; f++)
        wmma::fill_fragment(acc[f], 0.0f);
    int dm = w / (LD_CT / 16), dc = w % (LD_CT / 16);  /* this warp's dx tile */
    int hj = threadIdx.x % RP, hm0 = threadIdx.x / RP; /* this thread's dH elements */
    int xc = threadIdx.x % LD_CT, xm0 = threadIdx.x / LD_CT;
    for (int s0 = n0; s0 < n1; s0 += LD_BM) {
        bf rx[TC_QX], rh[QH], rd[TC_QX];
        tc_load_x(rx, x, ldx, s0, n1, c0, in);
#pragma unroll
        for (int q = 0; q < QH; q++) {
            int m = hm0 + q * (TC_THREADS / RP), n = s0 + m;
            rh[q] = n < n1 && hj < r ? dH[(size_t)n * ldh + hj] : __float2bfloat16(0.0f);
        }
        if (dx)
#pragma unroll
            for (int q = 0; q < TC_QX; q++) {
                int n = s0 + xm0 + q * (TC_THREADS / LD_CT);
                rd[q] = n < n1 && c0 + xc < in ? dx[(size_t)n * lddx + c0 + xc]
                                               : __float2bfloat16(0.0f);
            }
#pragma unroll
        for (int q = 0; q < QH; q++)
            hs[(hm0 + q * (TC_THREADS / RP)) * LDH + hj] = rh[q];
        tc_put_x(xs, ks, rx, s0, n1, c0, in, mld, moff, seed, thr, k);
        __syncthreads();
#pragma unroll
        for (int f = 0; f < FA; f++) {
            int tile = NA >= 8 ? w + 8 * f : w % NA, tj = tile / (LD_CT / 16),
                tc = tile % (LD_CT / 16);
            for (int kk = kg; kk < LD_BM / 16; kk += KA) {
                /* dH^T: element (j, m) at hs[m * LDH + j], column-major */
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::col_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, hs + kk * 16 * LDH + tj * 16, LDH);
                wmma::load_matrix_sync(fb, xs + kk * 16 * TC_LDB + tc * 16, TC_LDB);
                wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
        if (dx) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> d;
            wmma::fill_fragment(d, 0.0f);
#pragma unroll
            for (int kk = 0; kk < RP / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, hs + dm * 16 * LDH + kk * 16, LDH);
                wmma::load_matrix_sync(fb, as + kk * 16 * TC_LDB + dc * 16, TC_LDB);
                wmma::mma_sync(d, fa, fb, d);
            }
            wmma::store_matrix_sync(res + dm * 16 * TC_LDF + dc * 16, d, TC_LDF,
                                    wmma::mem_row_major);
            __syncthreads();
#pragma unroll
            for (int q = 0; q < TC_QX; q++) {
                int m = xm0 + q * (TC_THREADS / LD_CT), n = s0 + m;
                if (n >= n1 || c0 + xc >= in || !ks[m * LD_CT + xc]) continue;
                dx[(size_t)n * lddx + c0 + xc] =
                    __float2bfloat16(__bfloat162float(rd[q]) + k * res[m * TC_LDF + xc]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int f = 0; f < FA; f++) {
        int tile = NA >= 8 ? w + 8 * f : w % NA, tj = tile / (LD_CT / 16), tc = tile % (LD_CT / 16);
        wmma::store_matrix_sync(pa + kg * RP * TC_LDF + tj * 16 * TC_LDF + tc * 16, acc[f], TC_LDF,
                                wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < RP * LD_CT; e += TC_THREADS) {
        int j = e / LD_CT, c = e % LD_CT;
        if (j >= r || c0 + c >= in) continue;
        float v = 0.0f;
#pragma unroll
        for (int g = 0; g < KA; g++)
            v += pa[g * RP * TC_LDF + j * TC_LDF + c];
        part[((size_t)chunk * r + j) * in + c0 + c] = v;
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
                                 uint64_t seed, uint64_t mld, uint64_t moff, float *ws, int tc,
                                 lcuda_stream s) {
    if (N < 1 || r < 1) return;
    int splits = 1, cols = in;
    if (tc) lora_drop_fsplit(N, in, &splits, &cols);
    dim3 grid((N + LD_BM - 1) / LD_BM, splits);
    cudaStream_t st = (cudaStream_t)s;
    uint32_t thr = lora_drop_threshold(p);
    float k = 1.0f / (1.0f - p);
    bf *h = (bf *)H;
    const bf *xx = (const bf *)x, *a = (const bf *)A;
#define FWD_TC(RP)                                                                                 \
    lora_drop_fwd_tc<RP><<<grid, TC_THREADS, 0, st>>>(h, ldh, ws, cols, xx, ldx, a, N, in, r,      \
                                                      alpha, mld, moff, seed, thr, k)
#define FWD(...)                                                                                   \
    lora_drop_fwd_kernel<__VA_ARGS__><<<grid, LD_THREADS, 0, st>>>(h, ldh, xx, ldx, a, N, in, r,   \
                                                                   alpha, mld, moff, seed, thr, k)
    int rp = ld_rp(r);
    if (tc && rp <= 16)
        FWD_TC(16);
    else if (tc && rp == 32)
        FWD_TC(32);
    else if (tc)
        FWD_TC(64);
    else if (rp == 8)
        FWD(8, 1, 1);
    else if (rp == 16)
        FWD(16, 2, 1);
    else if (rp == 32)
        FWD(32, 2, 2);
    else
        FWD(64, 2, 4);
#undef FWD
#undef FWD_TC
    CUDA_CHECK_LAUNCH();
    if (splits > 1) {
        size_t n = (size_t)N * r;
        lora_drop_hsum_kernel<<<lora_grid(n, 256), 256, 0, st>>>(h, ldh, ws, N, r, splits, alpha);
        CUDA_CHECK_LAUNCH();
    }
}

extern "C" void lk_lora_drop_bwd(uint16_t *dA, uint16_t *dx, int lddx, const uint16_t *dH, int ldh,
                                 const uint16_t *x, int ldx, const uint16_t *A, int N, int in,
                                 int r, float p, uint64_t seed, uint64_t mld, uint64_t moff,
                                 float *ws, int tc, lcuda_stream s) {
    if (N < 1 || in < 1 || r < 1) return;
    int chunks, rows;
    lora_drop_grid(N, in, &chunks, &rows);
    dim3 grid((in + LD_CT - 1) / LD_CT, chunks);
    cudaStream_t st = (cudaStream_t)s;
    uint32_t thr = lora_drop_threshold(p);
    float k = 1.0f / (1.0f - p);
    bf *d = (bf *)dx;
    const bf *h = (const bf *)dH, *xx = (const bf *)x, *a = (const bf *)A;
#define BWD(K, RP)                                                                                 \
    K<RP><<<grid, tc ? TC_THREADS : LD_THREADS, 0, st>>>(ws, d, lddx, h, ldh, xx, ldx, a, N, in,   \
                                                         r, rows, mld, moff, seed, thr, k)
    int rp = ld_rp(r);
    if (tc && rp <= 16)
        BWD(lora_drop_bwd_tc, 16);
    else if (tc && rp == 32)
        BWD(lora_drop_bwd_tc, 32);
    else if (tc)
        BWD(lora_drop_bwd_tc, 64);
    else if (rp == 8)
        BWD(lora_drop_bwd_kernel, 8);
    else if (rp == 16)
        BWD(lora_drop_bwd_kernel, 16);
    else if (rp == 32)
        BWD(lora_drop_bwd_kernel, 32);
    else
        BWD(lora_drop_bwd_kernel, 64);
#undef BWD
    CUDA_CHECK_LAUNCH();
    size_t n = (size_t)r * in;
    lora_drop_sum_kernel<<<lora_grid(n, 256), 256, 0, st>>>((bf *)dA, ws, n, chunks);
    CUDA_CHECK_LAUNCH();
}
