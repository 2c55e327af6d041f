/* loom-worker's model modes (hf_cli.h) and the job-spec side of fine-tuning
 * (hf_spec.h): one process builds the engine for the model, loads the
 * weights, and runs score / generate / export in that order. */
#include "worker/hf_cli.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/exit_codes.h"
#include "api/jobspec.h"
#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/hf.h"
#include "worker/hf_generate.h"
#include "worker/hf_spec.h"
#include "worker/par.h"
#include "worker/zero.h"

int hf_cli_wanted(const struct hf_cli_opts *o) {
    return o->init_from || o->score || o->generate || o->export_hf;
}

void hf_cli_error(const char *code, const char *msg) {
    json_t *j = json_pack("{s:s, s:s, s:s}", "type", "error", "code", code, "message", msg);
    char *s = json_dumps(j, JSON_COMPACT);
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(j);
    log_error("%s: %s", code, msg);
}

void hf_cli_emit(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(j);
}

/* "1,2,3" -> ids in [0, V); returns the count, or -1 with msg. */
static int parse_tokens(const char *s, int V, int32_t **out, char *msg, size_t msglen) {
    size_t cap = 16;
    int n = 0;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= V || (*end && *end != ',')) {
            snprintf(msg, msglen, "token list \"%.100s\": item %d is not an id in [0, %d)", s,
                     n + 1, V);
            free(t);
            return -1;
        }
        if ((size_t)n == cap) {
            int32_t *nt = realloc(t, (cap *= 2) * sizeof *t);
            if (!nt) {
                free(t);
                return -1;
            }
            t = nt;
        }
        t[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        snprintf(msg, msglen, "token list \"%.100s\" is empty", s);
        free(t);
        return -1;
    }
    *out = t;
    return n;
}

struct cli {
    const struct hf_cli_opts *o;
    struct hf_model *hf; /* weights source or the model's origin; may be NULL */
    struct model_config cfg;
    struct engine *e;
    struct model *m;
    char ckpt[1024];
    struct loom_error le;
};

/* The model config and where the weights come from. Exit code or 0. */
static int resolve_source(struct cli *c) {
    const struct hf_cli_opts *o = c->o;
    if (o->init_from) {
        if (hf_open(o->init_from, &c->hf, &c->le) != 0) return LOOM_EXIT_BAD_SPEC;
        c->cfg = *hf_config(c->hf);
        return 0;
    }
    if (!o->spec) {
        loom_error_set(&c->le, 400, "USAGE", NULL,
                       "--score-tokens, --generate-tokens and --export-hf need --init-from DIR or "
                       "--spec FILE --out RUN");
        return LOOM_EXIT_BAD_SPEC;
    }
    struct loom_spec *s = calloc(1, sizeof *s);
    struct hf_spec hs;
    memset(&hs, 0, sizeof hs);
    int rc = LOOM_EXIT_BAD_SPEC;
    if (!s || hf_spec_load(o->spec, s, &hs, &c->le) != 0) goto out;
    if (s->train.lora.enabled) { /* its checkpoints hold the frozen base weights only */
        loom_error_set(&c->le, 422, "LORA_UNSUPPORTED", "train.lora",
                       "%s has train.lora: its run's checkpoints hold the base weights without "
                       "the adapters; use the spec's export.hf (merged at the end of the run) or "
                       "export.lora / --export-lora",
                       o->spec);
        goto out;
    }
    c->cfg = s->model;
    c->hf = hs.hf;
    hs.hf = NULL;
    int64_t step = 0;
    int found = o->out ? ckpt_find_latest(o->out, 0, c->ckpt, sizeof c->ckpt, &step) : 0;
    if (found < 0) {
        loom_error_set(&c->le, 422, "CHECKPOINT_INVALID", "out", "%s: cannot list checkpoints",
                       o->out);
        goto out;
    }
    if (found == 0) /* a fork that saved nothing yet: the checkpoint it starts from */
        snprintf(c->ckpt, sizeof c->ckpt, "%s", s->init_checkpoint);
    found = found || c->ckpt[0];
    if (!found && !c->hf) {
        loom_error_set(&c->le, 422, "NO_CHECKPOINT", "out",
                       "%s has no complete checkpoint and the spec has no model.init_from",
                       o->out ? o->out : "(no --out)");
        goto out;
    }
    rc = 0;
out:
    hf_spec_free(&hs);
    free(s);
    return rc;
}

/* T: positions the model's forward covers (scoring); gen: prompt + new
 * tokens, which the forward must cover too when generation recomputes. */
