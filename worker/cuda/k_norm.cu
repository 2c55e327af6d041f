/* LayerNorm and RMSNorm, forward (optionally fused with the residual add)
 * and backward. One warp per row, 16-byte loads (C must be a multiple of 8),
 * statistics in fp32. The weight/bias gradients are column sums computed in
 * a second, deterministic pass (row chunks, then a fixed-order sum), so no
 * float atomics are used. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/cuda/kernels.h"

#define ROWCHK 128

typedef __nv_bfloat16 bf;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

struct __align__(16) bf8 {
    __nv_bfloat162 h[4];
};

__device__ __forceinline__ void load8(float *f, const bf *p) {
    bf8 v = *(const bf8 *)p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(v.h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void store8(bf *p, const float *f) {
    bf8 v;
#pragma unroll
    for (int i = 0; i < 4; i++)
        v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *(bf8 *)p = v;
}

/* res (when a2 != NULL): res = a + a2 rounded to bf16, and the norm is taken
 * of the rounded sum (what the next layer reads). */
__global__ void norm_fwd_kernel(bf *out, float *mean_out, float *rstd_out, bf *res, const bf *a,
                                const bf *a2, const bf *w, const bf *bias, int N, int C, float eps,
                                int rms) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf *x = a + (size_t)row * C;
    if (a2) {
        const bf *y = a2 + (size_t)row * C;
        bf *r = res + (size_t)row * C;
        for (int i = lane * 8; i < C; i += 256) {
            float fx[8], fy[8];
            load8(fx, x + i);
            load8(fy, y + i);
            for (int j = 0; j < 8; j++)
                fx[j] += fy[j];
            store8(r + i, fx);
        }
        __syncwarp();
        x = r;
    }
    float s = 0.f;
    if (!rms) {
        for (int i = lane * 8; i < C; i += 256) {
            float f[8];
            load8(f, x + i);
            for (int j = 0; j < 8; j++)
                s += f[j];
        }
        s = warp_sum(s);
    }
    float mu = rms ? 0.f : s / C;
    float v = 0.f;
    for (int i = lane * 8; i < C; i += 256) {
        float f[8];
        load8(f, x + i);
        for (int j = 0; j < 8; j++) {
            float d = f[j] - mu;
            v += d * d;
        }
    }
    v = warp_sum(v);
    float rstd = rsqrtf(v / C + eps);
    bf *o = out + (size_t)row * C;
    for (int i = lane * 8; i < C; i += 256) {
        float f[8], fw[8], fb[8];
        load8(f, x + i);
        load8(fw, w + i);
        if (bias)
            load8(fb, bias + i);
        else
            for (int j = 0; j < 8; j++)
                fb[j] = 0.f;
        for (int j = 0; j < 8; j++)
            f[j] = (f[j] - mu) * rstd * fw[j] + fb[j];
        store8(o + i, f);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mu;
        rstd_out[row] = rstd;
    }
}

/* dx += rstd * (dn - mean(dn) - xhat * mean(dn * xhat)), dn = dout * w
 * (RMSNorm drops the mean(dn) term and uses xhat = x * rstd). */
__global__ void norm_bwd_dx_kernel(bf *dx, const bf *dout, const bf *xin, const bf *w,
                                   const float *mean, const float *rstd, int N, int C, int rms) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf *x = xin + (size_t)row * C, *g = dout + (size_t)row * C;
    float mu = rms ? 0.f : mean[row], rs = rstd[row];
    float s1 = 0.f, s2 = 0.f;
    for (int i = lane * 8; i < C; i += 256) {
        float fx[8], fg[8], fw[8];
        load8(fx, x + i);
        load8(fg, g + i);
        load8(fw, w + i);
        for (int j = 0; j < 8; j++) {
            float dn = fg[j] * fw[j];
            s1 += dn;
            s2 += dn * (fx[j] - mu) * rs;
        }
    }
    s1 = warp_sum(s1) / C;
    s2 = warp_sum(s2) / C;
    if (rms) s1 = 0.f;
    bf *d = dx + (size_t)row * C;
    for (int i = lane * 8; i < C; i += 256) {
        float fx[8], fg[8], fw[8], fd[8];
        load8(fx, x + i);
        load8(fg, g + i);
        load8(fw, w + i);
        load8(fd, d + i);
        for (int j = 0; j < 8; j++) {
            float xh = (fx[j] - mu) * rs;
            fd[j] += rs * (fg[j] * fw[j] - s1 - xh * s2);
        }
        store8(d + i, fd);
    }
}

/* Row-in-registers variants for C = 256 * NV (NV <= 8): one read of the
 * row instead of three (forward) or two (backward); same arithmetic order
 * per lane as the generic kernels. */
