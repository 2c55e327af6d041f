/* Hugging Face directories: config.json -> model_config, weights -> the
 * engine's flat buffers, and the way back (contract in hf.h).
 *
 * config.json is parsed by api/hf_config.c (shared with loomd, which reads
 * it at submit for the stored spec's sizes). A weight is addressed by
 * its Loom tensor (api/model.h, which uses the HF names); the per-element
 * map from a tp rank's share to the file is: split (column blocks, row
 * columns, vocabulary rows) -> full tensor element -> file element
 * (transposed for GPT-2's Conv1D weights, vocabulary rows past vocab_size
 * zero). Assumes a little-endian host, like safetensors.c. */
#include "worker/hf.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "worker/nf4.h"

#define HF_SHARD_DEFAULT 5000000000ull     /* 5 GB, what transformers writes by default */
#define HF_STAGE_ELEMS   ((size_t)1 << 22) /* 16 MiB of fp32 rows per thread and pass */
#define HF_MAX_THREADS   64

const char *hf_torch_dtype(enum st_dtype d) {
    return d == ST_BF16 ? "bfloat16" : d == ST_F16 ? "float16" : "float32";
}

struct hf_tensor {
    int file;                 /* index into files */
    const struct st_info *in; /* borrowed from the st_file */
    int transpose;            /* file [in, out] for a Loom [out, in] weight */
};

struct hf_model {
    char dir[PATH_MAX];
    enum hf_arch arch;
    struct model_config cfg;
    json_t *config; /* config.json */
    enum st_dtype dtype;
    struct st_file **files;
    char **file_names;
    int nfiles;
    struct model_layout layout; /* tp = 1, for the tensor list */
    struct hf_tensor *t;        /* [layout.n] */
    uint64_t bytes_read;
    int threads; /* conversion threads of hf_load (0: the online cores) */
};

void hf_set_threads(struct hf_model *h, int n) {
    h->threads = n > 0 ? n : 0;
}

const struct model_config *hf_config(const struct hf_model *h) {
    return &h->cfg;
}
enum hf_arch hf_model_arch(const struct hf_model *h) {
    return h->arch;
}
enum st_dtype hf_model_dtype(const struct hf_model *h) {
    return h->dtype;
}
const char *hf_model_dir(const struct hf_model *h) {
    return h->dir;
}
uint64_t hf_bytes_read(const struct hf_model *h) {
    return h->bytes_read;
}

int hf_eos_tokens(const struct hf_model *h, int *ids, int max) {
    json_t *v = json_object_get(h->config, "eos_token_id");
    int n = 0;
    if (json_is_integer(v) && max > 0) ids[n++] = (int)json_integer_value(v);
    for (size_t i = 0; json_is_array(v) && i < json_array_size(v) && n < max; i++)
        if (json_is_integer(json_array_get(v, i)))
            ids[n++] = (int)json_integer_value(json_array_get(v, i));
    return n;
}

void hf_free(struct hf_model *h) {
    if (!h) return;
    for (int i = 0; i < h->nfiles; i++) {
        st_close(h->files[i]);
        free(h->file_names[i]);
    }
    free(h->files);
    free(h->file_names);
    free(h->t);
    model_layout_free(&h->layout);
    json_decref(h->config);
    free(h);
}

/* ---- config.json (api/hf_config.c, shared with loomd) ---- */

static int parse_config(struct hf_model *h, const char *path, struct loom_error *err) {
    return hf_config_read(path, &h->config, &h->cfg, &h->arch, err);
}

/* ---- weights ---- */

static int st_error(int rc, const char *msg, struct loom_error *err) {
    const char *code = rc == ST_EDTYPE                        ? "HF_DTYPE"
                       : rc == ST_EHEADER || rc == ST_EFORMAT ? "SAFETENSORS_HEADER"
                                                              : "HF_IO";
    return loom_error_set(err, 422, code, "weights", "%s", msg);
}