static int build(struct cli *c, int T, int gen) {
    const struct hf_cli_opts *o = c->o;
    const char *dev = o->device && *o->device ? o->device : "cpu";
    struct backend *be = NULL;
    if (strcmp(dev, "cuda") == 0) {
#ifdef LOOM_HAVE_CUDA
        be = backend_cuda_new(0);
#else
        loom_error_set(&c->le, 422, "CUDA_NOT_BUILT", "device",
                       "--device cuda requested but this loom-worker was built without CUDA");
        return LOOM_EXIT_BAD_SPEC;
#endif
    } else if (strcmp(dev, "cpu") == 0) {
        be = backend_cpu_new((int)o->threads);
    } else {
        loom_error_set(&c->le, 422, "INVALID_DEVICE", "device", "--device %s: expected cpu or cuda",
                       dev);
        return LOOM_EXIT_BAD_SPEC;
    }
    if (!be) {
        loom_error_set(&c->le, 500, "DEVICE_UNAVAILABLE", "device",
                       "the %s backend could not start", dev);
        return LOOM_EXIT_FAILED;
    }
    /* no gradients, and no optimizer state unless a checkpoint (its moments)
     * or an export (the fp32 master) needs it: scoring a model costs its
     * weights, not 4x */
    struct engine_place p = {
        .rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1, .opt_later = 1, .windows_later = 1};
    c->e = engine_new(&c->cfg, &p, be);
    if (!c->e || engine_set_windows(c->e, 0, c->e->n_params, 0, 0) != 0 ||
        ((c->ckpt[0] || o->export_hf) && engine_opt_init(c->e) != 0)) {
        loom_error_set(&c->le, 500, "OUT_OF_MEMORY", NULL, "cannot build the engine (see stderr)");
        return LOOM_EXIT_FAILED;
    }
    if ((o->recompute || !be->rope_at || !be->attention_decode) && gen > T) T = gen;
    /* pad the positions to the attention's tile (the padding rows sit after
     * the real ones, which causal attention keeps them out of) */
    int tile = be->caps.attn_pos_multiple;
    if (tile > 1 && T % tile != 0) {
        int padded = (T + tile - 1) / tile * tile;
        T = padded <= c->cfg.seq_len ? padded : T;
    }
    struct model_opts mo = {.B = 1, .T = T, .threads = (int)o->threads};
    c->m = model_new_ex(c->e, &mo);
    if (!c->m) {
        loom_error_set(&c->le, 422, "UNSUPPORTED", "device",
                       "the model could not be built on %s (see stderr)", be->name);
        return LOOM_EXIT_BAD_SPEC;
    }
    char err[1024];
    if (c->ckpt[0]) {
        if (zero_load_checkpoint(c->e, c->ckpt, err, sizeof err) != 0) {
            loom_error_set(&c->le, 422, "CHECKPOINT_INVALID", "out", "%s", err);
            return LOOM_EXIT_FAILED;
        }
        log_info("weights from checkpoint %s", c->ckpt);
    } else if (hf_load(c->hf, c->e, &c->le) != 0) {
        return LOOM_EXIT_BAD_SPEC;
    }
    return 0;
}

static int do_score(struct cli *c, const int32_t *t, int n) {
    double *lp = malloc((size_t)n * sizeof *lp);
    if (!lp || hf_score(c->m, t, n, lp) != 0) {
        free(lp);
        loom_error_set(&c->le, 500, "SCORE_FAILED", NULL, "scoring failed (see stderr)");
        return LOOM_EXIT_FAILED;
    }
    json_t *a = json_array();
    json_array_append_new(a, json_null());
    for (int i = 1; i < n; i++)
        json_array_append_new(a, json_real(lp[i]));
    hf_cli_emit(json_pack("{s:s, s:o}", "type", "score", "logprobs", a));
    free(lp);
    return 0;
}

static int do_generate(struct cli *c, const int32_t *t, int n) {
    const struct hf_cli_opts *o = c->o;
    struct hf_sample_opts so = {.max_new = (int)o->max_new,
                                .temperature = o->temperature,
                                .top_p = o->top_p,
                                .seed = (uint64_t)o->seed};
    if (c->hf) so.n_eos = hf_eos_tokens(c->hf, so.eos, HF_MAX_EOS);
    int32_t *out = malloc((size_t)(so.max_new > 0 ? so.max_new : 1) * sizeof *out);
    int got = out ? hf_generate(c->m, t, n, &so, (int)o->recompute, out) : -1;
    if (got < 0) {
        free(out);
        loom_error_set(&c->le, 500, "GENERATE_FAILED", NULL,
                       "generation failed on the %s backend (see stderr)", c->e->be->name);
        return LOOM_EXIT_FAILED;
    }
    json_t *a = json_array();
    for (int i = 0; i < got; i++)
        json_array_append_new(a, json_integer(out[i]));
    hf_cli_emit(json_pack("{s:s, s:o}", "type", "generate", "tokens", a));
    free(out);
    return 0;
}

