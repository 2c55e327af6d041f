/* Linear layers through cuBLASLt: bf16 operands, fp32 accumulation, fused
 * bias / GELU / residual epilogues in the forward pass, the GELU gradient
 * fused into the data-gradient matmul, and bf16 weight gradients accumulated
 * in place (beta = 1). Bias gradients use a deterministic two-pass column
 * sum (not a cuBLASLt epilogue, so no algorithm choice touches them).
 *
 * Algorithm choice. Every GEMM configuration (shape, transposes, epilogue,
 * beta = 0 or 1, data type, and the alignment of each pointer up to 256
 * bytes) is looked up in a per-handle cache, so steady-state steps only
 * build descriptors. What fills the cache:
 * - Default: the first result of cublasLtMatmulAlgoGetHeuristic.
 * - LOOM_BLAS_TUNE=1 (the blas-tune row, given to lk_blas_new): the first time a configuration
 *   is met, up to LK_CANDS heuristic results (asked with the real pointer
 *   alignments and the LK_WS_BYTES workspace) are each run once and then
 *   timed with CUDA events on the layer's stream, LK_TUNE_ROUNDS rounds of
 *   LK_TUNE_REPS calls, best round kept, on that call's own operands; the
 *   fastest wins, but #0 stays unless beaten by more than LK_TUNE_MARGIN.
 *   A candidate whose cublasLtMatmul fails is skipped. The result is never
 *   changed by the timing: when the output D overlaps an input (beta = 1 in
 *   place: residual, accumulating dgrad, wgrad; or D over the DGELU input),
 *   candidates write to a temporary buffer (cudaMallocAsync on the stream,
 *   freed at once; if that fails the configuration keeps #0); otherwise they
 *   write D and the GELU pre-activation output, which the real call then
 *   overwrites. The real call always runs exactly once afterwards with the
 *   chosen algorithm, so accumulating outputs are added once. An epilogue
 *   output that overlaps an input, an unknown epilogue, or a stream under
 *   graph capture (nothing can be timed there; not cached, so a later call
 *   tunes) keeps #0. One info line per configuration gives the choice and
 *   the time of #0 against it. This is the only allocation made after
 *   start-up, and only in the first step.
 * - LOOM_BLAS_ALGO_CACHE=path: a text table of choices (key, index among
 *   the usable heuristic results, and the algorithm's configuration: id,
 *   tile, stages, split-k, ...). When the file exists at lk_blas_new, its
 *   entries are used instead of timing (the candidate with the recorded
 *   configuration, else the recorded index with a warning), whether
 *   or not LOOM_BLAS_TUNE is set; configurations it lacks are tuned (with
 *   LOOM_BLAS_TUNE=1) or take #0. With LOOM_BLAS_TUNE=1 every decision is
 *   written back (under flock of path.lock, merged with what another process
 *   wrote, through a rename). Timing is noisy, so with LOOM_BLAS_TUNE=1 and
 *   no table a resumed run may choose other algorithms and differ from the
 *   uninterrupted run in the last bits; with the table it repeats them. All
 *   ranks of a job share one file: for bit-exact resume of a multi-rank run,
 *   make the table before the run (a short run with the same shapes), since
 *   ranks that tune at the same time may choose differently and the file
 *   keeps the last writer's choice. Each chosen algorithm itself is
 *   deterministic (cuBLAS repeats bits on one GPU type and version). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "common/clock.h"
#include "common/log.h"
}
#include "worker/cuda/k_fp8.h"
#include "worker/cuda/kernels.h"

#define LK_WS_BYTES    (64u << 20)
#define LK_ALGO_CACHE  256
#define LK_TABLE_MAX   256
#define LK_CANDS       8    /* heuristic results timed per configuration */
#define LK_TUNE_ROUNDS 3    /* timed rounds per candidate (best kept) */
#define LK_TUNE_REPS   4    /* calls per timed round */
#define LK_TUNE_MARGIN 0.99 /* another algorithm must take < 99 % of #0's time */
#define LK_BIAS_ROWCHK 128  /* rows per partial in the bias column sum */

enum { AL_A, AL_B, AL_C, AL_D, AL_BIAS, AL_AUX, AL_N };

struct algo_key {
    int m, n, k, ta, tb, epi, dt, beta1;
    int align[AL_N]; /* pointer alignment in bytes, capped at 256; 0 when absent */
    /* leading dimensions of a strided call (lk_gemm_rm); 0 for the packed
     * calls, so the table file (which does not record them) still matches */
    int lda, ldb, ldc;
    /* 1: E4M3 A and B with scale pointers (lk_linear_fp8), 2: the same with
     * fast accumulation; 0: bf16 operands.
     * Never in the table file (fp8 calls take the heuristic's first). */
    int fp8;
};
struct algo_entry {
    struct algo_key key;
    cublasLtMatmulAlgo_t algo;
    int used;
};
/* An algorithm by its configuration attributes (what the table stores and
 * matches on; the opaque bytes of cublasLtMatmulAlgo_t are not compared). */
