/* Submit-time checks against the data and the tenant (see submitcheck.h). */
#include "daemon/submitcheck.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/store.h"

int submitcheck_roots_visible(const char *const *roots, size_t n) {
    struct stat st;
    for (size_t i = 0; i < n; i++)
        if (stat(roots[i], &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    return n > 0;
}

int submitcheck_data(const struct loom_spec *s, const char *const *roots, size_t nroots,
                     int roots_configured, struct loom_error *e) {
    if (!roots_configured || !submitcheck_roots_visible(roots, nroots)) return 0;
    static const struct {
        const char *field;
        size_t off;
    } paths[] = {
        {"data.train", offsetof(struct loom_spec, data.train)},
        {"data.val", offsetof(struct loom_spec, data.val)},
    };
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        const char *p = (const char *)s + paths[i].off;
        if (p[0] && jobspec_path_confined(p, roots, nroots, JOBSPEC_PATH_MUST_EXIST, paths[i].field,
                                          e) != 0)
            return -1;
    }
    return 0;
}

int submitcheck_vocab(const struct loom_spec *s, struct loom_error *e) {
    if (s->data.format != JOBSPEC_FMT_BIN || !s->data.train[0] || s->model.vocab_size <= 0)
        return 0;
    char meta[JOBSPEC_PATH_MAX + 16];
    snprintf(meta, sizeof meta, "%s", s->data.train);
    char *slash = strrchr(meta, '/');
    if (!slash) return 0;
    snprintf(slash + 1, sizeof meta - (size_t)(slash + 1 - meta), "meta.json");
    json_t *m = json_load_file(meta, 0, NULL);
    json_int_t v = json_integer_value(json_object_get(m, "vocab_size"));
    json_decref(m);
    if (v > s->model.vocab_size) {
        loom_err(e, LOOM_E_VOCAB_TOO_SMALL, "model.vocab_size",
                 "model.vocab_size=%d is below the data's vocab_size=%lld (%.200s): token ids up "
                 "to %lld would be out of range",
                 s->model.vocab_size, (long long)v, meta, (long long)v - 1);
        return -1;
    }
    return 0;
}

struct quota_q {
    const char *tenant;
    long quota;
};

static int quota_cb(struct store_tx *tx, void *arg) {
    struct quota_q *q = arg;
    json_t *t = NULL;
    if (store_tenant_get(tx, q->tenant, &t) == STORE_OK)
        q->quota = (long)json_integer_value(json_object_get(t, "gpu_quota"));
    json_decref(t);
    return STORE_OK;
}

int submitcheck_quota(struct store *st, const char *tenant_id, int world, struct loom_error *e) {
    if (!tenant_id) return 0;
    struct quota_q q = {tenant_id, 0};
    if (store_read(st, quota_cb, &q) != STORE_OK) return 0;
    if (q.quota > 0 && world > q.quota) {
        loom_err(e, LOOM_E_QUOTA_TOO_SMALL, "parallel",
                 "the job needs %d GPUs (dp*tp*pp) but tenant %s has gpu_quota=%ld: it could "
                 "never start",
                 world, tenant_id, q.quota);
        return -1;
    }
    return 0;
}
