/* model.init_from and export.hf of a job spec (contract in hf_spec.h). */
#include "worker/hf_spec.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/hf.h"
#include "worker/zero.h"

void hf_spec_free(struct hf_spec *hs) {
    hf_free(hs->hf);
    hs->hf = NULL;
}

int hf_spec_prepare(char **text, size_t *len, struct hf_spec *hs, struct loom_error *e) {
    memset(hs, 0, sizeof *hs);
    json_t *j = json_loadb(*text, *len, 0, NULL);
    json_t *model = json_object_get(j, "model");
    const char *from = json_string_value(json_object_get(model, "init_from"));
    const char *dir = from;
    int fork = from && strncmp(from, "job:", 4) == 0;
    /* a fork of a model that came from an HF directory: the directory gives
     * what the spec cannot express (Qwen2 biases, RoPE scaling, exact eps)
     * and the export's source files; the weights are the checkpoint's */
    if (fork) dir = json_string_value(json_object_get(model, "init_hf"));
    int rc = 0;
    /* no HF directory, or one the parser refuses: the spec goes to the
     * parser as it is (an unresolved job: reference is refused after it) */
    if (!json_is_object(j) || !dir || dir[0] != '/') goto out;
    if (hf_open(dir, &hs->hf, e) != 0) {
        rc = -1;
        goto out;
    }
    char what[1100];
    snprintf(what, sizeof what, "%s/config.json", hf_model_dir(hs->hf));
    struct hf_model_source src;
    hf_model_source_init(&src, hf_config(hs->hf), what);
    json_t *m = jobspec_model_from(&src, model, e);
    if (!m) {
        rc = -1;
        goto out;
    }
    if (fork) {
        static const char *const keep[] = {"init_from", "init_checkpoint", "init_hf"};
        for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
            if (json_object_get(model, keep[i]))
                json_object_set(m, keep[i], json_object_get(model, keep[i]));
    } else {
        json_object_set_new(m, "init_from", json_string(hf_model_dir(hs->hf)));
    }
    json_object_set_new(j, "model", m); /* frees `from` and `dir` */
    from = dir = NULL;
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (!s) {
        rc = loom_error_set(e, 500, "OUT_OF_MEMORY", NULL, "out of memory");
        goto out;
    }
    free(*text);
    *text = s;
    *len = strlen(s);
    log_info("model.init_from: %s (%s, %d layers, d_model %d, %s)", hf_model_dir(hs->hf),
             hf_arch_name(hf_model_arch(hs->hf)), hf_config(hs->hf)->n_layer,
             hf_config(hs->hf)->d_model, st_dtype_name(hf_model_dtype(hs->hf)));
out:
    if (rc != 0) hf_spec_free(hs);
    json_decref(j);
    return rc;
}

int hf_spec_apply(struct hf_spec *hs, struct loom_spec *s, struct loom_error *e) {
    hs->export_hf = s->export.hf;
    snprintf(hs->init_checkpoint, sizeof hs->init_checkpoint, "%s", s->init_checkpoint);
    if (strncmp(s->init_from, "job:", 4) == 0 && !s->init_checkpoint[0])
        return loom_error_set(e, 422, "INIT_FROM_UNRESOLVED", "model.init_from",
                              "model.init_from=\"%s\" names a job; the coordinator resolves "
                              "it to a checkpoint (model.init_checkpoint) before the worker "
                              "starts",
                              s->init_from);
    if (!hs->hf) return 0;
    struct model_config *c = &s->model;
    int seq = c->seq_len, bal = c->pp_balance;
    *c = *hf_config(hs->hf);
    c->seq_len = seq;
    c->pp_balance = bal;
    return 0;
}

int hf_spec_load(const char *path, struct loom_spec *s, struct hf_spec *hs, struct loom_error *e) {
    size_t n = 0;
    char *text = fs_read_file(path, 0, &n);
    if (!text)
        return loom_error_set(e, 422, "SPEC_UNREADABLE", "spec", "cannot read spec %s: %s", path,
                              strerror(errno));
    int rc = hf_spec_prepare(&text, &n, hs, e);
    if (rc == 0) rc = jobspec_parse_text(s, text, n, 0, e);
    if (rc == 0) rc = hf_spec_apply(hs, s, e);
    free(text);
    return rc;
}

/* A fork: the parameters of checkpoint `dir` (any layout: zero.h reshards)
 * with the AdamW moments zeroed, so the optimizer starts fresh. */
static int load_fork(struct engine *e, const char *dir, struct loom_error *err) {
    char msg[1024];
    if (zero_load_checkpoint(e, dir, msg, sizeof msg) != 0)
        return loom_error_set(err, 422, "CHECKPOINT_INVALID", "model.init_checkpoint",
                              "model.init_checkpoint=%s: %s", dir, msg);
    float *zeros = calloc(e->shard_n ? e->shard_n : 1, sizeof *zeros);
    if (!zeros) return loom_error_set(err, 500, "OUT_OF_MEMORY", NULL, "out of memory");
    engine_opt_write(e, ENGINE_OPT_M, zeros, 0, e->shard_n);
    engine_opt_write(e, ENGINE_OPT_V, zeros, 0, e->shard_n);
    free(zeros);
    e->be->sync(e->be->ctx);
    log_info("model.init_from: the weights of %s, a fresh optimizer, step 0", dir);
    return 0;
}

int hf_spec_init(struct hf_spec *hs, struct engine *e, const char *out_dir,
                 struct loom_error *err) {
    if (!hs->hf && !hs->init_checkpoint[0]) return 0;
    char path[1024];
    int64_t step = 0;
    if (out_dir && ckpt_find_latest(out_dir, 0, path, sizeof path, &step) > 0) {
        log_info("model.init_from: not loaded, resuming from %s (step %lld)", path,
                 (long long)step);
        return 0;
    }
    if (hs->init_checkpoint[0]) return load_fork(e, hs->init_checkpoint, err);
    return hf_load(hs->hf, e, err);
}