static const struct {
    cublasLtMatmulAlgoConfigAttributes_t attr;
    size_t size;
    const char *name;
} cfg_attrs[] = {
    {CUBLASLT_ALGO_CONFIG_ID, sizeof(int32_t), "algo"},
    {CUBLASLT_ALGO_CONFIG_TILE_ID, sizeof(uint32_t), "tile"},
    {CUBLASLT_ALGO_CONFIG_STAGES_ID, sizeof(uint32_t), "stages"},
    {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sizeof(int32_t), "splitk"},
    {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, sizeof(uint32_t), "reduction"},
    {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, sizeof(uint32_t), "swizzle"},
    {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, sizeof(uint32_t), "custom"},
    {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, sizeof(uint16_t), "inner"},
    {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, sizeof(uint16_t), "cluster"},
};
#define LK_NCFG 9
static_assert(sizeof cfg_attrs / sizeof cfg_attrs[0] == LK_NCFG, "cfg_attrs and LK_NCFG");

/* A decision of the tuned / table modes: index among the usable heuristic
 * results and the chosen algorithm's configuration. */
struct table_entry {
    struct algo_key key;
    int index;
    long long cfg[LK_NCFG];
};

struct lk_blas {
    cublasLtHandle_t lt;
    cudaStream_t s;
    void *ws;
    int tune;         /* LOOM_BLAS_TUNE=1 */
    char *table_path; /* LOOM_BLAS_ALGO_CACHE or NULL */
    int select;       /* tune or a table was read: candidates with alignment prefs */
    int table_full_warned;
    cudaEvent_t ev[2];
    struct lk_blas_stats st;
    int ntable;
    struct table_entry table[LK_TABLE_MAX];
    struct algo_entry cache[LK_ALGO_CACHE];
};

/* One matmul call, as lt_matmul builds it. C is the effective C operand
 * (D when the caller gave none). */
struct mm_call {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    const void *A, *B, *C, *bias;
    void *D, *aux;
    float alpha, beta;
    cublasLtEpilogue_t epi;
    size_t a_bytes, b_bytes, cd_bytes, bias_bytes, aux_bytes;
};

/* Epilogues this file uses; aux_out: the aux buffer is written (else read). */
static const struct epi_info {
    cublasLtEpilogue_t epi;
    const char *name;
    int aux_out;
} epi_table[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, "none", 0},
    {CUBLASLT_EPILOGUE_BIAS, "bias", 0},
    {CUBLASLT_EPILOGUE_GELU_AUX, "gelu_aux", 1},
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "gelu_aux_bias", 1},
    {CUBLASLT_EPILOGUE_DGELU, "dgelu", 0},
};

static const struct epi_info *epi_find(cublasLtEpilogue_t e) {
    for (size_t i = 0; i < sizeof epi_table / sizeof epi_table[0]; i++)
        if (epi_table[i].epi == e) return &epi_table[i];
    return NULL;
}

static int ptr_align(const void *p) {
    if (!p) return 0;
    uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && !(u & (uintptr_t)a))
        a <<= 1;
    return a;
}

static int overlap(const void *p, size_t pn, const void *q, size_t qn) {
    if (!p || !q || !pn || !qn) return 0;
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + qn && b < a + pn;
}

/* The configuration attributes of an algorithm (-1 where unreadable). */
static void algo_cfg(const cublasLtMatmulAlgo_t *a, long long cfg[LK_NCFG]) {
    for (int i = 0; i < LK_NCFG; i++) {
        size_t w = 0;
        cfg[i] = -1;
        if (cfg_attrs[i].size == 2) {
            uint16_t v = 0;
            if (cublasLtMatmulAlgoConfigGetAttribute(a, cfg_attrs[i].attr, &v, 2, &w) ==
                CUBLAS_STATUS_SUCCESS)
                cfg[i] = v;
        } else if (cfg_attrs[i].attr == CUBLASLT_ALGO_CONFIG_ID ||
                   cfg_attrs[i].attr == CUBLASLT_ALGO_CONFIG_SPLITK_NUM) {
            int32_t v = 0;
            if (cublasLtMatmulAlgoConfigGetAttribute(a, cfg_attrs[i].attr, &v, 4, &w) ==
                CUBLAS_STATUS_SUCCESS)
                cfg[i] = v;
        } else {
            uint32_t v = 0;
            if (cublasLtMatmulAlgoConfigGetAttribute(a, cfg_attrs[i].attr, &v, 4, &w) ==
                CUBLAS_STATUS_SUCCESS)
                cfg[i] = v;
        }
    }
}

