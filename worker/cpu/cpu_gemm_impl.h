/* Template of the CPU micro-kernels, included twice by cpu_gemm.c: once
 * under `#pragma GCC target("avx2")` with KFN(x) = x_avx2 and once for the
 * baseline with KFN(x) = x_base. Not a header of its own: it relies on the
 * vector helpers defined in cpu_gemm.c before the inclusion. No include
 * guard on purpose. */

static void KFN(mm_nt)(float *out, const float *X, const float *W, const float *bias, int r0,
                       int r1, int IC, int OC) {
    int I8 = IC & ~7;
    for (int r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? r1 - r : 4;
        const float *x0 = X + (size_t)r * IC;
        int o = 0;
        if (nr == 4) {
            const float *x1 = x0 + IC, *x2 = x1 + IC, *x3 = x2 + IC;
            for (; o + 2 <= OC; o += 2) {
                const float *w0 = W + (size_t)o * IC, *w1 = w0 + IC;
                v8 a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0},
                   a31 = {0};
                for (int i = 0; i < I8; i += 8) {
                    v8 b0 = ld(w0 + i), b1 = ld(w1 + i), x;
                    x = ld(x0 + i);
                    a00 += x * b0;
                    a01 += x * b1;
                    x = ld(x1 + i);
                    a10 += x * b0;
                    a11 += x * b1;
                    x = ld(x2 + i);
                    a20 += x * b0;
                    a21 += x * b1;
                    x = ld(x3 + i);
                    a30 += x * b0;
                    a31 += x * b1;
                }
                float b0v = bias ? bias[o] : 0.0f, b1v = bias ? bias[o + 1] : 0.0f;
                float *op = out + (size_t)r * OC + o;
                op[0] = dot_tail(hsum(a00), x0, w0, I8, IC) + b0v;
                op[1] = dot_tail(hsum(a01), x0, w1, I8, IC) + b1v;
                op[OC] = dot_tail(hsum(a10), x1, w0, I8, IC) + b0v;
                op[OC + 1] = dot_tail(hsum(a11), x1, w1, I8, IC) + b1v;
                op[2 * OC] = dot_tail(hsum(a20), x2, w0, I8, IC) + b0v;
                op[2 * OC + 1] = dot_tail(hsum(a21), x2, w1, I8, IC) + b1v;
                op[3 * OC] = dot_tail(hsum(a30), x3, w0, I8, IC) + b0v;
                op[3 * OC + 1] = dot_tail(hsum(a31), x3, w1, I8, IC) + b1v;
            }
        }
        /* remaining columns (and all columns of a short row block) */
        for (int rr = 0; rr < nr; rr++) {
            const float *x = x0 + (size_t)rr * IC;
            for (int oo = nr == 4 ? o : 0; oo < OC; oo++) {
                const float *w = W + (size_t)oo * IC;
                v8 a = {0};
                for (int i = 0; i < I8; i += 8)
                    a += ld(x + i) * ld(w + i);
                out[(size_t)(r + rr) * OC + oo] =
                    dot_tail(hsum(a), x, w, I8, IC) + (bias ? bias[oo] : 0.0f);
            }
        }
    }
}

