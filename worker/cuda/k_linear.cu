/* Linear layers through cuBLASLt: bf16 operands, fp32 accumulation, fused
 * bias / GELU / residual epilogues in the forward pass, the GELU gradient
 * fused into the data-gradient matmul, and fp32 weight gradients accumulated
 * in place (beta = 1). Bias gradients use a deterministic two-pass column
 * sum. Heuristic results are cached per shape so steady-state steps only
 * build descriptors. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/kernels.h"

#define LK_WS_BYTES    (64u << 20)
#define LK_ALGO_CACHE  64
#define LK_BIAS_ROWCHK 128 /* rows per partial in the bias column sum */

struct algo_key {
    int m, n, k, ta, tb, epi, dt, ct, beta1;
};
struct algo_entry {
    struct algo_key key;
    cublasLtMatmulAlgo_t algo;
    int used;
};

struct lk_blas {
    cublasLtHandle_t lt;
    cudaStream_t s;
    void *ws;
    struct algo_entry cache[LK_ALGO_CACHE];
};

extern "C" struct lk_blas *lk_blas_new(lcuda_stream s, struct lcuda_arena *arena) {
    struct lk_blas *b = (struct lk_blas *)calloc(1, sizeof *b);
    if (!b) lcuda_fail(__FILE__, __LINE__, "calloc", "out of host memory");
    CUBLAS_CHECK(cublasLtCreate(&b->lt));
    b->s = (cudaStream_t)s;
    b->ws = lcuda_arena_alloc(arena, LK_WS_BYTES);
    return b;
}

extern "C" void lk_blas_free(struct lk_blas *b) {
    if (!b) return;
    cublasLtDestroy(b->lt);
    free(b);
}

/* D[m][n] (column-major) = op(A) op(B) + beta C, with epilogue. */
static void lt_matmul(struct lk_blas *b, void *D, cudaDataType dt, const void *A, const void *B,
                      const void *C, int m, int n, int k, int ta, int tb, float beta,
                      cublasLtEpilogue_t epi, const void *bias, void *aux, int64_t ld_aux) {
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, ld = NULL;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof bias));
    if (aux) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &ld_aux, sizeof ld_aux));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, ta ? k : m));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, tb ? n : k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, dt, m, n, m));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, m));

    struct algo_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.ta = ta, key.tb = tb, key.epi = (int)epi, key.dt = dt;
    key.ct = dt, key.beta1 = beta != 0.0f;
    struct algo_entry *hit = NULL;
    for (int i = 0; i < LK_ALGO_CACHE; i++) {
        if (b->cache[i].used && !memcmp(&b->cache[i].key, &key, sizeof key)) {
            hit = &b->cache[i];
            break;
        }
    }
    if (!hit) {
        cublasLtMatmulPreference_t pref = NULL;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t wsb = LK_WS_BYTES;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        CUBLAS_CHECK(
            cublasLtMatmulAlgoGetHeuristic(b->lt, desc, la, lb, lc, ld, pref, 1, &res, &nres));
        cublasLtMatmulPreferenceDestroy(pref);
        if (nres == 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "no cuBLASLt algorithm for m=%d n=%d k=%d ta=%d tb=%d epi=%d",
                     m, n, k, ta, tb, (int)epi);
            lcuda_fail(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", msg);
        }
        int slot = 0;
        while (slot < LK_ALGO_CACHE && b->cache[slot].used)
            slot++;
        if (slot == LK_ALGO_CACHE) slot = 0; /* full: overwrite the first */
        b->cache[slot].key = key;
        b->cache[slot].algo = res.algo;
        b->cache[slot].used = 1;
        hit = &b->cache[slot];
    }
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(b->lt, desc, &alpha, A, la, B, lb, &beta, C ? C : D, lc, D, ld,
                                &hit->algo, b->ws, LK_WS_BYTES, b->s));
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
}

