/* Elementwise kernels: GELU (tanh form), SwiGLU, rotary embeddings, adds,
 * the token/position embedding forward and its deterministic backward, and
 * precision conversions. All are memory-bound; each thread handles a few
 * elements and the launch covers the tensor with a grid-stride loop. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/kernels.h"

typedef __nv_bfloat16 bf;

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static int grid_for(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    return (int)(g > 65535 * 8 ? 65535 * 8 : (g ? g : 1));
}

__device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_K * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float du = GELU_K * (1.f + 3.f * 0.044715f * x * x);
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
}

/* 16-byte vectors of 8 bf16: the elementwise kernels move whole vectors when
 * every pointer is 16-byte aligned, and finish a ragged tail one by one. */
struct __align__(16) bf8 {
    __nv_bfloat162 h[4];
};
__device__ __forceinline__ void ld8(float *f, const bf *p) {
    bf8 v = *(const bf8 *)p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(v.h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void st8(bf *p, const float *f) {
    bf8 v;
#pragma unroll
    for (int i = 0; i < 4; i++)
        v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *(bf8 *)p = v;
}
static int aligned16(const void *a, const void *b, const void *c) {
    return !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15);
}
/* Grid-stride over whole vectors (when vec), then the tail one by one:
 *   EW_VEC(n) { ...8 elements at i... } EW_TAIL(n) { ...element i... } */
#define EW_VEC(n)                                                                                  \
    size_t stride_ = (size_t)gridDim.x * blockDim.x;                                               \
    size_t tid_ = blockIdx.x * (size_t)blockDim.x + threadIdx.x;                                   \
    size_t n8_ = vec ? (n) / 8 : 0;                                                                \
    for (size_t v_ = tid_, i = v_ * 8; v_ < n8_; v_ += stride_, i = v_ * 8)
#define EW_TAIL(n) for (size_t i = n8_ * 8 + tid_; i < (n); i += stride_)

__global__ void gelu_fwd_kernel(bf *out, const bf *inp, size_t n, int vec) {
    EW_VEC(n) {
        float f[8];
        ld8(f, inp + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            f[j] = gelu_f(f[j]);
        st8(out + i, f);
    }
    EW_TAIL(n) out[i] = __float2bfloat16(gelu_f(__bfloat162float(inp[i])));
}
__global__ void gelu_bwd_kernel(bf *dinp, const bf *inp, const bf *dout, size_t n, int acc,
                                int vec) {
    EW_VEC(n) {
        float x[8], d[8], o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        ld8(x, inp + i);
        ld8(d, dout + i);
        if (acc) ld8(o, dinp + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            o[j] += gelu_grad(x[j]) * d[j];
        st8(dinp + i, o);
    }
    EW_TAIL(n) {
        float d = gelu_grad(__bfloat162float(inp[i])) * __bfloat162float(dout[i]);
        if (acc) d += __bfloat162float(dinp[i]);
        dinp[i] = __float2bfloat16(d);
    }
}

extern "C" void lk_gelu_fwd(lbf16 *out, const lbf16 *inp, size_t n, lcuda_stream s) {
    int vec = aligned16(out, inp, inp);
    gelu_fwd_kernel<<<grid_for(vec ? n / 8 + 1 : n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)out, (const bf *)inp, n, vec);
    CUDA_CHECK_LAUNCH();
}
extern "C" void lk_gelu_bwd(lbf16 *dinp, const lbf16 *inp, const lbf16 *dout, size_t n,
                            int accumulate, lcuda_stream s) {
    int vec = aligned16(dinp, inp, dout);
    gelu_bwd_kernel<<<grid_for(vec ? n / 8 + 1 : n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)dinp, (const bf *)inp, (const bf *)dout, n, accumulate, vec);
    CUDA_CHECK_LAUNCH();
}

__global__ void swiglu_fwd_kernel(bf *out, const bf *gate, const bf *up, int N, int F, int ld) {
    size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / F, c = i % F;
        float g = __bfloat162float(gate[r * ld + c]), u = __bfloat162float(up[r * ld + c]);
        out[i] = __float2bfloat16(g / (1.f + __expf(-g)) * u);
    }
}
__global__ void swiglu_bwd_kernel(bf *dgate, bf *dup, const bf *dout, const bf *gate, const bf *up,
                                  int N, int F, int ld, int acc) {
    size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / F, c = i % F;
        float g = __bfloat162float(gate[r * ld + c]), u = __bfloat162float(up[r * ld + c]);
        float d = __bfloat162float(dout[i]);
        float sg = 1.f / (1.f + __expf(-g));
        float silu = g * sg;
        float du = d * silu, dg = d * u * sg * (1.f + g * (1.f - sg));
        if (acc) {
            du += __bfloat162float(dup[r * ld + c]);
            dg += __bfloat162float(dgate[r * ld + c]);
        }
        dup[r * ld + c] = __float2bfloat16(du);
        dgate[r * ld + c] = __float2bfloat16(dg);
    }
}

