/* Causal attention through cuDNN's fused attention engines; see
 * cudnn_attn.h. The operation graphs below are the composite SDPA graphs of
 * cudnn-frontend (node/scaled_dot_product_flash_attention.h, softmax.h,
 * diagonal_band_mask.h, for a cuDNN before 9.21), expressed directly in the
 * backend C API: the frontend is C++ and not part of the toolkit, and the
 * engines recognise the graph's pattern, so the ops, data types and virtual
 * tensors follow it exactly. */
#include "worker/cuda/cudnn_attn.h"

#include <stdio.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#define LOOM_CUDNN_HEADERS 1
#endif
#endif

#ifndef LOOM_CUDNN_HEADERS

struct lcudnn_attn *lcudnn_attn_new(void *stream, int B, int T, int H, int Hkv, int D, int ld_qkv,
                                    int ld_o, int deterministic, char *why, size_t whylen) {
    (void)stream, (void)B, (void)T, (void)H, (void)Hkv, (void)D, (void)ld_qkv, (void)ld_o,
        (void)deterministic;
    snprintf(why, whylen, "built without cuDNN headers");
    return NULL;
}
int lcudnn_attn_fwd(struct lcudnn_attn *a, void *out, float *lse, const void *qkv) {
    (void)a, (void)out, (void)lse, (void)qkv;
    return -1;
}
int lcudnn_attn_bwd(struct lcudnn_attn *a, void *dqkv, const void *dout, const void *out,
                    const float *lse, const void *qkv) {
    (void)a, (void)dqkv, (void)dout, (void)out, (void)lse, (void)qkv;
    return -1;
}
size_t lcudnn_attn_bytes(const struct lcudnn_attn *a) {
    return (void)a, 0;
}
void lcudnn_attn_engines(const struct lcudnn_attn *a, int *fwd, int *bwd) {
    (void)a;
    *fwd = *bwd = -1;
}
void lcudnn_attn_free(struct lcudnn_attn *a) {
    (void)a;
}
long lcudnn_version(void) {
    return 0;
}

#else

#include <cuda_runtime.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- the library, opened once ---- */
static struct {
    int state; /* 0 untried, 1 loaded, -1 failed */
    char err[256];
    size_t (*version)(void);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*destroy)(cudnnHandle_t);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    const char *(*status_str)(cudnnStatus_t);
    void (*last_error)(char *, size_t);
    cudnnStatus_t (*mk)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*rm)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*set)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                         cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*get)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                         cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*fin)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*exec)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} L;
static pthread_once_t L_once = PTHREAD_ONCE_INIT;

static void lib_load(void) {
    const char *names[] = {"libcudnn.so.9", "libcudnn.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(L.err, sizeof L.err, "cannot load libcudnn.so.9: %s", e ? e : "?");
        L.state = -1;
        return;
    }
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        *(void **)&L.field = dlsym(h, name);                                                       \
        if (!L.field) {                                                                            \
            snprintf(L.err, sizeof L.err, "libcudnn.so.9 lacks %s", name);                         \
            L.state = -1;                                                                          \
            return;                                                                                \
        }                                                                                          \
    } while (0)
    SYM(version, "cudnnGetVersion");
    SYM(create, "cudnnCreate");
    SYM(destroy, "cudnnDestroy");
    SYM(set_stream, "cudnnSetStream");
    SYM(status_str, "cudnnGetErrorString");
    SYM(last_error, "cudnnGetLastErrorString");
    SYM(mk, "cudnnBackendCreateDescriptor");
    SYM(rm, "cudnnBackendDestroyDescriptor");
    SYM(set, "cudnnBackendSetAttribute");
    SYM(get, "cudnnBackendGetAttribute");
    SYM(fin, "cudnnBackendFinalize");
    SYM(exec, "cudnnBackendExecute");
#undef SYM
    if (L.version() / 10000 != CUDNN_MAJOR) {
        snprintf(L.err, sizeof L.err, "libcudnn version %zu, built for major %d", L.version(),
                 CUDNN_MAJOR);
        L.state = -1;
        return;
    }
    L.state = 1;
}

