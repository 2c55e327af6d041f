/* config.json -> model_config for the HF architectures, and the spec "model"
 * object of a model whose shape comes from a source (contract in
 * hf_config.h).
 *
 * Config fields are read through one table per architecture family (HF key,
 * where it goes, default, whether it is required); the features Loom lacks
 * are refused by value checks, so an import never silently computes another
 * model than the one the file describes. */
#include "api/hf_config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const arch_names[HF_NARCH] = {
    [HF_ARCH_LLAMA] = "LlamaForCausalLM",
    [HF_ARCH_MISTRAL] = "MistralForCausalLM",
    [HF_ARCH_QWEN2] = "Qwen2ForCausalLM",
    [HF_ARCH_GPT2] = "GPT2LMHeadModel",
};
/* config.json "model_type" of each, used when "architectures" is absent. */
static const char *const arch_types[HF_NARCH] = {"llama", "mistral", "qwen2", "gpt2"};

const char *hf_arch_name(enum hf_arch a) {
    return (unsigned)a < HF_NARCH ? arch_names[a] : "?";
}

/* ---- config.json ---- */

enum cf_kind { CF_INT, CF_DOUBLE, CF_BOOL };

/* One config.json key. `alt` is an older spelling (GPT-2's n_ctx). An
 * absent optional key keeps `def`; a required one is HF_CONFIG_INVALID. */
struct cf_row {
    const char *key, *alt;
    enum cf_kind kind;
    size_t off; /* into struct model_config */
    double def;
    int required;
};

#define CI(f) offsetof(struct model_config, f)

static const struct cf_row llama_rows[] = {
    {"hidden_size", NULL, CF_INT, CI(d_model), 0, 1},
    {"intermediate_size", NULL, CF_INT, CI(d_ff), 0, 1},
    {"num_hidden_layers", NULL, CF_INT, CI(n_layer), 0, 1},
    {"num_attention_heads", NULL, CF_INT, CI(n_head), 0, 1},
    {"num_key_value_heads", NULL, CF_INT, CI(n_kv_head), -1, 0}, /* -1: n_head */
    {"vocab_size", NULL, CF_INT, CI(vocab_size), 0, 1},
    {"max_position_embeddings", NULL, CF_INT, CI(seq_len), 2048, 0},
    {"rms_norm_eps", NULL, CF_DOUBLE, CI(norm_eps), 1e-6, 0},
    {"rope_theta", NULL, CF_DOUBLE, CI(rope_theta), 10000.0, 0},
    {"tie_word_embeddings", NULL, CF_BOOL, CI(tied_embeddings), 0, 0},
};

static const struct cf_row gpt2_rows[] = {
    {"n_embd", NULL, CF_INT, CI(d_model), 0, 1},
    {"n_layer", NULL, CF_INT, CI(n_layer), 0, 1},
    {"n_head", NULL, CF_INT, CI(n_head), 0, 1},
    {"vocab_size", NULL, CF_INT, CI(vocab_size), 0, 1},
    {"n_positions", "n_ctx", CF_INT, CI(seq_len), 1024, 0},
    {"layer_norm_epsilon", NULL, CF_DOUBLE, CI(norm_eps), 1e-5, 0},
    {"n_inner", NULL, CF_INT, CI(d_ff), -1, 0}, /* -1 (or null): 4 * n_embd */
};

