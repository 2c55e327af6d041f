/* Artifacts: the index built by scanning a job's out_dir and loomd's log
 * copies, checksums cached in the store, downloads with Range and ETag, and
 * deletes. See artifacts.h for the layout, storage and confinement rules. */
#define _GNU_SOURCE
#include "daemon/artifacts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/handlers.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#define MAX_ITEMS 10000
#define MAX_DEPTH 4

static const char *const kind_names[] = {"checkpoint", "model", "adapter", "log"};

const char *artifacts_kind_name(enum artifact_kind k) {
    return k >= 0 && k <= ARTIFACT_LOG ? kind_names[k] : "unknown";
}

/* snprintf for paths, through vsnprintf so that truncation is checked
 * here (-1) rather than warned about at every call. */
__attribute__((format(printf, 3, 4))) static int pathf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* ---------------- pure helpers ---------------- */

/* 1 when every segment of rel is non-empty and neither "." nor "..". */
static int segments_ok(const char *rel) {
    if (!rel || !*rel || rel[0] == '/') return 0;
    const char *p = rel;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
        if (!e) return 1;
        p = e + 1;
    }
}

/* "step_NNNNNNNN" (digits only) -> N, else -1. */
static long step_of(const char *name, size_t n) {
    if (n <= 5 || strncmp(name, "step_", 5)) return -1;
    long v = 0;
    for (size_t i = 5; i < n; i++) {
        if (name[i] < '0' || name[i] > '9' || v > LONG_MAX / 10) return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

enum artifact_kind artifacts_classify(const char *rel, long *step, int *is_dir_path) {
    *step = -1;
    *is_dir_path = 0;
    if (!segments_ok(rel)) return ARTIFACT_NONE;
    if (!strncmp(rel, "checkpoints/", 12)) {
        const char *d = rel + 12, *e = strchr(d, '/');
        long s = step_of(d, e ? (size_t)(e - d) : strlen(d));
        if (s < 0) return ARTIFACT_NONE;
        if (e && strchr(e + 1, '/')) return ARTIFACT_NONE; /* checkpoints are flat */
        *step = s;
        *is_dir_path = e == NULL;
        return ARTIFACT_CHECKPOINT;
    }
    static const struct {
        const char *prefix;
        enum artifact_kind kind;
    } exports[] = {{"export/hf", ARTIFACT_MODEL}, {"export/lora", ARTIFACT_ADAPTER}};
    for (size_t i = 0; i < sizeof exports / sizeof *exports; i++) {
        size_t n = strlen(exports[i].prefix);
        if (strncmp(rel, exports[i].prefix, n)) continue;
        if (rel[n] == 0) {
            *is_dir_path = 1;
            return exports[i].kind;
        }
        if (rel[n] == '/') return exports[i].kind;
    }
    if (!strncmp(rel, "logs/", 5) && !strchr(rel + 5, '/')) return ARTIFACT_LOG;
    return ARTIFACT_NONE;
}

/* Strict unsigned decimal of [p, e); -1 when empty or not digits. */
static int parse_u64(const char *p, const char *e, uint64_t *out) {
    if (p == e) return -1;
    uint64_t v = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

int artifacts_parse_range(const char *h, uint64_t size, uint64_t *off, uint64_t *len) {
    if (!h) return 0;
    while (*h == ' ')
        h++;
    if (strncmp(h, "bytes=", 6)) return -1;
    const char *spec = h + 6, *end = spec + strlen(spec);
    while (end > spec && end[-1] == ' ')
        end--;
    if (memchr(spec, ',', (size_t)(end - spec))) return -1; /* one range only */
    const char *dash = memchr(spec, '-', (size_t)(end - spec));
    if (!dash) return -1;
    uint64_t a = 0, b = 0;
    if (dash == spec) { /* suffix: the last N bytes */
        if (parse_u64(dash + 1, end, &b) || b == 0 || size == 0) return -1;
        if (b > size) b = size;
        *off = size - b;
        *len = b;
        return 1;
    }
    if (parse_u64(spec, dash, &a) || a >= size) return -1;
    if (dash + 1 == end) {
        b = size - 1;
    } else {
        if (parse_u64(dash + 1, end, &b) || b < a) return -1;
        if (b >= size) b = size - 1;
    }
    *off = a;
    *len = b - a + 1;
    return 1;
}

/* ---------------- the job and its roots ---------------- */

struct jobref {
    char id[32];
    enum job_state state;
    char out_dir[PATH_MAX];
    char logs_dir[PATH_MAX];
};

struct job_read {
    const char *tenant, *id;
    struct jobref *j;
};

static int job_read_cb(struct store_tx *tx, void *arg) {
    struct job_read *r = arg;
    struct store_job j;
    int rc = store_job_get(tx, r->tenant, r->id, &j);
    if (rc) return rc;
    snprintf(r->j->id, sizeof r->j->id, "%s", j.id);
    r->j->state = j.state;
    snprintf(r->j->out_dir, sizeof r->j->out_dir, "%s", j.out_dir ? j.out_dir : "");
    store_job_clear(&j);
    return STORE_OK;
}

/* Loads the job visible to the caller; replies and returns -1 otherwise. */
static int load_job(struct http_req *req, struct jobref *j) {
    const char *id = http_param(req, "id");
    memset(j, 0, sizeof *j);
    struct job_read r = {req->is_admin ? NULL : req->tenant_id, id, j};
    int rc =
        strlen(id) < sizeof j->id ? store_read(req->ld->store, job_read_cb, &r) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        API_ERROR(req, JOB_NOT_FOUND, "no job '%.64s'", id);
        return -1;
    }
    if (rc != STORE_OK) {
        API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
        return -1;
    }
    pathf(j->logs_dir, sizeof j->logs_dir, "%s/logs/%s", req->ld->cfg.data_dir, j->id);
    return 0;
}

/* The absolute path of rel, confined to its root: realpath of both, and the
 * file must lie strictly under the root. 0, or -1 (missing or escaping). */
static int resolve(const struct jobref *j, const char *rel, char *out, size_t outlen) {
    int logs = !strncmp(rel, "logs/", 5);
    const char *root = logs ? j->logs_dir : j->out_dir;
    const char *sub = logs ? rel + 5 : rel;
    char joined[PATH_MAX * 2], rroot[PATH_MAX], rfile[PATH_MAX];
    if (!root[0]) return -1;
    pathf(joined, sizeof joined, "%s/%s", root, sub);
    if (!realpath(root, rroot) || !realpath(joined, rfile)) return -1;
    size_t n = strlen(rroot);
    if (strncmp(rfile, rroot, n) || rfile[n] != '/') return -1;
    pathf(out, outlen, "%s", rfile);
    return 0;
}

/* ---------------- checksums ---------------- */

static int sha256_file(const char *path, char out[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char *buf = malloc(1 << 20);
    int ret = -1;
    if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) goto out;
    ssize_t n;
    while ((n = read(fd, buf, 1 << 20)) > 0)
        if (EVP_DigestUpdate(ctx, buf, (size_t)n) != 1) goto out;
    if (n < 0) goto out;
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != 32) goto out;
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    ret = 0;
out:
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return ret;
}

struct art {
    char *rel, *abs;
    enum artifact_kind kind;
    long step;
    uint64_t size;
    int64_t mtime_ns;
    char sha[65];
    int fresh; /* sha computed now: persist it */
};

struct art_list {
    struct art *v;
    int n, cap;
    const char *job_id;
};

static void list_free(struct art_list *l) {
    for (int i = 0; i < l->n; i++) {
        free(l->v[i].rel);
        free(l->v[i].abs);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int cache_read_cb(struct store_tx *tx, void *arg) {
    struct art_list *l = arg;
    sqlite3_stmt *st = store_stmt(tx, "SELECT path, size, mtime_ns, sha256 FROM artifact_hashes "
                                      "WHERE job_id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, l->job_id, -1, SQLITE_STATIC);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *p = (const char *)sqlite3_column_text(st, 0);
        for (int i = 0; i < l->n; i++) {
            struct art *a = &l->v[i];
            if (!a->sha[0] && !strcmp(a->rel, p) &&
                (uint64_t)sqlite3_column_int64(st, 1) == a->size &&
                sqlite3_column_int64(st, 2) == a->mtime_ns)
                snprintf(a->sha, sizeof a->sha, "%s", (const char *)sqlite3_column_text(st, 3));
        }
    }
    sqlite3_reset(st);
    return STORE_OK;
}

static int cache_write_cb(struct store_tx *tx, void *arg) {
    struct art_list *l = arg;
    for (int i = 0; i < l->n; i++) {
        struct art *a = &l->v[i];
        if (!a->fresh) continue;
        sqlite3_stmt *st = store_stmt(tx, "INSERT OR REPLACE INTO artifact_hashes(job_id, path, "
                                          "size, mtime_ns, sha256) VALUES (?,?,?,?,?)");
        if (!st) return STORE_ERR;
        sqlite3_bind_text(st, 1, l->job_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, a->rel, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)a->size);
        sqlite3_bind_int64(st, 4, a->mtime_ns);
        sqlite3_bind_text(st, 5, a->sha, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE) return STORE_ERR;
    }
    return STORE_OK;
}

/* Fills every item's sha256: the cache, then the manifests' shard sums, then
 * hashing the file. New sums are written back. */
static void fill_hashes(struct store *s, struct art_list *l, json_t *manifest_sums) {
    store_read(s, cache_read_cb, l);
    int fresh = 0;
    for (int i = 0; i < l->n; i++) {
        struct art *a = &l->v[i];
        if (a->sha[0]) continue;
        json_t *m = json_object_get(manifest_sums, a->rel);
        const char *sum = json_string_value(json_object_get(m, "sha256"));
        if (sum && strlen(sum) == 64 &&
            (uint64_t)json_integer_value(json_object_get(m, "bytes")) == a->size)
            snprintf(a->sha, sizeof a->sha, "%s", sum);
        else if (sha256_file(a->abs, a->sha) != 0)
            a->sha[0] = 0;
        if (a->sha[0]) a->fresh = fresh = 1;
    }
    if (fresh) store_write(s, cache_write_cb, l);
}

/* ---------------- scanning ---------------- */

static int list_add(struct art_list *l, const char *rel, const char *abs, enum artifact_kind k,
                    long step, const struct stat *st) {
    if (l->n >= MAX_ITEMS) return -1;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 32;
        struct art *p = realloc(l->v, sizeof *p * (size_t)cap);
        if (!p) return -1;
        l->v = p;
        l->cap = cap;
    }
    struct art *a = &l->v[l->n];
    memset(a, 0, sizeof *a);
    a->rel = strdup(rel);
    a->abs = strdup(abs);
    if (!a->rel || !a->abs) {
        free(a->rel);
        free(a->abs);
        return -1;
    }
    a->kind = k;
    a->step = step;
    a->size = (uint64_t)st->st_size;
    a->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    l->n++;
    return 0;
}

/* Regular files under abs (recursively up to depth), listed as rel/... */
static void scan_tree(struct art_list *l, const char *abs, const char *rel, enum artifact_kind k,
                      long step, int depth) {
    DIR *d = opendir(abs);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* ., .., temporaries */
        char a[PATH_MAX], r[PATH_MAX];
        if (snprintf(a, sizeof a, "%s/%s", abs, e->d_name) >= (int)sizeof a ||
            snprintf(r, sizeof r, "%s/%s", rel, e->d_name) >= (int)sizeof r)
            continue;
        struct stat st;
        if (lstat(a, &st) != 0) continue; /* symlinks are not followed */
        if (S_ISREG(st.st_mode))
            list_add(l, r, a, k, step, &st);
        else if (S_ISDIR(st.st_mode) && depth > 0)
            scan_tree(l, a, r, k, step, depth - 1);
    }
    closedir(d);
}

