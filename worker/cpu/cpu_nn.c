/* CPU backend: forward and backward of every layer in fp32 with OpenMP.
 *
 * Each parallel loop gives every output element to exactly one iteration and
 * sums inside it in an order fixed by the shapes, so results do not depend on
 * the thread count (see cpu.h). Matmul, attention and softmax rows run in
 * the micro-kernels of cpu_gemm.c; the dot product here (RMSNorm) uses eight
 * independent lanes added in a fixed tree. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/cpu/cpu.h"

#define CX ((struct cpu_ctx *)ctx)

static inline float dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += a[i + k] * b[i + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ---- documents packed in a row (set_doc_starts) ---- */

void cpu_set_doc_starts(void *ctx, const int32_t *starts, int N) {
    (void)N;
    CX->doc_start = starts;
}

/* Position of row r in its document, and the first key position a query row may see. */
static inline int doc_pos(const struct cpu_ctx *cx, int r, int T) {
    return cx->doc_start ? r % T - cx->doc_start[r] : r % T;
}

static inline int doc_first(const struct cpu_ctx *cx, size_t row) {
    return cx->doc_start ? cx->doc_start[row] : 0;
}

/* ---- embeddings ---- */

void cpu_embedding_fwd(void *ctx, void *out_, const int32_t *tokens, const void *wte_,
                       const void *wpe_, int B, int T, int C) {
    float *out = out_;
    const float *wte = wte_, *wpe = wpe_;
    int N = B * T;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *e = wte + (size_t)tokens[r] * C;
        float *o = out + (size_t)r * C;
        if (wpe) {
            const float *p = wpe + (size_t)doc_pos(CX, r, T) * C;
            for (int c = 0; c < C; c++)
                o[c] = e[c] + p[c];
        } else {
            memcpy(o, e, (size_t)C * sizeof *o);
        }
    }
}

void cpu_embedding_bwd(void *ctx, void *dwte_, void *dwpe_, const void *dout_,
                       const int32_t *tokens, int B, int T, int C) {
    float *dwte = dwte_, *dwpe = dwpe_;
    const float *dout = dout_;
    int N = B * T;
    /* Parallel over columns: each element sums its rows in increasing r. */
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        for (int r = 0; r < N; r++) {
            const float *d = dout + (size_t)r * C;
            float *e = dwte + (size_t)tokens[r] * C;
            for (int c = c0; c < c1; c++)
                e[c] += d[c];
            if (dwpe) {
                float *p = dwpe + (size_t)doc_pos(CX, r, T) * C;
                for (int c = c0; c < c1; c++)
                    p[c] += d[c];
            }
        }
    }
}

/* ---- norms ---- */

void cpu_layernorm_fwd(void *ctx, void *out_, float *mean, float *rstd, const void *inp_,
                       const void *w_, const void *b_, int N, int C, float eps) {
    float *out = out_;
    const float *inp = inp_, *w = w_, *b = b_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * C;
        float s = 0;
        for (int c = 0; c < C; c++)
            s += x[c];
        float m = s / C;
        float v = 0;
        for (int c = 0; c < C; c++)
            v += (x[c] - m) * (x[c] - m);
        float rs = 1.0f / sqrtf(v / C + eps);
        float *o = out + (size_t)r * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * rs * w[c] + (b ? b[c] : 0.0f);
        mean[r] = m;
        rstd[r] = rs;
    }
}

void cpu_layernorm_bwd(void *ctx, void *dinp_, void *dw_, void *db_, const void *dout_,
                       const void *inp_, const void *w_, const float *mean, const float *rstd,
                       int N, int C) {
    float *dinp = dinp_, *dw = dw_, *db = db_;
    const float *dout = dout_, *inp = inp_, *w = w_;
    if (dinp) {
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
        for (int r = 0; r < N; r++) {
            const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
            float m = mean[r], rs = rstd[r];
            float dm = 0, dmx = 0;
            for (int c = 0; c < C; c++) {
                float xh = (x[c] - m) * rs, dn = dy[c] * w[c];
                dm += dn;
                dmx += dn * xh;
            }
            dm /= C;
            dmx /= C;
            float *dx = dinp + (size_t)r * C;
            for (int c = 0; c < C; c++) {
                float xh = (x[c] - m) * rs, dn = dy[c] * w[c];
                dx[c] += (dn - dm - xh * dmx) * rs;
            }
        }
    }
    if (dw || db) {
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
        for (int c0 = 0; c0 < C; c0 += 16) {
            int c1 = c0 + 16 < C ? c0 + 16 : C;
            for (int r = 0; r < N; r++) {
                const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
                for (int c = c0; c < c1; c++) {
                    if (dw) dw[c] += dy[c] * (x[c] - mean[r]) * rstd[r];
                    if (db) db[c] += dy[c];
                }
            }
        }
    }
}