static int read_rows(const json_t *j, const struct cf_row *rows, size_t n, struct model_config *c,
                     const char *path, struct loom_error *err) {
    for (size_t i = 0; i < n; i++) {
        const struct cf_row *r = &rows[i];
        json_t *v = json_object_get(j, r->key);
        if ((!v || json_is_null(v)) && r->alt) v = json_object_get(j, r->alt);
        void *dst = (char *)c + r->off;
        if (!v || json_is_null(v)) {
            if (r->required)
                return loom_error_set(err, 422, "HF_CONFIG_INVALID", r->key,
                                      "%s: \"%s\" is required", path, r->key);
            if (r->kind == CF_DOUBLE)
                *(double *)dst = r->def;
            else
                *(int *)dst = (int)r->def;
            continue;
        }
        int ok = r->kind == CF_BOOL  ? json_is_boolean(v)
                 : r->kind == CF_INT ? json_is_integer(v) && json_integer_value(v) >= 0 &&
                                           json_integer_value(v) <= INT_MAX
                                     : json_is_number(v);
        if (!ok)
            return loom_error_set(err, 422, "HF_CONFIG_INVALID", r->key, "%s: \"%s\" must be %s",
                                  path, r->key,
                                  r->kind == CF_BOOL  ? "true or false"
                                  : r->kind == CF_INT ? "a non-negative integer"
                                                      : "a number");
        if (r->kind == CF_DOUBLE)
            *(double *)dst = json_number_value(v);
        else if (r->kind == CF_BOOL)
            *(int *)dst = json_is_true(v);
        else
            *(int *)dst = (int)json_integer_value(v);
    }
    return 0;
}

/* A config.json value must be absent, null or one of `ok` (a feature Loom
 * lacks otherwise); strings compare as themselves, others as compact JSON. */
static int need_value(const json_t *j, const char *key, const char *const *ok, const char *path,
                      struct loom_error *err) {
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) return 0;
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    const char *txt = json_is_string(v) ? json_string_value(v) : s;
    for (; *ok; ok++)
        if (txt && strcmp(txt, *ok) == 0) {
            free(s);
            return 0;
        }
    loom_error_set(err, 422, "HF_CONFIG_UNSUPPORTED", key,
                   "%s: %s = %s is not supported by Loom's implementation of this architecture",
                   path, key, s ? s : "?");
    free(s);
    return -1;
}

static int parse_rope_scaling(const json_t *j, struct model_config *c, const char *path,
                              struct loom_error *err) {
    json_t *rs = json_object_get(j, "rope_scaling");
    if (!rs || json_is_null(rs)) return 0;
    json_t *ty = json_object_get(rs, "rope_type");
    if (!ty) ty = json_object_get(rs, "type");
    const char *t = json_string_value(ty);
    if (t && strcmp(t, "default") == 0) return 0;
    if (!t || strcmp(t, "llama3") != 0)
        return loom_error_set(err, 422, "HF_CONFIG_UNSUPPORTED", "rope_scaling",
                              "%s: rope_scaling type \"%s\" is not supported (supported: llama3)",
                              path, t ? t : "?");
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {{"factor", CI(rope_factor)},
                {"low_freq_factor", CI(rope_low_freq_factor)},
                {"high_freq_factor", CI(rope_high_freq_factor)}};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        json_t *v = json_object_get(rs, keys[i].key);
        if (!json_is_number(v) || json_number_value(v) <= 0)
            return loom_error_set(err, 422, "HF_CONFIG_INVALID", "rope_scaling",
                                  "%s: rope_scaling.%s must be a positive number", path,
                                  keys[i].key);
        *(double *)((char *)c + keys[i].off) = json_number_value(v);
    }
    json_t *om = json_object_get(rs, "original_max_position_embeddings");
    if (!json_is_integer(om) || json_integer_value(om) <= 0 || json_integer_value(om) > INT_MAX)
        return loom_error_set(err, 422, "HF_CONFIG_INVALID", "rope_scaling",
                              "%s: rope_scaling.original_max_position_embeddings must be a "
                              "positive integer",
                              path);
    if (c->rope_high_freq_factor <= c->rope_low_freq_factor)
        return loom_error_set(err, 422, "HF_CONFIG_INVALID", "rope_scaling",
                              "%s: rope_scaling high_freq_factor=%g must exceed low_freq_factor=%g",
                              path, c->rope_high_freq_factor, c->rope_low_freq_factor);
    c->rope_original_max_pos = (int)json_integer_value(om);
    c->rope_scaling = MODEL_ROPE_SCALE_LLAMA3;
    return 0;
}

