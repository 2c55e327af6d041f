/* The attention device code shared by worker/cuda/k_attn.cu (the kernels the
 * product launches) and dev/cuda/attn_variants.cu (the variants that lost a
 * measurement, benched against them): the mma/ldmatrix/cp.async wrappers, the
 * tile loaders, the 64-query forward and backward bodies and their kernels,
 * the 128-query forward and dQ kernels, and the shape check and launches of
 * the forward2 and two-kernel backward. The scheme and fragment layouts
 * are described at the top of k_attn.cu.
 *
 * Documents packed in a row (train.packing "document"): every kernel takes a
 * template flag DOC and ds, the document start of each row ([B*T], a
 * position within the row's sequence, non-decreasing along it and <= the
 * row's own position). With DOC a query attends to the keys from its
 * document's start up to itself: the causal mask gains key < ds[query].
 * skip = 1 also leaves out the key tiles (forward, dQ) and query tiles (dK /
 * dV) that lie wholly outside every row's document (the attn-doc-skip row);
 * skip = 0 runs every tile the causal kernels run and masks. A row of an
 * m-tile can then see whole tiles of masked keys before its document starts:
 * the running max stays -inf, so the forward's exp2 offsets use 0 in its
 * place (no inf - inf). Without DOC (ds NULL) the code is the causal kernels'.
 *
 * Include after <cuda_bf16.h>, <cuda_runtime.h>, <math.h> and
 * worker/cuda/kernels.h. The header has no includes of its own so that
 * dev/cuda/attn_variants.cu can include it inside its namespace (the kernels
 * there keep these names without colliding with the product's at link time). */
#pragma once

typedef __nv_bfloat16 bf;

#define BQ       64 /* queries per CTA / tile */
#define BK       64 /* keys per tile */
#define NTHREADS 128
#define LOG2E    1.4426950408889634f
#define LN2      0.6931471805599453f

__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
__device__ __forceinline__ uint32_t ld32(const bf *p) {
    return *(const uint32_t *)p;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t *r, const bf *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const bf *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* Start copying a [64][HD] tile from global rows (stride ld) into a
 * row-major shared tile (stride HD+8) with 16-byte cp.async. */
template <int HD> __device__ __forceinline__ void tile_async(bf *dst, const bf *src, int ld) {
    constexpr int CH = HD / 8; /* 16-byte chunks per row */
    for (int c = threadIdx.x; c < 64 * CH; c += NTHREADS) {
        int r = c / CH, col = (c % CH) * 8;
        cp_async16(dst + r * (HD + 8) + col, src + (size_t)r * ld + col);
    }
}

/* A fragments of a 16-row slab (rows r0.., stride ld) of a global matrix. */
template <int HD>
__device__ __forceinline__ void load_afrag(uint32_t (*f)[4], const bf *src, int ld, int g, int t) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        f[kk][0] = ld32(src + (size_t)g * ld + kk * 16 + 2 * t);
        f[kk][1] = ld32(src + (size_t)(g + 8) * ld + kk * 16 + 2 * t);
        f[kk][2] = ld32(src + (size_t)g * ld + kk * 16 + 8 + 2 * t);
        f[kk][3] = ld32(src + (size_t)(g + 8) * ld + kk * 16 + 8 + 2 * t);
    }
}

/* acc[8][4] (16 x 64) = A (16 x HD, fragments) . R^T where R is a row-major
 * shared tile [64][HD+8]: R's rows are the B operand's columns, read with
 * ldmatrix (four 8x8 matrices = two k-steps of one n-tile per load). */
template <int HD>
__device__ __forceinline__ void mma_rows(float (*acc)[4], const uint32_t (*a)[4], const bf *R,
                                         int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
        for (int k2 = 0; k2 < HD / 32; k2++) {
            uint32_t b[4];
            ldsm_x4(b, R + (j * 8 + (lane & 7)) * (HD + 8) + k2 * 32 + (lane >> 3) * 8);
            mma16816(acc[j], a[2 * k2], b);
            mma16816(acc[j], a[2 * k2 + 1], b + 2);
        }
    }
}

/* out[HD/8][4] (16 x HD) += P (16 x 64, accumulator layout) . M where M is a
 * row-major shared tile [64][HD+8] (read transposed with ldmatrix.trans). */
template <int HD>
__device__ __forceinline__ void mma_acc_t(float (*out)[4], const float (*p)[4], const bf *M,
                                          int lane) {
    int mi = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        a[0] = pack2(p[2 * kk][0], p[2 * kk][1]);
        a[1] = pack2(p[2 * kk][2], p[2 * kk][3]);
        a[2] = pack2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[3] = pack2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int j2 = 0; j2 < HD / 16; j2++) {
            uint32_t b[4];
            ldsm_x4_t(b, M + (kk * 16 + (mi & 1) * 8 + r) * (HD + 8) + (j2 * 2 + (mi >> 1)) * 8);
            mma16816(out[2 * j2], a, b);
            mma16816(out[2 * j2 + 1], a, b + 2);
        }
    }
}

