/* LoRA adapters: forward / backward at the projection sites, AdamW, PEFT
 * export and merging. See lora.h. The adapters are small (r x in and
 * out x r per projection) and the backend is the cpu one, whose device
 * memory is host memory, so the products are plain loops here. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "worker/lora.h"
#include "worker/model.h"
#include "worker/safetensors.h"

/* One spec target: where it sits in a block. */
struct lora_target {
    const char *spec;   /* spec name */
    const char *module; /* HF module under the block ("self_attn.q_proj") */
    const char *peft;   /* PEFT target_modules entry */
    enum lora_site site;
};

static const struct lora_target targets_llama[] = {
    {"q", "self_attn.q_proj", "q_proj", LORA_SITE_QKV},
    {"k", "self_attn.k_proj", "k_proj", LORA_SITE_QKV},
    {"v", "self_attn.v_proj", "v_proj", LORA_SITE_QKV},
    {"o", "self_attn.o_proj", "o_proj", LORA_SITE_O},
    {"gate", "mlp.gate_proj", "gate_proj", LORA_SITE_FC},
    {"up", "mlp.up_proj", "up_proj", LORA_SITE_FC},
    {"down", "mlp.down_proj", "down_proj", LORA_SITE_DOWN},
    {NULL, NULL, NULL, 0},
};

static const struct lora_target targets_gpt2[] = {
    {"attn", "attn.c_attn", "c_attn", LORA_SITE_QKV},
    {"proj", "attn.c_proj", "attn.c_proj", LORA_SITE_O},
    {"fc", "mlp.c_fc", "c_fc", LORA_SITE_FC},
    {"fc2", "mlp.c_proj", "mlp.c_proj", LORA_SITE_DOWN},
    {NULL, NULL, NULL, 0},
};

struct lora_ad {
    char base[MODEL_TENSOR_MAX]; /* HF name of the base weight */
    const struct lora_target *tg;
    int layer, tensor; /* base tensor index in the layout */
    int in, out, col;  /* col: first output column of the site this adapter adds to */
    float *A, *B, *dA, *dB, *mA, *vA, *mB, *vB;
    float *ax; /* [N, r]: A inp of the last forward */
};