static int find_arch(const json_t *j, const char *path, struct loom_error *err) {
    json_t *a = json_object_get(j, "architectures");
    const char *name = json_string_value(json_array_get(a, 0));
    const char *type = json_string_value(json_object_get(j, "model_type"));
    for (int i = 0; i < HF_NARCH; i++)
        if (name ? strcmp(name, arch_names[i]) == 0 : type && strcmp(type, arch_types[i]) == 0)
            return i;
    char list[256] = "";
    for (int i = 0; i < HF_NARCH; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 arch_names[i]);
    return loom_error_set(err, 422, "UNSUPPORTED_ARCHITECTURE", "architectures",
                          "%s: architecture \"%s\" is not supported; supported: %s", path,
                          name   ? name
                          : type ? type
                                 : "(none given)",
                          list);
}

static int parse_json(const json_t *j, const char *path, struct model_config *c, enum hf_arch *arch,
                      struct loom_error *err) {
    int a = find_arch(j, path, err);
    if (a < 0) return -1;
    *arch = (enum hf_arch)a;
    memset(c, 0, sizeof *c);
    if (*arch == HF_ARCH_GPT2) {
        model_config_family_defaults(c, MODEL_GPT2);
        if (read_rows(j, gpt2_rows, sizeof gpt2_rows / sizeof *gpt2_rows, c, path, err) != 0)
            return -1;
        c->n_kv_head = c->n_head;
        if (c->d_ff < 0) c->d_ff = 4 * c->d_model;
        static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
        static const char *const no[] = {"false", NULL};
        static const char *const yes[] = {"true", NULL};
        if (need_value(j, "activation_function", gelu, path, err) != 0 ||
            need_value(j, "scale_attn_by_inverse_layer_idx", no, path, err) != 0 ||
            need_value(j, "reorder_and_upcast_attn", no, path, err) != 0 ||
            need_value(j, "scale_attn_weights", yes, path, err) != 0)
            return -1;
    } else {
        model_config_family_defaults(c, MODEL_LLAMA);
        if (read_rows(j, llama_rows, sizeof llama_rows / sizeof *llama_rows, c, path, err) != 0)
            return -1;
        if (c->n_kv_head < 0) c->n_kv_head = c->n_head;
        static const char *const silu[] = {"silu", NULL};
        static const char *const no[] = {"false", NULL};
        if (need_value(j, "hidden_act", silu, path, err) != 0 ||
            need_value(j, "attention_bias", no, path, err) != 0 ||
            need_value(j, "mlp_bias", no, path, err) != 0)
            return -1;
        if (*arch == HF_ARCH_QWEN2) {
            c->qkv_bias = 1;
            if (need_value(j, "use_sliding_window", no, path, err) != 0) return -1;
        }
        json_t *hd = json_object_get(j, "head_dim");
        if (json_is_integer(hd) && c->n_head > 0 &&
            json_integer_value(hd) != (json_int_t)(c->d_model / c->n_head))
            return loom_error_set(err, 422, "HF_CONFIG_UNSUPPORTED", "head_dim",
                                  "%s: head_dim=%" JSON_INTEGER_FORMAT
                                  " differs from hidden_size/num_attention_heads = %d/%d; Loom "
                                  "needs them equal",
                                  path, json_integer_value(hd), c->d_model, c->n_head);
        if (parse_rope_scaling(j, c, path, err) != 0) return -1;
        json_t *sw = json_object_get(j, "sliding_window");
        if (*arch == HF_ARCH_MISTRAL && json_is_integer(sw) && json_integer_value(sw) > 0 &&
            json_integer_value(sw) < c->seq_len) /* no sequence may exceed the window */
            c->seq_len = (int)json_integer_value(sw);
    }
    model_config_finalize(c);
    char msg[256];
    const char *field = NULL;
    if (model_config_check(c, msg, sizeof msg, &field) != 0)
        return loom_error_set(err, 422, "HF_CONFIG_INVALID", field ? field : "config.json",
                              "%s: %s", path, msg);
    c->preset[0] = '\0';
    return 0;
}

