/* The norm code shared by worker/cuda/k_norm.cu (the kernels the product
 * launches) and dev/cuda/norm_variants.cu (the generations that lost a
 * measurement, benched against them): the warp reductions and 16-byte bf16
 * vector loads and stores, the first generation's kernels (the product's wide
 * fallback), the one-pass forward and backward kernels (generation 1) and the
 * backward's launch. The scheme is described at the top of k_norm.cu.
 *
 * Include after <cuda_bf16.h>, <cuda_runtime.h> and worker/cuda/kernels.h.
 * The header has no includes of its own so that dev/cuda/norm_variants.cu can
 * include it inside its namespace (the kernels there keep these names without
 * colliding with the product's at link time). */
#pragma once

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

/* Row vectors as a uint4 (variants 1-4), so that loads and stores are 16
 * bytes: bf8, a struct of __nv_bfloat162, is copied member by member (4-byte
 * loads and stores in the PTX; variant 0 keeps them). bf16 -> fp32 is exact:
 * the bits shifted into the high half. */
__device__ __forceinline__ uint4 ldv(const bf *p) {
    return *(const uint4 *)p;
}
__device__ __forceinline__ void stv(bf *p, uint4 v) {
    *(uint4 *)p = v;
}
__device__ __forceinline__ void unpack2(float *f, unsigned u) {
    f[0] = __uint_as_float(u << 16);
    f[1] = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void unpack8(float *f, uint4 v) {
    unpack2(f, v.x);
    unpack2(f + 2, v.y);
    unpack2(f + 4, v.z);
    unpack2(f + 6, v.w);
}
__device__ __forceinline__ unsigned pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b); /* .x (a) in the low half */
    return *reinterpret_cast<unsigned *>(&h);
}
__device__ __forceinline__ uint4 pack8(const float *f) {
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}

/* The first kernels' loads and stores: WIDE (variant 4 and the fallbacks
 * of 1-3) through uint4, else through bf8 (variant 0); same values. */
template <bool WIDE> __device__ __forceinline__ void ld8(float *f, const bf *p) {
    if constexpr (WIDE)
        unpack8(f, ldv(p));
    else
        load8(f, p);
}
template <bool WIDE> __device__ __forceinline__ void st8(bf *p, const float *f) {
    if constexpr (WIDE)
        stv(p, pack8(f));
    else
        store8(p, f);
}

/* res (when a2 != NULL): res = a + a2 rounded to bf16, and the norm is taken
 * of the rounded sum (what the next layer reads). */
template <bool WIDE>
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
            ld8<WIDE>(fx, x + i);
            ld8<WIDE>(fy, y + i);
            for (int j = 0; j < 8; j++)
                fx[j] += fy[j];
            st8<WIDE>(r + i, fx);
        }
        __syncwarp();
        x = r;
    }
    float s = 0.f;
    if (!rms) {
        for (int i = lane * 8; i < C; i += 256) {
            float f[8];
            ld8<WIDE>(f, x + i);
            for (int j = 0; j < 8; j++)
                s += f[j];
        }
        s = warp_sum(s);
    }
    float mu = rms ? 0.f : s / C;
    float v = 0.f;
    for (int i = lane * 8; i < C; i += 256) {
        float f[8];
        ld8<WIDE>(f, x + i);
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
        ld8<WIDE>(f, x + i);
        ld8<WIDE>(fw, w + i);
        if (bias)
            ld8<WIDE>(fb, bias + i);
        else
            for (int j = 0; j < 8; j++)
                fb[j] = 0.f;
        for (int j = 0; j < 8; j++)
            f[j] = (f[j] - mu) * rstd * fw[j] + fb[j];
        st8<WIDE>(o + i, f);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mu;
        rstd_out[row] = rstd;
    }
}

/* dx += rstd * (dn - mean(dn) - xhat * mean(dn * xhat)), dn = dout * w
 * (RMSNorm drops the mean(dn) term and uses xhat = x * rstd). */