static int add_file(struct hf_model *h, const char *name, struct loom_error *err) {
    for (int i = 0; i < h->nfiles; i++)
        if (strcmp(h->file_names[i], name) == 0) return i;
    if (strchr(name, '/') || strcmp(name, "..") == 0)
        return loom_error_set(err, 422, "HF_CONFIG_INVALID", "weight_map",
                              "%s: weight_map names file \"%s\" outside the directory", h->dir,
                              name);
    struct st_file **nf = realloc(h->files, (size_t)(h->nfiles + 1) * sizeof *nf);
    if (nf) h->files = nf;
    char **nn = realloc(h->file_names, (size_t)(h->nfiles + 1) * sizeof *nn);
    if (nn) h->file_names = nn;
    if (!nf || !nn) return loom_error_set(err, 500, "HF_IO", NULL, "out of memory");
    char path[PATH_MAX + 256], msg[768];
    snprintf(path, sizeof path, "%s/%s", h->dir, name);
    struct st_file *f = NULL;
    int rc = st_open(path, &f, msg, sizeof msg);
    if (rc != 0) return st_error(rc, msg, err);
    h->files[h->nfiles] = f;
    h->file_names[h->nfiles] = strdup(name);
    return h->nfiles++;
}

/* The HF file name of Loom tensor `name`: the same, or for GPT-2 the name
 * without "transformer." (the original checkpoints omit the prefix). */
static const struct st_info *lookup(struct hf_model *h, const char *name, int *file) {
    for (int pass = 0; pass < 2; pass++) {
        const char *n = name;
        if (pass == 1) {
            if (h->arch != HF_ARCH_GPT2 || strncmp(name, "transformer.", 12) != 0) break;
            n = name + 12;
        }
        for (int i = 0; i < h->nfiles; i++) {
            const struct st_info *in = st_find(h->files[i], n);
            if (in) {
                *file = i;
                return in;
            }
        }
    }
    return NULL;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < n) snprintf(buf + at, n - at, "]");
}

static int check_tensors(struct hf_model *h, struct loom_error *err) {
    const struct model_config *c = &h->cfg;
    if (model_layout_init(&h->layout, c, 1) != 0)
        return loom_error_set(err, 422, "HF_CONFIG_INVALID", "config.json",
                              "%s: cannot lay out the model", h->dir);
    h->t = calloc((size_t)h->layout.n, sizeof *h->t);
    if (!h->t) return loom_error_set(err, 500, "HF_IO", NULL, "out of memory");
    for (int i = 0; i < h->layout.n; i++) {
        const struct model_tensor *t = &h->layout.t[i];
        int f = -1;
        const struct st_info *in = lookup(h, t->name, &f);
        if (!in)
            return loom_error_set(err, 422, "HF_TENSOR_MISSING", t->name,
                                  "%s: tensor %s is missing from the weights (%s, %d layers%s)",
                                  h->dir, t->name, hf_arch_name(h->arch), c->n_layer,
                                  c->tied_embeddings ? ", tied embeddings" : "");
        if (in->dtype != ST_F32 && in->dtype != ST_BF16 && in->dtype != ST_F16)
            return loom_error_set(err, 422, "HF_DTYPE", t->name,
                                  "%s/%s: tensor %s has dtype %s; supported: BF16, F16, F32",
                                  h->dir, h->file_names[f], t->name, st_dtype_name(in->dtype));
        int64_t want[2] = {t->shape[0], t->shape[1]};
        int tr = h->arch == HF_ARCH_GPT2 && t->kind == MODEL_T_LINEAR_W;
        if (t->kind == MODEL_T_EMBED || t->kind == MODEL_T_LM_HEAD) want[0] = c->vocab_size;
        if (tr) {
            want[0] = t->shape[1];
            want[1] = t->shape[0];
        }
        int ok = in->ndim == t->ndim && in->shape[0] == want[0] &&
                 (t->ndim == 1 || in->shape[1] == want[1]);
        if (!ok) {
            char got[96], exp[96];
            shape_str(got, sizeof got, in->ndim, in->shape);
            shape_str(exp, sizeof exp, t->ndim, want);
            return loom_error_set(err, 422, "HF_SHAPE_MISMATCH", t->name,
                                  "%s/%s: tensor %s has shape %s but config.json implies %s "
                                  "(hidden %d, heads %d/%d, ffn %d, vocab %d)",
                                  h->dir, h->file_names[f], t->name, got, exp, c->d_model,
                                  c->n_head, c->n_kv_head, c->d_ff, c->vocab_size);
        }
        h->t[i] = (struct hf_tensor){.file = f, .in = in, .transpose = tr};
        if (t->kind == MODEL_T_EMBED) h->dtype = in->dtype;
    }
    return 0;
}