extern "C" void lk_linear_fwd(struct lk_blas *b, lbf16 *out, lbf16 *pre_gelu, const lbf16 *inp,
                              const lbf16 *w, const lbf16 *bias, const lbf16 *acc, int N, int IC,
                              int OC, int gelu) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (gelu)
        epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (bias)
        epi = CUBLASLT_EPILOGUE_BIAS;
    if (gelu && !pre_gelu)
        lcuda_fail(__FILE__, __LINE__, "lk_linear_fwd", "gelu needs a pre_gelu buffer");
    lt_matmul(b, out, CUDA_R_16BF, w, inp, acc, OC, N, IC, 1, 0, acc ? 1.0f : 0.0f, epi, bias,
              gelu ? pre_gelu : NULL, OC);
}

extern "C" void lk_linear_bwd_data(struct lk_blas *b, lbf16 *dinp, const lbf16 *dout,
                                   const lbf16 *w, const lbf16 *pre_gelu, int N, int IC, int OC,
                                   int accumulate) {
    cublasLtEpilogue_t epi = pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
    if (pre_gelu && accumulate)
        lcuda_fail(__FILE__, __LINE__, "lk_linear_bwd_data", "DGELU cannot accumulate");
    lt_matmul(b, dinp, CUDA_R_16BF, w, dout, accumulate ? dinp : NULL, IC, N, OC, 0, 0,
              accumulate ? 1.0f : 0.0f, epi, NULL, (void *)pre_gelu, IC);
}

/* Column sums of dout[N][OC] over row chunks of LK_BIAS_ROWCHK rows:
 * part[chunk][col]. A block covers 256 columns (32 threads x 8 columns, one
 * 16-byte load each) and 8 row lanes, reduced through shared memory in a
 * fixed order. Needs OC % 8 == 0. */
__global__ void __launch_bounds__(256)
    bias_partial_kernel(float *part, const __nv_bfloat16 *dout, int N, int OC) {
    __shared__ float sh[8][256];
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int c0 = blockIdx.x * 256 + tx * 8;
    int chunk = blockIdx.y;
    int r0 = chunk * LK_BIAS_ROWCHK, r1 = min(N, r0 + LK_BIAS_ROWCHK);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (c0 < OC) {
        for (int r = r0 + ty; r < r1; r += 8) {
            uint4 v = *(const uint4 *)(dout + (size_t)r * OC + c0);
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(h[j]);
                acc[2 * j] += f.x;
                acc[2 * j + 1] += f.y;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        sh[ty][tx * 8 + j] = acc[j];
    __syncthreads();
    int col = blockIdx.x * 256 + threadIdx.x;
    if (col < OC) {
        float s = 0.f;
        for (int y = 0; y < 8; y++)
            s += sh[y][threadIdx.x];
        part[(size_t)chunk * OC + col] = s;
    }
}

__global__ void bias_final_kernel(__nv_bfloat16 *dbias, const float *part, int nchunk, int OC) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC) return;
    float s = 0.f;
    for (int c = 0; c < nchunk; c++)
        s += part[(size_t)c * OC + col];
    dbias[col] = __float2bfloat16(__bfloat162float(dbias[col]) + s);
}

extern "C" size_t lk_bias_scratch_bytes(int N, int OC) {
    return (size_t)((N + LK_BIAS_ROWCHK - 1) / LK_BIAS_ROWCHK) * OC * sizeof(float);
}

extern "C" void lk_linear_bwd_weight(struct lk_blas *b, lbf16 *dw, lbf16 *dbias, float *scratch,
                                     const lbf16 *dout, const lbf16 *inp, int N, int IC, int OC) {
    if (dw)
        lt_matmul(b, dw, CUDA_R_16BF, inp, dout, dw, IC, OC, N, 0, 1, 1.0f,
                  CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0);
    if (dbias) {
        if (OC % 8)
            lcuda_fail(__FILE__, __LINE__, "lk_linear_bwd_weight", "bias needs OC % 8 == 0");
        int nchunk = (N + LK_BIAS_ROWCHK - 1) / LK_BIAS_ROWCHK;
        dim3 grid((OC + 255) / 256, nchunk);
        bias_partial_kernel<<<grid, 256, 0, b->s>>>(scratch, (const __nv_bfloat16 *)dout, N, OC);
        CUDA_CHECK_LAUNCH();
        bias_final_kernel<<<(OC + 255) / 256, 256, 0, b->s>>>((__nv_bfloat16 *)dbias, scratch,
                                                              nchunk, OC);
        CUDA_CHECK_LAUNCH();
    }
}