/* The 16-byte forms: thread v takes 8 columns of one row (F and ld multiples
 * of 8, every pointer 16-byte aligned), so each load is one vector and the
 * row / column split is one 32-bit division per 8 elements. */
__global__ void swiglu_fwd_vec_kernel(bf *out, const bf *gate, const bf *up, int N, int F, int ld) {
    unsigned F8 = (unsigned)F / 8;
    size_t n8 = (size_t)N * F8;
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < n8;
         v += (size_t)gridDim.x * blockDim.x) {
        size_t r = v / F8, c = (v - r * F8) * 8;
        float g[8], u[8], o[8];
        ld8(g, gate + r * ld + c);
        ld8(u, up + r * ld + c);
#pragma unroll
        for (int j = 0; j < 8; j++)
            o[j] = g[j] / (1.f + __expf(-g[j])) * u[j];
        st8(out + v * 8, o);
    }
}
__global__ void swiglu_bwd_vec_kernel(bf *dgate, bf *dup, const bf *dout, const bf *gate,
                                      const bf *up, int N, int F, int ld, int acc) {
    unsigned F8 = (unsigned)F / 8;
    size_t n8 = (size_t)N * F8;
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < n8;
         v += (size_t)gridDim.x * blockDim.x) {
        size_t r = v / F8, c = (v - r * F8) * 8, at = r * ld + c;
        float g[8], u[8], d[8], dg[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f},
                                du[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        ld8(g, gate + at);
        ld8(u, up + at);
        ld8(d, dout + v * 8);
        if (acc) {
            ld8(dg, dgate + at);
            ld8(du, dup + at);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float sg = 1.f / (1.f + __expf(-g[j]));
            du[j] += d[j] * (g[j] * sg);
            dg[j] += d[j] * u[j] * sg * (1.f + g[j] * (1.f - sg));
        }
        st8(dup + at, du);
        st8(dgate + at, dg);
    }
}

static int swiglu_vec(int fast, int F, int ld, const void *a, const void *b, const void *c,
                      const void *d) {
    return fast && F % 8 == 0 && ld % 8 == 0 && aligned16(a, b, c) && aligned16(d, d, d);
}

extern "C" void lk_swiglu_fwd(lbf16 *out, const lbf16 *gate, const lbf16 *up, int N, int F,
                              int ld_in, int fast, lcuda_stream s) {
    if (swiglu_vec(fast, F, ld_in, out, gate, up, up)) {
        swiglu_fwd_vec_kernel<<<grid_for((size_t)N * F / 8, 256), 256, 0, (cudaStream_t)s>>>(
            (bf *)out, (const bf *)gate, (const bf *)up, N, F, ld_in);
    } else {
        swiglu_fwd_kernel<<<grid_for((size_t)N * F, 256), 256, 0, (cudaStream_t)s>>>(
            (bf *)out, (const bf *)gate, (const bf *)up, N, F, ld_in);
    }
    CUDA_CHECK_LAUNCH();
}
extern "C" void lk_swiglu_bwd(lbf16 *dgate, lbf16 *dup, const lbf16 *dout, const lbf16 *gate,
                              const lbf16 *up, int N, int F, int ld_in, int accumulate, int fast,
                              lcuda_stream s) {
    if (swiglu_vec(fast, F, ld_in, dgate, dup, dout, gate) && aligned16(up, up, up)) {
        swiglu_bwd_vec_kernel<<<grid_for((size_t)N * F / 8, 256), 256, 0, (cudaStream_t)s>>>(
            (bf *)dgate, (bf *)dup, (const bf *)dout, (const bf *)gate, (const bf *)up, N, F, ld_in,
            accumulate);
    } else {
        swiglu_bwd_kernel<<<grid_for((size_t)N * F, 256), 256, 0, (cudaStream_t)s>>>(
            (bf *)dgate, (bf *)dup, (const bf *)dout, (const bf *)gate, (const bf *)up, N, F, ld_in,
            accumulate);
    }
    CUDA_CHECK_LAUNCH();
}