struct lora {
    struct model *m;
    int r, N, n, gpt2;
    double alpha, scale;
    int site_w[LORA_NSITES], site_in[LORA_NSITES];
    struct lora_ad *ad; /* [n], layer-major */
    float *t;           /* [N, r] backward scratch */
};

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* U(-bound, bound) from a stream keyed by (seed, name). */
static void fill_uniform(float *h, size_t n, uint64_t seed, const char *name, double bound) {
    uint64_t s = seed ^ 0x6c6f72612d696e69ull; /* "lora-ini" */
    for (const char *p = name; *p; p++)
        s = (s ^ (unsigned char)*p) * 0x100000001b3ull;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
        h[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

void lora_free(struct lora *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) {
        struct lora_ad *a = &l->ad[i];
        free(a->A);
        free(a->B);
        free(a->dA);
        free(a->dB);
        free(a->mA);
        free(a->vA);
        free(a->mB);
        free(a->vB);
        free(a->ax);
    }
    free(l->ad);
    free(l->t);
    free(l);
}

static int refuse(const char **code, const char *c, char *err, size_t errlen, const char *msg) {
    *code = c;
    snprintf(err, errlen, "%s", msg);
    return -1;
}

struct lora *lora_new(struct model *m, const struct lora_opts *o, const char **code, char *err,
                      size_t errlen) {
    struct engine *e = m->e;
    char msg[512];
    if (strcmp(e->be->name, "cpu") != 0 || e->be->elt_size != sizeof(float)) {
        snprintf(msg, sizeof msg,
                 "train.lora runs on the cpu backend (fp32) only; this backend is %s", e->be->name);
        refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
        return NULL;
    }
    if (e->tp != 1 || e->pp != 1 || e->world != e->dp) {
        snprintf(msg, sizeof msg,
                 "train.lora supports data parallelism only (tp=1 pp=1); this layout has "
                 "world=%d dp=%d tp=%d pp=%d",
                 e->world, e->dp, e->tp, e->pp);
        refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
        return NULL;
    }
    if (e->offload) {
        refuse(code, "LORA_UNSUPPORTED", err, errlen,
               "train.lora does not combine with optimizer offload (the adapters' optimizer "
               "state is small); turn offload off");
        return NULL;
    }
    if (o->dropout != 0) {
        snprintf(msg, sizeof msg, "train.lora.dropout=%g: only dropout 0 is supported", o->dropout);
        refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
        return NULL;
    }
    if (o->rank < 1 || o->alpha <= 0 || o->n_targets < 1) {
        snprintf(msg, sizeof msg, "train.lora: rank=%d alpha=%g targets=%d invalid", o->rank,
                 o->alpha, o->n_targets);
        refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
        return NULL;
    }
    struct lora *l = calloc(1, sizeof *l);
    if (!l) goto oom;
    l->m = m;
    l->r = o->rank;
    l->N = m->B * m->T;
    l->alpha = o->alpha;
    l->scale = o->alpha / o->rank;
    l->gpt2 = e->cfg.family == MODEL_GPT2;
    int swiglu = e->cfg.act == MODEL_ACT_SWIGLU, AC = m->NH * m->HD;
    l->site_w[LORA_SITE_QKV] = m->QKV;
    l->site_in[LORA_SITE_QKV] = m->C;
    l->site_w[LORA_SITE_O] = m->C;
    l->site_in[LORA_SITE_O] = AC;
    l->site_w[LORA_SITE_FC] = m->F * (swiglu ? 2 : 1);
    l->site_in[LORA_SITE_FC] = m->C;
    l->site_w[LORA_SITE_DOWN] = m->C;
    l->site_in[LORA_SITE_DOWN] = m->F;
    const struct lora_target *tab = l->gpt2 ? targets_gpt2 : targets_llama;
    l->ad = calloc((size_t)m->L * o->n_targets, sizeof *l->ad);
    l->t = malloc((size_t)l->N * l->r * sizeof *l->t);
    if (!l->ad || !l->t) goto oom;
    for (int layer = 0; layer < m->L; layer++) {
        /* in table order, so that the adapters of a site are in column order */
        for (const struct lora_target *tg = tab; tg->spec; tg++) {
            int want = 0;
            for (int k = 0; k < o->n_targets; k++)
                want |= strcmp(o->targets[k], tg->spec) == 0;
            if (!want) continue;
            struct lora_ad *a = &l->ad[l->n];
            a->tg = tg;
            a->layer = layer;
            snprintf(a->base, sizeof a->base, "%s.%d.%s.weight",
                     l->gpt2 ? "transformer.h" : "model.layers", layer, tg->module);
            a->tensor = engine_tensor_find(e, a->base);
            if (a->tensor < 0) {
                snprintf(msg, sizeof msg, "train.lora: tensor %s is not in the model", a->base);
                refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
                lora_free(l);
                return NULL;
            }
            const struct model_tensor *t = &e->layout.t[a->tensor];
            a->in = l->site_in[tg->site];
            a->out = (int)t->shape[0];
            /* the column offset inside the fused output: the tensor's
             * distance from the first tensor of its site (q, gate: 0) */
            a->col = 0;
            if (!l->gpt2 && (tg->site == LORA_SITE_QKV || tg->site == LORA_SITE_FC)) {
                int first = tg->site == LORA_SITE_QKV ? m->blk[layer].qkvw : m->blk[layer].fcw;
                a->col = (int)((t->rank_offset - e->layout.t[first].rank_offset) / (int64_t)a->in);
            }
            if (t->shape[1] != a->in || a->col + a->out > l->site_w[tg->site]) {
                snprintf(msg, sizeof msg, "train.lora: %s has shape [%lld, %lld], expected in=%d",
                         a->base, (long long)t->shape[0], (long long)t->shape[1], a->in);
                refuse(code, "LORA_UNSUPPORTED", err, errlen, msg);
                lora_free(l);
                return NULL;
            }
            size_t na = (size_t)l->r * a->in, nb = (size_t)a->out * l->r;
            a->A = malloc(na * sizeof(float));
            a->B = calloc(nb, sizeof(float));
            a->dA = calloc(na, sizeof(float));
            a->dB = calloc(nb, sizeof(float));
            a->mA = calloc(na, sizeof(float));
            a->vA = calloc(na, sizeof(float));
            a->mB = calloc(nb, sizeof(float));
            a->vB = calloc(nb, sizeof(float));
            a->ax = calloc((size_t)l->N * l->r, sizeof(float));
            l->n++;
            if (!a->A || !a->B || !a->dA || !a->dB || !a->mA || !a->vA || !a->mB || !a->vB ||
                !a->ax)
                goto oom;
            fill_uniform(a->A, na, o->seed, a->base, 1.0 / sqrt((double)a->in));
        }
    }
    return l;
oom:
    lora_free(l);
    refuse(code, "OUT_OF_MEMORY", err, errlen, "out of memory for the LoRA adapters");
    return NULL;
}

void lora_fwd(struct lora *l, int layer, enum lora_site site, float *out, const float *inp) {
    int r = l->r, N = l->N, W = l->site_w[site];
    float s = (float)l->scale;
    for (int i = 0; i < l->n; i++) {
        struct lora_ad *a = &l->ad[i];
        if (a->layer != layer || a->tg->site != site) continue;
        int in = a->in, on = a->out, col = a->col;
        const float *A = a->A, *B = a->B;
        float *ax = a->ax;
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * in;
            float *u = ax + (size_t)n * r;
            for (int j = 0; j < r; j++) {
                const float *aj = A + (size_t)j * in;
                float acc = 0;
                for (int c = 0; c < in; c++)
                    acc += aj[c] * x[c];
                u[j] = acc;
            }
            float *y = out + (size_t)n * W + col;
            for (int o = 0; o < on; o++) {
                const float *bo = B + (size_t)o * r;
                float acc = 0;
                for (int j = 0; j < r; j++)
                    acc += bo[j] * u[j];
                y[o] += s * acc;
            }
        }
    }
}

