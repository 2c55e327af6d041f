/* Checkpoint directories: atomic multi-rank save, verification, pruning and
 * loading (layout and protocol described in checkpoint.h).
 *
 * Save protocol (every rank, three barriers):
 *   begin:  rank 0 makes OUT/checkpoints/.tmp.step_N fresh      -> barrier 1
 *   commit: each rank writes rank_R.safetensors (fsynced) and a small
 *           rank_R.json sidecar (size, SHA-256, tensor list, meta) -> barrier 2
 *           rank 0 reads every sidecar, writes manifest.json, removes the
 *           sidecars, fsyncs the directory, renames it to step_N, fsyncs
 *           checkpoints/, prunes to `keep`                      -> barrier 3
 *           every rank checks step_N/manifest.json exists.
 * A rank that fails still enters every barrier, so a failure never leaves the
 * others waiting; rank 0 notices a missing sidecar and does not rename, and
 * the others notice the missing final directory.
 *
 * Directories hold only plain files, so removal is one level deep. */
#define _GNU_SOURCE /* asprintf */
#include "worker/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/fsutil.h"
#include "common/log.h"

#define CKPT_FORMAT  "loom-checkpoint"
#define CKPT_VERSION 1

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* snprintf for paths, through vsnprintf so that truncation is checked here at
 * run time (returns -1) instead of guessed at by the compiler. */
static int pathf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pathf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* ---- file system helpers --------------------------------------------------- */

/* Remove a directory that holds only plain files. Missing is success. */
static int rm_flat(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0) rc = -1;
    }
    closedir(d);
    if (rmdir(path) != 0) rc = -1;
    return rc;
}

/* Write JSON to path via path.tmp, fsynced and renamed. */
static int write_json(const char *path, const json_t *j) {
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!s) return -1;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return -1;
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    int rc = fs_write_atomic(path, t, n + 1, 0644, 0);
    free(t);
    return rc;
}

static void join(char *out, size_t n, const char *a, const char *b) {
    pathf(out, n, "%s/%s", a, b);
}

static void ckpt_root(char *out, size_t n, const char *out_dir) {
    join(out, n, out_dir, "checkpoints");
}

/* Parse "step_NNNNNNNN" (digits only); returns the step or -1. */
static int64_t parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* ---- saving ---------------------------------------------------------------- */

struct ckpt_writer {
    struct ckpt_opts o;
    char *out_dir;
    int64_t step;
    char root[PATH_MAX]; /* OUT/checkpoints */
    char tmp[PATH_MAX];  /* .../.tmp.step_N */
    char fin[PATH_MAX];  /* .../step_N */
    struct st_tensor *t;
    char **names;
    size_t n, cap;
    json_t *meta;
    char sha[65];     /* SHA-256 of this rank's shard once written */
    char save_id[64]; /* unique id of this save, chosen by rank 0 in begin */
};

static void writer_free(struct ckpt_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++)
        free(w->names[i]);
    free(w->names);
    free(w->t);
    free(w->out_dir);
    json_decref(w->meta);
    free(w);
}

void ckpt_abort(struct ckpt_writer *w) {
    writer_free(w);
}

static int barrier(const struct ckpt_opts *o) {
    if (o->world <= 1) return 0;
    return o->barrier(o->barrier_ctx) == 0 ? 0 : CKPT_EBARRIER;
}