void cpu_rmsnorm_fwd(void *ctx, void *out_, float *rstd, const void *inp_, const void *w_, int N,
                     int C, float eps) {
    float *out = out_;
    const float *inp = inp_, *w = w_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * C;
        float s = dot(x, x, C);
        float rs = 1.0f / sqrtf(s / C + eps);
        float *o = out + (size_t)r * C;
        for (int c = 0; c < C; c++)
            o[c] = x[c] * rs * w[c];
        rstd[r] = rs;
    }
}

void cpu_rmsnorm_bwd(void *ctx, void *dinp_, void *dw_, const void *dout_, const void *inp_,
                     const void *w_, const float *rstd, int N, int C) {
    float *dinp = dinp_, *dw = dw_;
    const float *dout = dout_, *inp = inp_, *w = w_;
    if (dinp) {
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
        for (int r = 0; r < N; r++) {
            const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
            float rs = rstd[r];
            float s = 0;
            for (int c = 0; c < C; c++)
                s += dy[c] * w[c] * x[c];
            float k = s * rs * rs * rs / C;
            float *dx = dinp + (size_t)r * C;
            for (int c = 0; c < C; c++)
                dx[c] += rs * w[c] * dy[c] - x[c] * k;
        }
    }
    if (dw) {
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * C)) schedule(static)
        for (int c0 = 0; c0 < C; c0 += 16) {
            int c1 = c0 + 16 < C ? c0 + 16 : C;
            for (int r = 0; r < N; r++) {
                const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
                for (int c = c0; c < c1; c++)
                    dw[c] += dy[c] * x[c] * rstd[r];
            }
        }
    }
}

/* ---- matmul ---- */

void cpu_matmul_fwd(void *ctx, void *out_, const void *inp_, const void *W_, const void *bias_,
                    int N, int IC, int OC) {
    float *out = out_;
    const float *inp = inp_, *W = W_, *bias = bias_;
    /* Blocks of 4 rows (the micro-kernel's tile) reuse each weight row. */
    int nb = (N + 3) / 4;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * IC * OC)) schedule(static)
    for (int blk = 0; blk < nb; blk++) {
        int r0 = blk * 4, r1 = r0 + 4 < N ? r0 + 4 : N;
        CX->k->mm_nt(out, inp, W, bias, r0, r1, IC, OC);
    }
}

void cpu_matmul_bwd(void *ctx, void *dinp_, void *dW_, void *dbias_, const void *dout_,
                    const void *inp_, const void *W_, int N, int IC, int OC) {
    float *dinp = dinp_, *dW = dW_, *dbias = dbias_;
    const float *dout = dout_, *inp = inp_, *W = W_;
    size_t work = (size_t)N * IC * OC;
    if (dinp) {
        /* dinp[r,:] += sum_o dout[r,o] W[o,:] */
        int nb = (N + 3) / 4;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, work)) schedule(static)
        for (int blk = 0; blk < nb; blk++) {
            int r0 = blk * 4, r1 = r0 + 4 < N ? r0 + 4 : N;
            CX->k->mm_acc(dinp, (size_t)IC, dout, (size_t)OC, 1, W, (size_t)IC, r0, r1, IC, OC);
        }
    }
    if (dW) {
        /* dW[o,:] += sum_r dout[r,o] inp[r,:] */
        int nb = (OC + 3) / 4;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, work)) schedule(static)
        for (int blk = 0; blk < nb; blk++) {
            int o0 = blk * 4, o1 = o0 + 4 < OC ? o0 + 4 : OC;
            CX->k->mm_acc(dW, (size_t)IC, dout, 1, (size_t)OC, inp, (size_t)IC, o0, o1, IC, N);
        }
    }
    if (dbias) {
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * OC)) schedule(static)
        for (int o = 0; o < OC; o++) {
            float s = 0;
            for (int r = 0; r < N; r++)
                s += dout[(size_t)r * OC + o];
            dbias[o] += s;
        }
    }
}

/* ---- activations ---- */

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

void cpu_gelu_fwd(void *ctx, void *out_, const void *inp_, size_t n) {
    float *out = out_;
    const float *x = inp_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, n * 16)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float u = GELU_S * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
        out[i] = 0.5f * x[i] * (1.0f + tanhf(u));
    }
}