/* One thread per (row, head, pair i < hd/2); inv: the inverse frequencies
 * (RoPE scaling) or NULL for theta^(-2i/hd). */
__global__ void rope_kernel(bf *x, int N, int T, int H, int hd, int ld, float theta, float sign,
                            const float *inv) {
    int half = hd / 2;
    size_t n = (size_t)N * H * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t rh = idx / half;
        int h = (int)(rh % H);
        size_t row = rh / H;
        int pos = (int)(row % T);
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

extern "C" void lk_rope(lbf16 *x, int N, int T, int n_heads, int hd, int ld, float theta,
                        const float *inv, int inverse, lcuda_stream s) {
    size_t n = (size_t)N * n_heads * (hd / 2);
    rope_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)s>>>((bf *)x, N, T, n_heads, hd, ld,
                                                               theta, inverse ? -1.f : 1.f, inv);
    CUDA_CHECK_LAUNCH();
}

/* tab[t][i] = cos(t * inv[i]), tab[T + t][i] = sin(...) for t < T, i < half:
 * fp64 angles and functions (once per shape), rounded to fp32. */
__global__ void rope_table_kernel(float *tab, const double *inv, int T, int half) {
    size_t n = (size_t)T * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(k / half), i = (int)(k % half);
        double sn, cs;
        sincos((double)t * inv[i], &sn, &cs);
        tab[k] = (float)cs;
        tab[n + k] = (float)sn;
    }
}

/* One thread per (row, head, 8 consecutive pairs): two 16-byte loads of x
 * (columns i.. and half + i..) and the pairs' cos / sin from the table. */
__global__ void rope_vec_kernel(bf *x, const float *tab, int N, int T, int H, int hd, int ld,
                                float sign) {
    int half = hd / 2, g8 = half / 8;
    size_t n = (size_t)N * H * g8, tn = (size_t)T * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % g8) * 8;
        size_t rh = idx / g8;
        int h = (int)(rh % H);
        size_t row = rh / H;
        int pos = (int)(row % T);
        const float4 *cp = (const float4 *)(tab + (size_t)pos * half + i);
        const float4 *sp = (const float4 *)(tab + tn + (size_t)pos * half + i);
        float4 c0 = cp[0], c1 = cp[1], s0 = sp[0], s1 = sp[1];
        float cs[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
        float sn[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
        bf *p = x + row * ld + (size_t)h * hd + i;
        float a[8], b[8], oa[8], ob[8];
        ld8(a, p);
        ld8(b, p + half);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float sj = sign * sn[j];
            oa[j] = a[j] * cs[j] - b[j] * sj;
            ob[j] = b[j] * cs[j] + a[j] * sj;
        }
        st8(p, oa);
        st8(p + half, ob);
    }
}

extern "C" void lk_rope_table(float *tab, const double *inv, int T, int half, lcuda_stream s) {
    rope_table_kernel<<<grid_for((size_t)T * half, 256), 256, 0, (cudaStream_t)s>>>(tab, inv, T,
                                                                                    half);
    CUDA_CHECK_LAUNCH();
}

extern "C" int lk_rope_tab(lbf16 *x, const float *tab, int N, int T, int n_heads, int hd, int ld,
                           int inverse, lcuda_stream s) {
    if (hd % 16 || ld % 8 || ((uintptr_t)x & 15) || ((uintptr_t)tab & 15)) return -1;
    size_t n = (size_t)N * n_heads * (hd / 16);
    rope_vec_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)s>>>((bf *)x, tab, N, T, n_heads, hd,
                                                                   ld, inverse ? -1.f : 1.f);
    CUDA_CHECK_LAUNCH();
    return 0;
}