int ckpt_begin(const struct ckpt_opts *opts, int64_t step, struct ckpt_writer **out, char *err,
               size_t errlen) {
    *out = NULL;
    if (!opts || !opts->out_dir || opts->world < 1 || opts->rank < 0 || opts->rank >= opts->world ||
        step < 0 || (opts->world > 1 && !opts->barrier)) {
        seterr(err, errlen, "checkpoint: invalid options (rank %d, world %d, step %" PRId64 "%s)",
               opts ? opts->rank : -1, opts ? opts->world : -1, step,
               opts && opts->world > 1 && !opts->barrier ? ", no barrier" : "");
        return CKPT_EINVAL;
    }
    if (strlen(opts->out_dir) > PATH_MAX - 64) {
        seterr(err, errlen, "checkpoint: output directory path too long");
        return CKPT_EINVAL;
    }
    struct ckpt_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->out_dir = strdup(opts->out_dir))) {
        free(w);
        seterr(err, errlen, "out of memory");
        return CKPT_EIO;
    }
    w->o = *opts;
    w->o.out_dir = w->out_dir;
    w->step = step;
    ckpt_root(w->root, sizeof w->root, w->out_dir);
    pathf(w->tmp, sizeof w->tmp, "%s/.tmp.step_%08" PRId64, w->root, step);
    pathf(w->fin, sizeof w->fin, "%s/step_%08" PRId64, w->root, step);
    int rc = 0;
    if (opts->rank == 0) {
        if (fs_mkdir_p(w->root, 0755, FS_SYNC_PARENTS) != 0) {
            seterr(err, errlen, "checkpoint: cannot create %s: %s", w->root, strerror(errno));
            rc = CKPT_EIO;
        } else if (rm_flat(w->tmp) != 0 || mkdir(w->tmp, 0755) != 0) {
            seterr(err, errlen, "checkpoint: cannot create %s: %s", w->tmp, strerror(errno));
            rc = CKPT_EIO;
        }
    }
    if (rc == 0 && opts->rank == 0) {
        /* A unique id lets every rank tell this save's manifest from an older
         * one of the same step. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char id[64], p[PATH_MAX];
        snprintf(id, sizeof id, "%llx-%lx-%x", (unsigned long long)ts.tv_sec,
                 (unsigned long)ts.tv_nsec, (unsigned)getpid());
        json_t *j = json_pack("{s:s}", "save_id", id);
        join(p, sizeof p, w->tmp, "save_id.json");
        if (!j || write_json(p, j) != 0) {
            seterr(err, errlen, "checkpoint: cannot write %s: %s", p, strerror(errno));
            rc = CKPT_EIO;
        }
        json_decref(j);
    }
    int brc = barrier(&w->o); /* also when rank 0 failed: nobody waits forever */
    if (brc) {
        seterr(err, errlen, "checkpoint step %" PRId64 ": barrier failed", step);
        rc = brc;
    }
    if (rc == 0) {
        char p[PATH_MAX];
        join(p, sizeof p, w->tmp, "save_id.json");
        json_t *j = json_load_file(p, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "save_id"));
        if (id)
            snprintf(w->save_id, sizeof w->save_id, "%s", id);
        else {
            seterr(err, errlen, "checkpoint: %s was not created by rank 0", w->tmp);
            rc = CKPT_EPEER;
        }
        json_decref(j);
    }
    if (rc) {
        writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int ckpt_add(struct ckpt_writer *w, const char *name, enum st_dtype dtype, const void *data,
             int ndim, const int64_t *shape) {
    if (!w || !name || !st_dtype_name(dtype) || ndim < 0 || ndim > ST_MAX_DIMS || (ndim && !shape))
        return CKPT_EINVAL;
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->names[i], name) == 0) return CKPT_EINVAL;
    size_t cap_t = w->cap, cap_n = w->cap; /* both arrays grow together; w->cap once both did */
    if (buf_grow_array(&w->t, &cap_t, w->n + 1, sizeof *w->t, 16) != 0 ||
        buf_grow_array(&w->names, &cap_n, w->n + 1, sizeof *w->names, 16) != 0)
        return CKPT_EIO;
    w->cap = cap_t;
    char *copy = strdup(name);
    if (!copy) return CKPT_EIO;
    struct st_tensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->dtype = t->src_dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = data;
    w->names[w->n++] = copy;
    return 0;
}

int ckpt_add_f32(struct ckpt_writer *w, const char *name, const float *data, size_t n) {
    int64_t shape[1] = {(int64_t)n};
    return ckpt_add(w, name, ST_F32, data, 1, shape);
}

int ckpt_set_rank_meta(struct ckpt_writer *w, json_t *meta) {
    if (!w) {
        json_decref(meta);
        return CKPT_EINVAL;
    }
    json_decref(w->meta);
    w->meta = meta;
    return 0;
}