static int open_weights(struct hf_model *h, struct loom_error *err) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", h->dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        json_error_t je;
        json_t *ix = json_load_file(path, 0, &je);
        json_t *wm = json_object_get(ix, "weight_map");
        if (!json_is_object(wm)) {
            json_decref(ix);
            return loom_error_set(err, 422, "HF_CONFIG_INVALID", "weight_map",
                                  "%s: no \"weight_map\" object (%s)", path, je.text);
        }
        const char *k;
        json_t *v;
        int rc = 0;
        json_object_foreach(wm, k, v) {
            if (!json_is_string(v)) {
                rc = loom_error_set(err, 422, "HF_CONFIG_INVALID", "weight_map",
                                    "%s: weight_map[\"%s\"] is not a file name", path, k);
                break;
            }
            int f = add_file(h, json_string_value(v), err);
            if (f < 0) {
                rc = -1;
                break;
            }
            if (!st_find(h->files[f], k)) {
                rc = loom_error_set(err, 422, "HF_TENSOR_MISSING", k,
                                    "%s: the index puts %s in %s, which does not hold it", path, k,
                                    json_string_value(v));
                break;
            }
        }
        json_decref(ix);
        return rc;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", h->dir);
    if (stat(path, &st) != 0)
        return loom_error_set(err, 422, "HF_WEIGHTS_MISSING", "init_from",
                              "%s: neither model.safetensors nor model.safetensors.index.json "
                              "(only safetensors weights are read)",
                              h->dir);
    return add_file(h, "model.safetensors", err) < 0 ? -1 : 0;
}

int hf_open(const char *dir, struct hf_model **out, struct loom_error *err) {
    *out = NULL;
    struct hf_model *h = calloc(1, sizeof *h);
    if (!h) return loom_error_set(err, 500, "HF_IO", NULL, "out of memory");
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    size_t dl = strlen(h->dir);
    while (dl > 1 && h->dir[dl - 1] == '/')
        h->dir[--dl] = '\0';
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", h->dir);
    if (parse_config(h, path, err) != 0 || open_weights(h, err) != 0 ||
        check_tensors(h, err) != 0) {
        hf_free(h);
        return -1;
    }
    *out = h;
    return 0;
}

/* ---- loading ---- */

/* bf16 / fp16 -> fp32 inline here (the st_* converters are another
 * translation unit, a call per element): the same bits as st_bf16_to_f32
 * and st_f16_to_f32, which handle the fp16 cases the fast path leaves. */