static void KFN(mm_acc)(float *C, size_t ldc, const float *A, size_t sam, size_t sak,
                        const float *B, size_t ldb, int m0, int m1, int J, int K) {
    int J16 = J & ~15;
    for (int m = m0; m < m1; m += 4) {
        int nm = m1 - m < 4 ? m1 - m : 4;
        if (nm == 4) {
            const float *a0 = A + (size_t)m * sam, *a1 = a0 + sam, *a2 = a1 + sam, *a3 = a2 + sam;
            for (int j = 0; j < J16; j += 16) {
                v8 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0},
                   c31 = {0};
                for (int k = 0; k < K; k++) {
                    const float *b = B + (size_t)k * ldb + j;
                    v8 b0 = ld(b), b1 = ld(b + 8);
                    size_t ka = (size_t)k * sak;
                    float s0 = a0[ka], s1 = a1[ka], s2 = a2[ka], s3 = a3[ka];
                    c00 += s0 * b0;
                    c01 += s0 * b1;
                    c10 += s1 * b0;
                    c11 += s1 * b1;
                    c20 += s2 * b0;
                    c21 += s2 * b1;
                    c30 += s3 * b0;
                    c31 += s3 * b1;
                }
                float *c = C + (size_t)m * ldc + j;
                st(c, ld(c) + c00);
                st(c + 8, ld(c + 8) + c01);
                c += ldc;
                st(c, ld(c) + c10);
                st(c + 8, ld(c + 8) + c11);
                c += ldc;
                st(c, ld(c) + c20);
                st(c + 8, ld(c + 8) + c21);
                c += ldc;
                st(c, ld(c) + c30);
                st(c + 8, ld(c + 8) + c31);
            }
        }
        /* remaining columns, and every column of a short block of rows */
        for (int mm = 0; mm < nm; mm++) {
            const float *a = A + (size_t)(m + mm) * sam;
            float *c = C + (size_t)(m + mm) * ldc;
            int j = nm == 4 ? J16 : 0;
            for (; j + 16 <= J; j += 16) {
                v8 c0 = {0}, c1 = {0};
                for (int k = 0; k < K; k++) {
                    const float *b = B + (size_t)k * ldb + j;
                    float s = a[(size_t)k * sak];
                    c0 += s * ld(b);
                    c1 += s * ld(b + 8);
                }
                st(c + j, ld(c + j) + c0);
                st(c + j + 8, ld(c + j + 8) + c1);
            }
            for (; j < J; j++) {
                float s = 0;
                for (int k = 0; k < K; k++)
                    s += a[(size_t)k * sak] * B[(size_t)k * ldb + j];
                c[j] += s;
            }
        }
    }
}

static float KFN(xent_row)(float *l, int V, int Vp, int target, float grad_scale, int grads) {
    float m = -INFINITY;
    for (int v = 0; v < V; v++)
        if (l[v] > m) m = l[v];
    float tl = l[target];
    if (!grads) {
        /* the sum only: exponentiate a copy in blocks */
        float tmp[64], s = 0;
        for (int v0 = 0; v0 < V; v0 += 64) {
            int n = V - v0 < 64 ? V - v0 : 64;
            memcpy(tmp, l + v0, (size_t)n * sizeof(float));
            s += vexp_shift_sum(tmp, n, m);
        }
        return m + logf(s) - tl;
    }
    float s = 0;
    for (int v0 = 0; v0 < V; v0 += 64) {
        int n = V - v0 < 64 ? V - v0 : 64;
        s += vexp_shift_sum(l + v0, n, m);
    }
    float lz = m + logf(s), inv = grad_scale / s;
    int V8 = V & ~7;
    for (int v = 0; v < V8; v += 8)
        st(l + v, ld(l + v) * splat(inv));
    for (int v = V8; v < V; v++)
        l[v] *= inv;
    l[target] -= grad_scale;
    for (int v = V; v < Vp; v++)
        l[v] = 0;
    return lz - tl;
}

static void KFN(attn_fwd_row)(float *o, float *lse, const float *q, const float *k, const float *v,
                              size_t S, int t, int HD, float scale, float *p) {
    float m = -INFINITY;
    for (int j = 0; j <= t; j++) {
        p[j] = vdot(q, k + (size_t)j * S, HD) * scale;
        if (p[j] > m) m = p[j];
    }
    float sum = vexp_shift_sum(p, t + 1, m);
    float inv = 1.0f / sum;
    memset(o, 0, (size_t)HD * sizeof *o);
    for (int j = 0; j <= t; j++)
        vaxpy(o, p[j] * inv, v + (size_t)j * S, HD);
    *lse = m + logf(sum);
}

static void KFN(attn_bwd_row)(float *dq, float *dk, float *dv, const float *q, const float *k,
                              const float *v, const float *dy, const float *o, float lse, size_t S,
                              int t, int HD, float scale, float *p) {
    float D = vdot(dy, o, HD);
    float *pe = p + t + 1; /* probabilities; p holds the score gradients */
    for (int j = 0; j <= t; j++)
        pe[j] = vdot(q, k + (size_t)j * S, HD) * scale;
    vexp_shift_sum(pe, t + 1, lse);
    for (int j = 0; j <= t; j++) {
        size_t off = (size_t)j * S;
        float pj = pe[j];
        float ds = pj * (vdot(dy, v + off, HD) - D) * scale;
        p[j] = ds;
        vaxpy(dk + off, ds, q, HD);
        vaxpy(dv + off, pj, dy, HD);
    }
    for (int j = 0; j <= t; j++)
        vaxpy(dq, p[j], k + (size_t)j * S, HD);
}
