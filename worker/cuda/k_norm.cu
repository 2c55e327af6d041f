/* LayerNorm and RMSNorm, forward (optionally fused with the residual add)
 * and backward. One warp per row, 8 columns a lane per 256-column vector
 * (C must be a multiple of 8), statistics in fp32. No float atomics: the
 * weight/bias gradients are column sums over fixed row blocks (one fp32
 * partial row per block), then summed over the blocks in a fixed order.
 *
 * The kernels (variant 1 of the generations measured, fastest or tied at
 * every shape on H200: docs/perf.md, "Single-GPU step IV"): one backward
 * pass for C <= 2048: each warp keeps its rows' dout * xhat and dout column
 * sums (registers for C <= 768, shared memory above), the CTA adds its
 * warps' sums in a fixed order and writes one partial row; forward and
 * residual forward keep the row in registers for any C <= 2048; 16-byte
 * loads and stores (uint4). For C > 2048 and for a backward without dw and
 * db, the first generation's kernels with 16-byte loads (the "wide
 * fallback": a dx kernel, then a column-sum pass). Bit-reproducible. The
 * other generations (0: the first kernels with 4-byte loads; 2: shared
 * memory column sums for every C; 3: 8 rows a warp; 4: the fallback for
 * every C) are in dev/cuda/norm_variants.cu with the test and bench that
 * compare them. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "worker/cuda/kernels.h"
#include "worker/cuda/k_norm_common.cuh"

/* The one-pass backward's launch shapes: W warps and R rows a CTA, MINB
 * CTAs an SM for the register bound. Variants 1 and 2 give a warp 4 rows
 * (N = 16384 gives 4096 warps, about 2 CTA waves at C 768), variant 3 gives
 * it 8 (half the CTAs and partial rows; one wave of 2 CTAs an SM at C 768).
 * Register column sums (variants 1 and 3) for C <= 768 only: above, the 16
 * sums a vector would not fit beside the row. Returns R, the rows of each
 * partial row; lk_norm_scratch_bytes sizes for the smallest R of a C. */
template <int NV>
static int v1_bwd(bf *dx, float *part, const bf *dout, const bf *x, const bf *w, const float *mean,
                  const float *rstd, int N, int C, int rms, cudaStream_t st) {
#define V1_ARGS dx, part, dout, x, w, mean, rstd, N, C, rms, st
    if constexpr (NV <= 3) {
        v1_bwd_launch<NV, 8, 32, false, 2>(V1_ARGS);
        return 32;
    } else if constexpr (NV <= 7) {
        v1_bwd_launch<NV, 8, 32, true, 2>(V1_ARGS);
        return 32;
    } else {
        v1_bwd_launch<NV, 4, 16, true, 3>(V1_ARGS);
        return 16;
    }
#undef V1_ARGS
}

static void check_c(int C) {
    if (C % 8) lcuda_fail(__FILE__, __LINE__, "norm", "C must be a multiple of 8");
}

/* The wide fallback's dispatch. a2 != NULL: the residual forward (generic
 * kernel). */
static void v0_fwd(bf *out, float *mean, float *rstd, bf *res, const bf *a, const bf *a2,
                   const bf *w, const bf *bias, int N, int C, float eps, int rms, cudaStream_t st) {
    int nv = a2 ? 0 : reg_nv(C);
    if (nv) {
#define FWD_REG(NV)                                                                                \
    norm_fwd_reg_kernel<NV, true>                                                                  \
        <<<(N + 7) / 8, 256, 0, st>>>(out, mean, rstd, a, w, bias, N, eps, rms)
        NV_SWITCH(nv, FWD_REG);
#undef FWD_REG
    } else {
        norm_fwd_kernel<true>
            <<<(N + 7) / 8, 256, 0, st>>>(out, mean, rstd, res, a, a2, w, bias, N, C, eps, rms);
    }
    CUDA_CHECK_LAUNCH();
}