int hf_export_engine(struct engine *e, struct zero *z, struct par *par, const char *dir,
                     const struct hf_model *src, uint64_t shard_bytes, struct loom_error *err) {
    struct model_layout full;
    if (model_layout_init(&full, &e->cfg, 1) != 0)
        return loom_error_set(err, 500, "EXPORT_FAILED", NULL, "cannot lay out the model");
    float *h = malloc((size_t)full.numel * sizeof *h);
    int rc = -1;
    if (!h) {
        loom_error_set(err, 500, "EXPORT_FAILED", NULL, "out of memory (%lld parameters)",
                       (long long)full.numel);
        goto out;
    }
    int grc = 0;
    if (par)
        grc = par_gather_full(par, h);
    else if (z)
        grc = zero_gather_master(z, h);
    else
        engine_opt_read(e, ENGINE_OPT_MASTER, h, 0, e->n_params);
    if (grc != 0) {
        loom_error_set(err, 500, "EXPORT_FAILED", NULL, "gathering the weights failed");
        goto out;
    }
    rc = 0;
    if (e->rank == 0) {
        struct hf_export_opts xo = {.dir = dir,
                                    .src_dir = src ? hf_model_dir(src) : NULL,
                                    .dtype = src ? hf_model_dtype(src) : ST_F32,
                                    .shard_bytes = shard_bytes};
        rc = hf_export(&xo, &e->cfg, &full, h, err);
        if (rc == 0)
            hf_cli_emit(json_pack("{s:s, s:s, s:s}", "type", "export", "dir", dir, "dtype",
                                  st_dtype_name(xo.dtype)));
    }
out:
    free(h);
    model_layout_free(&full);
    return rc;
}

int hf_cli_run(const struct hf_cli_opts *o) {
    struct cli c;
    memset(&c, 0, sizeof c);
    c.o = o;
    int32_t *st = NULL, *gt = NULL;
    int ns = 0, ng = 0, code = resolve_source(&c);
    char msg[256];
    if (code) goto out;
    if (o->score && (ns = parse_tokens(o->score, c.cfg.vocab_size, &st, msg, sizeof msg)) < 0) {
        loom_error_set(&c.le, 422, "BAD_TOKENS", "score-tokens", "%s", msg);
        code = LOOM_EXIT_BAD_SPEC;
        goto out;
    }
    if (o->generate &&
        (ng = parse_tokens(o->generate, c.cfg.vocab_size, &gt, msg, sizeof msg)) < 0) {
        loom_error_set(&c.le, 422, "BAD_TOKENS", "generate-tokens", "%s", msg);
        code = LOOM_EXIT_BAD_SPEC;
        goto out;
    }
    if (ns > c.cfg.seq_len) {
        loom_error_set(&c.le, 422, "TOO_LONG", "score-tokens",
                       "%d tokens exceed the model's %d positions", ns, c.cfg.seq_len);
        code = LOOM_EXIT_BAD_SPEC;
        goto out;
    }
    if (gt && (int64_t)ng + o->max_new > c.cfg.seq_len) {
        loom_error_set(&c.le, 422, "TOO_LONG", "max-new-tokens",
                       "%d prompt tokens + --max-new-tokens %ld exceed the model's %d positions",
                       ng, o->max_new, c.cfg.seq_len);
        code = LOOM_EXIT_BAD_SPEC;
        goto out;
    }
    if ((code = build(&c, ns > 0 ? ns : 1, gt ? ng + (int)o->max_new : 0)) != 0) goto out;
    hf_cli_emit(
        json_pack("{s:s, s:s, s:s, s:I, s:i, s:s, s:s}", "type", "model", "architecture",
                  c.hf ? hf_arch_name(hf_model_arch(c.hf)) : model_family_name(c.cfg.family),
                  "dtype", c.hf ? st_dtype_name(hf_model_dtype(c.hf)) : "F32", "params",
                  (json_int_t)model_n_params(&c.cfg), "seq_len", c.cfg.seq_len, "weights",
                  c.ckpt[0] ? c.ckpt : hf_model_dir(c.hf), "device", c.e->be->name));
    if (st && (code = do_score(&c, st, ns)) != 0) goto out;
    if (gt && (code = do_generate(&c, gt, ng)) != 0) goto out;
    if (o->export_hf) {
        if (hf_export_engine(c.e, NULL, NULL, o->export_hf, c.hf, (uint64_t)(o->shard_mb * 1e6),
                             &c.le) != 0) {
            code = LOOM_EXIT_FAILED;
            goto out;
        }
    }
out:
    if (code) hf_cli_error(c.le.code[0] ? c.le.code : "FAILED", c.le.message);
    free(st);
    free(gt);
    model_free(c.m);
    engine_free(c.e);
    hf_free(c.hf);
    return code;
}