static void algo_describe(const cublasLtMatmulAlgo_t *a, char *buf, size_t n) {
    long long cfg[LK_NCFG];
    algo_cfg(a, cfg);
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < LK_NCFG && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s %lld", i ? " " : "", cfg_attrs[i].name,
                                 cfg[i]);
}

/* ---- the table file (LOOM_BLAS_ALGO_CACHE) ---- */

static struct table_entry *table_find(struct lk_blas *b, const struct algo_key *key) {
    for (int i = 0; i < b->ntable; i++)
        if (!memcmp(&b->table[i].key, key, sizeof *key)) return &b->table[i];
    return NULL;
}

static void table_add(struct lk_blas *b, const struct algo_key *key, int index,
                      const long long cfg[LK_NCFG]) {
    if (table_find(b, key)) return;
    if (b->ntable == LK_TABLE_MAX) {
        if (!b->table_full_warned)
            log_warn("blas: algorithm table full (%d configurations); later ones not recorded",
                     LK_TABLE_MAX);
        b->table_full_warned = 1;
        return;
    }
    struct table_entry *t = &b->table[b->ntable++];
    t->key = *key;
    t->index = index;
    memcpy(t->cfg, cfg, sizeof t->cfg);
}

/* Add the file's entries for keys not yet known. Returns the number of
 * entries read, -1 when the file cannot be opened. */
static int table_read(struct lk_blas *b, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t ver = 0;
        if (sscanf(line, "# cuBLASLt %zu", &ver) == 1 && ver != cublasLtGetVersion())
            log_warn("blas: %s was written with cuBLASLt %zu, this is %zu: its algorithms may "
                     "not be offered",
                     path, ver, cublasLtGetVersion());
        if (line[0] == '#' || line[0] == '\n') continue;
        struct algo_key k;
        memset(&k, 0, sizeof k);
        int index = 0;
        long long c[LK_NCFG];
        int got = sscanf(line,
                         "%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %lld %lld %lld %lld %lld "
                         "%lld %lld %lld %lld",
                         &k.m, &k.n, &k.k, &k.ta, &k.tb, &k.epi, &k.dt, &k.beta1, &k.align[AL_A],
                         &k.align[AL_B], &k.align[AL_C], &k.align[AL_D], &k.align[AL_BIAS],
                         &k.align[AL_AUX], &index, &c[0], &c[1], &c[2], &c[3], &c[4], &c[5], &c[6],
                         &c[7], &c[8]);
        if (got != 15 + LK_NCFG || index < 0 || index >= LK_CANDS) {
            log_warn("blas: %s:%d: malformed line skipped", path, lineno);
            continue;
        }
        table_add(b, &k, index, c);
        n++;
    }
    fclose(f);
    return n;
}

/* Merge with the file (another rank may have written it) and replace it
 * through a rename, under flock(path.lock). Failures are warnings: the
 * choices still hold for this process. */
static void table_save(struct lk_blas *b) {
    const char *path = b->table_path;
    size_t len = strlen(path) + 32;
    char *lock = (char *)malloc(len), *tmp = (char *)malloc(len);
    int lfd = -1;
    FILE *f = NULL;
    if (!lock || !tmp) goto out;
    snprintf(lock, len, "%s.lock", path);
    snprintf(tmp, len, "%s.tmp.%d", path, (int)getpid());
    lfd = open(lock, O_CREAT | O_RDWR, 0644);
    if (lfd >= 0) flock(lfd, LOCK_EX);
    table_read(b, path);
    f = fopen(tmp, "w");
    if (!f) {
        log_warn("blas: cannot write %s", tmp);
        goto out;
    }
    fprintf(f, "# loom cuBLASLt algorithm table: m n k ta tb epilogue dtype beta1, alignment of "
               "A B C D bias aux, index among the heuristic's usable results; the algorithm: id "
               "tile stages splitk reduction swizzle custom inner cluster\n");
    fprintf(f, "# cuBLASLt %zu\n", cublasLtGetVersion());
    for (int i = 0; i < b->ntable; i++) {
        const struct table_entry *t = &b->table[i];
        const struct algo_key *k = &t->key;
        fprintf(f, "%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", k->m, k->n, k->k, k->ta, k->tb,
                k->epi, k->dt, k->beta1, k->align[AL_A], k->align[AL_B], k->align[AL_C],
                k->align[AL_D], k->align[AL_BIAS], k->align[AL_AUX], t->index);
        for (int j = 0; j < LK_NCFG; j++)
            fprintf(f, " %lld", t->cfg[j]);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        f = NULL;
        log_warn("blas: cannot write %s", tmp);
        unlink(tmp);
        goto out;
    }
    f = NULL;
    if (rename(tmp, path) != 0) {
        log_warn("blas: cannot rename %s to %s", tmp, path);
        unlink(tmp);
    }
out:
    if (lfd >= 0) close(lfd); /* releases the flock */
    free(lock);
    free(tmp);
}

