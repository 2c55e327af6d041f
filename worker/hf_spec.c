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

void hf_spec_free(struct hf_spec *hs) {
    hf_free(hs->hf);
    hs->hf = NULL;
}

/* The explicit "model" object for directory h (seq_len from the spec's
 * model.seq_len when given). */
static json_t *model_object(const struct hf_model *h, const json_t *old, struct loom_error *e) {
    const struct model_config *c = hf_config(h);
    json_t *sl = json_object_get(old, "seq_len");
    int gpt2 = c->family == MODEL_GPT2;
    json_int_t seq = json_is_integer(sl)                        ? json_integer_value(sl)
                     : gpt2 || c->seq_len < HF_SPEC_SEQ_DEFAULT ? c->seq_len
                                                                : HF_SPEC_SEQ_DEFAULT;
    if (gpt2 && seq != c->seq_len) {
        loom_error_set(e, 422, "HF_CONFIG_UNSUPPORTED", "model.seq_len",
                       "model.seq_len=%lld: a gpt2 model from %s keeps its %d learned positions, "
                       "so seq_len must be %d",
                       (long long)seq, hf_model_dir(h), c->seq_len, c->seq_len);
        return NULL;
    }
    if (seq > c->seq_len) {
        loom_error_set(e, 422, "HF_CONFIG_UNSUPPORTED", "model.seq_len",
                       "model.seq_len=%lld exceeds the %d positions of %s", (long long)seq,
                       c->seq_len, hf_model_dir(h));
        return NULL;
    }
    json_t *m = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:b, s:f}", "family",
                          model_family_name(c->family), "n_layer", c->n_layer, "n_head", c->n_head,
                          "n_kv_head", c->n_kv_head, "d_model", c->d_model, "d_ff", c->d_ff,
                          "vocab_size", c->vocab_size, "seq_len", seq, "tied_embeddings",
                          c->tied_embeddings, "norm_eps", c->norm_eps);
    if (m && !gpt2) json_object_set_new(m, "rope_theta", json_real(c->rope_theta));
    return m;
}

int hf_spec_prepare(char **text, size_t *len, struct hf_spec *hs, struct loom_error *e) {
    memset(hs, 0, sizeof *hs);
    json_t *j = json_loadb(*text, *len, 0, NULL);
    json_t *model = json_object_get(j, "model");
    const char *dir = json_string_value(json_object_get(model, "init_from"));
    int rc = 0;
    /* no init_from, or one the parser refuses or the coordinator resolves
     * (job:<id>): the spec goes to the parser as it is */
    if (!json_is_object(j) || !dir || dir[0] != '/') goto out;
    if (hf_open(dir, &hs->hf, e) != 0) {
        rc = -1;
        goto out;
    }
    json_t *m = model_object(hs->hf, model, e);
    if (!m) {
        rc = -1;
        goto out;
    }
    json_object_set_new(m, "init_from", json_string(hf_model_dir(hs->hf)));
    json_object_set_new(j, "model", m); /* frees `dir` */
    dir = NULL;
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
    if (!hs->hf) {
        if (s->init_from[0])
            return loom_error_set(e, 422, "INIT_FROM_UNRESOLVED", "model.init_from",
                                  "model.init_from=\"%s\" names a job; the coordinator resolves "
                                  "it to a directory before the worker starts",
                                  s->init_from);
        return 0;
    }
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

int hf_spec_init(struct hf_spec *hs, struct engine *e, const char *out_dir,
                 struct loom_error *err) {
    if (!hs->hf) return 0;
    char path[1024];
    int64_t step = 0;
    if (out_dir && ckpt_find_latest(out_dir, 0, path, sizeof path, &step) > 0) {
        log_info("model.init_from: not loaded, resuming from %s (step %lld)", path,
                 (long long)step);
        return 0;
    }
    return hf_load(hs->hf, e, err);
}