static int lib_ok(char *why, size_t whylen) {
    pthread_once(&L_once, lib_load);
    if (L.state != 1) snprintf(why, whylen, "%s", L.err);
    return L.state == 1;
}

long lcudnn_version(void) {
    char tmp[256];
    return lib_ok(tmp, sizeof tmp) ? (long)L.version() : 0;
}

/* ---- graph building: every descriptor made is kept in g->keep and freed
 * with the builder; the first failure is recorded and later calls are
 * no-ops ---- */
#define KEEP_MAX 160
struct gb {
    cudnnBackendDescriptor_t keep[KEEP_MAX];
    int nkeep;
    cudnnBackendDescriptor_t ops[40];
    int nops;
    int failed;
    char msg[400];
};

static void gb_fail(struct gb *g, cudnnStatus_t st, const char *what) {
    if (g->failed) return;
    char last[256] = "";
    L.last_error(last, sizeof last);
    snprintf(g->msg, sizeof g->msg, "%s: %s%s%s", what, L.status_str(st), last[0] ? ": " : "",
             last);
    g->failed = 1;
}

static cudnnBackendDescriptor_t gb_mk(struct gb *g, cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->failed) return NULL;
    if (g->nkeep == KEEP_MAX) {
        snprintf(g->msg, sizeof g->msg, "too many descriptors");
        g->failed = 1;
        return NULL;
    }
    cudnnStatus_t st = L.mk(t, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, st, "create descriptor");
        return NULL;
    }
    g->keep[g->nkeep++] = d;
    return d;
}

static void gb_set(struct gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t n, const void *v) {
    if (g->failed) return;
    cudnnStatus_t st = L.set(d, name, type, n, v);
    if (st != CUDNN_STATUS_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "set attribute %d", (int)name);
        gb_fail(g, st, what);
    }
}

static void gb_fin(struct gb *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->failed) return;
    cudnnStatus_t st = L.fin(d);
    if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, st, what);
}

static void gb_free(struct gb *g) {
    for (int i = g->nkeep - 1; i >= 0; i--)
        L.rm(g->keep[i]);
    g->nkeep = 0;
}

static cudnnBackendDescriptor_t tensor(struct gb *g, int64_t uid, cudnnDataType_t dt,
                                       const int64_t dim[4], const int64_t str[4], bool virt,
                                       bool byval) {
    cudnnBackendDescriptor_t t = gb_mk(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16;
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (byval) gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
    gb_fin(g, t, "tensor");
    return t;
}

/* a by-value fp32 scalar (its value is passed through the variant pack) */
static cudnnBackendDescriptor_t scalar(struct gb *g, int64_t uid) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, uid, CUDNN_DATA_FLOAT, one, one, false, true);
}

/* d.name = other (a descriptor attribute; a NULL other is left unset) */
static void gb_link(struct gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                    cudnnBackendDescriptor_t other) {
    if (other) gb_set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &other);
}

/* An operation of `type` whose attributes names[i] are the descriptors
 * descs[i] (NULL ones left unset), finalised and appended to the graph. */
static void op(struct gb *g, cudnnBackendDescriptorType_t type, const char *what, int n,
               const cudnnBackendAttributeName_t *names, const cudnnBackendDescriptor_t *descs) {
    cudnnBackendDescriptor_t o = gb_mk(g, type);
    for (int i = 0; i < n; i++)
        gb_link(g, o, names[i], descs[i]);
    gb_fin(g, o, what);
    if (!g->failed) g->ops[g->nops++] = o;
}