/* Write this rank's shard and sidecar into the temporary directory. */
static int write_shard(struct ckpt_writer *w, char *err, size_t errlen) {
    char file[64], path[PATH_MAX], side[PATH_MAX], buf[32];
    snprintf(file, sizeof file, "rank_%05d.safetensors", w->o.rank);
    join(path, sizeof path, w->tmp, file);
    json_t *md = json_object();
    json_object_set_new(md, "format", json_string(CKPT_FORMAT "-shard"));
    snprintf(buf, sizeof buf, "%" PRId64, w->step);
    json_object_set_new(md, "step", json_string(buf));
    snprintf(buf, sizeof buf, "%d", w->o.rank);
    json_object_set_new(md, "rank", json_string(buf));
    snprintf(buf, sizeof buf, "%d", w->o.world);
    json_object_set_new(md, "world", json_string(buf));
    unsigned char sha[32];
    uint64_t bytes = 0;
    char serr[512] = "";
    int rc = st_write(path, w->t, w->n, md, sha, &bytes, serr, sizeof serr);
    json_decref(md);
    if (rc) {
        seterr(err, errlen, "checkpoint shard of rank %d: %s", w->o.rank, serr);
        return CKPT_EIO;
    }
    char hex[65];
    st_hex(sha, hex);
    memcpy(w->sha, hex, sizeof hex);
    json_t *tensors = json_array();
    for (size_t i = 0; i < w->n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < w->t[i].ndim; d++)
            json_array_append_new(shape, json_integer(w->t[i].shape[d]));
        json_array_append_new(tensors, json_pack("{s:s,s:s,s:o}", "name", w->t[i].name, "dtype",
                                                 st_dtype_name(w->t[i].dtype), "shape", shape));
    }
    json_t *s = json_pack("{s:i,s:s,s:I,s:s,s:O?,s:o}", "rank", w->o.rank, "file", file, "bytes",
                          (json_int_t)bytes, "sha256", hex, "meta", w->meta, "tensors", tensors);
    snprintf(file, sizeof file, "rank_%05d.json", w->o.rank);
    join(side, sizeof side, w->tmp, file);
    rc = s && write_json(side, s) == 0 ? 0 : CKPT_EIO;
    if (rc) seterr(err, errlen, "checkpoint: cannot write %s: %s", side, strerror(errno));
    json_decref(s);
    return rc;
}