template <int NV>
__global__ void norm_fwd_reg_kernel(bf *out, float *mean_out, float *rstd_out, const bf *a,
                                    const bf *w, const bf *bias, int N, float eps, int rms) {
    constexpr int C = NV * 256;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf *x = a + (size_t)row * C;
    float f[NV][8];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        load8(f[k], x + lane * 8 + k * 256);
#pragma unroll
        for (int j = 0; j < 8; j++)
            s += f[k][j];
    }
    float mu = rms ? 0.f : warp_sum(s) / C;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float d = f[k][j] - mu;
            v += d * d;
        }
    v = warp_sum(v);
    float rstd = rsqrtf(v / C + eps);
    bf *o = out + (size_t)row * C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = lane * 8 + k * 256;
        float fw[8], fb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        load8(fw, w + i);
        if (bias) load8(fb, bias + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            f[k][j] = (f[k][j] - mu) * rstd * fw[j] + fb[j];
        store8(o + i, f[k]);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mu;
        rstd_out[row] = rstd;
    }
}

template <int NV>
__global__ void norm_bwd_dx_reg_kernel(bf *dx, const bf *dout, const bf *xin, const bf *w,
                                       const float *mean, const float *rstd, int N, int rms) {
    constexpr int C = NV * 256;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf *x = xin + (size_t)row * C, *g = dout + (size_t)row * C;
    float mu = rms ? 0.f : mean[row], rs = rstd[row];
    float xh[NV][8], dn[NV][8];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = lane * 8 + k * 256;
        float fw[8];
        load8(xh[k], x + i);
        load8(dn[k], g + i);
        load8(fw, w + i);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            dn[k][j] *= fw[j];
            xh[k][j] = (xh[k][j] - mu) * rs;
            s1 += dn[k][j];
            s2 += dn[k][j] * xh[k][j];
        }
    }
    s1 = warp_sum(s1) / C;
    s2 = warp_sum(s2) / C;
    if (rms) s1 = 0.f;
    bf *d = dx + (size_t)row * C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = lane * 8 + k * 256;
        float fd[8];
        load8(fd, d + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            fd[j] += rs * (dn[k][j] - s1 - xh[k][j] * s2);
        store8(d + i, fd);
    }
}

/* NV for the register variants, or 0 for the generic kernels. */
static int reg_nv(int C) {
    return (C % 256 == 0 && C / 256 >= 1 && C / 256 <= 8) ? C / 256 : 0;
}

#define NV_SWITCH(nv, CALL)                                                                        \
    switch (nv) {                                                                                  \
    case 1:                                                                                        \
        CALL(1);                                                                                   \
        break;                                                                                     \
    case 2:                                                                                        \
        CALL(2);                                                                                   \
        break;                                                                                     \
    case 3:                                                                                        \
        CALL(3);                                                                                   \
        break;                                                                                     \
    case 4:                                                                                        \
        CALL(4);                                                                                   \
        break;                                                                                     \
    case 5:                                                                                        \
        CALL(5);                                                                                   \
        break;                                                                                     \
    case 6:                                                                                        \
        CALL(6);                                                                                   \
        break;                                                                                     \
    case 7:                                                                                        \
        CALL(7);                                                                                   \
        break;                                                                                     \
    default:                                                                                       \
        CALL(8);                                                                                   \
        break;                                                                                     \
    }

/* part[chunk][0..C) = sum dout * xhat, part[chunk][C..2C) = sum dout over
 * the chunk's rows; 256 columns a block (8 per thread, 16-byte loads) and 8
 * row lanes reduced through shared memory in a fixed order. */
__global__ void __launch_bounds__(256)
    norm_bwd_wpart_kernel(float *part, const bf *dout, const bf *xin, const float *mean,
                          const float *rstd, int N, int C, int rms) {
    __shared__ float shw[8][256], shb[8][256];
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int c0 = blockIdx.x * 256 + tx * 8;
    int chunk = blockIdx.y;
    int r0 = chunk * ROWCHK, r1 = min(N, r0 + ROWCHK);
    float sw[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    float sb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (c0 < C) {
        for (int r = r0 + ty; r < r1; r += 8) {
            float g[8], x[8];
            load8(g, dout + (size_t)r * C + c0);
            load8(x, xin + (size_t)r * C + c0);
            float mu = rms ? 0.f : mean[r], rs = rstd[r];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                sw[j] += g[j] * (x[j] - mu) * rs;
                sb[j] += g[j];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        shw[ty][tx * 8 + j] = sw[j];
        shb[ty][tx * 8 + j] = sb[j];
    }
    __syncthreads();
    int col = blockIdx.x * 256 + threadIdx.x;
    if (col < C) {
        float a = 0.f, b = 0.f;
        for (int y = 0; y < 8; y++) {
            a += shw[y][threadIdx.x];
            b += shb[y][threadIdx.x];
        }
        part[(size_t)chunk * 2 * C + col] = a;
        part[(size_t)chunk * 2 * C + C + col] = b;
    }
}

__global__ void norm_bwd_wfinal_kernel(bf *dw, bf *db, const float *part, int nchunk, int C) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= C) return;
    float sw = 0.f, sb = 0.f;
    for (int c = 0; c < nchunk; c++) {
        sw += part[(size_t)c * 2 * C + col];
        sb += part[(size_t)c * 2 * C + C + col];
    }
    if (dw) dw[col] = __float2bfloat16(__bfloat162float(dw[col]) + sw);
    if (db) db[col] = __float2bfloat16(__bfloat162float(db[col]) + sb);
}

