/* Positions within documents packed in a row (train.packing "document"): the
 * learned position embedding and RoPE at position r % T - doc_start[r]
 * instead of r % T (kernels.h; the attention's document mask is k_attn.cu's).
 * One element (embedding) or one rotation pair (RoPE) per thread: these run
 * once per layer on [N][C] activations, beside GEMMs that dominate. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "worker/cuda/kernels.h"

typedef __nv_bfloat16 bf;

static int doc_grid(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    return b > 65535 ? 65535 : (int)(b ? b : 1);
}

__global__ void embed_fwd_doc_kernel(bf *out, const int32_t *tok, const bf *wte, const bf *wpe,
                                     const int32_t *ds, int N, int T, int C) {
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C;
        int c = (int)(i % C);
        float v = __bfloat162float(wte[(size_t)tok[r] * C + c]);
        if (wpe) v += __bfloat162float(wpe[(size_t)((int)(r % T) - ds[r]) * C + c]);
        out[i] = __float2bfloat16(v);
    }
}

extern "C" void lk_embed_fwd_doc(lbf16 *out, const int32_t *tokens, const lbf16 *wte,
                                 const lbf16 *wpe, const int32_t *doc_start, int N, int T, int C,
                                 lcuda_stream s) {
    embed_fwd_doc_kernel<<<doc_grid((size_t)N * C, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)out, tokens, (const bf *)wte, (const bf *)wpe, doc_start, N, T, C);
    CUDA_CHECK_LAUNCH();
}

/* One thread per (row, head, pair i < hd/2), rotate-half pairs (i, i + hd/2). */
__global__ void rope_doc_kernel(bf *x, const float *tab, const float *inv, float theta,
                                const int32_t *ds, int N, int T, int H, int hd, int ld,
                                float sign) {
    int half = hd / 2;
    size_t n = (size_t)N * H * half, tn = (size_t)T * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t rh = idx / half;
        int h = (int)(rh % H);
        size_t row = rh / H;
        int pos = (int)(row % T) - ds[row];
        float sn, cs;
        if (tab) {
            cs = tab[(size_t)pos * half + i];
            sn = tab[tn + (size_t)pos * half + i];
        } else {
            float freq = inv ? inv[i] : powf(theta, -2.0f * i / hd);
            sincosf(pos * freq, &sn, &cs);
        }
        sn *= sign;
        bf *p = x + row * ld + (size_t)h * hd;
        float a = __bfloat162float(p[i]), b = __bfloat162float(p[i + half]);
        p[i] = __float2bfloat16(a * cs - b * sn);
        p[i + half] = __float2bfloat16(b * cs + a * sn);
    }
}

extern "C" void lk_rope_doc(lbf16 *x, const float *tab, const float *inv, float theta,
                            const int32_t *doc_start, int N, int T, int n_heads, int hd, int ld,
                            int inverse, lcuda_stream s) {
    size_t n = (size_t)N * n_heads * (hd / 2);
    rope_doc_kernel<<<doc_grid(n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)x, tab, inv, theta, doc_start, N, T, n_heads, hd, ld, inverse ? -1.f : 1.f);
    CUDA_CHECK_LAUNCH();
}