template <bool WIDE>
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
        ld8<WIDE>(fx, x + i);
        ld8<WIDE>(fg, g + i);
        ld8<WIDE>(fw, w + i);
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
        ld8<WIDE>(fx, x + i);
        ld8<WIDE>(fg, g + i);
        ld8<WIDE>(fw, w + i);
        ld8<WIDE>(fd, d + i);
        for (int j = 0; j < 8; j++) {
            float xh = (fx[j] - mu) * rs;
            fd[j] += rs * (fg[j] * fw[j] - s1 - xh * s2);
        }
        st8<WIDE>(d + i, fd);
    }
}

/* Row-in-registers variants for C = 256 * NV (NV <= 8): one read of the
 * row instead of three (forward) or two (backward); same arithmetic order
 * per lane as the generic kernels. */
template <int NV, bool WIDE>
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
        ld8<WIDE>(f[k], x + lane * 8 + k * 256);
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
        ld8<WIDE>(fw, w + i);
        if (bias) ld8<WIDE>(fb, bias + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            f[k][j] = (f[k][j] - mu) * rstd * fw[j] + fb[j];
        st8<WIDE>(o + i, f[k]);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mu;
        rstd_out[row] = rstd;
    }
}

template <int NV, bool WIDE>
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
        ld8<WIDE>(xh[k], x + i);
        ld8<WIDE>(dn[k], g + i);
        ld8<WIDE>(fw, w + i);
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
        ld8<WIDE>(fd, d + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            fd[j] += rs * (dn[k][j] - s1 - xh[k][j] * s2);
        st8<WIDE>(d + i, fd);
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
template <bool WIDE>
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
            ld8<WIDE>(g, dout + (size_t)r * C + c0);
            ld8<WIDE>(x, xin + (size_t)r * C + c0);
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

/* ---- variants 1 and 2 ---- */

/* Largest C the one-pass kernels hold in registers (8 vectors a lane). */
#define V1_MAXC 2048

static int v1_nv(int C) {
    return C <= V1_MAXC ? (C + 255) / 256 : 0;
}

/* Forward for any C <= 256 * NV: lane `lane` holds columns k*256 + lane*8 +
 * [0, 8) of its row (k < NV; vectors past C are skipped) as bf16, so x is
 * read once and the row costs 4 registers a vector. RES: res = bf16(a + a2)
 * is written and normalised (as variant 0). For NV <= 4 the weight and bias
 * loads are issued with the row's, ahead of the reductions. Same per-lane
 * arithmetic order as norm_fwd_kernel. */
template <int NV, bool RES>
__global__ void __launch_bounds__(256, NV <= 3 ? 4 : 1)
    norm_fwd_v1_kernel(bf *out, float *mean_out, float *rstd_out, bf *res, const bf *a,
                       const bf *a2, const bf *w, const bf *bias, int N, int C, float eps,
                       int rms) {
    constexpr bool EARLY_W = NV <= 4;
    int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    uint4 px[NV], pw[EARLY_W ? NV : 1], pb[EARLY_W ? NV : 1];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = k * 256 + lane * 8;
        if (c < C) {
            px[k] = ldv(a + off + c);
            if constexpr (EARLY_W) {
                pw[k] = ldv(w + c);
                if (bias) pb[k] = ldv(bias + c);
            }
        }
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = k * 256 + lane * 8;
        if (c >= C) continue;
        float f[8];
        unpack8(f, px[k]);
        if constexpr (RES) {
            float fy[8];
            unpack8(fy, ldv(a2 + off + c));
#pragma unroll
            for (int j = 0; j < 8; j++)
                f[j] += fy[j];
            px[k] = pack8(f);
            stv(res + off + c, px[k]);
            unpack8(f, px[k]);
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            s += f[j];
    }
    float mu = rms ? 0.f : warp_sum(s) / C;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if (k * 256 + lane * 8 >= C) continue;
        float f[8];
        unpack8(f, px[k]);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float d = f[j] - mu;
            v += d * d;
        }
    }
    v = warp_sum(v);
    float rstd = rsqrtf(v / C + eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = k * 256 + lane * 8;
        if (c >= C) continue;
        float f[8], fw[8], fb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        unpack8(f, px[k]);
        if constexpr (EARLY_W) {
            unpack8(fw, pw[k]);
            if (bias) unpack8(fb, pb[k]);
        } else {
            unpack8(fw, ldv(w + c));
            if (bias) unpack8(fb, ldv(bias + c));
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            f[j] = (f[j] - mu) * rstd * fw[j] + fb[j];
        stv(out + off + c, pack8(f));
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mu;
        rstd_out[row] = rstd;
    }
}