extern "C" struct lk_blas *lk_blas_new(lcuda_stream s, struct lcuda_arena *arena, int tune,
                                       const char *p) {
    struct lk_blas *b = (struct lk_blas *)calloc(1, sizeof *b);
    if (!b) lcuda_fail(__FILE__, __LINE__, "calloc", "out of host memory");
    CUBLAS_CHECK(cublasLtCreate(&b->lt));
    b->s = (cudaStream_t)s;
    b->ws = lcuda_arena_alloc(arena, LK_WS_BYTES);
    b->tune = tune != 0;
    if (p && *p) {
        b->table_path = strdup(p);
        if (!b->table_path) lcuda_fail(__FILE__, __LINE__, "strdup", "out of host memory");
        int n = table_read(b, p);
        if (n >= 0)
            log_info("blas: %d algorithm choice(s) read from %s (no timing for those)", n, p);
    }
    b->select = b->tune || b->ntable > 0;
    if (b->tune)
        log_info("blas: LOOM_BLAS_TUNE=1: GEMM algorithms chosen by timing up to %d candidates "
                 "per configuration%s%s",
                 LK_CANDS, b->table_path ? ", recorded in " : "",
                 b->table_path ? b->table_path : "");
    if (b->tune) {
        CUDA_CHECK(cudaEventCreate(&b->ev[0]));
        CUDA_CHECK(cudaEventCreate(&b->ev[1]));
    }
    return b;
}

extern "C" void lk_blas_free(struct lk_blas *b) {
    if (!b) return;
    if (b->ev[0]) cudaEventDestroy(b->ev[0]);
    if (b->ev[1]) cudaEventDestroy(b->ev[1]);
    cublasLtDestroy(b->lt);
    free(b->table_path);
    free(b);
}

extern "C" void lk_blas_get_stats(const struct lk_blas *b, struct lk_blas_stats *st) {
    *st = b->st;
}

/* ---- choosing an algorithm ---- */

/* Usable heuristic results (state SUCCESS, workspace within LK_WS_BYTES),
 * best first, into res[want]; fails fast when there is none. with_align
 * tells the heuristic the real pointer alignments (tune / table modes). */
static int lt_heuristic(struct lk_blas *b, const struct mm_call *c, const struct algo_key *key,
                        int want, int with_align, cublasLtMatmulHeuristicResult_t *res) {
    cublasLtMatmulPreference_t pref = NULL;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = LK_WS_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    if (with_align) {
        static const struct {
            cublasLtMatmulPreferenceAttributes_t attr;
            int which;
        } al[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, AL_A},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, AL_B},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, AL_C},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, AL_D}};
        for (size_t i = 0; i < sizeof al / sizeof al[0]; i++) {
            uint32_t v = (uint32_t)key->align[al[i].which];
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al[i].attr, &v, sizeof v));
        }
    }
    int nres = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(b->lt, c->desc, c->la, c->lb, c->lc, c->ld, pref,
                                                want, res, &nres));
    cublasLtMatmulPreferenceDestroy(pref);
    int n = 0;
    for (int i = 0; i < nres; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= LK_WS_BYTES)
            res[n++] = res[i];
    if (n == 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "no cuBLASLt algorithm for m=%d n=%d k=%d ta=%d tb=%d epi=%d",
                 key->m, key->n, key->k, key->ta, key->tb, key->epi);
        lcuda_fail(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", msg);
    }
    return n;
}

static cublasStatus_t lt_run(struct lk_blas *b, const struct mm_call *c,
                             const cublasLtMatmulAlgo_t *algo, void *D) {
    return cublasLtMatmul(b->lt, c->desc, &c->alpha, c->A, c->la, c->B, c->lb, &c->beta, c->C,
                          c->lc, D, c->ld, algo, b->ws, LK_WS_BYTES, b->s);
}

/* Time the candidates res[0..nc) on the call's own operands and return the
 * index to use (0 when nothing can be timed safely). The outputs the caller
 * sees are left for the real call to write (see the top of the file). */