static void check_c(int C) {
    if (C % 8) lcuda_fail(__FILE__, __LINE__, "norm", "C must be a multiple of 8");
}

extern "C" void lk_norm_fwd(lbf16 *out, float *mean, float *rstd, const lbf16 *x, const lbf16 *w,
                            const lbf16 *bias, int N, int C, float eps, int rms, lcuda_stream s) {
    check_c(C);
    int nv = reg_nv(C);
    if (nv) {
#define FWD_REG(NV)                                                                                \
    norm_fwd_reg_kernel<NV><<<(N + 7) / 8, 256, 0, (cudaStream_t)s>>>(                             \
        (bf *)out, mean, rstd, (const bf *)x, (const bf *)w, (const bf *)bias, N, eps, rms)
        NV_SWITCH(nv, FWD_REG);
#undef FWD_REG
    } else {
        norm_fwd_kernel<<<(N + 7) / 8, 256, 0, (cudaStream_t)s>>>(
            (bf *)out, mean, rstd, NULL, (const bf *)x, NULL, (const bf *)w, (const bf *)bias, N, C,
            eps, rms);
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_residual_norm_fwd(lbf16 *res, lbf16 *out, float *mean, float *rstd,
                                     const lbf16 *a, const lbf16 *b, const lbf16 *w,
                                     const lbf16 *bias, int N, int C, float eps, int rms,
                                     lcuda_stream s) {
    check_c(C);
    norm_fwd_kernel<<<(N + 7) / 8, 256, 0, (cudaStream_t)s>>>(
        (bf *)out, mean, rstd, (bf *)res, (const bf *)a, (const bf *)b, (const bf *)w,
        (const bf *)bias, N, C, eps, rms);
    CUDA_CHECK_LAUNCH();
}

extern "C" size_t lk_norm_scratch_bytes(int N, int C) {
    return (size_t)((N + ROWCHK - 1) / ROWCHK) * 2 * C * sizeof(float);
}

extern "C" void lk_norm_bwd(lbf16 *dx, lbf16 *dw, lbf16 *dbias, float *scratch, const lbf16 *dout,
                            const lbf16 *x, const lbf16 *w, const float *mean, const float *rstd,
                            int N, int C, int rms, lcuda_stream s) {
    check_c(C);
    cudaStream_t st = (cudaStream_t)s;
    if (dx) {
        int nv = reg_nv(C);
        if (nv) {
#define BWD_REG(NV)                                                                                \
    norm_bwd_dx_reg_kernel<NV><<<(N + 7) / 8, 256, 0, st>>>(                                       \
        (bf *)dx, (const bf *)dout, (const bf *)x, (const bf *)w, mean, rstd, N, rms)
            NV_SWITCH(nv, BWD_REG);
#undef BWD_REG
        } else {
            norm_bwd_dx_kernel<<<(N + 7) / 8, 256, 0, st>>>(
                (bf *)dx, (const bf *)dout, (const bf *)x, (const bf *)w, mean, rstd, N, C, rms);
        }
        CUDA_CHECK_LAUNCH();
    }
    if (!dw && !dbias) return;
    int nchunk = (N + ROWCHK - 1) / ROWCHK;
    dim3 grid((C + 255) / 256, nchunk);
    norm_bwd_wpart_kernel<<<grid, 256, 0, st>>>(scratch, (const bf *)dout, (const bf *)x, mean,
                                                rstd, N, C, rms);
    CUDA_CHECK_LAUNCH();
    norm_bwd_wfinal_kernel<<<(C + 255) / 256, 256, 0, st>>>((bf *)dw, (bf *)dbias, scratch, nchunk,
                                                            C);
    CUDA_CHECK_LAUNCH();
}