int hf_config_read(const char *path, json_t **json, struct model_config *c, enum hf_arch *arch,
                   struct loom_error *err) {
    json_error_t je;
    struct stat st;
    if (json) *json = NULL;
    if (stat(path, &st) != 0)
        return loom_error_set(err, 422, "HF_CONFIG_MISSING", "model.init_from",
                              "%s: no config.json in the model directory (%s)", path,
                              strerror(errno));
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!json_is_object(j))
        loom_error_set(err, 422, "HF_CONFIG_INVALID", "config.json",
                       "%s: not a JSON object (line %d: %s)", path, je.line, je.text);
    else
        rc = parse_json(j, path, c, arch, err);
    if (rc == 0 && json)
        *json = j;
    else
        json_decref(j);
    return rc;
}

int hf_config_parse(const char *path, struct model_config *c, enum hf_arch *arch,
                    struct loom_error *err) {
    return hf_config_read(path, NULL, c, arch, err);
}

void hf_model_source_init(struct hf_model_source *src, const struct model_config *c,
                          const char *path) {
    int gpt2 = c->family == MODEL_GPT2;
    *src = (struct hf_model_source){
        .cfg = c,
        .what = path,
        .max_seq = c->seq_len,
        .exact_seq = gpt2,
        .def_seq = gpt2 || c->seq_len < HF_SPEC_SEQ_DEFAULT ? c->seq_len : HF_SPEC_SEQ_DEFAULT,
        .seq_code = LOOM_E_HF_CONFIG_UNSUPPORTED,
    };
}

/* ---- the spec's model object ---- */

/* The sizes a spec may state beside a source, and how to compare them. */
enum st_kind { ST_INT, ST_BOOL, ST_DBL };
static const struct {
    const char *key;
    enum st_kind kind;
    size_t off;
} stated[] = {
    {"n_layer", ST_INT, CI(n_layer)},
    {"n_head", ST_INT, CI(n_head)},
    {"n_kv_head", ST_INT, CI(n_kv_head)},
    {"d_model", ST_INT, CI(d_model)},
    {"d_ff", ST_INT, CI(d_ff)},
    {"vocab_size", ST_INT, CI(vocab_size)},
    {"tied_embeddings", ST_BOOL, CI(tied_embeddings)},
    {"norm_eps", ST_DBL, CI(norm_eps)},
    {"rope_theta", ST_DBL, CI(rope_theta)},
};

/* Reals agree to 6 digits: config.json's eps may be a float32 value printed
 * in full (9.999999747378752e-06 for 1e-5); the worker uses the file's. */
static int same_real(double a, double b) {
    return fabs(a - b) <= 1e-6 * fmax(fabs(a), fabs(b));
}

static int mismatch(struct loom_error *e, const char *key, const char *mine, const char *theirs,
                    const char *what) {
    char field[64];
    snprintf(field, sizeof field, "model.%s", key);
    return loom_err(e, LOOM_E_INIT_FROM_MISMATCH, field,
                    "%s=%s but model.init_from's model (%s) has %s=%s; leave it out or make them "
                    "agree",
                    field, mine, what, key, theirs);
}