static int lt_tune(struct lk_blas *b, const char *what, const struct mm_call *c,
                   const struct algo_key *key, const cublasLtMatmulHeuristicResult_t *res, int nc) {
    const struct epi_info *ei = epi_find(c->epi);
    char desc[200];
    snprintf(desc, sizeof desc, "%s m=%d n=%d k=%d ta=%d tb=%d epi=%s beta=%d", what, key->m,
             key->n, key->k, key->ta, key->tb, ei ? ei->name : "?", key->beta1);
    if (nc < 2) {
        log_info("blas: %s: one candidate, #0", desc);
        return 0;
    }
    /* inputs the candidates must not disturb */
    const struct {
        const void *p;
        size_t n;
    } in[] = {{c->A, c->a_bytes},
              {c->B, c->b_bytes},
              {c->bias, c->bias_bytes},
              {c->beta != 0.0f ? c->C : NULL, c->cd_bytes},
              {ei && !ei->aux_out ? c->aux : NULL, c->aux_bytes}};
    int d_scratch = 0, aux_clash = 0;
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        if (overlap(c->D, c->cd_bytes, in[i].p, in[i].n)) d_scratch = 1;
        if (ei && ei->aux_out && overlap(c->aux, c->aux_bytes, in[i].p, in[i].n)) aux_clash = 1;
    }
    if (!ei || aux_clash) {
        log_info("blas: %s: not tuned (%s), #0", desc,
                 ei ? "the epilogue output overlaps an input" : "unknown epilogue");
        return 0;
    }
    void *D = c->D;
    if (d_scratch) {
        cudaError_t e = cudaMallocAsync(&D, c->cd_bytes, b->s);
        if (e != cudaSuccess) {
            cudaGetLastError(); /* not sticky: clear it */
            log_warn("blas: %s: not tuned (no %zu bytes for a scratch output: %s), #0", desc,
                     c->cd_bytes, cudaGetErrorString(e));
            return 0;
        }
    }
    double t_start = clock_mono_msf();
    float best[LK_CANDS];
    int ok[LK_CANDS];
    for (int i = 0; i < nc; i++) {
        best[i] = 1e30f;
        ok[i] = lt_run(b, c, &res[i].algo, D) == CUBLAS_STATUS_SUCCESS; /* warm-up + check */
        if (!ok[i]) cudaGetLastError(); /* a refused launch must not reach a later check */
    }
    for (int r = 0; r < LK_TUNE_ROUNDS; r++) {
        for (int i = 0; i < nc; i++) {
            if (!ok[i]) continue;
            CUDA_CHECK(cudaEventRecord(b->ev[0], b->s));
            for (int j = 0; j < LK_TUNE_REPS && ok[i]; j++)
                if (lt_run(b, c, &res[i].algo, D) != CUBLAS_STATUS_SUCCESS) {
                    ok[i] = 0;
                    cudaGetLastError();
                }
            CUDA_CHECK(cudaEventRecord(b->ev[1], b->s));
            CUDA_CHECK(cudaEventSynchronize(b->ev[1]));
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, b->ev[0], b->ev[1]));
            if (ok[i] && ms / LK_TUNE_REPS < best[i]) best[i] = ms / LK_TUNE_REPS;
        }
    }
    if (d_scratch) CUDA_CHECK(cudaFreeAsync(D, b->s));
    int pick = -1;
    for (int i = 0; i < nc; i++)
        if (ok[i] && (pick < 0 || best[i] < best[pick])) pick = i;
    if (pick < 0) pick = 0; /* nothing ran: #0, which the real call then checks */
    if (ok[0] && best[pick] > LK_TUNE_MARGIN * best[0]) pick = 0;
    b->st.tune_ms += clock_mono_msf() - t_start;
    char ad[200];
    algo_describe(&res[pick].algo, ad, sizeof ad);
    if (ok[0])
        log_info("blas: %s: #%d of %d (%s) %.1f us, #0 %.1f us (%+.1f %%)%s", desc, pick, nc, ad,
                 best[pick] * 1e3, best[0] * 1e3, 100.0 * (best[pick] / best[0] - 1.0),
                 d_scratch ? ", timed into a scratch output" : "");
    else
        log_info("blas: %s: #%d of %d (%s) %.1f us, #0 failed%s", desc, pick, nc, ad,
                 best[pick] * 1e3, d_scratch ? ", timed into a scratch output" : "");
    return pick;
}

/* Tune / table modes: the algorithm for a configuration met for the first
 * time. Returns 1 when the choice may be cached (0 under graph capture). */