/* One-pass backward. CTA b owns rows [b*R, b*R + R); warp q of W takes rows
 * b*R + q, + W, ... in order. Per row (lane columns as in the forward):
 * dx += rstd * (dn - mean(dn) - xhat * mean(dn * xhat)) with the arithmetic
 * of norm_bwd_dx_kernel, and the warp adds dout * xhat and dout (LayerNorm
 * only) to its column sums: registers (SACC false) or a warp-private slice
 * of shared memory (SACC true; each lane touches only its own float4s, so no
 * barrier is needed until the end). Then the W warp sums of each column are
 * added in warp order and part[b][0, C) = dw sums, part[b][C, 2C) = db sums.
 * Shared layout: float4 [W][2 (dw, db)][NV][2 (column halves)][32 lanes],
 * so a warp's float4 accesses hit 32 consecutive float4s (no conflicts). */
template <int NV, int W, int R, bool SACC, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
    norm_bwd_v1_kernel(bf *dx, float *part, const bf *dout, const bf *xin, const bf *w,
                       const float *mean, const float *rstd, int N, int C, int rms) {
    constexpr int SLICE = NV * 64; /* float4s of one warp's dw (or db) sums */
    constexpr bool EARLY_DX = NV <= 3;
    extern __shared__ float4 sh4[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r0 = blockIdx.x * R, r1 = min(N, r0 + R);
    float4 *mw = sh4 + (size_t)warp * 2 * SLICE, *mb = mw + SLICE;
    float aw[SACC ? 1 : NV][8], ab[SACC ? 1 : NV][8];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if constexpr (SACC) {
            float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
            mw[(2 * k) * 32 + lane] = z;
            mw[(2 * k + 1) * 32 + lane] = z;
            mb[(2 * k) * 32 + lane] = z;
            mb[(2 * k + 1) * 32 + lane] = z;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                aw[k][j] = ab[k][j] = 0.f;
        }
    }
    for (int r = r0 + warp; r < r1; r += W) {
        size_t off = (size_t)r * C;
        uint4 px[NV], pg[NV], pd[EARLY_DX ? NV : 1];
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int c = k * 256 + lane * 8;
            if (c < C) {
                px[k] = ldv(xin + off + c);
                pg[k] = ldv(dout + off + c);
                if constexpr (EARLY_DX) {
                    if (dx) pd[k] = ldv(dx + off + c);
                }
            }
        }
        float mu = rms ? 0.f : mean[r], rs = rstd[r];
        float s1 = 0.f, s2 = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int c = k * 256 + lane * 8;
            if (c >= C) continue;
            float fx[8], fg[8], fw[8];
            unpack8(fx, px[k]);
            unpack8(fg, pg[k]);
            unpack8(fw, ldv(w + c));
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float dn = fg[j] * fw[j];
                float xh = (fx[j] - mu) * rs;
                s1 += dn;
                s2 += dn * xh;
            }
        }
        /* both butterflies at once (same sums as two warp_sum calls) */
        for (int o = 16; o > 0; o >>= 1) {
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        }
        s1 /= C;
        s2 /= C;
        if (rms) s1 = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int c = k * 256 + lane * 8;
            if (c >= C) continue;
            float fx[8], fg[8], fw[8], xh[8];
            unpack8(fx, px[k]);
            unpack8(fg, pg[k]);
            unpack8(fw, ldv(w + c));