/* The shard checksums a checkpoint manifest records, as {rel/file:
 * {sha256, bytes}} in sums. */
static void manifest_sums(const char *manifest, const char *rel_dir, json_t *sums) {
    json_t *m = json_load_file(manifest, 0, NULL);
    size_t i;
    json_t *sh;
    json_array_foreach(json_object_get(m, "shards"), i, sh) {
        const char *file = json_string_value(json_object_get(sh, "file"));
        if (!file || strchr(file, '/')) continue;
        char key[PATH_MAX];
        pathf(key, sizeof key, "%s/%s", rel_dir, file);
        json_object_set(sums, key, sh);
    }
    json_decref(m);
}

/* Complete checkpoint saves; *newest gets the highest step (-1: none). The
 * manifests' shard sums go into sums ({rel: {sha256, bytes}}). */
static void scan_checkpoints(struct art_list *l, const char *out_dir, json_t *sums, long *newest) {
    char root[PATH_MAX];
    *newest = -1;
    pathf(root, sizeof root, "%s/checkpoints", out_dir);
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long step = step_of(e->d_name, strlen(e->d_name));
        if (step < 0) continue;
        char dir[PATH_MAX], man[PATH_MAX], rel[PATH_MAX];
        pathf(dir, sizeof dir, "%s/%s", root, e->d_name);
        pathf(man, sizeof man, "%s/manifest.json", dir);
        if (access(man, R_OK) != 0) continue; /* not a complete save */
        if (step > *newest) *newest = step;
        if (!l) continue;
        pathf(rel, sizeof rel, "checkpoints/%s", e->d_name);
        scan_tree(l, dir, rel, ARTIFACT_CHECKPOINT, step, 0);
        manifest_sums(man, rel, sums);
    }
    closedir(d);
}