static int lt_select(struct lk_blas *b, const char *what, const struct mm_call *c,
                     const struct algo_key *key, cublasLtMatmulAlgo_t *out) {
    cublasLtMatmulHeuristicResult_t res[LK_CANDS];
    int nc = lt_heuristic(b, c, key, LK_CANDS, 1, res);
    const struct table_entry *te = table_find(b, key);
    if (te) {
        /* the recorded index when it still holds the recorded algorithm,
         * else the first candidate with that configuration */
        int idx = -1;
        for (int j = -1; j < nc && idx < 0; j++) {
            int i = j < 0 ? te->index : j;
            if (i >= nc) continue;
            long long cfg[LK_NCFG];
            algo_cfg(&res[i].algo, cfg);
            if (!memcmp(cfg, te->cfg, sizeof cfg)) idx = i;
        }
        if (idx < 0) {
            idx = te->index < nc ? te->index : 0;
            log_warn("blas: %s m=%d n=%d k=%d: the table's algorithm is not offered (other "
                     "cuBLASLt or GPU?); taking #%d of %d",
                     what, key->m, key->n, key->k, idx, nc);
        }
        *out = res[idx].algo;
        b->st.from_table++;
        if (idx != 0) b->st.not_first++;
        return 1;
    }
    if (!b->tune) {
        *out = res[0].algo;
        return 1;
    }
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(b->s, &cs));
    if (cs != cudaStreamCaptureStatusNone) {
        *out = res[0].algo;
        return 0;
    }
    int idx = lt_tune(b, what, c, key, res, nc);
    *out = res[idx].algo;
    b->st.tuned++;
    if (idx != 0) b->st.not_first++;
    long long cfg[LK_NCFG];
    algo_cfg(&res[idx].algo, cfg);
    table_add(b, key, idx, cfg);
    if (b->table_path) table_save(b);
    return 1;
}

static size_t dtype_bytes(cudaDataType dt) {
    return dt == CUDA_R_16BF || dt == CUDA_R_16F ? 2 : 4;
}

/* Leading dimensions and alpha of a strided call (lt_matmul_ex); lda = 0:
 * the packed operands of lt_matmul, alpha 1. */
struct lt_ld {
    int lda, ldb, ldc;
    float alpha;
};

/* D[m][n] (column-major) = op(A) op(B) + beta C, with epilogue. `what`
 * names the call in the tuning log. */
static void lt_matmul_ex(struct lk_blas *b, const char *what, void *D, cudaDataType dt,
                         const void *A, const void *B, const void *C, int m, int n, int k, int ta,
                         int tb, float beta, cublasLtEpilogue_t epi, const void *bias, void *aux,
                         int64_t ld_aux, const struct lt_ld *ld);

static void lt_matmul(struct lk_blas *b, const char *what, void *D, cudaDataType dt, const void *A,
                      const void *B, const void *C, int m, int n, int k, int ta, int tb, float beta,
                      cublasLtEpilogue_t epi, const void *bias, void *aux, int64_t ld_aux) {
    lt_matmul_ex(b, what, D, dt, A, B, C, m, n, k, ta, tb, beta, epi, bias, aux, ld_aux, NULL);
}