#pragma unroll
            for (int j = 0; j < 8; j++)
                xh[j] = (fx[j] - mu) * rs;
            if (dx) {
                float fd[8];
                if constexpr (EARLY_DX)
                    unpack8(fd, pd[k]);
                else
                    unpack8(fd, ldv(dx + off + c));
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float dn = fg[j] * fw[j];
                    fd[j] += rs * (dn - s1 - xh[j] * s2);
                }
                stv(dx + off + c, pack8(fd));
            }
            if constexpr (SACC) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float4 *pw4 = &mw[(2 * k + h) * 32 + lane];
                    float4 t = *pw4;
                    t.x += fg[4 * h] * xh[4 * h];
                    t.y += fg[4 * h + 1] * xh[4 * h + 1];
                    t.z += fg[4 * h + 2] * xh[4 * h + 2];
                    t.w += fg[4 * h + 3] * xh[4 * h + 3];
                    *pw4 = t;
                    if (!rms) {
                        float4 *pb4 = &mb[(2 * k + h) * 32 + lane];
                        float4 u = *pb4;
                        u.x += fg[4 * h];
                        u.y += fg[4 * h + 1];
                        u.z += fg[4 * h + 2];
                        u.w += fg[4 * h + 3];
                        *pb4 = u;
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    aw[k][j] += fg[j] * xh[j];
                    ab[k][j] += fg[j];
                }
            }
        }
    }
    if constexpr (!SACC) {
#pragma unroll
        for (int k = 0; k < NV; k++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mw[(2 * k + h) * 32 + lane] =
                    make_float4(aw[k][4 * h], aw[k][4 * h + 1], aw[k][4 * h + 2], aw[k][4 * h + 3]);
                mb[(2 * k + h) * 32 + lane] =
                    make_float4(ab[k][4 * h], ab[k][4 * h + 1], ab[k][4 * h + 2], ab[k][4 * h + 3]);
            }
    }
    __syncthreads();
    /* float4 q of array a (0 dw, 1 db) holds columns 4q .. 4q+3: vector
     * k = q / 64 of lane (q % 64) / 2, half q % 2 */
    float *pr = part + (size_t)blockIdx.x * 2 * C;
    for (int t = threadIdx.x; t < 2 * SLICE; t += W * 32) {
        int a = t / SLICE, q = t % SLICE, col = 4 * q;
        if (col >= C) continue;
        int idx = a * SLICE + ((q / 64) * 2 + (q & 1)) * 32 + (q % 64) / 2;
        float4 acc = sh4[idx];
        for (int y = 1; y < W; y++) {
            float4 u = sh4[(size_t)y * 2 * SLICE + idx];
            acc.x += u.x;
            acc.y += u.y;
            acc.z += u.z;
            acc.w += u.w;
        }
        *(float4 *)(pr + (size_t)a * C + col) = acc;
    }
}

/* dw[c] += sum over the nblk partial rows of part[.][c], db[c] likewise
 * from part[.][C + c]; columns below ncol (C without db, else 2C). A CTA
 * takes 32 columns; warp g adds rows
 * g, g + 16, ... in order, then the 16 warp sums are added in warp order. */
__global__ void __launch_bounds__(512)
    norm_bwd_wsum_kernel(bf *dw, bf *db, const float *part, int nblk, int C, int ncol) {
    __shared__ float sh[16][33];
    int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    int col = blockIdx.x * 32 + lane;
    float s = 0.f;
    if (col < ncol) {
#pragma unroll 8
        for (int p = g; p < nblk; p += 16)
            s += part[(size_t)p * 2 * C + col];
    }
    sh[g][lane] = s;
    __syncthreads();
    if (g != 0 || col >= ncol) return;
    float t = 0.f;
#pragma unroll
    for (int q = 0; q < 16; q++)
        t += sh[q][lane];
    bf *d = col < C ? dw : db;
    int c = col < C ? col : col - C;
    if (d) d[c] = __float2bfloat16(__bfloat162float(d[c]) + t);
}

static size_t v1_smem(int nv, int W) {
    return (size_t)W * 2 * nv * 64 * sizeof(float4);
}

template <int NV, int W, int R, bool SACC, int MINB>
static void v1_bwd_launch(bf *dx, float *part, const bf *dout, const bf *x, const bf *w,
                          const float *mean, const float *rstd, int N, int C, int rms,
                          cudaStream_t st) {
    size_t smem = v1_smem(NV, W);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(norm_bwd_v1_kernel<NV, W, R, SACC, MINB>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    norm_bwd_v1_kernel<NV, W, R, SACC, MINB>
        <<<(N + R - 1) / R, W * 32, smem, st>>>(dx, part, dout, x, w, mean, rstd, N, C, rms);
    CUDA_CHECK_LAUNCH();
}