/* Write (add = 0) or add into (add = 1) rows g and g+8 of a 16-row slab. */
template <int HD>
__device__ __forceinline__ void store_rows(bf *dst, int ld, const float (*acc)[4], float s0,
                                           float s1, int g, int t, int add) {
#pragma unroll
    for (int jd = 0; jd < HD / 8; jd++) {
        bf *p0 = dst + (size_t)g * ld + jd * 8 + 2 * t, *p1 = p0 + (size_t)8 * ld;
        float x0 = acc[jd][0] * s0, x1 = acc[jd][1] * s0;
        float y0 = acc[jd][2] * s1, y1 = acc[jd][3] * s1;
        if (add) {
            float2 e0 = __bfloat1622float2(*(const __nv_bfloat162 *)p0);
            float2 e1 = __bfloat1622float2(*(const __nv_bfloat162 *)p1);
            x0 += e0.x, x1 += e0.y, y0 += e1.x, y1 += e1.y;
        }
        *(uint32_t *)p0 = pack2(x0, x1);
        *(uint32_t *)p1 = pack2(y0, y1);
    }
}

#define TS(HD) (64 * ((HD) + 8)) /* elements of one padded [64][HD] tile */

template <int HD, bool DOC = false>
__device__ __forceinline__ void
attn_fwd_body(bf *out, float *lse, const bf *q, const bf *k, const bf *v, int ldq, int ldkv,
              int ldo, int T, int H, int Hkv, float sl2, const int *ds = nullptr, int skip = 0) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Ks = (bf *)smem;      /* [2][64][HD+8] */
    bf *Vs = Ks + 2 * TS(HD); /* [2][64][HD+8] */
    int nqb = T / BQ;
    int qb = nqb - 1 - blockIdx.x;
    int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int q0 = qb * BQ + w * 16;
    int ds0 = 0, ds1 = 0, kb0 = 0; /* DOC: rows g, g+8's document starts; first key tile */
    if (DOC) {
        ds0 = ds[(size_t)b * T + q0 + g];
        ds1 = ds[(size_t)b * T + q0 + g + 8];
        if (skip) kb0 = ds[(size_t)b * T + qb * BQ] / BK;
    }
    const bf *kbase = k + (size_t)b * T * ldkv + hk * HD;
    const bf *vbase = v + (size_t)b * T * ldkv + hk * HD;
    tile_async<HD>(Ks, kbase + (size_t)kb0 * BK * ldkv, ldkv);
    tile_async<HD>(Vs, vbase + (size_t)kb0 * BK * ldkv, ldkv);
    cp_commit();
    uint32_t qf[HD / 16][4];
    load_afrag<HD>(qf, q + ((size_t)b * T + q0) * ldq + h * HD, ldq, g, t);
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    for (int kb = kb0; kb <= qb; kb++) {
        int cb = (kb - kb0) & 1; /* this tile's buffer */
        if (kb < qb) {
            int nb = cb ^ 1;
            tile_async<HD>(Ks + nb * TS(HD), kbase + (size_t)(kb + 1) * BK * ldkv, ldkv);
            tile_async<HD>(Vs + nb * TS(HD), vbase + (size_t)(kb + 1) * BK * ldkv, ldkv);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const bf *Kc = Ks + cb * TS(HD), *Vc = Vs + cb * TS(HD);
        float s[8][4];
        mma_rows<HD>(s, qf, Kc, lane);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[j][e] * sl2;
                if (kb == qb) {
                    int key = j * 8 + 2 * t + (e & 1), qr = w * 16 + g + (e >= 2 ? 8 : 0);
                    if (key > qr) x = -INFINITY;
                }
                if (DOC && kb * BK + j * 8 + 2 * t + (e & 1) < (e >= 2 ? ds1 : ds0)) x = -INFINITY;
                s[j][e] = x;
            }
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        float u0 = n0, u1 = n1; /* the exp2 offsets */
        if (DOC) {              /* rows that have seen no key of their document yet */
            u0 = n0 == -INFINITY ? 0.f : n0;
            u1 = n1 == -INFINITY ? 0.f : n1;
        }
        float a0 = exp2f(m0 - u0), a1 = exp2f(m1 - u1);
        m0 = n0;
        m1 = n1;
        float r0 = 0.f, r1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[j][0] = exp2f(s[j][0] - u0);
            s[j][1] = exp2f(s[j][1] - u0);
            s[j][2] = exp2f(s[j][2] - u1);
            s[j][3] = exp2f(s[j][3] - u1);
            r0 += s[j][0] + s[j][1];
            r1 += s[j][2] + s[j][3];
        }
        l0 = l0 * a0 + r0;
        l1 = l1 * a1 + r1;
#pragma unroll
        for (int jd = 0; jd < HD / 8; jd++) {
            o[jd][0] *= a0;
            o[jd][1] *= a0;
            o[jd][2] *= a1;
            o[jd][3] *= a1;
        }
        mma_acc_t<HD>(o, s, Vc, lane);
        __syncthreads(); /* the buffer is refilled two iterations on */
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    store_rows<HD>(out + ((size_t)b * T + q0) * ldo + h * HD, ldo, o, 1.f / l0, 1.f / l1, g, t, 0);
    if (t == 0) {
        lse[(size_t)bh * T + q0 + g] = (m0 + log2f(l0)) * LN2;
        lse[(size_t)bh * T + q0 + g + 8] = (m1 + log2f(l1)) * LN2;
    }
}