static void v0_bwd(bf *dx, bf *dw, bf *dbias, float *scratch, const bf *dout, const bf *x,
                   const bf *w, const float *mean, const float *rstd, int N, int C, int rms,
                   cudaStream_t st) {
    if (dx) {
        int nv = reg_nv(C);
        if (nv) {
#define BWD_REG(NV)                                                                                \
    norm_bwd_dx_reg_kernel<NV, true>                                                               \
        <<<(N + 7) / 8, 256, 0, st>>>(dx, dout, x, w, mean, rstd, N, rms)
            NV_SWITCH(nv, BWD_REG);
#undef BWD_REG
        } else {
            norm_bwd_dx_kernel<true>
                <<<(N + 7) / 8, 256, 0, st>>>(dx, dout, x, w, mean, rstd, N, C, rms);
        }
        CUDA_CHECK_LAUNCH();
    }
    if (!dw && !dbias) return;
    int nchunk = (N + ROWCHK - 1) / ROWCHK;
    dim3 grid((C + 255) / 256, nchunk);
    norm_bwd_wpart_kernel<true><<<grid, 256, 0, st>>>(scratch, dout, x, mean, rstd, N, C, rms);
    CUDA_CHECK_LAUNCH();
    norm_bwd_wfinal_kernel<<<(C + 255) / 256, 256, 0, st>>>(dw, dbias, scratch, nchunk, C);
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_norm_fwd(lbf16 *out, float *mean, float *rstd, const lbf16 *x, const lbf16 *w,
                            const lbf16 *bias, int N, int C, float eps, int rms, lcuda_stream s) {
    check_c(C);
    cudaStream_t st = (cudaStream_t)s;
    int nv1 = v1_nv(C);
    if (nv1) {
#define FWD_V1(NV)                                                                                 \
    norm_fwd_v1_kernel<NV, false><<<(N + 7) / 8, 256, 0, st>>>((bf *)out, mean, rstd, NULL,        \
                                                               (const bf *)x, NULL, (const bf *)w, \
                                                               (const bf *)bias, N, C, eps, rms)
        NV_SWITCH(nv1, FWD_V1);
#undef FWD_V1
        CUDA_CHECK_LAUNCH();
    } else {
        v0_fwd((bf *)out, mean, rstd, NULL, (const bf *)x, NULL, (const bf *)w, (const bf *)bias, N,
               C, eps, rms, st);
    }
}

extern "C" void lk_residual_norm_fwd(lbf16 *res, lbf16 *out, float *mean, float *rstd,
                                     const lbf16 *a, const lbf16 *b, const lbf16 *w,
                                     const lbf16 *bias, int N, int C, float eps, int rms,
                                     lcuda_stream s) {
    check_c(C);
    cudaStream_t st = (cudaStream_t)s;
    int nv1 = v1_nv(C);
    if (nv1) {
#define RES_V1(NV)                                                                                 \
    norm_fwd_v1_kernel<NV, true><<<(N + 7) / 8, 256, 0, st>>>(                                     \
        (bf *)out, mean, rstd, (bf *)res, (const bf *)a, (const bf *)b, (const bf *)w,             \
        (const bf *)bias, N, C, eps, rms)
        NV_SWITCH(nv1, RES_V1);
#undef RES_V1
        CUDA_CHECK_LAUNCH();
    } else {
        v0_fwd((bf *)out, mean, rstd, (bf *)res, (const bf *)a, (const bf *)b, (const bf *)w,
               (const bf *)bias, N, C, eps, rms, st);
    }
}

/* The larger of variant 0's chunks of ROWCHK rows and the one-pass
 * kernels' blocks (v1_bwd's smallest R for this C), 2C floats each. */
extern "C" size_t lk_norm_scratch_bytes(int N, int C) {
    size_t rows = (size_t)(N + ROWCHK - 1) / ROWCHK;
    int nv = v1_nv(C);
    if (nv) {
        int R = nv == 8 ? 16 : 32;
        size_t r1 = (size_t)(N + R - 1) / R;
        if (r1 > rows) rows = r1;
    }
    return rows * 2 * C * sizeof(float);
}

extern "C" void lk_norm_bwd(lbf16 *dx, lbf16 *dw, lbf16 *dbias, float *scratch, const lbf16 *dout,
                            const lbf16 *x, const lbf16 *w, const float *mean, const float *rstd,
                            int N, int C, int rms, lcuda_stream s) {
    check_c(C);
    cudaStream_t st = (cudaStream_t)s;
    int nv1 = v1_nv(C);
    if (nv1 && (dw || dbias)) {
        int R = 0;
#define BWD_V1(NV)                                                                                 \
    R = v1_bwd<NV>((bf *)dx, scratch, (const bf *)dout, (const bf *)x, (const bf *)w, mean, rstd,  \
                   N, C, rms, st)
        NV_SWITCH(nv1, BWD_V1);
#undef BWD_V1
        int ncol = dbias ? 2 * C : C;
        norm_bwd_wsum_kernel<<<(ncol + 31) / 32, 512, 0, st>>>((bf *)dw, (bf *)dbias, scratch,
                                                               (N + R - 1) / R, C, ncol);
        CUDA_CHECK_LAUNCH();
    } else {
        v0_bwd((bf *)dx, (bf *)dw, (bf *)dbias, scratch, (const bf *)dout, (const bf *)x,
               (const bf *)w, mean, rstd, N, C, rms, st);
    }
}