static int is_reserved(const char *k) {
    static const char *const keys[] = {"format",     "version", "step",   "world",
                                       "created_at", "shards",  "save_id"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (strcmp(k, keys[i]) == 0) return 1;
    return 0;
}

/* Rank 0: collect sidecars, write the manifest, rename, prune. */
static int finish(struct ckpt_writer *w, const json_t *extra, char *err, size_t errlen) {
    int rc = CKPT_EIO;
    char path[PATH_MAX], name[64];
    json_t *shards = json_array(), *man = NULL;
    for (int r = 0; r < w->o.world; r++) {
        snprintf(name, sizeof name, "rank_%05d.json", r);
        join(path, sizeof path, w->tmp, name);
        json_t *s = json_load_file(path, 0, NULL);
        if (!json_is_object(s)) {
            json_decref(s);
            seterr(err, errlen, "checkpoint step %" PRId64 ": rank %d did not write its shard",
                   w->step, r);
            rc = CKPT_EPEER;
            goto out;
        }
        json_array_append_new(shards, s);
    }
    time_t now = time(NULL);
    struct tm tm;
    char when[32];
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    man = json_pack("{s:s,s:i,s:I,s:i,s:s,s:s}", "format", CKPT_FORMAT, "version", CKPT_VERSION,
                    "step", (json_int_t)w->step, "world", w->o.world, "created_at", when, "save_id",
                    w->save_id);
    if (json_is_object(extra)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)extra, k, v) {
            if (!is_reserved(k)) json_object_set(man, k, v);
        }
    }
    json_object_set(man, "shards", shards);
    join(path, sizeof path, w->tmp, "manifest.json");
    if (write_json(path, man) != 0) {
        seterr(err, errlen, "checkpoint: cannot write %s: %s", path, strerror(errno));
        goto out;
    }
    for (int r = 0; r < w->o.world; r++) {
        snprintf(name, sizeof name, "rank_%05d.json", r);
        join(path, sizeof path, w->tmp, name);
        unlink(path);
    }
    join(path, sizeof path, w->tmp, "save_id.json");
    unlink(path);
    if (fs_fsync_dir(w->tmp) != 0) {
        seterr(err, errlen, "checkpoint: fsync %s: %s", w->tmp, strerror(errno));
        goto out;
    }
    /* A save of a step that already exists (e.g. the final step of a resumed
     * run) replaces it: move the old one aside first, rename cannot replace a
     * non-empty directory. */
    char old[PATH_MAX];
    pathf(old, sizeof old, "%s/.old.step_%08" PRId64, w->root, w->step);
    struct stat st;
    int had_old = stat(w->fin, &st) == 0;
    if (had_old && (rm_flat(old) != 0 || rename(w->fin, old) != 0)) {
        seterr(err, errlen, "checkpoint: cannot move the old %s aside: %s", w->fin,
               strerror(errno));
        goto out;
    }
    if (rename(w->tmp, w->fin) != 0) {
        seterr(err, errlen, "checkpoint: rename %s -> %s: %s", w->tmp, w->fin, strerror(errno));
        goto out;
    }
    if (fs_fsync_dir(w->root) != 0) {
        seterr(err, errlen, "checkpoint: fsync %s: %s", w->root, strerror(errno));
        goto out;
    }
    if (had_old) rm_flat(old);
    if (w->o.keep > 0 && ckpt_prune(w->out_dir, w->o.keep) < 0)
        log_warn("checkpoint: pruning %s to %d failed", w->root, w->o.keep);
    rc = 0;
out:
    json_decref(shards);
    json_decref(man);
    return rc;
}

int ckpt_commit(struct ckpt_writer *w, const json_t *manifest, char *path_out, size_t pathlen,
                char *err, size_t errlen) {
    if (!w) return CKPT_EINVAL;
    int rc = write_shard(w, err, errlen);
    if (barrier(&w->o)) {
        seterr(err, errlen, "checkpoint step %" PRId64 ": barrier failed", w->step);
        writer_free(w);
        return CKPT_EBARRIER;
    }
    if (w->o.rank == 0 && rc == 0) rc = finish(w, manifest, err, errlen);
    if (barrier(&w->o)) {
        seterr(err, errlen, "checkpoint step %" PRId64 ": barrier failed", w->step);
        writer_free(w);
        return CKPT_EBARRIER;
    }
    /* Complete only if the final manifest lists this rank's shard as written now
     * (an older save of the same step may still be there when rank 0 failed). */
    char man[PATH_MAX];
    join(man, sizeof man, w->fin, "manifest.json");
    if (rc == 0) {
        json_t *m = json_load_file(man, 0, NULL);
        json_t *s = json_array_get(json_object_get(m, "shards"), (size_t)w->o.rank);
        const char *h = json_string_value(json_object_get(s, "sha256"));
        const char *id = json_string_value(json_object_get(m, "save_id"));
        if (!h || strcmp(h, w->sha) != 0 || !id || strcmp(id, w->save_id) != 0) {
            seterr(err, errlen, "checkpoint step %" PRId64 " was not completed by rank 0 (%s %s)",
                   w->step, man, m ? "is not this save's" : "missing");
            rc = CKPT_EPEER;
        }
        json_decref(m);
    }
    if (rc == 0 && path_out) pathf(path_out, pathlen, "%s", w->fin);
    writer_free(w);
    return rc;
}

/* ---- listing and pruning --------------------------------------------------- */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int ckpt_list(const char *out_dir, int64_t **steps, size_t *n) {
    char root[PATH_MAX];
    *steps = NULL;
    *n = 0;
    ckpt_root(root, sizeof root, out_dir);
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? 0 : CKPT_EIO;
    size_t cap = 0;
    int64_t *v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = parse_step_name(e->d_name);
        if (s < 0) continue;
        if (BUF_GROW(v, cap, *n + 1, 16) != 0) {
            free(v);
            closedir(d);
            return CKPT_EIO;
        }
        v[(*n)++] = s;
    }
    closedir(d);
    qsort(v, *n, sizeof *v, cmp_i64);
    *steps = v;
    return 0;
}