/* di[bh][t] = sum_d dout * out (one warp per row and head). */
__global__ void attn_bwd_pre_kernel(float *di, int *sem, int nsem, const bf *dout, const bf *out,
                                    int ldo, int N, int T, int H, int hd) {
    int gid = blockIdx.x * blockDim.x + threadIdx.x;
    if (gid < nsem) sem[gid] = 0; /* the fused backward's dQ counters (dev/cuda) */
    int wid = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (wid >= N * H) return;
    int row = wid / H, h = wid % H;
    const bf *a = dout + (size_t)row * ldo + h * hd, *c = out + (size_t)row * ldo + h * hd;
    float s = 0.f;
    for (int i = lane * 2; i < hd; i += 64) {
        float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(a + i));
        float2 y = __bfloat1622float2(*(const __nv_bfloat162 *)(c + i));
        s += x.x * y.x + x.y * y.y;
    }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    int b = row / T, tt = row % T;
    if (lane == 0) di[((size_t)b * H + h) * T + tt] = s;
}

/* dK, dV for one key block of one kv head: loops over the query heads of
 * the group and the query blocks at or after the key block (Q, dO tiles
 * double-buffered through cp.async). */
template <int HD, bool DOC = false>
__device__ __forceinline__ void
attn_bwd_kv_body(bf *dk, bf *dv, const bf *dout, const float *lse, const float *di, const bf *q,
                 const bf *k, const bf *v, int ldq, int ldkv, int ldo, int T, int H, int Hkv,
                 float sl2, float scale, int add, const int *ds = nullptr, int skip = 0) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Qs = (bf *)smem;                        /* [2][64][HD+8] */
    bf *dOs = Qs + 2 * TS(HD);                  /* [2][64][HD+8] */
    float *lse_s = (float *)(dOs + 2 * TS(HD)); /* [2][64], times log2 e */
    float *di_s = lse_s + 2 * BQ;               /* [2][64] */
    int *ds_s = (int *)(di_s + 2 * BQ);         /* [2][64] (DOC) */
    int nqb = T / BQ;
    int kb = blockIdx.x;
    int bhk = blockIdx.y, b = bhk / Hkv, hk = bhk % Hkv, grp = H / Hkv;
    int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int k0 = kb * BK + w * 16;
    int nq = nqb - kb;
    if (DOC && skip) /* the query blocks whose first row's document reaches this key block:
                        starts only grow along the sequence, so the rest see none of it */
        for (nq = 1; kb + nq < nqb && ds[(size_t)b * T + (kb + nq) * BQ] < (kb + 1) * BK; nq++)
            ;
    int niter = nq * grp;
    /* iteration it: query head hk*grp + it / nq, query block kb + it % nq */
#define KV_ISSUE(it)                                                                               \
    do {                                                                                           \
        int h_ = hk * grp + (it) / nq, qb_ = kb + (it) % nq, buf_ = (it)&1;                        \
        size_t bh_ = (size_t)b * H + h_;                                                           \
        tile_async<HD>(Qs + buf_ * TS(HD), q + ((size_t)b * T + qb_ * BQ) * ldq + h_ * HD, ldq);   \
        tile_async<HD>(dOs + buf_ * TS(HD), dout + ((size_t)b * T + qb_ * BQ) * ldo + h_ * HD,     \
                       ldo);                                                                       \
        cp_commit();                                                                               \
        if (threadIdx.x < BQ) {                                                                    \
            lse_s[buf_ * BQ + threadIdx.x] = lse[bh_ * T + qb_ * BQ + threadIdx.x] * LOG2E;        \
            di_s[buf_ * BQ + threadIdx.x] = di[bh_ * T + qb_ * BQ + threadIdx.x];                  \
            if (DOC) ds_s[buf_ * BQ + threadIdx.x] = ds[(size_t)b * T + qb_ * BQ + threadIdx.x];   \
        }                                                                                          \
    } while (0)
    KV_ISSUE(0);
    uint32_t kf[HD / 16][4], vf[HD / 16][4];
    load_afrag<HD>(kf, k + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, g, t);
    load_afrag<HD>(vf, v + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, g, t);
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dka[j][e] = dva[j][e] = 0.f;
    for (int it = 0; it < niter; it++) {
        if (it + 1 < niter) {
            KV_ISSUE(it + 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        int qb = kb + it % nq, buf = it & 1;
        const bf *Qc = Qs + buf * TS(HD), *dOc = dOs + buf * TS(HD);
        const float *ls = lse_s + buf * BQ, *dis = di_s + buf * BQ;
        const int *dss = ds_s + buf * BQ;
        float p[8][4], dp[8][4];
        mma_rows<HD>(p, kf, Qc, lane); /* S^T: keys x queries */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qi = j * 8 + 2 * t + (e & 1);
                int key = w * 16 + g + (e >= 2 ? 8 : 0);
                float x = exp2f(p[j][e] * sl2 - ls[qi]);
                p[j][e] = (qb == kb && key > qi) || (DOC && kb * BK + key < dss[qi]) ? 0.f : x;
            }
        mma_acc_t<HD>(dva, p, dOc, lane); /* dV += P^T dO */
        mma_rows<HD>(dp, vf, dOc, lane);  /* dP^T = V dO^T */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dp[j][e] = p[j][e] * (dp[j][e] - dis[j * 8 + 2 * t + (e & 1)]);
        mma_acc_t<HD>(dka, dp, Qc, lane); /* dK += dS^T Q */
        __syncthreads();
    }
#undef KV_ISSUE
    store_rows<HD>(dk + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, dka, scale, scale, g, t, add);
    store_rows<HD>(dv + ((size_t)b * T + k0) * ldkv + hk * HD, ldkv, dva, 1.f, 1.f, g, t, add);
}