/* out = a + b (acc = 0) or out += a (b unused, acc = 1); out may alias a. */
__global__ void add_kernel(bf *out, const bf *a, const bf *b, size_t n, int acc, int vec) {
    EW_VEC(n) {
        float x[8], y[8];
        ld8(x, a + i);
        ld8(y, acc ? out + i : b + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            x[j] += y[j];
        st8(out + i, x);
    }
    EW_TAIL(n) {
        out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(acc ? out[i] : b[i]));
    }
}
extern "C" void lk_add(lbf16 *out, const lbf16 *a, const lbf16 *b, size_t n, lcuda_stream s) {
    int vec = aligned16(out, a, b);
    add_kernel<<<grid_for(vec ? n / 8 + 1 : n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)out, (const bf *)a, (const bf *)b, n, 0, vec);
    CUDA_CHECK_LAUNCH();
}
extern "C" void lk_accumulate(lbf16 *dst, const lbf16 *src, size_t n, lcuda_stream s) {
    int vec = aligned16(dst, src, src);
    add_kernel<<<grid_for(vec ? n / 8 + 1 : n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)dst, (const bf *)src, NULL, n, 1, vec);
    CUDA_CHECK_LAUNCH();
}

__global__ void scale_kernel(bf *x, size_t n, float sc, int vec) {
    EW_VEC(n) {
        float f[8];
        ld8(f, x + i);
#pragma unroll
        for (int j = 0; j < 8; j++)
            f[j] *= sc;
        st8(x + i, f);
    }
    EW_TAIL(n) x[i] = __float2bfloat16(__bfloat162float(x[i]) * sc);
}
extern "C" void lk_scale(lbf16 *x, size_t n, float sc, lcuda_stream s) {
    int vec = aligned16(x, x, x);
    scale_kernel<<<grid_for(vec ? n / 8 + 1 : n, 256), 256, 0, (cudaStream_t)s>>>((bf *)x, n, sc,
                                                                                  vec);
    CUDA_CHECK_LAUNCH();
}

__global__ void embed_fwd_kernel(bf *out, const int32_t *tok, const bf *wte, const bf *wpe, int N,
                                 int T, int C) {
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C;
        int c = (int)(i % C);
        float v = __bfloat162float(wte[(size_t)tok[r] * C + c]);
        if (wpe) v += __bfloat162float(wpe[(size_t)(r % T) * C + c]);
        out[i] = __float2bfloat16(v);
    }
}
extern "C" void lk_embed_fwd(lbf16 *out, const int32_t *tokens, const lbf16 *wte, const lbf16 *wpe,
                             int N, int T, int C, lcuda_stream s) {
    embed_fwd_kernel<<<grid_for((size_t)N * C, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)out, tokens, (const bf *)wte, (const bf *)wpe, N, T, C);
    CUDA_CHECK_LAUNCH();
}

/* One block per distinct token: its rows summed in index order. */
__global__ void embed_bwd_wte_kernel(bf *dwte, const bf *dout, const int32_t *order,
                                     const int32_t *starts, const int32_t *uniq, int C) {
    int u = blockIdx.x;
    int b0 = starts[u], b1 = starts[u + 1];
    bf *dst = dwte + (size_t)uniq[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
        for (int j = b0; j < b1; j++)
            s += __bfloat162float(dout[(size_t)order[j] * C + c]);
        dst[c] = __float2bfloat16(__bfloat162float(dst[c]) + s);
    }
}
/* dwpe[t][c] += sum over sequences b of dout[b*T+t][c]. */
__global__ void embed_bwd_wpe_kernel(bf *dwpe, const bf *dout, int N, int T, int C) {
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (size_t r = i / C; r < (size_t)N; r += T)
            s += __bfloat162float(dout[r * C + i % C]);
        dwpe[i] = __float2bfloat16(__bfloat162float(dwpe[i]) + s);
    }
}