void cpu_gelu_bwd(void *ctx, void *dinp_, const void *inp_, const void *dout_, size_t n) {
    float *dinp = dinp_;
    const float *x = inp_, *dy = dout_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, n * 16)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_S * (xi + 0.044715f * xi * xi * xi);
        float th = tanhf(u);
        float du = GELU_S * (1.0f + 3.0f * 0.044715f * xi * xi);
        float g = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
        dinp[i] += g * dy[i];
    }
}

void cpu_swiglu_fwd(void *ctx, void *out_, const void *inp_, int N, int F) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * F * 16)) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *g = inp + (size_t)r * 2 * F, *u = g + F;
        float *o = out + (size_t)r * F;
        for (int j = 0; j < F; j++) {
            float s = 1.0f / (1.0f + expf(-g[j]));
            o[j] = g[j] * s * u[j];
        }
    }
}

void cpu_swiglu_bwd(void *ctx, void *dinp_, const void *inp_, const void *dout_, int N, int F) {
    float *dinp = dinp_;
    const float *inp = inp_, *dout = dout_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)N * F * 16)) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *g = inp + (size_t)r * 2 * F, *u = g + F, *dy = dout + (size_t)r * F;
        float *dg = dinp + (size_t)r * 2 * F, *du = dg + F;
        for (int j = 0; j < F; j++) {
            float s = 1.0f / (1.0f + expf(-g[j]));
            dg[j] += dy[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
            du[j] += dy[j] * g[j] * s;
        }
    }
}

/* ---- RoPE ---- */

double cpu_rope_angle(const struct cpu_ctx *cx, int t, int d, int HD, float theta) {
    if (cx->rope_inv && cx->rope_half == HD / 2) return t * cx->rope_inv[d];
    return t * pow((double)theta, -2.0 * d / HD);
}

/* cos/sin table [T, HD/2] for (T, HD, theta), rebuilt when they change
 * (rope_set_freqs drops it). */
static const float *rope_table(struct cpu_ctx *cx, int T, int HD, float theta) {
    if (cx->rope_tab && cx->rope_T == T && cx->rope_HD == HD && cx->rope_theta == theta)
        return cx->rope_tab;
    free(cx->rope_tab);
    int h = HD / 2;
    cx->rope_tab = malloc((size_t)T * h * 2 * sizeof(float));
    if (!cx->rope_tab) die("rope table: out of memory (T=%d HD=%d)", T, HD);
    for (int t = 0; t < T; t++)
        for (int d = 0; d < h; d++) {
            double ang = cpu_rope_angle(cx, t, d, HD, theta);
            cx->rope_tab[(size_t)t * h + d] = (float)cos(ang);
            cx->rope_tab[(size_t)T * h + (size_t)t * h + d] = (float)sin(ang);
        }
    cx->rope_T = T;
    cx->rope_HD = HD;
    cx->rope_theta = theta;
    return cx->rope_tab;
}

static void rope_apply(struct cpu_ctx *cx, float *x, int N, int T, int stride, int n_heads, int HD,
                       float theta, float sign) {
    const float *tab = rope_table(cx, T, HD, theta);
    int h = HD / 2;
#pragma omp parallel for num_threads(cx->nt) if (CPU_PAR(cx, (size_t)N * n_heads * HD))            \
    schedule(static)
    for (int r = 0; r < N; r++) {
        int t = doc_pos(cx, r, T);
        const float *cs = tab + (size_t)t * h, *sn = tab + (size_t)T * h + (size_t)t * h;
        for (int hd = 0; hd < n_heads; hd++) {
            float *v = x + (size_t)r * stride + (size_t)hd * HD;
            for (int d = 0; d < h; d++) {
                float a = v[d], b = v[d + h], s = sign * sn[d];
                v[d] = a * cs[d] - b * s;
                v[d + h] = b * cs[d] + a * s;
            }
        }
    }
}

void cpu_rope_fwd(void *ctx, void *x, int N, int T, int stride, int n_heads, int HD, float theta) {
    rope_apply(CX, x, N, T, stride, n_heads, HD, theta, 1.0f);
}

void cpu_rope_bwd(void *ctx, void *dx, int N, int T, int stride, int n_heads, int HD, float theta) {
    rope_apply(CX, dx, N, T, stride, n_heads, HD, theta, -1.0f);
}

/* ---- attention ---- */