static inline float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float f16_f32(uint16_t h) {
    uint32_t e = (h >> 10) & 0x1fu;
    if (e == 0 || e == 0x1f) return st_f16_to_f32(h); /* zero, subnormal, inf, NaN */
    /* normal: exponent rebased by 127 - 15 = 112, mantissa shifted into place */
    uint32_t u = ((uint32_t)(h & 0x8000u) << 16) | ((((uint32_t)h & 0x7fffu) << 13) + (112u << 23));
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float elem(const unsigned char *p, size_t i, enum st_dtype d) {
    uint16_t u;
    switch (d) {
    case ST_BF16:
        memcpy(&u, p + 2 * i, 2);
        return bf16_f32(u);
    case ST_F16:
        memcpy(&u, p + 2 * i, 2);
        return f16_f32(u);
    default: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    }
}

/* n contiguous elements from element i0 on, with the dtype switch outside
 * the loop (the bf16 loop vectorises: a load, a shift, a store). */
static void run(float *restrict o, const unsigned char *restrict p, size_t i0, size_t n,
                enum st_dtype d) {
    const unsigned char *q = p + i0 * st_dtype_size(d);
    uint16_t u;
    if (d == ST_F32) {
        memcpy(o, q, n * sizeof *o);
    } else if (d == ST_BF16) {
        for (size_t j = 0; j < n; j++) {
            memcpy(&u, q + 2 * j, 2);
            o[j] = bf16_f32(u);
        }
    } else {
        for (size_t j = 0; j < n; j++) {
            memcpy(&u, q + 2 * j, 2);
            o[j] = f16_f32(u);
        }
    }
}

/* The part [*a, *b) of tensor i's rank range that this engine holds (its
 * window, or all of it behind a view); 0 when none. */
static int held_range(const struct engine *e, int i, size_t *a, size_t *b) {
    const struct model_tensor *t = &e->layout.t[i];
    size_t lo = (size_t)t->rank_offset, hi = lo + (size_t)t->rank_numel;
    if (e->pview[i]) {
        *a = lo;
        *b = hi;
        return 1;
    }
    *a = lo > e->p_lo ? lo : e->p_lo;
    *b = hi < e->p_hi ? hi : e->p_hi;
    return *a < *b;
}

/* Rows [r0, r1) of tensor t's share for tp rank idx into out (rank row
 * layout), read from the file tensor: as fp32, or with raw = 1 as the
 * file's own dtype (its bytes copied, for a backend of that dtype). */
static void fill_rows(const struct model_tensor *t, const struct hf_tensor *ht,
                      const unsigned char *src, int V, int tp, int idx, int64_t r0, int64_t r1,
                      void *out, int raw) {
    int64_t d0 = t->shape[0], rc = t->rank_shape[1];
    int64_t cols_f = t->ndim == 2 ? ht->in->shape[1] : 1;
    enum st_dtype dt = ht->in->dtype;
    for (int64_t i = r0; i < r1; i++) {
        int64_t gi = i, gj0 = 0;
        switch (t->split) {
        case MODEL_SPLIT_COLUMN: {
            int64_t blk = d0 / t->parts, per = blk / tp;
            gi = (i / per) * blk + idx * per + i % per;
            break;
        }
        case MODEL_SPLIT_ROW:
            gj0 = idx * rc;
            break;
        case MODEL_SPLIT_VOCAB:
            gi = idx * t->rank_shape[0] + i;
            break;
        default:
            break;
        }
        size_t esz = raw ? st_dtype_size(dt) : sizeof(float);
        unsigned char *ob = (unsigned char *)out + (size_t)((i - r0) * rc) * esz;
        float *o = (float *)(void *)ob;
        if ((t->kind == MODEL_T_EMBED || t->kind == MODEL_T_LM_HEAD) && (gi >= V || gi >= d0)) {
            memset(ob, 0, (size_t)rc * esz);
            continue;
        }
        if (raw && ht->transpose)
            for (int64_t j = 0; j < rc; j++)
                memcpy(ob + (size_t)j * esz, src + (size_t)((gj0 + j) * cols_f + gi) * esz, esz);
        else if (raw)
            memcpy(ob, src + (size_t)(gi * cols_f + gj0) * esz, (size_t)rc * esz);
        else if (ht->transpose) /* Loom (gi, gj) is file (gj, gi); file rows are d1 */
            for (int64_t j = 0; j < rc; j++)
                o[j] = elem(src, (size_t)((gj0 + j) * cols_f + gi), dt);
        else
            run(o, src, (size_t)(gi * cols_f + gj0), (size_t)rc, dt);
    }
}

/* One thread's rows [r0, r1) of a conversion pass into out (the pass's
 * buffer, already offset to row r0). */
struct fill_job {
    const struct model_tensor *t;
    const struct hf_tensor *ht;
    const unsigned char *src;
    int V, tp, idx;
    int64_t r0, r1;
    void *out;
    int raw;
};

static void *fill_main(void *arg) {
    const struct fill_job *j = arg;
    fill_rows(j->t, j->ht, j->src, j->V, j->tp, j->idx, j->r0, j->r1, j->out, j->raw);
    return NULL;
}

/* Rows [q0, q1) into out with up to nt threads (pthreads over contiguous
 * row blocks; the calling thread takes the first). Rows are independent and
 * each is converted the same way whichever thread does it, so the result is
 * that of one thread. Threads that cannot be started leave their block to
 * the caller. */
static void fill_parallel(const struct model_tensor *t, const struct hf_tensor *ht,
                          const unsigned char *src, int V, int tp, int idx, int64_t q0, int64_t q1,
                          void *out, int raw, int nt) {
    int64_t rows = q1 - q0, rc = t->rank_shape[1];
    /* blocks of at least 4096 elements: below that a thread costs more
     * than it converts */
    int64_t min_rows = 4096 / (rc > 0 ? rc : 1) + 1;
    if ((int64_t)nt > rows / min_rows) nt = (int)(rows / min_rows);
    if (nt < 1) nt = 1;
    struct fill_job job[HF_MAX_THREADS];
    pthread_t tid[HF_MAX_THREADS];
    int started[HF_MAX_THREADS] = {0};
    int64_t per = (rows + nt - 1) / nt;
    for (int k = 0; k < nt; k++) {
        int64_t a = q0 + k * per, b = a + per < q1 ? a + per : q1;
        size_t esz = raw ? st_dtype_size(ht->in->dtype) : sizeof(float);
        job[k] = (struct fill_job){
            t,  ht, src, V, tp, idx, a, b, (unsigned char *)out + (size_t)((a - q0) * rc) * esz,
            raw};
        if (k > 0 && a < b) started[k] = pthread_create(&tid[k], NULL, fill_main, &job[k]) == 0;
    }
    for (int k = 0; k < nt; k++)
        if (k == 0 || (!started[k] && job[k].r0 < job[k].r1)) fill_main(&job[k]);
    for (int k = 1; k < nt; k++)
        if (started[k]) pthread_join(tid[k], NULL);
}

static int load_threads(const struct hf_model *h) {
    long n = h->threads > 0 ? h->threads : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > HF_MAX_THREADS ? HF_MAX_THREADS : (int)n;
}

/* Tensor i whole (its tp = 1 rows, as one process reads them) into the NF4
 * storage, in passes of buf[cap]. */
static int load_whole(struct hf_model *h, struct engine *e, int i, float *buf, size_t cap, int nt,
                      struct loom_error *err) {
    const struct model_tensor *t = &e->layout.t[i];
    const struct hf_tensor *ht = &h->t[i];
    struct model_tensor w = *t; /* the tensor as tp = 1 lays it out */
    w.split = MODEL_SPLIT_REPLICATED;
    w.rank_shape[0] = t->shape[0];
    w.rank_shape[1] = t->shape[1];
    w.rank_numel = t->numel;
    char msg[512];
    const unsigned char *src = st_data(h->files[ht->file], ht->in, msg, sizeof msg);
    if (!src) return loom_error_set(err, 422, "HF_IO", t->name, "%s", msg);
    struct backend *be = e->be;
    int raw = be->dtype == BACKEND_BF16 && ht->in->dtype == ST_BF16 && be->elt_size == 2;
    int64_t d1 = t->shape[1], step = (int64_t)(cap / (size_t)d1);
    int rc = 0;
    for (int64_t q = 0; q < t->shape[0] && rc == 0; q += step) {
        int64_t q1 = q + step < t->shape[0] ? q + step : t->shape[0];
        fill_parallel(&w, ht, src, h->cfg.vocab_size, 1, 0, q, q1, buf, raw, nt);
        if (nf4_put_full(e->nf4, i, (size_t)(q * d1), buf, (size_t)((q1 - q) * d1),
                         raw ? be->elt_size : sizeof(float)) != 0)
            rc = loom_error_set(err, 500, "HF_IO", NULL, "out of memory quantizing %s", t->name);
    }
    st_release(h->files[ht->file], ht->in);
    h->bytes_read += ht->in->nbytes;
    return rc;
}

int hf_load(struct hf_model *h, struct engine *e, struct loom_error *err) {
    const struct model_config *c = &h->cfg, *ec = &e->cfg;
    if (ec->family != c->family || ec->n_layer != c->n_layer || ec->d_model != c->d_model ||
        ec->n_head != c->n_head || ec->n_kv_head != c->n_kv_head || ec->d_ff != c->d_ff ||
        ec->vocab_size != c->vocab_size || ec->tied_embeddings != c->tied_embeddings ||
        ec->qkv_bias != c->qkv_bias || (c->family == MODEL_GPT2 && ec->seq_len != c->seq_len))
        return loom_error_set(err, 422, "HF_SHAPE_MISMATCH", "model",
                              "%s: the engine's model (layers %d, d_model %d, heads %d/%d, d_ff "
                              "%d, vocab %d) is not the directory's (%d, %d, %d/%d, %d, %d)",
                              h->dir, ec->n_layer, ec->d_model, ec->n_head, ec->n_kv_head, ec->d_ff,
                              ec->vocab_size, c->n_layer, c->d_model, c->n_head, c->n_kv_head,
                              c->d_ff, c->vocab_size);
    /* rows are converted through a staging buffer of at most HF_STAGE_ELEMS
     * floats (one row when a row is wider) per conversion thread, so host
     * memory stays bounded */
    size_t maxrow = 1;
    for (int i = 0; i < e->layout.n; i++)
        if ((size_t)e->layout.t[i].rank_shape[1] > maxrow)
            maxrow = (size_t)e->layout.t[i].rank_shape[1];
    for (int i = 0; i < e->layout.n; i++) /* whole rows of the tensors load_whole reads */
        if (nf4_full_tensor(e->nf4, i) && (size_t)e->layout.t[i].shape[1] > maxrow)
            maxrow = (size_t)e->layout.t[i].shape[1];
    int nt = load_threads(h);
    size_t cap = maxrow > HF_STAGE_ELEMS ? maxrow : HF_STAGE_ELEMS;
    cap *= (size_t)nt;
    /* one buffer for the whole load; page-locked where the backend has such
     * memory (cuda), so each pass reaches the device at full copy speed */
    struct backend *be = e->be;
    int pinned = be->host_alloc != NULL;
    float *buf = pinned ? be->host_alloc(be->ctx, cap * sizeof *buf) : NULL;
    if (!buf) {
        pinned = 0;
        buf = malloc(cap * sizeof *buf);
    }
    if (!buf) return loom_error_set(err, 500, "HF_IO", NULL, "out of memory (%zu floats)", cap);
    int rc = 0;
    uint64_t total = 0;
    double t0 = clock_mono_s();
    for (int i = 0; i < e->layout.n && rc == 0; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        const struct hf_tensor *ht = &h->t[i]; /* same order: the same config's layout */
        total += ht->in->nbytes;
        if (nf4_full_tensor(e->nf4, i)) { /* QLoRA under tp: the whole tensor, quantized as one
                                             process does (worker/nf4.h nf4_put_full) */
            rc = load_whole(h, e, i, buf, cap, nt, err);
            continue;
        }
        size_t a, b;
        if (!held_range(e, i, &a, &b)) continue;
        int64_t rc1 = t->rank_shape[1];
        int64_t r0 = (int64_t)(a - (size_t)t->rank_offset) / rc1;
        int64_t r1 = ((int64_t)(b - (size_t)t->rank_offset) + rc1 - 1) / rc1;
        char msg[512];
        const unsigned char *src = st_data(h->files[ht->file], ht->in, msg, sizeof msg);
        if (!src) {
            rc = loom_error_set(err, 422, "HF_IO", t->name, "%s", msg);
            break;
        }
        /* a bf16 file into a bf16 backend goes over as it is (no fp32 pass:
         * half the bytes, and the values are exact in both) */
        int raw = be->dtype == BACKEND_BF16 && ht->in->dtype == ST_BF16 && be->elt_size == 2;
        int64_t step = (int64_t)(cap / (size_t)rc1);
        for (int64_t q = r0; q < r1 && rc == 0; q += step) {
            int64_t q1 = q + step < r1 ? q + step : r1;
            size_t off = (size_t)t->rank_offset + (size_t)(q * rc1), n = (size_t)((q1 - q) * rc1);
            fill_parallel(t, ht, src, c->vocab_size, e->tp, e->tp_idx, q, q1, buf, raw, nt);
            if ((raw ? engine_params_from_host_raw(e, off, buf, n)
                     : engine_params_from_host(e, off, buf, n)) != 0)
                rc = loom_error_set(err, 500, "HF_IO", NULL, "out of memory uploading %s", t->name);
        }
        st_release(h->files[ht->file], ht->in);
        /* bytes of the file this touched: the share's fraction of the tensor */
        h->bytes_read += ht->in->nbytes * (uint64_t)((r1 - r0) * rc1) / (uint64_t)t->numel;
    }
    e->be->sync(e->be->ctx);
    if (pinned)
        be->host_free(be->ctx, buf);
    else
        free(buf);
    double dt = clock_mono_s() - t0;
    if (rc == 0)
        log_info("hf: rank %d loaded its share of %s (%llu of %llu bytes of weights) in %.3f s "
                 "(%.2f GB/s, %d conversion thread%s)",
                 e->rank, h->dir, (unsigned long long)h->bytes_read, (unsigned long long)total, dt,
                 dt > 0 ? (double)h->bytes_read / dt / 1e9 : 0.0, nt, nt == 1 ? "" : "s");
    return rc;
}

/* ---- export ---- */

/* Copy a file byte for byte (atomically replacing dst). 0, 1 when src does
 * not exist, -1 on error. */
static int copy_file(const char *src, const char *dst) {
    size_t n = 0;
    char *data = fs_read_file(src, 0, &n);
    if (!data) return errno == ENOENT ? 1 : -1;
    int rc = fs_write_atomic(dst, data, n, 0644, 0);
    free(data);
    return rc;
}

static int write_json(const char *dir, const char *name, json_t *j) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    int rc = s ? fs_write_atomic(path, s, strlen(s), 0644, 0) : -1;
    free(s);
    return rc;
}