/* y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX */
static void pointwise(struct gb *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = gb_mk(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    gb_fin(g, pw, "pointwise descriptor");
    op(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation", 5,
       (const cudnnBackendAttributeName_t[]){
           CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
           CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
           CUDNN_ATTR_OPERATION_POINTWISE_YDESC},
       (const cudnnBackendDescriptor_t[]){pw, x, b, t, y});
}

static void reduction(struct gb *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = gb_mk(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    gb_fin(g, r, "reduction descriptor");
    op(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation", 3,
       (const cudnnBackendAttributeName_t[]){CUDNN_ATTR_OPERATION_REDUCTION_DESC,
                                             CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                             CUDNN_ATTR_OPERATION_REDUCTION_YDESC},
       (const cudnnBackendDescriptor_t[]){r, x, y});
}

static void matmul(struct gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = gb_mk(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    gb_set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    gb_fin(g, m, "matmul descriptor");
    op(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation", 4,
       (const cudnnBackendAttributeName_t[]){
           CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
           CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC},
       (const cudnnBackendDescriptor_t[]){a, b, c, m});
}

static void reshape(struct gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    op(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation", 2,
       (const cudnnBackendAttributeName_t[]){CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                             CUDNN_ATTR_OPERATION_RESHAPE_YDESC},
       (const cudnnBackendDescriptor_t[]){x, y});
}

/* unique ids of the non-virtual tensors (virtual ones count up from 100) */
enum {
    U_Q = 1,
    U_K,
    U_V,
    U_O,
    U_STATS,
    U_SCALE,
    U_NEGINF,
    U_DO,
    U_DQ,
    U_DK,
    U_DV,
    U_SSUM,
    U_ONE,
    U_DQACC,
};

struct plan {
    struct gb g; /* the graph's descriptors, kept for the plan's lifetime */
    cudnnBackendDescriptor_t plan;
    int64_t ws_bytes;
    int engine;
};

struct lcudnn_attn {
    cudnnHandle_t h;
    cudaStream_t s;
    int B, T, H, Hkv, D, ld, ldo, det;
    struct plan fwd, bwd;
    void *ws; /* max of the two plans' workspaces */
    size_t ws_bytes;
    float *ssum;  /* [B][H][T] softmax sums (backward) */
    float *dqacc; /* [B][H][T][D] fp32 dQ (nondeterministic backward) */
    float scale, neginf, one;
    char why[640];
};

/* Finalises the operation graph of g's ops and the first engine the
 * heuristics offer that builds (skipping nondeterministic ones when asked);
 * a failure while the ops were made is reported here too. */
static int make_plan(struct lcudnn_attn *a, struct gb *g, int det, struct plan *out,
                     const char *what) {
    cudnnBackendDescriptor_t graph = gb_mk(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &a->h);
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    gb_fin(g, graph, "operation graph");
    cudnnBackendDescriptor_t heur = gb_mk(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    gb_link(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    gb_fin(g, heur, "heuristics");
    if (g->failed) goto fail;
    int64_t n = 0;
    cudnnStatus_t st =
        L.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL);
    if (st != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, st, "heuristics result count");
        goto fail;
    }
    if (n > 16) n = 16;
    if (n == 0) {
        snprintf(g->msg, sizeof g->msg, "no engine offered for the graph");
        g->failed = 1;
        goto fail;
    }
    cudnnBackendDescriptor_t cfgs[16];
    for (int64_t i = 0; i < n; i++)
        cfgs[i] = gb_mk(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g->failed) goto fail;
    int64_t got = 0;
    st = L.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfgs);
    if (st != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, st, "heuristics results");
        goto fail;
    }
    char tried[256] = "";
    size_t tl = 0;
    for (int64_t i = 0; i < got; i++) {
        cudnnBackendDescriptor_t eng = gb_mk(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        if (g->failed) goto fail;
        int64_t ne = 0, gidx = -1, nn = 0;
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        L.get(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ne, &eng);
        L.get(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &ne, &gidx);
        int nondet = 0;
        if (L.get(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                  CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) == CUDNN_STATUS_SUCCESS)
            for (int64_t j = 0; j < nn; j++)
                nondet |= notes[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
        if (tl < sizeof tried - 32)
            tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%lld%s", tl ? "," : "",
                                   (long long)gidx, nondet ? "(nd)" : "");
        if (det && nondet) continue;
        cudnnBackendDescriptor_t p = NULL;
        if (L.mk(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS) continue;
        if (L.set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &a->h) ||
            L.set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &cfgs[i]) ||
            L.fin(p)) {
            L.rm(p);
            continue;
        }
        int64_t ws = 0, nw = 0;
        L.get(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &nw, &ws);
        out->plan = p;
        out->ws_bytes = ws;
        out->engine = (int)gidx;
        return 0; /* g's descriptors stay alive with the plan */
    }
    snprintf(g->msg, sizeof g->msg, "no engine built (offered: %s)", tried);
    g->failed = 1;
fail:
    snprintf(a->why, sizeof a->why, "%s: %s", what, g->msg);
    gb_free(g);
    return -1;
}

/* Dims and strides of the graphs' tensors: Q, K, V (and their gradients)
 * are views of the fused qkv rows (K and V with Hkv heads), Kt / Vt the same
 * with the last two swapped; O and dO rows of ld_o; S the B x H x T x T
 * scores (virtual), St their transposed view; R the B x H x T x 1 row
 * statistics; OO the virtual dO * O product as cudnn-frontend lays it out;
 * acc the packed fp32 dQ; full the packed per-query-head dK / dV of grouped-
 * query attention (virtual), summed over each group of H / Hkv heads. The
 * matmuls broadcast K and V over the group: query head h reads kv head
 * h / (H / Hkv), as k_attn.cu does. */
struct shapes {
    int64_t dq[4], sq[4], dk[4], dkt[4], skt[4], dO[4], sO[4], sOO[4], sacc[4], dS[4], sS[4],
        sST[4], dR[4], sR[4];
};

static struct shapes shapes_of(const struct lcudnn_attn *a) {
    int64_t B = a->B, H = a->H, Hk = a->Hkv, T = a->T, D = a->D, ld = a->ld, ldo = a->ldo;
    struct shapes p = {.dq = {B, H, T, D},
                       .sq = {T * ld, D, ld, 1},
                       .dk = {B, Hk, T, D},
                       .dkt = {B, Hk, D, T},
                       .skt = {T * ld, D, 1, ld},
                       .dO = {B, H, T, D},
                       .sO = {T * ldo, D, ldo, 1},
                       .sOO = {H * T * D, T * D, H * D, 1},
                       .sacc = {H * T * D, T * D, D, 1},
                       .dS = {B, H, T, T},
                       .sS = {H * T * T, T * T, T, 1},
                       .sST = {H * T * T, T * T, 1, T},
                       .dR = {B, H, T, 1},
                       .sR = {H * T, T, 1, 1}};
    return p;
}

static int build_fwd(struct lcudnn_attn *a) {
    struct gb *g = &a->fwd.g;
    const struct shapes sh = shapes_of(a);
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT, I = CUDNN_DATA_INT32,
                          BO = CUDNN_DATA_BOOLEAN;
    cudnnBackendDescriptor_t q = tensor(g, U_Q, BF, sh.dq, sh.sq, false, false);
    cudnnBackendDescriptor_t kt = tensor(g, U_K, BF, sh.dkt, sh.skt, false, false);
    cudnnBackendDescriptor_t v = tensor(g, U_V, BF, sh.dk, sh.sq, false, false);
    cudnnBackendDescriptor_t o = tensor(g, U_O, BF, sh.dO, sh.sO, false, false);
    cudnnBackendDescriptor_t stats = tensor(g, U_STATS, F, sh.dR, sh.sR, false, false);
    cudnnBackendDescriptor_t scale = scalar(g, U_SCALE), neginf = scalar(g, U_NEGINF);
    cudnnBackendDescriptor_t s = tensor(g, 100, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t s2 = tensor(g, 101, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t row = tensor(g, 102, I, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t col = tensor(g, 103, I, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t keep = tensor(g, 104, BO, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t s3 = tensor(g, 105, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t mx = tensor(g, 106, F, sh.dR, sh.sR, true, false);
    cudnnBackendDescriptor_t s4 = tensor(g, 107, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t e = tensor(g, 108, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t z = tensor(g, 109, F, sh.dR, sh.sR, true, false);
    cudnnBackendDescriptor_t lz = tensor(g, 110, F, sh.dR, sh.sR, true, false);
    cudnnBackendDescriptor_t p = tensor(g, 111, BF, sh.dS, sh.sS, true, false);
    matmul(g, q, kt, s);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, s, scale, NULL, s2);
    /* causal mask: keep where row >= col */
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 2, s2, NULL, NULL, row);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 3, s2, NULL, NULL, col);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, BO, -1, row, col, NULL, keep);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, s2, neginf, keep, s3);
    /* softmax with statistics */
    reduction(g, CUDNN_REDUCE_TENSOR_MAX, s3, mx);
    pointwise(g, CUDNN_POINTWISE_SUB, F, -1, s3, mx, NULL, s4);
    pointwise(g, CUDNN_POINTWISE_EXP, F, -1, s4, NULL, NULL, e);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    pointwise(g, CUDNN_POINTWISE_LOG, F, -1, z, NULL, NULL, lz);
    pointwise(g, CUDNN_POINTWISE_ADD, F, -1, mx, lz, NULL, stats);
    pointwise(g, CUDNN_POINTWISE_DIV, F, -1, e, z, NULL, p);
    matmul(g, p, v, o);
    return make_plan(a, g, 1, &a->fwd, "forward");
}

static int build_bwd(struct lcudnn_attn *a) {
    struct gb *g = &a->bwd.g;
    const struct shapes sh = shapes_of(a);
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT, I = CUDNN_DATA_INT32,
                          BO = CUDNN_DATA_BOOLEAN;
    cudnnBackendDescriptor_t q = tensor(g, U_Q, BF, sh.dq, sh.sq, false, false);
    cudnnBackendDescriptor_t kt = tensor(g, U_K, BF, sh.dkt, sh.skt, false, false);
    cudnnBackendDescriptor_t vt = tensor(g, U_V, BF, sh.dkt, sh.skt, false, false);
    cudnnBackendDescriptor_t o = tensor(g, U_O, BF, sh.dO, sh.sO, false, false);
    cudnnBackendDescriptor_t dout = tensor(g, U_DO, BF, sh.dO, sh.sO, false, false);
    cudnnBackendDescriptor_t stats = tensor(g, U_STATS, F, sh.dR, sh.sR, false, false);
    cudnnBackendDescriptor_t ddq = tensor(g, U_DQ, BF, sh.dq, sh.sq, false, false);
    cudnnBackendDescriptor_t ddk = tensor(g, U_DK, BF, sh.dk, sh.sq, false, false);
    cudnnBackendDescriptor_t ddv = tensor(g, U_DV, BF, sh.dk, sh.sq, false, false);
    cudnnBackendDescriptor_t ssum = tensor(g, U_SSUM, F, sh.dR, sh.sR, false, false);
    cudnnBackendDescriptor_t scale = scalar(g, U_SCALE), neginf = scalar(g, U_NEGINF),
                             one = scalar(g, U_ONE);
    cudnnBackendDescriptor_t t = tensor(g, 100, F, sh.dO, sh.sOO, true, false);
    cudnnBackendDescriptor_t r = tensor(g, 101, F, sh.dR, sh.sR, true, false);
    cudnnBackendDescriptor_t s = tensor(g, 102, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t s2 = tensor(g, 103, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t s3 = tensor(g, 104, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t row = tensor(g, 105, I, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t col = tensor(g, 106, I, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t keep = tensor(g, 107, BO, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t s4 = tensor(g, 108, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t e = tensor(g, 109, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t pt = tensor(g, 110, BF, sh.dS, sh.sST, true, false);
    cudnnBackendDescriptor_t dp = tensor(g, 111, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t dp2 = tensor(g, 112, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t ds = tensor(g, 113, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t ds2 = tensor(g, 114, F, sh.dS, sh.sS, true, false);
    cudnnBackendDescriptor_t dst = tensor(g, 115, BF, sh.dS, sh.sST, true, false);
    cudnnBackendDescriptor_t k2 = tensor(g, 116, F, sh.dk, sh.sq, true, false);
    /* grouped-query attention: dK and dV per query head, then summed per group
     * (cudnn-frontend's dK_fullhead / dV_fullhead, bf16 and packed) */
    const bool gqa = a->Hkv != a->H;
    cudnnBackendDescriptor_t dvfull = gqa ? tensor(g, 117, BF, sh.dq, sh.sacc, true, false) : NULL;
    cudnnBackendDescriptor_t dkfull = gqa ? tensor(g, 118, BF, sh.dq, sh.sacc, true, false) : NULL;
    /* softmax sums: rowsum(dO * O) */
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, dout, o, NULL, t);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, t, r);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, r, one, NULL, ssum);
    /* P recomputed from the statistics */
    matmul(g, q, kt, s);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, s, scale, NULL, s2);
    pointwise(g, CUDNN_POINTWISE_SUB, F, -1, s2, stats, NULL, s3);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 2, s3, NULL, NULL, row);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 3, s3, NULL, NULL, col);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, BO, -1, row, col, NULL, keep);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, s3, neginf, keep, s4);
    pointwise(g, CUDNN_POINTWISE_EXP, F, -1, s4, NULL, NULL, e);
    /* dV = P^T dO */
    reshape(g, e, pt);
    if (gqa) {
        matmul(g, pt, dout, dvfull);
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, dvfull, ddv);
    } else {
        matmul(g, pt, dout, ddv);
    }
    /* dS = P * (dO V^T - sums) * scale */
    matmul(g, dout, vt, dp);
    pointwise(g, CUDNN_POINTWISE_SUB, F, -1, dp, ssum, NULL, dp2);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, dp2, e, NULL, ds);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, ds, scale, NULL, ds2);
    /* dK = dS^T Q */
    reshape(g, ds2, dst);
    if (gqa) {
        matmul(g, dst, q, dkfull);
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, dkfull, ddk);
    } else {
        matmul(g, dst, q, ddk);
    }
    /* dQ = dS K */
    reshape(g, kt, k2);
    if (a->det) {
        matmul(g, ds2, k2, ddq);
    } else {
        cudnnBackendDescriptor_t acc = tensor(g, U_DQACC, F, sh.dq, sh.sacc, false, false);
        matmul(g, ds2, k2, acc);
        pointwise(g, CUDNN_POINTWISE_IDENTITY, F, -1, acc, NULL, NULL, ddq);
    }
    return make_plan(a, g, a->det, &a->bwd, "backward");
}

static int run(struct lcudnn_attn *a, struct plan *p, int n, const int64_t *uids, void **ptrs) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = L.mk(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = L.set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = L.set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = L.set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &a->ws);
    if (st == CUDNN_STATUS_SUCCESS) st = L.fin(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = L.exec(a->h, p->plan, vp);
    if (vp) L.rm(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[256] = "";
        L.last_error(last, sizeof last);
        fprintf(stderr, "cudnn attention: execute: %s %s\n", L.status_str(st), last);
        return -1;
    }
    return 0;
}

int lcudnn_attn_fwd(struct lcudnn_attn *a, void *out, float *lse, const void *qkv) {
    const uint16_t *q = qkv;
    int64_t uids[] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF};
    void *ptrs[] = {(void *)q,
                    (void *)(q + (size_t)a->H * a->D),
                    (void *)(q + (size_t)(a->H + a->Hkv) * a->D),
                    out,
                    lse,
                    &a->scale,
                    &a->neginf};
    return run(a, &a->fwd, 7, uids, ptrs);
}

int lcudnn_attn_bwd(struct lcudnn_attn *a, void *dqkv, const void *dout, const void *out,
                    const float *lse, const void *qkv) {
    const uint16_t *q = qkv;
    uint16_t *dq = dqkv;
    size_t hk = (size_t)a->H * a->D, hv = (size_t)(a->H + a->Hkv) * a->D;
    if (!a->det && cudaMemsetAsync(a->dqacc, 0, (size_t)a->B * a->H * a->T * a->D * 4, a->s))
        return -1;
    int64_t uids[] = {U_Q,  U_K,  U_V,    U_O,     U_DO,     U_STATS, U_DQ,
                      U_DK, U_DV, U_SSUM, U_SCALE, U_NEGINF, U_ONE,   U_DQACC};
    void *ptrs[] = {
        (void *)q, (void *)(q + hk), (void *)(q + hv), (void *)out, (void *)dout, (void *)lse,
        dq,        dq + hk,          dq + hv,          a->ssum,     &a->scale,    &a->neginf,
        &a->one,   a->dqacc};
    return run(a, &a->bwd, a->det ? 13 : 14, uids, ptrs);
}

void lcudnn_attn_free(struct lcudnn_attn *a) {
    if (!a) return;
    if (a->fwd.plan) L.rm(a->fwd.plan);
    if (a->bwd.plan) L.rm(a->bwd.plan);
    gb_free(&a->fwd.g);
    gb_free(&a->bwd.g);
    cudaFree(a->ws);
    cudaFree(a->ssum);
    cudaFree(a->dqacc);
    if (a->h) L.destroy(a->h);
    free(a);
}

struct lcudnn_attn *lcudnn_attn_new(void *stream, int B, int T, int H, int Hkv, int D, int ld_qkv,
                                    int ld_o, int deterministic, char *why, size_t whylen) {
    if (Hkv < 1 || Hkv > H || H % Hkv) {
        snprintf(why, whylen, "%d query heads are not a multiple of %d kv heads", H, Hkv);
        return NULL;
    }
    if (!lib_ok(why, whylen)) return NULL;
    struct lcudnn_attn *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    a->s = stream;
    a->B = B, a->T = T, a->H = H, a->Hkv = Hkv, a->D = D, a->ld = ld_qkv, a->ldo = ld_o,
    a->det = deterministic;
    a->scale = 1.0f / sqrtf((float)D);
    a->neginf = -INFINITY;
    a->one = 1.0f;
    cudnnStatus_t st = L.create(&a->h);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(why, whylen, "cudnnCreate: %s", L.status_str(st));
        a->h = NULL;
        lcudnn_attn_free(a);
        return NULL;
    }
    st = L.set_stream(a->h, a->s);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(why, whylen, "cudnnSetStream: %s", L.status_str(st));
        lcudnn_attn_free(a);
        return NULL;
    }
    if (build_fwd(a) || build_bwd(a)) {
        snprintf(why, whylen, "%s", a->why);
        lcudnn_attn_free(a);
        return NULL;
    }
    a->ws_bytes = (size_t)(a->fwd.ws_bytes > a->bwd.ws_bytes ? a->fwd.ws_bytes : a->bwd.ws_bytes);
    size_t nrow = (size_t)B * H * T;
    if ((a->ws_bytes && cudaMalloc(&a->ws, a->ws_bytes) != cudaSuccess) ||
        cudaMalloc((void **)&a->ssum, nrow * 4) != cudaSuccess ||
        (!a->det && cudaMalloc((void **)&a->dqacc, nrow * D * 4) != cudaSuccess)) {
        cudaGetLastError();
        snprintf(why, whylen, "cannot allocate %zu bytes of workspace", a->ws_bytes + nrow * 4);
        lcudnn_attn_free(a);
        return NULL;
    }
    return a;
}

size_t lcudnn_attn_bytes(const struct lcudnn_attn *a) {
    size_t nrow = (size_t)a->B * a->H * a->T;
    return a->ws_bytes + nrow * 4 + (a->det ? 0 : nrow * a->D * 4);
}

void lcudnn_attn_engines(const struct lcudnn_attn *a, int *fwd, int *bwd) {
    *fwd = a->fwd.engine;
    *bwd = a->bwd.engine;
}

#endif