static int cmp_rel(const void *a, const void *b) {
    return strcmp(((const struct art *)a)->rel, ((const struct art *)b)->rel);
}

static void scan_job(const struct jobref *j, struct art_list *l, json_t *sums) {
    long newest;
    if (j->out_dir[0]) {
        scan_checkpoints(l, j->out_dir, sums, &newest);
        char a[PATH_MAX];
        pathf(a, sizeof a, "%s/export/hf", j->out_dir);
        scan_tree(l, a, "export/hf", ARTIFACT_MODEL, -1, MAX_DEPTH);
        pathf(a, sizeof a, "%s/export/lora", j->out_dir);
        scan_tree(l, a, "export/lora", ARTIFACT_ADAPTER, -1, MAX_DEPTH);
    }
    scan_tree(l, j->logs_dir, "logs", ARTIFACT_LOG, -1, 0);
    if (l->n > 1) qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_rel);
}

/* ---------------- routes ---------------- */

int artifacts_api_list(struct http_req *req) {
    struct jobref j;
    if (load_job(req, &j) != 0) return 0;
    struct art_list l = {.job_id = j.id};
    json_t *sums = json_object();
    scan_job(&j, &l, sums);
    fill_hashes(req->ld->store, &l, sums);
    json_decref(sums);
    json_t *items = json_array();
    for (int i = 0; i < l.n; i++) {
        struct art *a = &l.v[i];
        json_array_append_new(items,
                              json_pack("{s:s, s:s, s:o, s:I, s:o, s:o}", "path", a->rel, "kind",
                                        artifacts_kind_name(a->kind), "step",
                                        a->step >= 0 ? json_integer(a->step) : json_null(), "size",
                                        (json_int_t)a->size, "sha256",
                                        a->sha[0] ? json_string(a->sha) : json_null(), "created_at",
                                        store_time_json(a->mtime_ns / 1000000)));
    }
    list_free(&l);
    return http_reply_json(req, 200, json_pack("{s:o}", "items", items));
}