/* The sizes `m` (the spec's model object) states, against src. */
static int check_stated(const struct hf_model_source *src, const json_t *m, struct loom_error *e) {
    const struct model_config *c = src->cfg;
    char a[64], b[64];
    const char *fam = json_string_value(json_object_get(m, "family"));
    if (json_object_get(m, "family") && (!fam || model_family_parse(fam) != (int)c->family))
        return mismatch(e, "family", fam ? fam : "(not a string)", model_family_name(c->family),
                        src->what);
    /* a preset stands for its sizes: each one not stated explicitly must agree */
    struct model_config pc;
    int have_preset = 0;
    const char *preset = json_string_value(json_object_get(m, "preset"));
    if (preset) {
        const struct model_preset *p = model_preset_find(c->family, preset);
        if (!p)
            return loom_err(e, LOOM_E_UNKNOWN_PRESET, "model.preset",
                            "no %s preset \"%s\" (model.init_from's model %s is %s)",
                            model_family_name(c->family), preset, src->what,
                            model_family_name(c->family));
        pc = p->config;
        have_preset = 1;
    }
    for (size_t i = 0; i < sizeof stated / sizeof *stated; i++) {
        if (stated[i].off == CI(rope_theta) && c->pos != MODEL_POS_ROPE) continue;
        const json_t *v = json_object_get(m, stated[i].key);
        const void *ref = (const char *)c + stated[i].off;
        const void *pv = have_preset ? (const char *)&pc + stated[i].off : NULL;
        int bad = 0;
        switch (stated[i].kind) {
        case ST_INT:
            if (v) {
                bad = !json_is_integer(v) || json_integer_value(v) != *(const int *)ref;
                snprintf(a, sizeof a, "%s", "?");
                if (json_is_integer(v))
                    snprintf(a, sizeof a, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
            } else if (pv) {
                bad = *(const int *)pv != *(const int *)ref;
                snprintf(a, sizeof a, "%d (preset %s)", *(const int *)pv, preset);
            }
            snprintf(b, sizeof b, "%d", *(const int *)ref);
            break;
        case ST_BOOL:
            if (v) {
                bad = !json_is_boolean(v) || json_is_true(v) != (*(const int *)ref != 0);
                snprintf(a, sizeof a, "%s", json_is_true(v) ? "true" : "false");
            } else if (pv) {
                bad = (*(const int *)pv != 0) != (*(const int *)ref != 0);
                snprintf(a, sizeof a, "%s (preset %s)", *(const int *)pv ? "true" : "false",
                         preset);
            }
            snprintf(b, sizeof b, "%s", *(const int *)ref ? "true" : "false");
            break;
        case ST_DBL:
            if (v) {
                bad = !json_is_number(v) || !same_real(json_number_value(v), *(const double *)ref);
                snprintf(a, sizeof a, "%.15g", json_number_value(v));
            } else if (pv) {
                bad = !same_real(*(const double *)pv, *(const double *)ref);
                snprintf(a, sizeof a, "%.15g (preset %s)", *(const double *)pv, preset);
            }
            snprintf(b, sizeof b, "%.15g", *(const double *)ref);
            break;
        }
        if (bad) return mismatch(e, stated[i].key, a, b, src->what);
    }
    return 0;
}

json_t *jobspec_model_from(const struct hf_model_source *src, const json_t *spec_model,
                           struct loom_error *e) {
    const struct model_config *c = src->cfg;
    if (check_stated(src, spec_model, e) != 0) return NULL;
    json_t *sl = json_object_get(spec_model, "seq_len");
    json_int_t seq = json_is_integer(sl) ? json_integer_value(sl) : src->def_seq;
    if (src->exact_seq && seq != c->seq_len) {
        loom_err(e, src->seq_code, "model.seq_len",
                 "model.seq_len=%lld: a gpt2 model from %s keeps its %d learned positions, so "
                 "seq_len must be %d",
                 (long long)seq, src->what, c->seq_len, c->seq_len);
        return NULL;
    }
    if (src->max_seq > 0 && seq > src->max_seq) {
        loom_err(e, src->seq_code, "model.seq_len",
                 "model.seq_len=%lld exceeds the %d positions of %s", (long long)seq, src->max_seq,
                 src->what);
        return NULL;
    }
    json_t *m = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:b, s:f}", "family",
                          model_family_name(c->family), "n_layer", c->n_layer, "n_head", c->n_head,
                          "n_kv_head", c->n_kv_head, "d_model", c->d_model, "d_ff", c->d_ff,
                          "vocab_size", c->vocab_size, "seq_len", seq, "tied_embeddings",
                          c->tied_embeddings, "norm_eps", c->norm_eps);
    if (m && c->pos == MODEL_POS_ROPE)
        json_object_set_new(m, "rope_theta", json_real(c->rope_theta));
    if (!m) {
        loom_err(e, LOOM_E_INTERNAL, NULL, "out of memory");
        return NULL;
    }
    /* the rest as given (a preset that agrees, a misspelt key for the parser
     * to report); where it came from is the caller's to set */
    static const char *const source_keys[] = {"init_from", "init_checkpoint", "init_hf"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)spec_model, key, v) {
        int skip = json_object_get(m, key) != NULL;
        for (size_t i = 0; i < sizeof source_keys / sizeof *source_keys; i++)
            skip |= strcmp(key, source_keys[i]) == 0;
        if (!skip) json_object_set(m, key, v);
    }
    return m;
}