int ckpt_prune(const char *out_dir, int keep) {
    if (keep <= 0) return 0;
    char root[PATH_MAX], path[PATH_MAX + 32];
    int64_t *steps = NULL;
    size_t n = 0;
    int removed = 0;
    if (ckpt_list(out_dir, &steps, &n) != 0) return CKPT_EIO;
    ckpt_root(root, sizeof root, out_dir);
    for (size_t i = 0; i + (size_t)keep < n; i++) {
        pathf(path, sizeof path, "%s/step_%08" PRId64, root, steps[i]);
        if (rm_flat(path) == 0)
            removed++;
        else
            log_warn("checkpoint: cannot remove %s: %s", path, strerror(errno));
    }
    free(steps);
    /* Leftovers of interrupted saves. */
    DIR *d = opendir(root);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, ".tmp.step_", 10) != 0 &&
                strncmp(e->d_name, ".old.step_", 10) != 0)
                continue;
            pathf(path, sizeof path, "%s/%s", root, e->d_name);
            if (rm_flat(path) == 0) removed++;
        }
        closedir(d);
    }
    fs_fsync_dir(root);
    return removed;
}

/* ---- verification and loading ---------------------------------------------- */

/* Load dir/manifest.json and check its structure (not the shard contents). */
static int load_manifest(const char *dir, int world, json_t **out, char *err, size_t errlen) {
    char path[PATH_MAX];
    join(path, sizeof path, dir, "manifest.json");
    json_error_t je;
    json_t *m = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    *out = NULL;
    if (!m) {
        seterr(err, errlen, "%s: %s", path,
               access(path, F_OK) != 0 ? "missing (incomplete checkpoint)" : je.text);
        return CKPT_ECORRUPT;
    }
    json_t *fmt = json_object_get(m, "format"), *ver = json_object_get(m, "version");
    json_t *step = json_object_get(m, "step"), *w = json_object_get(m, "world");
    json_t *shards = json_object_get(m, "shards");
    const char *why = NULL;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), CKPT_FORMAT) != 0)
        why = "not a loom checkpoint manifest (format)";
    else if (!json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION)
        why = "unsupported manifest version";
    else if (!json_is_integer(step) || json_integer_value(step) < 0)
        why = "bad step";
    else if (!json_is_integer(w) || json_integer_value(w) < 1)
        why = "bad world";
    else if (!json_is_array(shards) || (json_int_t)json_array_size(shards) != json_integer_value(w))
        why = "shard list does not have one entry per rank";
    if (!why) {
        const char *base = strrchr(dir, '/');
        base = base ? base + 1 : dir;
        int64_t named = parse_step_name(base);
        if (named >= 0 && named != json_integer_value(step))
            why = "step differs from its directory";
    }
    if (!why && world > 0 && json_integer_value(w) != world) {
        seterr(err, errlen, "%s: written by %" JSON_INTEGER_FORMAT " ranks, this run has %d", path,
               json_integer_value(w), world);
        json_decref(m);
        return CKPT_ECORRUPT;
    }
    for (size_t i = 0; !why && i < json_array_size(shards); i++) {
        json_t *s = json_array_get(shards, i);
        json_t *r = json_object_get(s, "rank"), *f = json_object_get(s, "file");
        json_t *b = json_object_get(s, "bytes"), *h = json_object_get(s, "sha256");
        if (!json_is_integer(r) || json_integer_value(r) != (json_int_t)i || !json_is_string(f) ||
            strchr(json_string_value(f), '/') || !json_is_integer(b) || !json_is_string(h) ||
            strlen(json_string_value(h)) != 64)
            why = "bad shard entry";
    }
    if (why) {
        seterr(err, errlen, "%s: %s", path, why);
        json_decref(m);
        return CKPT_ECORRUPT;
    }
    *out = m;
    return 0;
}