void lora_bwd(struct lora *l, int layer, enum lora_site site, float *dinp, const float *dout,
              const float *inp) {
    int r = l->r, N = l->N, W = l->site_w[site];
    float s = (float)l->scale;
    float *t = l->t;
    for (int i = 0; i < l->n; i++) {
        struct lora_ad *a = &l->ad[i];
        if (a->layer != layer || a->tg->site != site) continue;
        int in = a->in, on = a->out, col = a->col;
        const float *A = a->A, *B = a->B, *ax = a->ax;
        /* t = s * g B, g = dout[:, col:col+on] */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * W + col;
            float *tn = t + (size_t)n * r;
            for (int j = 0; j < r; j++)
                tn[j] = 0;
            for (int o = 0; o < on; o++) {
                const float *bo = B + (size_t)o * r;
                for (int j = 0; j < r; j++)
                    tn[j] += g[o] * bo[j];
            }
            for (int j = 0; j < r; j++)
                tn[j] *= s;
        }
        /* dB[o, j] += s * sum_n g[n, o] ax[n, j] */
#pragma omp parallel for schedule(static)
        for (int o = 0; o < on; o++) {
            float *db = a->dB + (size_t)o * r;
            for (int n = 0; n < N; n++) {
                float g = s * dout[(size_t)n * W + col + o];
                const float *u = ax + (size_t)n * r;
                for (int j = 0; j < r; j++)
                    db[j] += g * u[j];
            }
        }
        /* dA[j, c] += sum_n t[n, j] inp[n, c] */
#pragma omp parallel for schedule(static)
        for (int j = 0; j < r; j++) {
            float *da = a->dA + (size_t)j * in;
            for (int n = 0; n < N; n++) {
                float tj = t[(size_t)n * r + j];
                const float *x = inp + (size_t)n * in;
                for (int c = 0; c < in; c++)
                    da[c] += tj * x[c];
            }
        }
        /* dinp[n, c] += sum_j t[n, j] A[j, c] */
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *dx = dinp + (size_t)n * in;
            const float *tn = t + (size_t)n * r;
            for (int j = 0; j < r; j++) {
                const float *aj = A + (size_t)j * in;
                for (int c = 0; c < in; c++)
                    dx[c] += tn[j] * aj[c];
            }
        }
    }
}

