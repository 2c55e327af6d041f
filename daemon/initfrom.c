/* model.init_from at submit: HF directories and job forks (see initfrom.h).
 * The spec's JSON is rewritten before jobspec_parse so that everything after
 * it (validation, the planner's memory check, the canonical stored form)
 * sees the sizes as if the user had written them. */
#include "daemon/initfrom.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/hf_config.h"
#include "daemon/store.h"

#define STEPS_MAX 4096 /* checkpoints listed for a fork (keep is at most 1000) */

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

int initfrom_list_steps(const char *out_dir, long long *steps, int max) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/checkpoints", out_dir);
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        if (strncmp(de->d_name, "step_", 5) != 0) continue; /* .tmp.step_N: not complete */
        errno = 0;
        long long s = strtoll(de->d_name + 5, &end, 10);
        if (errno || *end || end == de->d_name + 5 || s < 0) continue;
        char man[PATH_MAX + 300];
        struct stat st;
        snprintf(man, sizeof man, "%s/%s/manifest.json", dir, de->d_name);
        if (stat(man, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (n < max) steps[n] = s;
        n++;
    }
    closedir(d);
    qsort(steps, (size_t)(n < max ? n : max), sizeof *steps, cmp_ll);
    return n;
}

/* The rewritten copy of body with model m (stolen) in place of "model". */
static json_t *with_model(json_t *body, json_t *m) {
    json_t *out = json_copy(body); /* shallow: the other sections are shared, not changed */
    if (!out) {
        json_decref(m);
        return NULL;
    }
    json_object_set_new(out, "model", m);
    return out;
}

/* ---- HF directories ---- */

static int resolve_peft(const struct initfrom_ctx *c, json_t *body, json_t *model, const char *dir,
                        json_t **out, struct loom_error *e);