/* Check shard i's size and, with hash, its checksum and format; on success
 * optionally open it. */
static int check_shard(const char *dir, const json_t *man, int i, int hash, struct st_file **stf,
                       char *err, size_t errlen) {
    json_t *s = json_array_get(json_object_get(man, "shards"), (size_t)i);
    const char *file = json_string_value(json_object_get(s, "file"));
    uint64_t want = (uint64_t)json_integer_value(json_object_get(s, "bytes")), got = 0;
    const char *want_hex = json_string_value(json_object_get(s, "sha256"));
    char path[PATH_MAX], hex[65], serr[512] = "";
    join(path, sizeof path, dir, file);
    struct stat st;
    if (stat(path, &st) != 0) {
        seterr(err, errlen, "%s: missing", path);
        return CKPT_ECORRUPT;
    }
    if ((uint64_t)st.st_size != want) {
        seterr(err, errlen, "%s: %s: %" PRIu64 " bytes, manifest says %" PRIu64, path,
               (uint64_t)st.st_size < want ? "truncated" : "wrong size", (uint64_t)st.st_size,
               want);
        return CKPT_ECORRUPT;
    }
    if (!hash) return 0;
    if (st_sha256_file(path, hex, &got, serr, sizeof serr) != 0) {
        seterr(err, errlen, "%s", serr);
        return CKPT_EIO;
    }
    if (got != want || strcmp(hex, want_hex) != 0) {
        seterr(err, errlen, "%s: SHA-256 mismatch (file %.12s..., manifest %.12s...)", path, hex,
               want_hex);
        return CKPT_ECORRUPT;
    }
    struct st_file *f = NULL;
    if (st_open(path, &f, serr, sizeof serr) != 0) {
        seterr(err, errlen, "%s", serr);
        return CKPT_ECORRUPT;
    }
    if (stf)
        *stf = f;
    else
        st_close(f);
    return 0;
}

int ckpt_verify(const char *dir, int world, char *err, size_t errlen) {
    json_t *m = NULL;
    int rc = load_manifest(dir, world, &m, err, errlen);
    if (rc) return rc;
    int n = (int)json_array_size(json_object_get(m, "shards"));
    for (int i = 0; i < n && rc == 0; i++)
        rc = check_shard(dir, m, i, 1, NULL, err, errlen);
    json_decref(m);
    return rc;
}

int ckpt_verify_rank(const char *dir, int world, int rank, char *err, size_t errlen) {
    json_t *m = NULL;
    int rc = load_manifest(dir, world, &m, err, errlen);
    if (rc) return rc;
    int n = (int)json_array_size(json_object_get(m, "shards"));
    if (rank < 0 || rank >= n) {
        seterr(err, errlen, "%s: no shard for rank %d (world %d)", dir, rank, n);
        rc = CKPT_ENOTFOUND;
    }
    for (int i = 0; i < n && rc == 0; i++)
        rc = check_shard(dir, m, i, i == rank, NULL, err, errlen);
    json_decref(m);
    return rc;
}

int ckpt_find_latest_shared(const char *out_dir, int world, int rank, ckpt_agree_fn agree,
                            void *ctx, char *path, size_t pathlen, int64_t *step) {
    int64_t *steps = NULL;
    size_t n = 0;
    char root[PATH_MAX], dir[PATH_MAX + 32], err[1024];
    if (!agree) return CKPT_EINVAL;
    int rc = ckpt_list(out_dir, &steps, &n);
    if (rc) return rc;
    ckpt_root(root, sizeof root, out_dir);
    int found = 0;
    for (size_t i = n; i-- > 0;) {
        pathf(dir, sizeof dir, "%s/step_%08" PRId64, root, steps[i]);
        err[0] = '\0';
        int mine = ckpt_verify_rank(dir, world, rank, err, sizeof err) == 0, all = mine;
        if (agree(ctx, &all) != 0) {
            found = CKPT_EBARRIER;
            break;
        }
        if (!all) {
            log_warn("skipping checkpoint %s: %s", dir,
                     mine ? "another rank's shard failed verification" : err);
            continue;
        }
        if (path) pathf(path, pathlen, "%s", dir);
        if (step) *step = steps[i];
        found = 1;
        break;
    }
    free(steps);
    return found;
}