/* dQ for one query block of one head: recomputes P and dP per key block. */
template <int HD, bool DOC = false>
__device__ __forceinline__ void
attn_bwd_q_body(bf *dq, const bf *dout, const float *lse, const float *di, const bf *q, const bf *k,
                const bf *v, int ldq, int ldkv, int ldo, int T, int H, int Hkv, float sl2,
                float scale, int add, const int *ds = nullptr, int skip = 0) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Ks = (bf *)smem;      /* [2][64][HD+8] */
    bf *Vs = Ks + 2 * TS(HD); /* [2][64][HD+8] */
    int nqb = T / BQ;
    int qb = nqb - 1 - blockIdx.x;
    int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int q0 = qb * BQ + w * 16;
    int ds0 = 0, ds1 = 0, kb0 = 0; /* as in attn_fwd_body */
    if (DOC) {
        ds0 = ds[(size_t)b * T + q0 + g];
        ds1 = ds[(size_t)b * T + q0 + g + 8];
        if (skip) kb0 = ds[(size_t)b * T + qb * BQ] / BK;
    }
    const bf *kbase = k + (size_t)b * T * ldkv + hk * HD;
    const bf *vbase = v + (size_t)b * T * ldkv + hk * HD;
    tile_async<HD>(Ks, kbase + (size_t)kb0 * BK * ldkv, ldkv);
    tile_async<HD>(Vs, vbase + (size_t)kb0 * BK * ldkv, ldkv);
    cp_commit();
    uint32_t qf[HD / 16][4], of[HD / 16][4];
    load_afrag<HD>(qf, q + ((size_t)b * T + q0) * ldq + h * HD, ldq, g, t);
    load_afrag<HD>(of, dout + ((size_t)b * T + q0) * ldo + h * HD, ldo, g, t);
    float ls0 = lse[(size_t)bh * T + q0 + g] * LOG2E,
          ls1 = lse[(size_t)bh * T + q0 + g + 8] * LOG2E;
    float d0 = di[(size_t)bh * T + q0 + g], d1 = di[(size_t)bh * T + q0 + g + 8];
    float dqa[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        dqa[j][0] = dqa[j][1] = dqa[j][2] = dqa[j][3] = 0.f;
    for (int kb = kb0; kb <= qb; kb++) {
        int cb = (kb - kb0) & 1;
        if (kb < qb) {
            int nb = cb ^ 1;
            tile_async<HD>(Ks + nb * TS(HD), kbase + (size_t)(kb + 1) * BK * ldkv, ldkv);
            tile_async<HD>(Vs + nb * TS(HD), vbase + (size_t)(kb + 1) * BK * ldkv, ldkv);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const bf *Kc = Ks + cb * TS(HD), *Vc = Vs + cb * TS(HD);
        float p[8][4], dp[8][4];
        mma_rows<HD>(p, qf, Kc, lane);
        mma_rows<HD>(dp, of, Vc, lane);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = j * 8 + 2 * t + (e & 1), qr = w * 16 + g + (e >= 2 ? 8 : 0);
                float x = exp2f(p[j][e] * sl2 - (e >= 2 ? ls1 : ls0));
                if (kb == qb && key > qr) x = 0.f;
                if (DOC && kb * BK + key < (e >= 2 ? ds1 : ds0)) x = 0.f;
                p[j][e] = x * (dp[j][e] - (e >= 2 ? d1 : d0));
            }
        mma_acc_t<HD>(dqa, p, Kc, lane); /* dQ += dS K */
        __syncthreads();
    }
    store_rows<HD>(dq + ((size_t)b * T + q0) * ldq + h * HD, ldq, dqa, scale, scale, g, t, add);
}

/* Two register budgets for the backward kernels (b aims at more resident
 * blocks per SM for hd 64); the choice changes speed only, never results. */