static void lt_matmul_ex(struct lk_blas *b, const char *what, void *D, cudaDataType dt,
                         const void *A, const void *B, const void *C, int m, int n, int k, int ta,
                         int tb, float beta, cublasLtEpilogue_t epi, const void *bias, void *aux,
                         int64_t ld_aux, const struct lt_ld *ld) {
    int64_t lda = ld ? ld->lda : (ta ? k : m), ldb = ld ? ld->ldb : (tb ? n : k);
    int64_t ldc = ld ? ld->ldc : m;
    struct mm_call c;
    memset(&c, 0, sizeof c);
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
    if (aux) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &ld_aux, sizeof ld_aux));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.lc, dt, m, n, ldc));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.ld, dt, m, n, ldc));
    c.A = A, c.B = B, c.C = C ? C : D, c.D = D, c.bias = bias, c.aux = aux;
    c.alpha = ld ? ld->alpha : 1.0f, c.beta = beta, c.epi = epi;
    /* the extent each operand spans (strided: up to its last element) */
    c.a_bytes = (size_t)lda * ((ta ? m : k) - 1) + (ta ? k : m);
    c.b_bytes = (size_t)ldb * ((tb ? k : n) - 1) + (tb ? n : k);
    c.a_bytes *= 2, c.b_bytes *= 2;
    c.cd_bytes = ((size_t)ldc * (n - 1) + m) * dtype_bytes(dt);
    c.bias_bytes = bias ? (size_t)m * 2 : 0;
    c.aux_bytes = aux ? (size_t)ld_aux * n * 2 : 0;

    struct algo_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.ta = ta, key.tb = tb, key.epi = (int)epi, key.dt = dt;
    key.beta1 = beta != 0.0f;
    key.align[AL_A] = ptr_align(A), key.align[AL_B] = ptr_align(B);
    key.align[AL_C] = ptr_align(c.C), key.align[AL_D] = ptr_align(D);
    key.align[AL_BIAS] = ptr_align(bias), key.align[AL_AUX] = ptr_align(aux);
    if (ld) key.lda = (int)lda, key.ldb = (int)ldb, key.ldc = (int)ldc;
    const cublasLtMatmulAlgo_t *algo = NULL;
    cublasLtMatmulAlgo_t uncached;
    for (int i = 0; i < LK_ALGO_CACHE && !algo; i++)
        if (b->cache[i].used && !memcmp(&b->cache[i].key, &key, sizeof key))
            algo = &b->cache[i].algo;
    if (!algo) {
        int cache_it = 1;
        if (b->select && !ld) { /* strided calls: the heuristic's first (not in the table) */
            cache_it = lt_select(b, what, &c, &key, &uncached);
        } else {
            cublasLtMatmulHeuristicResult_t res;
            lt_heuristic(b, &c, &key, 1, ld != NULL, &res); /* strided: the real alignments */
            uncached = res.algo;
        }
        algo = &uncached;
        if (cache_it) {
            int slot = 0;
            while (slot < LK_ALGO_CACHE && b->cache[slot].used)
                slot++;
            if (slot == LK_ALGO_CACHE) slot = 0; /* full: overwrite the first */
            b->cache[slot].key = key;
            b->cache[slot].algo = uncached;
            b->cache[slot].used = 1;
            b->st.configs++;
        }
    }
    CUBLAS_CHECK(lt_run(b, &c, algo, D));
    cublasLtMatrixLayoutDestroy(c.la);
    cublasLtMatrixLayoutDestroy(c.lb);
    cublasLtMatrixLayoutDestroy(c.lc);
    cublasLtMatrixLayoutDestroy(c.ld);
    cublasLtMatmulDescDestroy(c.desc);
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
    lt_matmul(b, "fwd", out, CUDA_R_16BF, w, inp, acc, OC, N, IC, 1, 0, acc ? 1.0f : 0.0f, epi,
              bias, gelu ? pre_gelu : NULL, OC);
}

extern "C" void lk_linear_bwd_data(struct lk_blas *b, lbf16 *dinp, const lbf16 *dout,
                                   const lbf16 *w, const lbf16 *pre_gelu, int N, int IC, int OC,
                                   int accumulate) {
    cublasLtEpilogue_t epi = pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
    if (pre_gelu && accumulate)
        lcuda_fail(__FILE__, __LINE__, "lk_linear_bwd_data", "DGELU cannot accumulate");
    lt_matmul(b, "dgrad", dinp, CUDA_R_16BF, w, dout, accumulate ? dinp : NULL, IC, N, OC, 0, 0,
              accumulate ? 1.0f : 0.0f, epi, NULL, (void *)pre_gelu, IC);
}

/* Row-major strided GEMM (kernels.h): C^T = op(B)^T op(A)^T in cuBLASLt's
 * column-major terms, so row-major C[m][n] (row stride ldc) is the
 * column-major [n][m] with leading dimension ldc; likewise A and B. */
extern "C" void lk_gemm_rm(struct lk_blas *b, int ta, int tb, int m, int n, int k, float alpha,
                           const lbf16 *A, int lda, const lbf16 *B, int ldb, float beta, lbf16 *C,
                           int ldc) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    struct lt_ld ld = {.lda = ldb, .ldb = lda, .ldc = ldc, .alpha = alpha};
    lt_matmul_ex(b, "lora", C, CUDA_R_16BF, B, A, beta != 0.0f ? C : NULL, n, m, k, tb, ta, beta,
                 CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, &ld);
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
        lt_matmul(b, "wgrad", dw, CUDA_R_16BF, inp, dout, dw, IC, OC, N, 0, 1, 1.0f,
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

/* ---- FP8 (k_fp8.h): E4M3 x E4M3 -> bf16 with per-tensor scale pointers ---- */

extern "C" int lk_fp8_shape_ok(int m, int n, int k, const void *D, const void *C,
                               const void *bias) {
    if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || k % 16) return 0;
    const void *p[] = {D, C, bias};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i] && ((uintptr_t)p[i] & 15)) return 0;
    return 1;
}

/* The TN form (column-major): A [k][m] with op T, B [k][n] with op N, C / D
 * [m][n], ld k, k and m. Algorithms are cached like lt_matmul's (the key's
 * fp8 field keeps them apart) but neither tuned nor written to the table:
 * the heuristic's first. A refused or unsupported call returns -1 before
 * anything is written. */