/* 1 when dir holds a PEFT adapter (adapter_config.json). */
static int is_peft(const char *dir) {
    char p[JOBSPEC_PATH_MAX + 32];
    struct stat st;
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The model of HF directory dir; init_from becomes `adapter` (the PEFT
 * adapter dir is the base of), or dir itself when adapter is NULL (and a
 * PEFT adapter at dir is followed to its base). */
static int resolve_hf_as(const struct initfrom_ctx *c, json_t *body, json_t *model, const char *dir,
                         const char *adapter, json_t **out, struct loom_error *e);

static int resolve_hf(const struct initfrom_ctx *c, json_t *body, json_t *model, const char *dir,
                      json_t **out, struct loom_error *e) {
    return resolve_hf_as(c, body, model, dir, NULL, out, e);
}

static int resolve_hf_as(const struct initfrom_ctx *c, json_t *body, json_t *model, const char *dir,
                         const char *adapter, json_t **out, struct loom_error *e) {
    if (jobspec_path_confined(dir, c->roots, c->nroots, 0, "model.init_from", e) != 0) return -1;
    struct stat st;
    if (stat(dir, &st) != 0) {
        /* a spec that states the shape itself still works where loomd does
         * not see the models (no shared storage): the worker checks then */
        if (!c->strict && json_object_get(model, "family")) {
            *out = json_incref(body);
            return 0;
        }
        return loom_err(e, LOOM_E_INIT_FROM_NOT_FOUND, "model.init_from",
                        "model.init_from=\"%.300s\": no such directory where loomd looks (%s); "
                        "loomd reads its config.json for the model's family and sizes",
                        dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return loom_err(e, LOOM_E_INIT_FROM_NOT_FOUND, "model.init_from",
                        "model.init_from=\"%.300s\" is not a directory (an HF model directory "
                        "holds config.json and model.safetensors)",
                        dir);
    if (!adapter && is_peft(dir)) return resolve_peft(c, body, model, dir, out, e);
    char cfg_path[JOBSPEC_PATH_MAX + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    struct model_config cfg;
    enum hf_arch arch;
    if (hf_config_read(cfg_path, NULL, &cfg, &arch, e) != 0) return -1;
    struct hf_model_source src;
    hf_model_source_init(&src, &cfg, cfg_path);
    json_t *m = jobspec_model_from(&src, model, e);
    if (!m) return -1;
    json_object_set_new(m, "init_from", json_string(adapter ? adapter : dir));
    *out = with_model(body, m);
    return *out ? 0 : loom_err(e, LOOM_E_INTERNAL, NULL, "out of memory");
}

/* ---- PEFT adapter directories ---- */

/* A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) to
 * continue with train.lora: the model is its base's, the HF directory
 * base_model_name_or_path names (resolved as an HF init_from, confined to
 * the same roots); init_from stays the adapter directory, which the worker
 * follows to the base (worker/main.c). The adapter's r and lora_alpha must
 * equal what train.lora states (the worker checks them against the
 * defaults too). */
static int resolve_peft(const struct initfrom_ctx *c, json_t *body, json_t *model, const char *dir,
                        json_t **out, struct loom_error *e) {
    char path[JOBSPEC_PATH_MAX + 32];
    json_error_t je;
    int rc = -1;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *cfg = json_load_file(path, 0, &je);
    const json_t *lora = json_object_get(json_object_get(body, "train"), "lora");
    if (!cfg) {
        loom_err(e, LOOM_E_LORA_INIT_INVALID, "model.init_from", "%.300s is not JSON: %s", path,
                 je.text);
        goto out;
    }
    const char *pt = json_string_value(json_object_get(cfg, "peft_type"));
    if (!pt || strcmp(pt, "LORA") != 0) {
        loom_err(e, LOOM_E_LORA_INIT_INVALID, "model.init_from",
                 "%.300s has peft_type=%s; train.lora continues a LORA adapter", path,
                 pt ? pt : "(none)");
        goto out;
    }
    if (!json_is_object(lora)) {
        loom_err(e, LOOM_E_LORA_INIT_INVALID, "model.init_from",
                 "model.init_from=\"%.300s\" is a PEFT adapter but the spec has no train.lora "
                 "to continue it with",
                 dir);
        goto out;
    }
    static const char *const keys[2][2] = {{"rank", "r"}, {"alpha", "lora_alpha"}};
    for (int k = 0; k < 2; k++) {
        const json_t *want = json_object_get(lora, keys[k][0]);
        const json_t *have = json_object_get(cfg, keys[k][1]);
        if (want && (!json_is_number(have) || json_number_value(have) != json_number_value(want))) {
            loom_err(e, LOOM_E_LORA_INIT_INVALID, "train.lora",
                     "train.lora.%s=%g but the PEFT adapter %.300s has %s=%g (continue it with the "
                     "same rank and alpha)",
                     keys[k][0], json_number_value(want), dir, keys[k][1],
                     json_is_number(have) ? json_number_value(have) : -1.0);
            goto out;
        }
    }
    const char *base = json_string_value(json_object_get(cfg, "base_model_name_or_path"));
    if (!base || !*base) {
        loom_err(e, LOOM_E_PEFT_BASE_NOT_FOUND, "model.init_from",
                 "%.300s has no base_model_name_or_path: loomd and the worker find the base "
                 "model's HF directory there",
                 path);
        goto out;
    }
    if (base[0] != '/') {
        loom_err(e, LOOM_E_PEFT_BASE_NOT_FOUND, "model.init_from",
                 "%.300s: base_model_name_or_path=\"%.200s\" is not an absolute directory path "
                 "(a hub name is not resolved; point it at the base model's HF directory)",
                 path, base);
        goto out;
    }
    char bdir[JOBSPEC_PATH_MAX];
    snprintf(bdir, sizeof bdir, "%s", base);
    if (jobspec_path_confined(bdir, c->roots, c->nroots, 0, "model.init_from", e) != 0) goto out;
    struct stat st;
    if (stat(bdir, &st) != 0 || !S_ISDIR(st.st_mode) || is_peft(bdir)) {
        /* a spec stating the shape itself: the worker resolves the base */
        if (stat(bdir, &st) != 0 && !c->strict && json_object_get(model, "family")) {
            *out = json_incref(body);
            rc = 0;
            goto out;
        }
        loom_err(e, LOOM_E_PEFT_BASE_NOT_FOUND, "model.init_from",
                 "the PEFT adapter %.300s names base_model_name_or_path=\"%.300s\", %s", dir, bdir,
                 is_peft(bdir) ? "another adapter, not a base model"
                               : "which is not a directory where loomd looks");
        goto out;
    }
    rc = resolve_hf_as(c, body, model, bdir, dir, out, e);
out:
    json_decref(cfg);
    return rc;
}

/* ---- forks ---- */

struct parent_op {
    const char *tenant_id, *id;
    struct store_job job;
};

static int parent_cb(struct store_tx *tx, void *arg) {
    struct parent_op *op = arg;
    return store_job_get(tx, op->tenant_id, op->id, &op->job);
}

static int resolve_job(const struct initfrom_ctx *c, json_t *body, json_t *model, const char *ref,
                       json_t **out, struct loom_error *e) {
    char id[JOBSPEC_ID_MAX];
    const char *at = strchr(ref + 4, '@');
    snprintf(id, sizeof id, "%.*s", (int)(at ? (size_t)(at - ref - 4) : strlen(ref + 4)), ref + 4);
    long long want = at ? strtoll(at + 1, NULL, 10) : -1;
    struct parent_op op = {.tenant_id = c->tenant_id, .id = id};
    struct loom_spec *ps = NULL;
    long long *steps = NULL;
    int rc = -1;
    int src = store_read(c->st, parent_cb, &op);
    if (src == STORE_NOT_FOUND) {
        /* another tenant's job answers exactly as a missing one */
        loom_err(e, LOOM_E_JOB_NOT_FOUND, "model.init_from", "model.init_from=\"%s\": no job '%s'",
                 ref, id);
        goto out;
    }
    if (src != STORE_OK) {
        loom_err(e, LOOM_E_STORE_UNAVAILABLE, NULL, "the store is unavailable; retry");
        goto out;
    }
    ps = malloc(sizeof *ps);
    steps = malloc(STEPS_MAX * sizeof *steps);
    if (!ps || !steps) {
        loom_err(e, LOOM_E_INTERNAL, NULL, "out of memory");
        goto out;
    }
    struct loom_error pe;
    if (jobspec_parse_text(ps, op.job.spec, strlen(op.job.spec), JOBSPEC_FOR_PLAN, &pe) != 0) {
        loom_err(e, LOOM_E_INTERNAL, "model.init_from", "job %s's stored spec does not parse: %s",
                 id, pe.message);
        goto out;
    }
    if (ps->train.lora.enabled) {
        loom_err(e, LOOM_E_INIT_FROM_UNSUPPORTED, "model.init_from",
                 "model.init_from=\"%s\": job %s trains LoRA adapters, and its checkpoints hold "
                 "the frozen base weights only; start from its export (export.hf) instead",
                 ref, id);
        goto out;
    }
    int n = initfrom_list_steps(op.job.out_dir ? op.job.out_dir : "", steps, STEPS_MAX);
    if (n > STEPS_MAX) n = STEPS_MAX;
    if (n < 0) {
        loom_err(e, LOOM_E_CHECKPOINT_NOT_FOUND, "model.init_from",
                 "model.init_from=\"%s\": cannot list the checkpoints of job %s under %.300s "
                 "(%s)",
                 ref, id, op.job.out_dir, strerror(errno));
        goto out;
    }
    if (n == 0) {
        loom_err(e, LOOM_E_CHECKPOINT_NOT_FOUND, "model.init_from",
                 "model.init_from=\"%s\": job %s (%s) has no saved checkpoint yet", ref, id,
                 job_state_name(op.job.state));
        goto out;
    }
    long long step = steps[n - 1];
    if (want >= 0) {
        int k = 0;
        while (k < n && steps[k] != want)
            k++;
        if (k == n) {
            char list[512] = "";
            for (int i = 0; i < n; i++) {
                size_t l = strlen(list);
                if (l > sizeof list - 24) {
                    snprintf(list + l, sizeof list - l, ", ...");
                    break;
                }
                snprintf(list + l, sizeof list - l, "%s%lld", i ? ", " : "", steps[i]);
            }
            loom_err(e, LOOM_E_CHECKPOINT_NOT_FOUND, "model.init_from",
                     "model.init_from=\"%s\": job %s has no checkpoint at step %lld; saved "
                     "steps: %s",
                     ref, id, want, list);
            goto out;
        }
        step = want;
    }
    char what[96];
    snprintf(what, sizeof what, "job %s", id);
    struct hf_model_source s = {.cfg = &ps->model,
                                .what = what,
                                .max_seq = 0,
                                .exact_seq = ps->model.pos == MODEL_POS_LEARNED,
                                .def_seq = ps->model.seq_len,
                                .seq_code = LOOM_E_INIT_FROM_MISMATCH};
    json_t *m = jobspec_model_from(&s, model, e);
    if (!m) goto out;
    char ckpt[JOBSPEC_PATH_MAX], name[JOBSPEC_PATH_MAX];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step_%08lld", op.job.out_dir, step);
    snprintf(name, sizeof name, "job:%s@%lld", id, step);
    json_object_set_new(m, "init_from", json_string(name));
    json_object_set_new(m, "init_checkpoint", json_string(ckpt));
    const char *hf = ps->init_from[0] == '/' ? ps->init_from : ps->init_hf;
    if (hf[0]) json_object_set_new(m, "init_hf", json_string(hf));
    *out = with_model(body, m);
    rc = *out ? 0 : loom_err(e, LOOM_E_INTERNAL, NULL, "out of memory");
out:
    store_job_clear(&op.job);
    free(ps);
    free(steps);
    return rc;
}

int initfrom_resolve(const struct initfrom_ctx *c, json_t *body, json_t **out,
                     struct loom_error *e) {
    *out = NULL;
    json_t *model = json_object_get(body, "model");
    const char *v = json_string_value(json_object_get(model, "init_from"));
    int is_job = v && strncmp(v, "job:", 4) == 0;
    static const char *const set_by_loomd[] = {"init_checkpoint", "init_hf"};
    /* a fork's resolution replaces these; anywhere else a request may not
     * name a checkpoint or source directly (it would skip the checks) */
    for (size_t i = 0; json_is_object(model) && !is_job && i < 2; i++)
        if (json_object_get(model, set_by_loomd[i])) {
            char field[48];
            snprintf(field, sizeof field, "model.%s", set_by_loomd[i]);
            return loom_err(e, LOOM_E_INVALID_INIT_FROM, field,
                            "%s is set by loomd when model.init_from names a job "
                            "(job:<id>[@<step>]); leave it out",
                            field);
        }
    if (!v) {
        *out = json_incref(body);
        return 0;
    }
    if (jobspec_check_init_from("model.init_from", v, e) != 0) return -1;
    if (!is_job) return resolve_hf(c, body, model, v, out, e);
    if (!c->tenant_id) { /* no tenant to check the reference against: leave it */
        *out = json_incref(body);
        return 0;
    }
    return resolve_job(c, body, model, v, out, e);
}