/* config.json for c when there is no source to start from. */
static json_t *config_for(const struct model_config *c, enum st_dtype dt) {
    if (c->family == MODEL_GPT2)
        return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:n, s:s, s:f, s:b, s:s}",
                         "architectures", hf_arch_name(HF_ARCH_GPT2), "model_type", "gpt2",
                         "n_embd", c->d_model, "n_layer", c->n_layer, "n_head", c->n_head,
                         "n_positions", c->seq_len, "vocab_size", c->vocab_size, "n_inner",
                         "activation_function", "gelu_new", "layer_norm_epsilon", c->norm_eps,
                         "tie_word_embeddings", 1, "torch_dtype", hf_torch_dtype(dt));
    json_t *j = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, "
        "s:s, s:b, s:b}",
        "architectures", hf_arch_name(c->qkv_bias ? HF_ARCH_QWEN2 : HF_ARCH_LLAMA), "model_type",
        c->qkv_bias ? "qwen2" : "llama", "hidden_size", c->d_model, "intermediate_size", c->d_ff,
        "num_hidden_layers", c->n_layer, "num_attention_heads", c->n_head, "num_key_value_heads",
        c->n_kv_head, "vocab_size", c->vocab_size, "max_position_embeddings", c->seq_len,
        "rms_norm_eps", c->norm_eps, "rope_theta", c->rope_theta, "tie_word_embeddings",
        c->tied_embeddings, "hidden_act", "silu", "torch_dtype", hf_torch_dtype(dt),
        "attention_bias", 0, "mlp_bias", 0);
    if (j && c->rope_scaling == MODEL_ROPE_SCALE_LLAMA3)
        json_object_set_new(j, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      c->rope_factor, "low_freq_factor", c->rope_low_freq_factor,
                                      "high_freq_factor", c->rope_high_freq_factor,
                                      "original_max_position_embeddings",
                                      c->rope_original_max_pos));
    return j;
}