template <int HD, bool DOC = false>
__global__ void __launch_bounds__(NTHREADS)
    attn_fwd_kernel_a(bf *out, float *lse, const bf *q, const bf *k, const bf *v, int ldq, int ldkv,
                      int ldo, int T, int H, int Hkv, float sl2, const int *ds, int skip) {
    attn_fwd_body<HD, DOC>(out, lse, q, k, v, ldq, ldkv, ldo, T, H, Hkv, sl2, ds, skip);
}
template <int HD, bool DOC = false>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_kv_kernel_a(bf *dk, bf *dv, const bf *dout, const float *lse, const float *di,
                         const bf *q, const bf *k, const bf *v, int ldq, int ldkv, int ldo, int T,
                         int H, int Hkv, float sl2, float scale, int add, const int *ds, int skip) {
    attn_bwd_kv_body<HD, DOC>(dk, dv, dout, lse, di, q, k, v, ldq, ldkv, ldo, T, H, Hkv, sl2, scale,
                              add, ds, skip);
}
template <int HD, bool DOC = false>
__global__ void __launch_bounds__(NTHREADS, 3)
    attn_bwd_kv_kernel_b(bf *dk, bf *dv, const bf *dout, const float *lse, const float *di,
                         const bf *q, const bf *k, const bf *v, int ldq, int ldkv, int ldo, int T,
                         int H, int Hkv, float sl2, float scale, int add, const int *ds, int skip) {
    attn_bwd_kv_body<HD, DOC>(dk, dv, dout, lse, di, q, k, v, ldq, ldkv, ldo, T, H, Hkv, sl2, scale,
                              add, ds, skip);
}
template <int HD, bool DOC = false>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_q_kernel_a(bf *dq, const bf *dout, const float *lse, const float *di, const bf *q,
                        const bf *k, const bf *v, int ldq, int ldkv, int ldo, int T, int H, int Hkv,
                        float sl2, float scale, int add, const int *ds, int skip) {
    attn_bwd_q_body<HD, DOC>(dq, dout, lse, di, q, k, v, ldq, ldkv, ldo, T, H, Hkv, sl2, scale, add,
                             ds, skip);
}
template <int HD, bool DOC = false>
__global__ void __launch_bounds__(NTHREADS, 3)
    attn_bwd_q_kernel_b(bf *dq, const bf *dout, const float *lse, const float *di, const bf *q,
                        const bf *k, const bf *v, int ldq, int ldkv, int ldo, int T, int H, int Hkv,
                        float sl2, float scale, int add, const int *ds, int skip) {
    attn_bwd_q_body<HD, DOC>(dq, dout, lse, di, q, k, v, ldq, ldkv, ldo, T, H, Hkv, sl2, scale, add,
                             ds, skip);
}

/* ---- scheme 2: 128-query CTAs (forward, and dQ of the backward) ---- */

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#define NBUF 3 /* K/V (fwd) and Q/dO (bwd) tiles in flight: one barrier a step */

/* attn_fwd2_kernel's online softmax for one m-tile (first row row0) and key
 * tile kb: the causal mask where the tile reaches past the diagonal, the
 * running max m and sum l of rows g and g+8 (in units of score * log2(e) /
 * sqrt(hd)), P = exp2(S - max) written over s, and O rescaled by
 * exp2(old max - new max). */
template <int HD, bool DOC = false>
__device__ __forceinline__ void fwd2_softmax(float (&s)[8][4], float (&o)[HD / 8][4], float (&m)[2],
                                             float (&l)[2], int row0, int kb, int g, int t,
                                             float sl2, const int *dsr = nullptr) {
    if (kb * BK + BK - 1 > row0) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kb * BK + j * 8 + 2 * t + (e & 1);
                int qr = row0 + g + (e >= 2 ? 8 : 0);
                if (key > qr) s[j][e] = -INFINITY;
            }
    }
    if (DOC) { /* dsr: the document starts of rows g and g+8 */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (kb * BK + j * 8 + 2 * t + (e & 1) < dsr[e >> 1]) s[j][e] = -INFINITY;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
        mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    float n0 = fmaxf(m[0], mx0 * sl2), n1 = fmaxf(m[1], mx1 * sl2);
    float u0 = n0, u1 = n1; /* the exp2 offsets */
    if (DOC) {              /* rows that have seen no key of their document yet */
        u0 = n0 == -INFINITY ? 0.f : n0;
        u1 = n1 == -INFINITY ? 0.f : n1;
    }
    float a0 = ex2(m[0] - u0), a1 = ex2(m[1] - u1);
    m[0] = n0;
    m[1] = n1;
    float r0 = 0.f, r1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        s[j][0] = ex2(fmaf(s[j][0], sl2, -u0));
        s[j][1] = ex2(fmaf(s[j][1], sl2, -u0));
        s[j][2] = ex2(fmaf(s[j][2], sl2, -u1));
        s[j][3] = ex2(fmaf(s[j][3], sl2, -u1));
        r0 += s[j][0] + s[j][1];
        r1 += s[j][2] + s[j][3];
    }
    l[0] = l[0] * a0 + r0;
    l[1] = l[1] * a1 + r1;
#pragma unroll
    for (int jd = 0; jd < HD / 8; jd++) {
        o[jd][0] *= a0;
        o[jd][1] *= a0;
        o[jd][2] *= a1;
        o[jd][3] *= a1;
    }
}

/* Forward, 128 queries per CTA of 4 warps. Warp w owns two 16-row m-tiles,
 * local rows w*16 and 64 + w*16, so every K/V fragment read from shared
 * memory feeds two mmas (the 16-row scheme above is bound by ldmatrix
 * bandwidth) and the diagonal work is spread evenly: on the last key tile
 * each warp's first m-tile is wholly masked. Masked scores become -inf, so a
 * masked m-tile leaves its running max and sum unchanged; a CTA whose second
 * half lies past T (T % 128 == 64) computes it and never stores it. */