extern "C" int lk_linear_fp8(struct lk_blas *b, lbf16 *D, const lbf16 *C, const lbf16 *bias,
                             const uint8_t *A, const float *a_scale, const uint8_t *B,
                             const float *b_scale, int m, int n, int k, int fast_accum) {
    if (!lk_fp8_shape_ok(m, n, k, D, C, bias)) return -1;
    if (((uintptr_t)a_scale | (uintptr_t)b_scale) & 15) {
        /* cuBLASLt refuses such a GEMM at the call (NOT_SUPPORTED), after the
         * heuristic offered algorithms for it */
        log_warn("blas: FP8 GEMM m=%d n=%d k=%d: a scale pointer is not 16-byte aligned (%p, "
                 "%p): bf16 instead",
                 m, n, k, (const void *)a_scale, (const void *)b_scale);
        return -1;
    }
    struct mm_call c;
    memset(&c, 0, sizeof c);
    int rc = -1;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &a_scale, sizeof a_scale));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &b_scale, sizeof b_scale));
    if (fast_accum) {
        int8_t fa = 1;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa,
                                                    sizeof fa));
    }
    if (bias) {
        cudaDataType bt = CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bt, sizeof bt));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.la, CUDA_R_8F_E4M3, k, m, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_8F_E4M3, k, n, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.lc, CUDA_R_16BF, m, n, m));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.ld, CUDA_R_16BF, m, n, m));
    c.A = A, c.B = B, c.C = C ? (const void *)C : (const void *)D, c.D = D, c.bias = bias;
    c.alpha = 1.0f, c.beta = C ? 1.0f : 0.0f, c.epi = epi;

    struct algo_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.ta = 1, key.tb = 0, key.epi = (int)epi;
    key.dt = CUDA_R_16BF, key.beta1 = C != NULL, key.fp8 = fast_accum ? 2 : 1;
    key.align[AL_A] = ptr_align(A), key.align[AL_B] = ptr_align(B);
    key.align[AL_C] = ptr_align(c.C), key.align[AL_D] = ptr_align(D);
    key.align[AL_BIAS] = ptr_align(bias);
    const cublasLtMatmulAlgo_t *algo = NULL;
    cublasLtMatmulHeuristicResult_t res;
    for (int i = 0; i < LK_ALGO_CACHE && !algo; i++)
        if (b->cache[i].used && !memcmp(&b->cache[i].key, &key, sizeof key))
            algo = &b->cache[i].algo;
    if (!algo) {
        cublasLtMatmulPreference_t pref = NULL;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t wsb = LK_WS_BYTES;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        /* the real alignments (activation rows need not sit on 256 bytes) */
        const cublasLtMatmulPreferenceAttributes_t al[] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        const int which[] = {AL_A, AL_B, AL_C, AL_D};
        for (int i = 0; i < 4; i++) {
            uint32_t v = (uint32_t)key.align[which[i]];
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al[i], &v, sizeof v));
        }
        int nres = 0;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(b->lt, c.desc, c.la, c.lb, c.lc, c.ld,
                                                           pref, 1, &res, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        if (hs != CUBLAS_STATUS_SUCCESS || nres < 1 || res.state != CUBLAS_STATUS_SUCCESS ||
            res.workspaceSize > LK_WS_BYTES) {
            log_warn("blas: no FP8 algorithm for m=%d n=%d k=%d (%s): bf16 instead", m, n, k,
                     cublasLtGetStatusString(hs));
            goto out;
        }
        int slot = 0;
        while (slot < LK_ALGO_CACHE && b->cache[slot].used)
            slot++;
        if (slot == LK_ALGO_CACHE) slot = 0;
        b->cache[slot].key = key;
        b->cache[slot].algo = res.algo;
        b->cache[slot].used = 1;
        b->st.configs++;
        algo = &res.algo;
    }
    {
        cublasStatus_t st = lt_run(b, &c, algo, D);
        if (st != CUBLAS_STATUS_SUCCESS) {
            cudaGetLastError();
            log_warn("blas: FP8 GEMM m=%d n=%d k=%d refused (%s): bf16 instead", m, n, k,
                     cublasLtGetStatusString(st));
            goto out;
        }
    }
    rc = 0;
out:
    cublasLtMatrixLayoutDestroy(c.la);
    cublasLtMatrixLayoutDestroy(c.lb);
    cublasLtMatrixLayoutDestroy(c.lc);
    cublasLtMatrixLayoutDestroy(c.ld);
    cublasLtMatmulDescDestroy(c.desc);
    return rc;
}