static int artifact_not_found(struct http_req *req, const char *job, const char *rel) {
    return API_ERROR(req, ARTIFACT_NOT_FOUND, "job %s has no artifact '%.300s'", job, rel);
}

static const char *content_type_of(const char *rel) {
    size_t n = strlen(rel);
    if (n > 5 && !strcmp(rel + n - 5, ".json")) return "application/json";
    if (n > 4 && !strcmp(rel + n - 4, ".log")) return "text/plain; charset=utf-8";
    return "application/octet-stream";
}

int artifacts_api_get(struct http_req *req) {
    struct jobref j;
    if (load_job(req, &j) != 0) return 0;
    const char *rel = http_param(req, "path");
    long step;
    int is_dir;
    char abs[PATH_MAX];
    struct stat st;
    enum artifact_kind kind = artifacts_classify(rel, &step, &is_dir);
    if (kind == ARTIFACT_NONE || is_dir || resolve(&j, rel, abs, sizeof abs) != 0 ||
        stat(abs, &st) != 0 || !S_ISREG(st.st_mode))
        return artifact_not_found(req, j.id, rel);
    /* The checksum (ETag) through the same cache as the listing. */
    struct art_list l = {.job_id = j.id};
    if (list_add(&l, rel, abs, kind, step, &st) != 0)
        return API_ERROR(req, INTERNAL, "out of memory");
    json_t *sums = json_object();
    if (kind == ARTIFACT_CHECKPOINT) {
        char dir[PATH_MAX], man[PATH_MAX];
        pathf(dir, sizeof dir, "%.*s", (int)(strrchr(rel, '/') - rel), rel);
        pathf(man, sizeof man, "%s/%s/manifest.json", j.out_dir, dir);
        manifest_sums(man, dir, sums);
    }
    fill_hashes(req->ld->store, &l, sums);
    json_decref(sums);
    char etag[70];
    snprintf(etag, sizeof etag, "\"%s\"", l.n ? l.v[0].sha : "");
    list_free(&l);
    const char *inm = http_header(req, "If-None-Match");
    http_add_header(req, "ETag", etag);
    http_add_header(req, "Accept-Ranges", "bytes");
    if (inm && !strcmp(inm, etag)) return http_reply_text(req, 304, NULL, "", 0);
    uint64_t size = (uint64_t)st.st_size, off = 0, len = size;
    int r = artifacts_parse_range(http_header(req, "Range"), size, &off, &len);
    if (r < 0) {
        char cr[64];
        snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)size);
        http_add_header(req, "Content-Range", cr);
        return API_ERROR(req, RANGE_NOT_SATISFIABLE,
                         "Range '%.100s' is not one satisfiable byte range of the %llu-byte "
                         "file",
                         http_header(req, "Range"), (unsigned long long)size);
    }
    int fd = open(abs, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return artifact_not_found(req, j.id, rel);
    if (r == 1) {
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)off,
                 (unsigned long long)(off + len - 1), (unsigned long long)size);
        http_add_header(req, "Content-Range", cr);
    }
    return http_reply_fd(req, r == 1 ? 206 : 200, content_type_of(rel), fd, off, len);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