int ckpt_find_latest(const char *out_dir, int world, char *path, size_t pathlen, int64_t *step) {
    int64_t *steps = NULL;
    size_t n = 0;
    char root[PATH_MAX], dir[PATH_MAX + 32], err[1024];
    int rc = ckpt_list(out_dir, &steps, &n);
    if (rc) return rc;
    ckpt_root(root, sizeof root, out_dir);
    int found = 0;
    for (size_t i = n; i-- > 0;) {
        pathf(dir, sizeof dir, "%s/step_%08" PRId64, root, steps[i]);
        err[0] = '\0';
        if (ckpt_verify(dir, world, err, sizeof err) != 0) {
            log_warn("skipping checkpoint %s: %s", dir, err);
            continue;
        }
        if (path) pathf(path, pathlen, "%s", dir);
        if (step) *step = steps[i];
        found = 1;
        break;
    }
    free(steps);
    return found;
}

struct ckpt_reader {
    json_t *manifest;
    struct st_file *st;
    int rank;
    char *dir;
};

int ckpt_open(const char *dir, int rank, struct ckpt_reader **out, char *err, size_t errlen) {
    *out = NULL;
    json_t *m = NULL;
    int rc = load_manifest(dir, 0, &m, err, errlen);
    if (rc) return rc;
    if (rank < 0 || rank >= (int)json_array_size(json_object_get(m, "shards"))) {
        seterr(err, errlen, "%s: no shard for rank %d (world %zu)", dir, rank,
               json_array_size(json_object_get(m, "shards")));
        json_decref(m);
        return CKPT_ENOTFOUND;
    }
    struct st_file *f = NULL;
    rc = check_shard(dir, m, rank, 1, &f, err, errlen);
    struct ckpt_reader *r = rc ? NULL : calloc(1, sizeof *r);
    if (!rc && (!r || !(r->dir = strdup(dir)))) {
        free(r);
        r = NULL;
        seterr(err, errlen, "out of memory");
        rc = CKPT_EIO;
    }
    if (rc) {
        st_close(f);
        json_decref(m);
        return rc;
    }
    r->manifest = m;
    r->st = f;
    r->rank = rank;
    *out = r;
    return 0;
}

void ckpt_close(struct ckpt_reader *r) {
    if (!r) return;
    st_close(r->st);
    json_decref(r->manifest);
    free(r->dir);
    free(r);
}

const json_t *ckpt_manifest(const struct ckpt_reader *r) {
    return r->manifest;
}

int64_t ckpt_step(const struct ckpt_reader *r) {
    return json_integer_value(json_object_get(r->manifest, "step"));
}

int ckpt_world(const struct ckpt_reader *r) {
    return (int)json_integer_value(json_object_get(r->manifest, "world"));
}

const json_t *ckpt_rank_meta(const struct ckpt_reader *r) {
    json_t *s = json_array_get(json_object_get(r->manifest, "shards"), (size_t)r->rank);
    json_t *m = json_object_get(s, "meta");
    return json_is_null(m) ? NULL : m;
}

const struct st_info *ckpt_find(const struct ckpt_reader *r, const char *name) {
    return st_find(r->st, name);
}

int ckpt_read(const struct ckpt_reader *r, const char *name, enum st_dtype dtype, void *dst,
              size_t dst_bytes, char *err, size_t errlen) {
    int rc = st_read(r->st, name, dtype, dst, dst_bytes, err, errlen);
    switch (rc) {
    case 0:
        return 0;
    case ST_ENOTFOUND:
        return CKPT_ENOTFOUND;
    case ST_EINVAL:
        return CKPT_EINVAL;
    default:
        return CKPT_EIO;
    }
}

int ckpt_read_f32(const struct ckpt_reader *r, const char *name, float *dst, size_t n, char *err,
                  size_t errlen) {
    return ckpt_read(r, name, ST_F32, dst, n * sizeof *dst, err, errlen);
}