template <int HD, bool DOC = false>
__global__ void __launch_bounds__(NTHREADS, 2)
    attn_fwd2_kernel(bf *out, float *lse, const bf *q, const bf *k, const bf *v, int ldq, int ldkv,
                     int ldo, int T, int H, int Hkv, float sl2, const int *ds, int skip) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Ks = (bf *)smem;         /* [NBUF][64][HD+8] */
    bf *Vs = Ks + NBUF * TS(HD); /* [NBUF][64][HD+8] */
    int nqb = (T + 127) / 128;
    int qb = nqb - 1 - blockIdx.x; /* longest rows first */
    int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int has1 = qb * 128 + 64 < T;
    int nk = 2 * qb + 1 + has1; /* key tiles of 64 */
    /* DOC: the document starts of each m-tile's rows g, g+8; the first key tile */
    int dsr[2][2] = {{0, 0}, {0, 0}}, kb0 = 0;
    if (DOC) {
#pragma unroll
        for (int i = 0; i < 2; i++)
            if (i == 0 || has1) {
                const int *d = ds + (size_t)b * T + qb * 128 + i * 64 + w * 16 + g;
                dsr[i][0] = d[0];
                dsr[i][1] = d[8];
            }
        if (skip) kb0 = ds[(size_t)b * T + qb * 128] / BK;
    }
    const bf *kbase = k + (size_t)b * T * ldkv + hk * HD;
    const bf *vbase = v + (size_t)b * T * ldkv + hk * HD;
    tile_async<HD>(Ks, kbase + (size_t)kb0 * BK * ldkv, ldkv);
    tile_async<HD>(Vs, vbase + (size_t)kb0 * BK * ldkv, ldkv);
    cp_commit();
    if (nk > kb0 + 1) {
        tile_async<HD>(Ks + TS(HD), kbase + (size_t)(kb0 + 1) * BK * ldkv, ldkv);
        tile_async<HD>(Vs + TS(HD), vbase + (size_t)(kb0 + 1) * BK * ldkv, ldkv);
    }
    cp_commit();
    uint32_t qf[2][HD / 16][4];
    const bf *qrow = q + ((size_t)b * T + qb * 128 + w * 16) * ldq + h * HD;
    load_afrag<HD>(qf[0], qrow, ldq, g, t);
    if (has1) {
        load_afrag<HD>(qf[1], qrow + (size_t)64 * ldq, ldq, g, t);
    } else {
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            qf[1][kk][0] = qf[1][kk][1] = qf[1][kk][2] = qf[1][kk][3] = 0u;
    }
    float o[2][HD / 8][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.f;
    /* running max (in units of score * log2(e) / sqrt(hd)) and sum, rows g, g+8 */
    float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float l[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    int mi = lane >> 3, r8 = lane & 7;
    for (int kb = kb0; kb < nk; kb++) {
        cp_wait<1>();
        __syncthreads(); /* tile kb landed; every warp is done with tile kb-1 */
        if (kb + 2 < nk) {
            int nb = (kb - kb0 + 2) % NBUF;
            tile_async<HD>(Ks + nb * TS(HD), kbase + (size_t)(kb + 2) * BK * ldkv, ldkv);
            tile_async<HD>(Vs + nb * TS(HD), vbase + (size_t)(kb + 2) * BK * ldkv, ldkv);
        }
        cp_commit();
        int cb = (kb - kb0) % NBUF;
        const bf *Kc = Ks + cb * TS(HD), *Vc = Vs + cb * TS(HD);
        float s[2][8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int i = 0; i < 2; i++)
                s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.f;
#pragma unroll
            for (int k2 = 0; k2 < HD / 32; k2++) {
                uint32_t bb[4];
                ldsm_x4(bb, Kc + (j * 8 + r8) * (HD + 8) + k2 * 32 + mi * 8);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mma16816(s[i][j], qf[i][2 * k2], bb);
                    mma16816(s[i][j], qf[i][2 * k2 + 1], bb + 2);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) /* row0: the first row of m-tile i */
            fwd2_softmax<HD, DOC>(s[i], o[i], m[i], l[i], qb * 128 + i * 64 + w * 16, kb, g, t, sl2,
                                  dsr[i]);
            /* O += P V, each V fragment shared by both m-tiles */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t a[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                a[i][0] = pack2(s[i][2 * kk][0], s[i][2 * kk][1]);
                a[i][1] = pack2(s[i][2 * kk][2], s[i][2 * kk][3]);
                a[i][2] = pack2(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
                a[i][3] = pack2(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
            }
#pragma unroll
            for (int j2 = 0; j2 < HD / 16; j2++) {
                uint32_t bb[4];
                ldsm_x4_t(bb,
                          Vc + (kk * 16 + (mi & 1) * 8 + r8) * (HD + 8) + (j2 * 2 + (mi >> 1)) * 8);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mma16816(o[i][2 * j2], a[i], bb);
                    mma16816(o[i][2 * j2 + 1], a[i], bb + 2);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (i == 1 && !has1) break;
        float l0 = l[i][0], l1 = l[i][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        int q0 = qb * 128 + i * 64 + w * 16;
        store_rows<HD>(out + ((size_t)b * T + q0) * ldo + h * HD, ldo, o[i], 1.f / l0, 1.f / l1, g,
                       t, 0);
        if (t == 0) {
            lse[(size_t)bh * T + q0 + g] = (m[i][0] + log2f(l0)) * LN2;
            lse[(size_t)bh * T + q0 + g + 8] = (m[i][1] + log2f(l1)) * LN2;
        }
    }
}

/* dQ of the two-kernel scheme with forward2's layout: 128 queries per CTA,
 * warp w owns m-tiles at local rows w*16 and 64 + w*16, so each K and V
 * fragment read from shared memory feeds both; a key tile is taken in two
 * halves of 32 keys to keep S and dP in registers beside dQ. For hd <= 64
 * (hd 128 keeps attn_bwd_q_kernel). */
template <int HD, bool DOC = false>
__global__ void __launch_bounds__(NTHREADS, 2)
    attn_bwd_q2_kernel(bf *dq, const bf *dout, const float *lse, const float *di, const bf *q,
                       const bf *k, const bf *v, int ldq, int ldkv, int ldo, int T, int H, int Hkv,
                       float sl2, float scale, int add, const int *ds, int skip) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Ks = (bf *)smem;         /* [NBUF][64][HD+8] */
    bf *Vs = Ks + NBUF * TS(HD); /* [NBUF][64][HD+8] */
    int nqb = (T + 127) / 128;
    int qb = nqb - 1 - blockIdx.x;
    int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int mi = lane >> 3, r8 = lane & 7;
    int has1 = qb * 128 + 64 < T;
    int nk = 2 * qb + 1 + has1;
    int dsr[2][2] = {{0, 0}, {0, 0}}, kb0 = 0; /* as in attn_fwd2_kernel */
    if (DOC) {
#pragma unroll
        for (int i = 0; i < 2; i++)
            if (i == 0 || has1) {
                const int *d = ds + (size_t)b * T + qb * 128 + i * 64 + w * 16 + g;
                dsr[i][0] = d[0];
                dsr[i][1] = d[8];
            }
        if (skip) kb0 = ds[(size_t)b * T + qb * 128] / BK;
    }
    const bf *kbase = k + (size_t)b * T * ldkv + hk * HD;
    const bf *vbase = v + (size_t)b * T * ldkv + hk * HD;
    tile_async<HD>(Ks, kbase + (size_t)kb0 * BK * ldkv, ldkv);
    tile_async<HD>(Vs, vbase + (size_t)kb0 * BK * ldkv, ldkv);
    cp_commit();
    if (nk > kb0 + 1) {
        tile_async<HD>(Ks + TS(HD), kbase + (size_t)(kb0 + 1) * BK * ldkv, ldkv);
        tile_async<HD>(Vs + TS(HD), vbase + (size_t)(kb0 + 1) * BK * ldkv, ldkv);
    }
    cp_commit();
    uint32_t qf[2][HD / 16][4], of[2][HD / 16][4];
    float ls[2][2], dd[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int q0 = qb * 128 + i * 64 + w * 16;
        if (i == 0 || has1) {
            load_afrag<HD>(qf[i], q + ((size_t)b * T + q0) * ldq + h * HD, ldq, g, t);
            load_afrag<HD>(of[i], dout + ((size_t)b * T + q0) * ldo + h * HD, ldo, g, t);
            ls[i][0] = lse[(size_t)bh * T + q0 + g] * LOG2E;
            ls[i][1] = lse[(size_t)bh * T + q0 + g + 8] * LOG2E;
            dd[i][0] = di[(size_t)bh * T + q0 + g];
            dd[i][1] = di[(size_t)bh * T + q0 + g + 8];
        } else {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    qf[i][kk][e] = of[i][kk][e] = 0u;
            ls[i][0] = ls[i][1] = dd[i][0] = dd[i][1] = 0.f;
        }
    }
    float dqa[2][HD / 8][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            dqa[i][j][0] = dqa[i][j][1] = dqa[i][j][2] = dqa[i][j][3] = 0.f;
    for (int kb = kb0; kb < nk; kb++) {
        cp_wait<1>();
        __syncthreads();
        if (kb + 2 < nk) {
            int nb = (kb - kb0 + 2) % NBUF;
            tile_async<HD>(Ks + nb * TS(HD), kbase + (size_t)(kb + 2) * BK * ldkv, ldkv);
            tile_async<HD>(Vs + nb * TS(HD), vbase + (size_t)(kb + 2) * BK * ldkv, ldkv);
        }
        cp_commit();
        int cb = (kb - kb0) % NBUF;
        const bf *Kc = Ks + cb * TS(HD), *Vc = Vs + cb * TS(HD);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float p[2][4][4], dp[2][4][4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                int j = hf * 4 + jj;
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        p[i][jj][e] = dp[i][jj][e] = 0.f;
#pragma unroll
                for (int k2 = 0; k2 < HD / 32; k2++) {
                    uint32_t bk[4], bv[4];
                    ldsm_x4(bk, Kc + (j * 8 + r8) * (HD + 8) + k2 * 32 + mi * 8);
                    ldsm_x4(bv, Vc + (j * 8 + r8) * (HD + 8) + k2 * 32 + mi * 8);
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        mma16816(p[i][jj], qf[i][2 * k2], bk);
                        mma16816(p[i][jj], qf[i][2 * k2 + 1], bk + 2);
                        mma16816(dp[i][jj], of[i][2 * k2], bv);
                        mma16816(dp[i][jj], of[i][2 * k2 + 1], bv + 2);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int row0 = qb * 128 + i * 64 + w * 16;
                int diag = kb * BK + BK - 1 > row0;
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int key = kb * BK + hf * 32 + jj * 8 + 2 * t + (e & 1);
                        int qr = row0 + g + (e >= 2 ? 8 : 0);
                        float x = ex2(fmaf(p[i][jj][e], sl2, -ls[i][e >> 1]));
                        if (diag && key > qr) x = 0.f;
                        if (DOC && key < dsr[i][e >> 1]) x = 0.f;
                        p[i][jj][e] = x * (dp[i][jj][e] - dd[i][e >> 1]);
                    }
            }
            /* dQ += dS (16 x 32 keys) K (32 keys x HD), K fragments shared */
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                uint32_t a[2][4];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    a[i][0] = pack2(p[i][2 * kk][0], p[i][2 * kk][1]);
                    a[i][1] = pack2(p[i][2 * kk][2], p[i][2 * kk][3]);
                    a[i][2] = pack2(p[i][2 * kk + 1][0], p[i][2 * kk + 1][1]);
                    a[i][3] = pack2(p[i][2 * kk + 1][2], p[i][2 * kk + 1][3]);
                }
#pragma unroll
                for (int j2 = 0; j2 < HD / 16; j2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, Kc + (hf * 32 + kk * 16 + (mi & 1) * 8 + r8) * (HD + 8) +
                                      (j2 * 2 + (mi >> 1)) * 8);
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        mma16816(dqa[i][2 * j2], a[i], bb);
                        mma16816(dqa[i][2 * j2 + 1], a[i], bb + 2);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (i == 1 && !has1) break;
        int q0 = qb * 128 + i * 64 + w * 16;
        store_rows<HD>(dq + ((size_t)b * T + q0) * ldq + h * HD, ldq, dqa[i], scale, scale, g, t,
                       add);
    }
}

/* Host side: the shape check and the launches both files use. */
static void check_shape(int T, int H, int Hkv, int hd) {
    if (T % 64 || Hkv <= 0 || H % Hkv || (hd != 32 && hd != 64 && hd != 128))
        lcuda_fail(__FILE__, __LINE__, "attention",
                   "needs T % 64 == 0, H % Hkv == 0 and hd in {32, 64, 128}");
}

template <int HD, bool DOC = false>
static void fwd2_launch(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                        int ldq, int ldkv, int ldo, int B, int T, int H, int Hkv, cudaStream_t st,
                        const int *ds = nullptr, int skip = 0) {
    float sl2 = LOG2E / sqrtf((float)HD);
    dim3 grid((T + 127) / 128, B * H);
    size_t smem = 2 * NBUF * TS(HD) * sizeof(bf);
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd2_kernel<HD, DOC>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attn_fwd2_kernel<HD, DOC><<<grid, NTHREADS, smem, st>>>((bf *)out, lse, (const bf *)q,
                                                            (const bf *)k, (const bf *)v, ldq, ldkv,
                                                            ldo, T, H, Hkv, sl2, ds, skip);
    CUDA_CHECK_LAUNCH();
}

template <int HD, int MINB, bool DOC = false>
static void bwd_launch(lbf16 *dq, lbf16 *dk, lbf16 *dv, const float *di, const lbf16 *dout,
                       const float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v, int ldq,
                       int ldkv, int ldo, int B, int T, int H, int Hkv, int add, cudaStream_t st,
                       const int *ds = nullptr, int skip = 0) {
    float scale = 1.f / sqrtf((float)HD), sl2 = LOG2E * scale;
    /* + the document starts of two query tiles (DOC) */
    size_t smem_kv = 4 * TS(HD) * sizeof(bf) + 4 * BQ * sizeof(float) + (DOC ? 2 * BQ * 4 : 0);
    size_t smem_q = 4 * TS(HD) * sizeof(bf);
    CUDA_CHECK(
        cudaFuncSetAttribute((MINB ? attn_bwd_kv_kernel_b<HD, DOC> : attn_bwd_kv_kernel_a<HD, DOC>),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
    CUDA_CHECK(
        cudaFuncSetAttribute((MINB ? attn_bwd_q_kernel_b<HD, DOC> : attn_bwd_q_kernel_a<HD, DOC>),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    (MINB ? attn_bwd_kv_kernel_b<HD, DOC>
          : attn_bwd_kv_kernel_a<HD, DOC>)<<<dim3(T / BK, B * Hkv), NTHREADS, smem_kv, st>>>(
        (bf *)dk, (bf *)dv, (const bf *)dout, lse, di, (const bf *)q, (const bf *)k, (const bf *)v,
        ldq, ldkv, ldo, T, H, Hkv, sl2, scale, add, ds, skip);
    CUDA_CHECK_LAUNCH();
    if (!dq) return; /* hd <= 64: dQ comes from attn_bwd_q2_kernel */
    (MINB ? attn_bwd_q_kernel_b<HD, DOC>
          : attn_bwd_q_kernel_a<HD, DOC>)<<<dim3(T / BQ, B * H), NTHREADS, smem_q, st>>>(
        (bf *)dq, (const bf *)dout, lse, di, (const bf *)q, (const bf *)k, (const bf *)v, ldq, ldkv,
        ldo, T, H, Hkv, sl2, scale, add, ds, skip);
    CUDA_CHECK_LAUNCH();
}