struct forget {
    const char *job, *rel;
};

static int forget_cb(struct store_tx *tx, void *arg) {
    struct forget *f = arg;
    sqlite3_stmt *st = store_stmt(tx, "DELETE FROM artifact_hashes WHERE job_id = ?1 AND "
                                      "(path = ?2 OR substr(path, 1, length(?2) + 1) = ?2 || '/')");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, f->job, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, f->rel, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int artifacts_api_delete(struct http_req *req) {
    struct jobref j;
    if (load_job(req, &j) != 0) return 0;
    const char *rel = http_param(req, "path");
    long step;
    int is_dir;
    char abs[PATH_MAX];
    struct stat st;
    enum artifact_kind k = artifacts_classify(rel, &step, &is_dir);
    if (k == ARTIFACT_NONE || resolve(&j, rel, abs, sizeof abs) != 0 || lstat(abs, &st) != 0 ||
        (is_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)))
        return artifact_not_found(req, j.id, rel);
    if (k == ARTIFACT_CHECKPOINT && !is_dir)
        return API_ERROR(req, ARTIFACT_IN_CHECKPOINT,
                         "'%.300s' is one file of checkpoint step %ld; delete the whole "
                         "checkpoints/step_%08ld instead",
                         rel, step, step);
    if (k == ARTIFACT_CHECKPOINT && !job_state_terminal(j.state)) {
        long newest;
        scan_checkpoints(NULL, j.out_dir, NULL, &newest);
        if (step == newest)
            return API_ERROR(req, CHECKPOINT_IN_USE,
                             "step %ld is the newest checkpoint of job %s, which is %s (a retry "
                             "resumes from it)",
                             step, j.id, job_state_name(j.state));
    }
    int rc = is_dir ? nftw(abs, rm_entry, 16, FTW_DEPTH | FTW_PHYS) : unlink(abs);
    if (rc != 0) {
        log_warn("artifacts: delete %s: %s", abs, strerror(errno));
        return API_ERROR(req, ARTIFACT_DELETE_FAILED, "could not delete '%.300s' of job %s", rel,
                         j.id);
    }
    struct forget f = {j.id, rel};
    store_write(req->ld->store, forget_cb, &f);
    return http_reply_json(req, 200,
                           json_pack("{s:s, s:s, s:b}", "job_id", j.id, "path", rel, "deleted", 1));
}