int lora_grad_sync(struct lora *l) {
    struct engine *e = l->m->e;
    if (e->dp == 1 || !e->hooks.allreduce_sum) return 0;
    size_t n = 0;
    for (int i = 0; i < l->n; i++)
        n += (size_t)l->r * (l->ad[i].in + l->ad[i].out);
    /* the comm layer's host all-reduce takes doubles: the adapters are small */
    double *buf = malloc((n ? n : 1) * sizeof *buf);
    if (!buf) return -1;
    size_t k = 0;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        for (size_t j = 0; j < (size_t)l->r * a->in; j++)
            buf[k++] = a->dA[j];
        for (size_t j = 0; j < (size_t)a->out * l->r; j++)
            buf[k++] = a->dB[j];
    }
    int rc = e->hooks.allreduce_sum(e, e->hooks.user, buf, (int)n);
    k = 0;
    for (int i = 0; i < l->n && rc == 0; i++) {
        struct lora_ad *a = &l->ad[i];
        for (size_t j = 0; j < (size_t)l->r * a->in; j++)
            a->dA[j] = (float)buf[k++];
        for (size_t j = 0; j < (size_t)a->out * l->r; j++)
            a->dB[j] = (float)buf[k++];
    }
    free(buf);
    return rc;
}

void lora_zero_grads(struct lora *l) {
    for (int i = 0; i < l->n; i++) {
        struct lora_ad *a = &l->ad[i];
        memset(a->dA, 0, (size_t)l->r * a->in * sizeof(float));
        memset(a->dB, 0, (size_t)a->out * l->r * sizeof(float));
    }
}

double lora_grad_norm_sq(const struct lora *l) {
    double s = 0;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        size_t na = (size_t)l->r * a->in, nb = (size_t)a->out * l->r;
        for (size_t k = 0; k < na; k++)
            s += (double)a->dA[k] * a->dA[k];
        for (size_t k = 0; k < nb; k++)
            s += (double)a->dB[k] * a->dB[k];
    }
    return s;
}

/* The cpu backend's AdamW formula (fp32), with the adapter as its own master. */
static void adamw(float *w, const float *grad, float *m, float *v, size_t n,
                  const struct optim_cfg *c, double lr, double gs, int64_t step) {
    float b1 = (float)c->beta1, b2 = (float)c->beta2;
    float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
    float flr = (float)lr, eps = (float)c->eps, wd = (float)c->weight_decay, fgs = (float)gs;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * fgs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / c1, vh = vi / c2;
        w[i] -= flr * (mh / (sqrtf(vh) + eps) + wd * w[i]);
    }
}

void lora_adamw(struct lora *l, const struct optim_cfg *c, double lr, double grad_scale,
                int64_t step) {
    for (int i = 0; i < l->n; i++) {
        struct lora_ad *a = &l->ad[i];
        adamw(a->A, a->dA, a->mA, a->vA, (size_t)l->r * a->in, c, lr, grad_scale, step);
        adamw(a->B, a->dB, a->mB, a->vB, (size_t)a->out * l->r, c, lr, grad_scale, step);
    }
}

int lora_count(const struct lora *l) {
    return l->n;
}

int lora_rank(const struct lora *l) {
    return l->r;
}

double lora_scale(const struct lora *l) {
    return l->scale;
}

void lora_view(const struct lora *l, int i, struct lora_view *v) {
    const struct lora_ad *a = &l->ad[i];
    *v = (struct lora_view){.base = a->base,
                            .layer = a->layer,
                            .in = a->in,
                            .out = a->out,
                            .A = a->A,
                            .B = a->B,
                            .dA = a->dA,
                            .dB = a->dB};
}