/* Tokenizer and chat-template files a tokenizer loader may look for. */
static const char *const tokenizer_files[] = {
    "tokenizer.json",      "tokenizer_config.json",
    "tokenizer.model",     "special_tokens_map.json",
    "vocab.json",          "merges.txt",
    "added_tokens.json",   "vocab.txt",
    "chat_template.jinja", "chat_template.json",
};

int hf_export(const struct hf_export_opts *o, const struct model_config *c,
              const struct model_layout *full, const float *params, struct loom_error *err) {
    if (full->tp != 1 || (o->dtype != ST_F32 && o->dtype != ST_BF16 && o->dtype != ST_F16))
        return loom_error_set(err, 422, "EXPORT_FAILED", "export",
                              "export needs a tp = 1 layout and dtype F32, BF16 or F16");
    if (fs_mkdir_p(o->dir, 0755, 0) != 0)
        return loom_error_set(err, 422, "EXPORT_FAILED", "export", "%s: cannot create: %s", o->dir,
                              strerror(errno));
    uint64_t cap = o->shard_bytes ? o->shard_bytes : HF_SHARD_DEFAULT;
    size_t esz = st_dtype_size(o->dtype);
    struct st_tensor *t = calloc((size_t)full->n, sizeof *t);
    int *shard = calloc((size_t)full->n, sizeof *shard);
    json_t *wm = json_object(), *md = json_pack("{s:s}", "format", "pt"), *cfg = NULL;
    int rc = -1, n = 0, nshards = 0;
    uint64_t total = 0, in_shard = 0;
    if (!t || !shard || !wm || !md) {
        loom_error_set(err, 500, "EXPORT_FAILED", NULL, "out of memory");
        goto out;
    }
    for (int i = 0; i < full->n; i++) { /* the tensors and their shard, in layout order */
        const struct model_tensor *mt = &full->t[i];
        struct st_tensor *s = &t[n];
        s->name = mt->name;
        s->dtype = o->dtype;
        s->src_dtype = ST_F32;
        s->data = params + mt->offset;
        s->ndim = mt->ndim;
        s->shape[0] = mt->shape[0];
        s->shape[1] = mt->shape[1];
        if (mt->kind == MODEL_T_EMBED || mt->kind == MODEL_T_LM_HEAD) {
            s->shape[0] = c->vocab_size; /* the padding rows are Loom's */
        } else if (mt->kind == MODEL_T_LINEAR_W && c->family == MODEL_GPT2) {
            s->shape[0] = mt->shape[1]; /* Conv1D [in, out] */
            s->shape[1] = mt->shape[0];
            s->transpose = 1;
        }
        uint64_t bytes = (uint64_t)s->shape[0] * (uint64_t)(s->ndim == 2 ? s->shape[1] : 1) * esz;
        if (n == 0 || (in_shard > 0 && in_shard + bytes > cap)) {
            nshards++;
            in_shard = 0;
        }
        in_shard += bytes;
        total += bytes;
        shard[n++] = nshards - 1;
    }
    char name[64], path[PATH_MAX + 128], msg[512];
    for (int k = 0; k < nshards; k++) {
        int a = 0;
        while (shard[a] != k)
            a++;
        int b = a;
        while (b < n && shard[b] == k)
            b++;
        if (nshards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        snprintf(path, sizeof path, "%s/%s", o->dir, name);
        if (st_write(path, t + a, (size_t)(b - a), md, NULL, NULL, msg, sizeof msg) != 0) {
            loom_error_set(err, 500, "EXPORT_FAILED", "export", "%s", msg);
            goto out;
        }
        for (int i = a; i < b; i++)
            json_object_set_new(wm, t[i].name, json_string(name));
    }
    json_t *ix =
        json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
    int wrc = write_json(o->dir, "model.safetensors.index.json", ix);
    json_decref(ix);
    if (wrc != 0) goto ioerr;
    /* config.json: the source's with this dtype, or one for c */
    if (o->src_dir) {
        snprintf(path, sizeof path, "%s/config.json", o->src_dir);
        cfg = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
    }
    if (json_is_object(cfg)) {
        json_object_set_new(cfg, "torch_dtype", json_string(hf_torch_dtype(o->dtype)));
        if (json_object_get(cfg, "dtype")) /* the newer transformers spelling */
            json_object_set_new(cfg, "dtype", json_string(hf_torch_dtype(o->dtype)));
    } else {
        json_decref(cfg);
        cfg = config_for(c, o->dtype);
    }
    if (!cfg || write_json(o->dir, "config.json", cfg) != 0) goto ioerr;
    int have_gen = 0;
    char dst[PATH_MAX + 128];
    if (o->src_dir) {
        snprintf(path, sizeof path, "%s/generation_config.json", o->src_dir);
        snprintf(dst, sizeof dst, "%s/generation_config.json", o->dir);
        int crc = copy_file(path, dst);
        if (crc < 0) goto ioerr;
        have_gen = crc == 0;
        for (size_t i = 0; i < sizeof tokenizer_files / sizeof *tokenizer_files; i++) {
            snprintf(path, sizeof path, "%s/%s", o->src_dir, tokenizer_files[i]);
            snprintf(dst, sizeof dst, "%s/%s", o->dir, tokenizer_files[i]);
            if (copy_file(path, dst) < 0) goto ioerr;
        }
    }
    if (!have_gen) { /* what transformers derives from the model config */
        json_t *g = json_pack("{s:b}", "_from_model_config", 1);
        static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            json_t *v = json_object_get(cfg, keys[i]);
            if (v && !json_is_null(v)) json_object_set(g, keys[i], v);
        }
        int grc = write_json(o->dir, "generation_config.json", g);
        json_decref(g);
        if (grc != 0) goto ioerr;
    }
    log_info("hf: exported %s (%d tensors, %.1f MB %s in %d file%s)", o->dir, n, total / 1e6,
             st_dtype_name(o->dtype), nshards, nshards == 1 ? "" : "s");
    rc = 0;
    goto out;
ioerr:
    loom_error_set(err, 500, "EXPORT_FAILED", "export", "%s: cannot write: %s", o->dir,
                   strerror(errno ? errno : EIO));
out:
    json_decref(cfg);
    json_decref(wm);
    json_decref(md);
    free(t);
    free(shard);
    return rc;
}