extern "C" void lk_embed_bwd(lbf16 *dwte, lbf16 *dwpe, const lbf16 *dout, const int32_t *order,
                             const int32_t *starts, const int32_t *uniq, int n_uniq, int N, int T,
                             int C, lcuda_stream s) {
    cudaStream_t st = (cudaStream_t)s;
    if (n_uniq > 0) {
        embed_bwd_wte_kernel<<<n_uniq, 256, 0, st>>>((bf *)dwte, (const bf *)dout, order, starts,
                                                     uniq, C);
        CUDA_CHECK_LAUNCH();
    }
    if (dwpe) {
        embed_bwd_wpe_kernel<<<grid_for((size_t)T * C, 256), 256, 0, st>>>(
            (bf *)dwpe, (const bf *)dout, N, T, C);
        CUDA_CHECK_LAUNCH();
    }
}

/* rows[u] = the sum of token u's dout rows in index order (compact: one
 * row per distinct token, stored, not added). */
__global__ void embed_rows_kernel(bf *rows, const bf *dout, const int32_t *order,
                                  const int32_t *starts, int C) {
    int u = blockIdx.x;
    int b0 = starts[u], b1 = starts[u + 1];
    bf *dst = rows + (size_t)u * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
        for (int j = b0; j < b1; j++)
            s += __bfloat162float(dout[(size_t)order[j] * C + c]);
        dst[c] = __float2bfloat16(s);
    }
}
/* dwte[uniq[u]] += rows[u] for each u whose uniq[u] >= 0 (ids are distinct:
 * no two blocks touch one row) */
__global__ void embed_scatter_kernel(bf *dwte, const bf *rows, const int32_t *uniq, int C) {
    int u = blockIdx.x, t = uniq[u];
    if (t < 0) return;
    bf *dst = dwte + (size_t)t * C;
    const bf *src = rows + (size_t)u * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dst[c] = __float2bfloat16(__bfloat162float(dst[c]) + __bfloat162float(src[c]));
}
extern "C" void lk_embed_rows(lbf16 *rows, const lbf16 *dout, const int32_t *order,
                              const int32_t *starts, int n_uniq, int C, lcuda_stream s) {
    if (n_uniq <= 0) return;
    embed_rows_kernel<<<n_uniq, 256, 0, (cudaStream_t)s>>>((bf *)rows, (const bf *)dout, order,
                                                           starts, C);
    CUDA_CHECK_LAUNCH();
}
extern "C" void lk_embed_scatter_add(lbf16 *dwte, const lbf16 *rows, const int32_t *uniq,
                                     int n_rows, int C, lcuda_stream s) {
    if (n_rows <= 0) return;
    embed_scatter_kernel<<<n_rows, 256, 0, (cudaStream_t)s>>>((bf *)dwte, (const bf *)rows, uniq,
                                                              C);
    CUDA_CHECK_LAUNCH();
}

/* Counting sort by token keeps equal tokens in row order (stable). */
extern "C" int lk_embed_buckets(const int32_t *tokens, int N, int32_t *order, int32_t *starts,
                                int32_t *uniq) {
    int maxtok = 0;
    for (int i = 0; i < N; i++)
        if (tokens[i] > maxtok) maxtok = tokens[i];
    int32_t *cnt = (int32_t *)calloc((size_t)maxtok + 2, sizeof *cnt);
    if (!cnt) lcuda_fail(__FILE__, __LINE__, "calloc", "out of host memory");
    for (int i = 0; i < N; i++)
        cnt[tokens[i] + 1]++;
    int nu = 0;
    for (int t = 0; t <= maxtok; t++) {
        if (cnt[t + 1]) {
            uniq[nu] = t;
            starts[nu] = cnt[t];
            nu++;
        }
        cnt[t + 1] += cnt[t];
    }
    starts[nu] = N;
    for (int i = 0; i < N; i++)
        order[cnt[tokens[i]]++] = i;
    free(cnt);
    return nu;
}

__global__ void f2b_kernel(bf *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}
__global__ void b2f_kernel(float *dst, const bf *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}
extern "C" void lk_f32_to_bf16(lbf16 *dst, const float *src, size_t n, lcuda_stream s) {
    f2b_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)s>>>((bf *)dst, src, n);
    CUDA_CHECK_LAUNCH();
}
extern "C" void lk_bf16_to_f32(float *dst, const lbf16 *src, size_t n, lcuda_stream s) {
    b2f_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)s>>>(dst, (const bf *)src, n);
    CUDA_CHECK_LAUNCH();
}
