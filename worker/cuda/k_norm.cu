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

/* part[chunk][0..C) = sum dout * xhat, part[chunk][C..2C) = sum dout. */
__global__ void norm_bwd_wpart_kernel(float *part, const bf *dout, const bf *xin, const float *mean,
                                      const float *rstd, int N, int C, int rms) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (col >= C) return;
    int r0 = chunk * ROWCHK, r1 = min(N, r0 + ROWCHK);
    float sw = 0.f, sb = 0.f;
    for (int r = r0; r < r1; r++) {
        float g = __bfloat162float(dout[(size_t)r * C + col]);
        float x = __bfloat162float(xin[(size_t)r * C + col]);
        float mu = rms ? 0.f : mean[r];
        sw += g * (x - mu) * rstd[r];
        sb += g;
    }
    part[(size_t)chunk * 2 * C + col] = sw;
    part[(size_t)chunk * 2 * C + C + col] = sb;
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
    norm_fwd_kernel<<<(N + 7) / 8, 256, 0, (cudaStream_t)s>>>((bf *)out, mean, rstd, NULL,
                                                              (const bf *)x, NULL, (const bf *)w,
                                                              (const bf *)bias, N, C, eps, rms);
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
        norm_bwd_dx_kernel<<<(N + 7) / 8, 256, 0, st>>>((bf *)dx, (const bf *)dout, (const bf *)x,
                                                        (const bf *)w, mean, rstd, N, C, rms);
        CUDA_CHECK_LAUNCH();
    }
    if (!dw && !dbias) return;
    int nchunk = (N + ROWCHK - 1) / ROWCHK;
    dim3 grid((C + 127) / 128, nchunk);
    norm_bwd_wpart_kernel<<<grid, 128, 0, st>>>(scratch, (const bf *)dout, (const bf *)x, mean,
                                                rstd, N, C, rms);
    CUDA_CHECK_LAUNCH();
    norm_bwd_wfinal_kernel<<<(C + 255) / 256, 256, 0, st>>>((bf *)dw, (bf *)dbias, scratch, nchunk,
                                                            C);
    CUDA_CHECK_LAUNCH();
}