void cpu_attention_fwd(void *ctx, void *out_, float *lse, const void *qkv_, int B, int T, int NH,
                       int NKV, int HD) {
    struct cpu_ctx *cx = CX;
    float *out = out_;
    const float *qkv = qkv_;
    int S = (NH + 2 * NKV) * HD, grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    long total = (long)B * NH * T;
#pragma omp parallel num_threads(cx->nt) if (CPU_PAR(cx, (size_t)total * T * HD))
    {
        float *p = cx->attn_scratch + (size_t)cpu_thread_id() * 2 * cx->lim.T;
#pragma omp for schedule(static)
        for (long idx = 0; idx < total; idx++) {
            int t = (int)(idx % T), h = (int)((idx / T) % NH), b = (int)(idx / ((long)T * NH));
            int kvh = h / grp;
            const float *base = qkv + (size_t)b * T * S;
            /* packed documents: the keys of the query's own document are rows s..t, a causal
             * row of t - s over keys starting at row s */
            int s0 = doc_first(cx, (size_t)b * T + t);
            const float *kb = base + (size_t)s0 * S;
            cx->k->attn_fwd_row(out + ((size_t)b * T + t) * NH * HD + (size_t)h * HD,
                                lse + ((size_t)b * NH + h) * T + t, base + (size_t)t * S + h * HD,
                                kb + (size_t)(NH + kvh) * HD, kb + (size_t)(NH + NKV + kvh) * HD,
                                (size_t)S, t - s0, HD, scale, p);
        }
    }
}

void cpu_attention_bwd(void *ctx, void *dqkv_, const void *dout_, const void *qkv_,
                       const void *out_, const float *lse, int B, int T, int NH, int NKV, int HD) {
    struct cpu_ctx *cx = CX;
    float *dqkv = dqkv_;
    const float *dout = dout_, *qkv = qkv_, *out = out_;
    int S = (NH + 2 * NKV) * HD, grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    int tasks = B * NKV;
    /* One task per (batch, kv head): it owns dk and dv of that head and dq of
     * the query heads in its group, so no two threads write one element. */
#pragma omp parallel num_threads(cx->nt) if (CPU_PAR(cx, (size_t)tasks * T * T * HD))
    {
        float *p = cx->attn_scratch + (size_t)cpu_thread_id() * 2 * cx->lim.T;
#pragma omp for schedule(static)
        for (int task = 0; task < tasks; task++) {
            int b = task / NKV, kvh = task % NKV;
            for (int h = kvh * grp; h < (kvh + 1) * grp; h++) {
                for (int t = 0; t < T; t++) {
                    size_t row = (size_t)b * T + t;
                    int s0 = doc_first(cx, row); /* the document's first row (see forward) */
                    size_t kb = ((size_t)b * T + (size_t)s0) * S;
                    cx->k->attn_bwd_row(
                        dqkv + row * S + (size_t)h * HD, dqkv + kb + (size_t)(NH + kvh) * HD,
                        dqkv + kb + (size_t)(NH + NKV + kvh) * HD, qkv + row * S + (size_t)h * HD,
                        qkv + kb + (size_t)(NH + kvh) * HD,
                        qkv + kb + (size_t)(NH + NKV + kvh) * HD,
                        dout + row * NH * HD + (size_t)h * HD, out + row * NH * HD + (size_t)h * HD,
                        lse[((size_t)b * NH + h) * T + t], (size_t)S, t - s0, HD, scale, p);
                }
            }
        }
    }
}

/* ---- classifier ---- */

void cpu_classifier(void *ctx, float *losses, void *dinp_, void *dW, const void *inp_,
                    const void *W, const int32_t *targets, int N, int C, int V, int Vp,
                    float grad_scale) {
    struct cpu_ctx *cx = CX;
    float *dinp = dinp_;
    const float *inp = inp_;
    int grads = dinp || dW;
    for (int r0 = 0; r0 < N; r0 += cx->cls_chunk) {
        int n = N - r0 < cx->cls_chunk ? N - r0 : cx->cls_chunk;
        float *lg = cx->logits;
        cpu_matmul_fwd(ctx, lg, inp + (size_t)r0 * C, W, NULL, n, C, Vp);
#pragma omp parallel for num_threads(cx->nt) if (CPU_PAR(cx, (size_t)n * Vp * 4)) schedule(static)
        for (int i = 0; i < n; i++) {
            float *l = lg + (size_t)i * Vp;
            int tg = targets[r0 + i];
            if (tg < 0) {
                losses[r0 + i] = 0;
                if (grads) memset(l, 0, (size_t)Vp * sizeof *l);
                continue;
            }
            losses[r0 + i] = cx->k->xent_row(l, V, Vp, tg, grad_scale, grads);
        }
        if (grads)
            cpu_matmul_bwd(ctx, dinp ? dinp + (size_t)r0 * C : NULL, dW, NULL, lg,
                           inp + (size_t)r0 * C, W, n, C, Vp);
    }
}