/* "base_model.model.<module>.lora_X.weight" from the base weight's name. */
static void peft_name(char *dst, size_t n, const char *base, const char *which) {
    size_t len = strlen(base);
    int cut = len > 7 && strcmp(base + len - 7, ".weight") == 0 ? (int)(len - 7) : (int)len;
    snprintf(dst, n, "base_model.model.%.*s.%s.weight", cut, base, which);
}

int lora_export_peft(const struct lora *l, const char *dir, const char *base_name, char *err,
                     size_t errlen) {
    int rc = -1;
    char path[1200];
    struct st_tensor *ts = calloc((size_t)l->n * 2 + 1, sizeof *ts);
    char(*names)[MODEL_TENSOR_MAX + 48] = calloc((size_t)l->n * 2 + 1, sizeof *names);
    json_t *cfg = NULL, *mods = NULL;
    if (!ts || !names) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        goto out;
    }
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        peft_name(names[2 * i], sizeof names[0], a->base, "lora_A");
        peft_name(names[2 * i + 1], sizeof names[0], a->base, "lora_B");
        ts[2 * i] = (struct st_tensor){.name = names[2 * i],
                                       .dtype = ST_F32,
                                       .src_dtype = ST_F32,
                                       .ndim = 2,
                                       .shape = {l->r, a->in},
                                       .data = a->A};
        ts[2 * i + 1] = (struct st_tensor){.name = names[2 * i + 1],
                                           .dtype = ST_F32,
                                           .src_dtype = ST_F32,
                                           .ndim = 2,
                                           .shape = {a->out, l->r},
                                           .data = a->B};
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (st_write(path, ts, (size_t)l->n * 2, NULL, NULL, NULL, err, errlen) != 0) goto out;
    mods = json_array();
    const struct lora_target *tab = l->gpt2 ? targets_gpt2 : targets_llama;
    for (const struct lora_target *tg = tab; tg->spec; tg++)
        for (int i = 0; i < l->n; i++)
            if (l->ad[i].tg == tg) {
                json_array_append_new(mods, json_string(tg->peft));
                break;
            }
    cfg =
        json_pack("{s:s, s:s, s:i, s:f, s:f, s:o, s:s, s:s, s:b, s:b, s:b}", "peft_type", "LORA",
                  "task_type", "CAUSAL_LM", "r", l->r, "lora_alpha", l->alpha, "lora_dropout", 0.0,
                  "target_modules", mods, "base_model_name_or_path", base_name ? base_name : "",
                  "bias", "none", "fan_in_fan_out", l->gpt2, "inference_mode", 1, "use_rslora", 0);
    mods = NULL; /* cfg's */
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (!cfg || json_dump_file(cfg, path, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) != 0) {
        snprintf(err, errlen, "cannot write %s", path);
        goto out;
    }
    rc = 0;
out:
    json_decref(cfg);
    json_decref(mods);
    free(ts);
    free(names);
    return rc;
}

int lora_merge(struct lora *l) {
    struct engine *e = l->m->e;
    int rc = -1;
    size_t maxn = 1;
    for (int i = 0; i < l->n; i++) {
        size_t n = (size_t)l->ad[i].out * l->ad[i].in;
        if (n > maxn) maxn = n;
    }
    float *w = malloc(maxn * sizeof *w);
    if (!w) return -1;
    for (int i = 0; i < l->n; i++) {
        const struct lora_ad *a = &l->ad[i];
        const struct model_tensor *t = &e->layout.t[a->tensor];
        size_t off = (size_t)t->rank_offset, n = (size_t)a->out * a->in;
        engine_opt_read(e, ENGINE_OPT_MASTER, w, off - e->shard_off, n);
        for (int o = 0; o < a->out; o++)
            for (int c = 0; c < a->in; c++) {
                double acc = 0;
                for (int j = 0; j < l->r; j++)
                    acc += (double)a->B[(size_t)o * l->r + j] * a->A[(size_t)j * a->in + c];
                w[(size_t)o * a->in + c] += (float)(l->scale * acc);
            }
        if (engine_params_from_host(e, off, w, n) != 0) goto out;
    }
    rc = 0;
out:
    free(w);
    return rc;
}
