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
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/buf.h"
#include "common/byterange.h"
#include "common/log.h"
#include "daemon/events.h"
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

int artifacts_parse_range(const char *h, uint64_t size, uint64_t *off, uint64_t *len) {
    return byterange_parse(h, size, off, len);
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
    return byterange_sha256_file(path, out);
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

static int artifact_not_found(struct http_req *req, const char *job, const char *rel);
static const char *content_type_of(const char *rel);

/* ---------------- node-local job directories (proxy) ---------------- */

/* When the agents keep job directories on their own disks (loom-agent
 * --job-root --artifact-listen), the job's nodes reported an artifact server
 * at registration (nodes.artifact_url, migration 110) and loomd asks them:
 * the listing merges what each node holds (a checkpoint's shards may be
 * spread over several), a download is fetched from the first node that has
 * the file. Logs stay loomd's own copies. */
#define PROXY_NODES 16

struct node_srv {
    char url[256];
    char token[130];
};

struct job_nodes {
    const char *job;
    struct node_srv v[PROXY_NODES];
    int n;
};

static int job_nodes_cb(struct store_tx *tx, void *arg) {
    struct job_nodes *jn = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT n.artifact_url, n.artifact_token, MAX(a.attempt) AS att FROM attempts a, "
            "json_each(a.placement) p JOIN nodes n ON n.name = json_extract(p.value, '$.node') "
            "WHERE a.job_id = ?1 AND n.artifact_url <> '' GROUP BY n.name ORDER BY att DESC, "
            "n.name");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, jn->job, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && jn->n < PROXY_NODES) {
        struct node_srv *ns = &jn->v[jn->n++];
        snprintf(ns->url, sizeof ns->url, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(ns->token, sizeof ns->token, "%s", (const char *)sqlite3_column_text(st, 1));
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

struct fetch {
    int fd;    /* body goes here (-1: into mem) */
    char *mem; /* body when fd < 0 */
    size_t len, cap;
    int failed;
    char etag[80], content_range[96];
    const char *method; /* NULL: GET */
};

static size_t fetch_body(char *p, size_t sz, size_t nm, void *arg) {
    struct fetch *f = arg;
    size_t n = sz * nm;
    if (f->fd >= 0) {
        for (size_t off = 0; off < n;) {
            ssize_t w = write(f->fd, p + off, n - off);
            if (w <= 0) {
                f->failed = 1;
                return 0;
            }
            off += (size_t)w;
        }
        f->len += n;
        return n;
    }
    if (f->len + n > (64u << 20)) { /* a listing, not a file: bounded */
        f->failed = 1;
        return 0;
    }
    if (buf_grow_array(&f->mem, &f->cap, f->len + n + 1, 1, 4096) != 0) return 0;
    memcpy(f->mem + f->len, p, n);
    f->len += n;
    f->mem[f->len] = 0;
    return n;
}

static void header_value(const char *line, size_t n, const char *name, char *out, size_t olen) {
    size_t k = strlen(name);
    if (n <= k + 1 || strncasecmp(line, name, k) || line[k] != ':') return;
    const char *v = line + k + 1;
    while (v < line + n && *v == ' ')
        v++;
    size_t vl = (size_t)(line + n - v);
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
        vl--;
    snprintf(out, olen, "%.*s", (int)vl, v);
}

static size_t fetch_header(char *p, size_t sz, size_t nm, void *arg) {
    struct fetch *f = arg;
    header_value(p, sz * nm, "ETag", f->etag, sizeof f->etag);
    header_value(p, sz * nm, "Content-Range", f->content_range, sizeof f->content_range);
    return sz * nm;
}

/* One GET to a node's artifact server: rel NULL lists the job; returns the
 * HTTP status (0: transport failure, logged). range/inm forwarded (NULL: none). */
static long node_get(const struct node_srv *ns, const char *job, const char *rel, const char *range,
                     const char *inm, struct fetch *f) {
    CURL *h = curl_easy_init();
    if (!h) return 0;
    char url[PATH_MAX + 400], auth[200], hr[200], hi[200];
    int n = snprintf(url, sizeof url, "%s/v1/node/artifacts/%s", ns->url, job);
    for (const char *p = rel; p && *p && n < (int)sizeof url - 8;) {
        /* Each segment escaped on its own; the slashes stay. */
        const char *e = strchr(p, '/');
        int sl = e ? (int)(e - p) : (int)strlen(p);
        char *esc = curl_easy_escape(h, p, sl);
        n += snprintf(url + n, sizeof url - (size_t)n, "/%s", esc ? esc : "");
        curl_free(esc);
        p = e ? e + 1 : p + sl;
    }
    struct curl_slist *hdr = NULL;
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", ns->token);
    hdr = curl_slist_append(hdr, auth);
    if (range) {
        snprintf(hr, sizeof hr, "Range: %.150s", range);
        hdr = curl_slist_append(hdr, hr);
    }
    if (inm) {
        snprintf(hi, sizeof hi, "If-None-Match: %.150s", inm);
        hdr = curl_slist_append(hdr, hi);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (f->method) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, f->method);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 3600L * 1000);
    /* A stalled node: under 1 KiB/s for 60 s ends the transfer. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, fetch_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, fetch_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, f);
    long status = 0;
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK && !f->failed)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else
        log_warn("artifacts: %s: %s", url,
                 rc == CURLE_OK ? "write failed" : curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return status;
}

/* The job's nodes with an artifact server; jn->n == 0: the files are local. */
static int job_nodes(struct http_req *req, const char *job, struct job_nodes *jn) {
    memset(jn, 0, sizeof *jn);
    jn->job = job;
    if (store_read(req->ld->store, job_nodes_cb, jn) != STORE_OK) {
        API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
        return -1;
    }
    return 0;
}

/* Adds to items the artifacts node ns holds (not yet in `seen`). */
static void node_list(const struct node_srv *ns, const char *job, json_t *items, json_t *seen) {
    struct fetch f = {.fd = -1};
    long st = node_get(ns, job, NULL, NULL, NULL, &f);
    json_t *r = st == 200 && f.mem ? json_loads(f.mem, 0, NULL) : NULL;
    free(f.mem);
    json_t *files = json_object_get(r, "items"), *have = json_object();
    size_t i;
    json_t *it;
    json_array_foreach(files, i, it) {
        const char *p = json_string_value(json_object_get(it, "path"));
        if (p) json_object_set_new(have, p, json_true());
    }
    json_array_foreach(files, i, it) {
        const char *rel = json_string_value(json_object_get(it, "path"));
        long step;
        int is_dir;
        enum artifact_kind k = rel ? artifacts_classify(rel, &step, &is_dir) : ARTIFACT_NONE;
        if (k == ARTIFACT_NONE || k == ARTIFACT_LOG || is_dir || json_object_get(seen, rel))
            continue;
        if (k == ARTIFACT_CHECKPOINT) { /* complete saves only: the step has its manifest */
            char man[PATH_MAX];
            pathf(man, sizeof man, "%.*s/manifest.json", (int)(strrchr(rel, '/') - rel), rel);
            if (!json_object_get(have, man)) continue;
        }
        json_t *sha = json_object_get(it, "sha256");
        json_array_append_new(
            items,
            json_pack("{s:s, s:s, s:o, s:O, s:O, s:o}", "path", rel, "kind", artifacts_kind_name(k),
                      "step", step >= 0 ? json_integer(step) : json_null(), "size",
                      json_object_get(it, "size"), "sha256", sha ? sha : json_null(), "created_at",
                      store_time_json(json_integer_value(json_object_get(it, "mtime_ms")))));
        json_object_set_new(seen, rel, json_true());
    }
    json_decref(have);
    json_decref(r);
}

static int cmp_item(const void *a, const void *b) {
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "path")),
                  json_string_value(json_object_get(*(json_t *const *)b, "path")));
}

/* Sorts a JSON array of items by path. */
static json_t *sorted_items(json_t *items) {
    size_t n = json_array_size(items);
    json_t **v = calloc(n ? n : 1, sizeof *v);
    json_t *out = json_array();
    for (size_t i = 0; v && i < n; i++)
        v[i] = json_array_get(items, i);
    if (v && n > 1) qsort(v, n, sizeof *v, cmp_item);
    for (size_t i = 0; v && i < n; i++)
        json_array_append(out, v[i]);
    free(v);
    json_decref(items);
    return out;
}

/* An unnamed read-write file in dir: O_TMPFILE, or (file systems without
 * it) a named one removed at once. -1 with errno. */
static int spool_file(const char *dir) {
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
    char path[PATH_MAX];
    pathf(path, sizeof path, "%s/.artifact-spool.XXXXXX", dir);
    fd = mkostemp(path, O_CLOEXEC);
    if (fd >= 0) unlink(path);
    return fd;
}

/* GET of one artifact from the job's nodes: the bytes land in an unnamed
 * temporary file in loomd's data dir, then are served like a local file.
 * (A copy first, not a pass-through stream: the reply then has its length
 * and status before the first byte, and a node failing mid-way is an error
 * reply instead of a cut body. Range is forwarded, so a piece costs only
 * its own bytes.) */
static int proxy_get(struct http_req *req, const struct job_nodes *jn, const char *job,
                     const char *rel) {
    const char *range = http_header(req, "Range"), *inm = http_header(req, "If-None-Match");
    for (int i = 0; i < jn->n; i++) {
        struct fetch f = {.fd = spool_file(req->ld->cfg.data_dir)};
        if (f.fd < 0) return API_ERROR(req, INTERNAL, "no temporary file: %s", strerror(errno));
        long st = node_get(&jn->v[i], job, rel, range, inm, &f);
        if (st == 200 || st == 206) {
            if (f.etag[0]) http_add_header(req, "ETag", f.etag);
            http_add_header(req, "Accept-Ranges", "bytes");
            if (st == 206 && f.content_range[0])
                http_add_header(req, "Content-Range", f.content_range);
            return http_reply_fd(req, (int)st, content_type_of(rel), f.fd, 0, f.len);
        }
        close(f.fd);
        if (st == 304) {
            if (f.etag[0]) http_add_header(req, "ETag", f.etag);
            return http_reply_text(req, 304, NULL, "", 0);
        }
        if (st == 416) {
            if (f.content_range[0]) http_add_header(req, "Content-Range", f.content_range);
            return API_ERROR(req, RANGE_NOT_SATISFIABLE,
                             "Range '%.100s' is not one satisfiable byte range of the file",
                             range ? range : "");
        }
        /* 404 or a node that is down: try the next holder. */
    }
    return artifact_not_found(req, job, rel);
}

/* ---------------- routes ---------------- */

int artifacts_api_list(struct http_req *req) {
    struct jobref j;
    if (load_job(req, &j) != 0) return 0;
    struct job_nodes jn;
    if (job_nodes(req, j.id, &jn) != 0) return 0;
    struct art_list l = {.job_id = j.id};
    json_t *sums = json_object();
    if (jn.n) /* node-local directories: loomd has only the logs */
        scan_tree(&l, j.logs_dir, "logs", ARTIFACT_LOG, -1, 0);
    else
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
    if (jn.n) {
        json_t *seen = json_object();
        for (int i = 0; i < jn.n; i++)
            node_list(&jn.v[i], j.id, items, seen);
        json_decref(seen);
        items = sorted_items(items);
    }
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
    if (kind != ARTIFACT_NONE && kind != ARTIFACT_LOG && !is_dir) {
        struct job_nodes jn;
        if (job_nodes(req, j.id, &jn) != 0) return 0;
        if (jn.n) return proxy_get(req, &jn, j.id, rel);
    }
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

/* DELETE of an artifact that lives on the job's nodes: it must be in their
 * listing (so only what loomd lists as an artifact can go: a complete
 * checkpoint step, an export, one file of an export), the same refusals as
 * for local files apply, then every holder is told to delete it (the agent
 * deletes inside its job directory only, agent/artifacts.c). */
static int node_delete(struct http_req *req, const struct jobref *j, const struct job_nodes *jn,
                       const char *rel, enum artifact_kind k, long step, int is_dir) {
    json_t *items = json_array(), *seen = json_object();
    for (int i = 0; i < jn->n; i++)
        node_list(&jn->v[i], j->id, items, seen);
    json_decref(seen);
    size_t rl = strlen(rel), i;
    json_t *it;
    int found = 0;
    long newest = -1;
    json_array_foreach(items, i, it) {
        const char *p = json_string_value(json_object_get(it, "path"));
        if (!strcmp(p, rel) || (is_dir && !strncmp(p, rel, rl) && p[rl] == '/')) found = 1;
        json_t *s = json_object_get(it, "step");
        if (json_is_integer(s) && json_integer_value(s) > newest)
            newest = (long)json_integer_value(s);
    }
    json_decref(items);
    if (!found) return artifact_not_found(req, j->id, rel);
    if (k == ARTIFACT_CHECKPOINT && !is_dir)
        return API_ERROR(req, ARTIFACT_IN_CHECKPOINT,
                         "'%.300s' is one file of checkpoint step %ld; delete the whole "
                         "checkpoints/step_%08ld instead",
                         rel, step, step);
    if (k == ARTIFACT_CHECKPOINT && !job_state_terminal(j->state) && step == newest)
        return API_ERROR(req, CHECKPOINT_IN_USE,
                         "step %ld is the newest checkpoint of job %s, which is %s (a retry "
                         "resumes from it)",
                         step, j->id, job_state_name(j->state));
    int deleted = 0, failed = 0;
    for (int n = 0; n < jn->n; n++) {
        struct fetch f = {.fd = -1, .method = "DELETE"};
        long st = node_get(&jn->v[n], j->id, rel, NULL, NULL, &f);
        free(f.mem);
        if (st == 200)
            deleted++;
        else if (st != 404)
            failed++; /* a node that is down keeps its copy: say so */
    }
    if (!deleted || failed)
        return API_ERROR(req, ARTIFACT_DELETE_FAILED,
                         "could not delete '%.300s' of job %s on %d of its %d node(s)", rel, j->id,
                         deleted ? failed : jn->n, jn->n);
    struct forget fg = {j->id, rel};
    store_write(req->ld->store, forget_cb, &fg);
    return http_reply_json(
        req, 200, json_pack("{s:s, s:s, s:b}", "job_id", j->id, "path", rel, "deleted", 1));
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
    if (k != ARTIFACT_NONE && k != ARTIFACT_LOG) {
        /* Files on the nodes' own disks (logs are always loomd's copies). */
        struct job_nodes jn;
        if (job_nodes(req, j.id, &jn) != 0) return 0;
        if (jn.n > 0) return node_delete(req, &j, &jn, rel, k, step, is_dir);
    }
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

/* ---------------- retention ---------------- */

struct artifacts_retention {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, started;
};

int artifacts_tenant_ttl_set(struct store_tx *tx, const char *tenant_id, long ttl_s) {
    sqlite3_stmt *st = store_stmt(tx, "UPDATE tenants SET artifact_ttl_s = ?2 WHERE id = ?1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, tenant_id, -1, SQLITE_STATIC);
    if (ttl_s < 0)
        sqlite3_bind_null(st, 2);
    else
        sqlite3_bind_int64(st, 2, ttl_s);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    return sqlite3_changes(store_tx_db(tx)) ? STORE_OK : STORE_NOT_FOUND;
}

int artifacts_tenant_ttl_json(struct store_tx *tx, const char *tenant_id, json_t *t) {
    sqlite3_stmt *st = store_stmt(tx, "SELECT artifact_ttl_s FROM tenants WHERE id = ?1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, tenant_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        json_object_set_new(t, "artifact_ttl_s",
                            sqlite3_column_type(st, 0) == SQLITE_NULL
                                ? json_null()
                                : json_integer(sqlite3_column_int64(st, 0)));
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : STORE_ERR;
}

#define SWEEP_BATCH 64

struct expired {
    int64_t now, def_ttl;
    int n;
    struct {
        char id[32], tenant[32];
        char *out_dir;
        int64_t ttl;
    } v[SWEEP_BATCH];
};

/* Finished jobs past their TTL whose artifacts are still there. */
static int expired_cb(struct store_tx *tx, void *arg) {
    struct expired *e = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT j.id, j.tenant_id, j.out_dir, COALESCE(t.artifact_ttl_s, ?2) AS ttl FROM jobs "
            "j JOIN tenants t ON t.id = j.tenant_id WHERE j.artifacts_expired_at IS NULL AND "
            "j.finished_at IS NOT NULL AND j.state IN ('succeeded', 'failed', 'cancelled') AND "
            "COALESCE(t.artifact_ttl_s, ?2) > 0 AND j.finished_at + 1000 * COALESCE("
            "t.artifact_ttl_s, ?2) <= ?1 ORDER BY j.finished_at LIMIT ?3");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, e->now);
    sqlite3_bind_int64(st, 2, e->def_ttl);
    sqlite3_bind_int(st, 3, SWEEP_BATCH);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && e->n < SWEEP_BATCH) {
        snprintf(e->v[e->n].id, sizeof e->v[e->n].id, "%s",
                 (const char *)sqlite3_column_text(st, 0));
        snprintf(e->v[e->n].tenant, sizeof e->v[e->n].tenant, "%s",
                 (const char *)sqlite3_column_text(st, 1));
        const unsigned char *d = sqlite3_column_text(st, 2);
        e->v[e->n].out_dir = d ? strdup((const char *)d) : NULL;
        e->v[e->n].ttl = sqlite3_column_int64(st, 3);
        e->n++;
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

struct expire_mark {
    const char *job, *tenant;
    int64_t now, ttl;
    json_t *paths;
};

static int expire_mark_cb(struct store_tx *tx, void *arg) {
    struct expire_mark *m = arg;
    sqlite3_stmt *st = store_stmt(tx, "UPDATE jobs SET artifacts_expired_at = ?2 WHERE id = ?1 "
                                      "AND artifacts_expired_at IS NULL");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, m->job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, m->now);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    if (!sqlite3_changes(store_tx_db(tx))) return STORE_OK;
    st = store_stmt(tx, "DELETE FROM artifact_hashes WHERE job_id = ?1 AND (substr(path, 1, 12) "
                        "= 'checkpoints/' OR substr(path, 1, 7) = 'export/')");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, m->job, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    json_t *d = json_pack("{s:I, s:O}", "ttl_s", (json_int_t)m->ttl, "paths", m->paths);
    int64_t seq = events_emit(tx, "artifacts.expired", m->job, m->tenant, d);
    json_decref(d);
    return seq < 0 ? (int)seq : STORE_OK;
}

/* The retention roots of a job (checkpoint.keep's and the exports). */
static const char *const expire_roots[] = {"checkpoints", "export"};

/* Deletes one job's roots: on its nodes, else under out_dir. 0 when every
 * copy is gone (or never was), -1 to retry at the next sweep. */
static int expire_job(struct loomd *ld, const char *job, const char *out_dir, json_t *paths) {
    struct job_nodes jn;
    memset(&jn, 0, sizeof jn);
    jn.job = job;
    if (store_read(ld->store, job_nodes_cb, &jn) != STORE_OK) return -1;
    int failed = 0;
    for (size_t r = 0; r < sizeof expire_roots / sizeof *expire_roots; r++) {
        int gone = 0;
        for (int i = 0; i < jn.n; i++) {
            struct fetch f = {.fd = -1, .method = "DELETE"};
            long st = node_get(&jn.v[i], job, expire_roots[r], NULL, NULL, &f);
            free(f.mem);
            if (st == 200) gone = 1;
            if (st != 200 && st != 404) failed = 1;
        }
        if (!jn.n && out_dir) {
            /* Shared storage: out_dir is loomd's own jobs dir entry; the
             * root itself is not followed if it is a symlink. */
            char abs[PATH_MAX];
            struct stat sb;
            pathf(abs, sizeof abs, "%s/%s", out_dir, expire_roots[r]);
            if (lstat(abs, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                if (nftw(abs, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
                    log_warn("artifacts: retention: delete %s: %s", abs, strerror(errno));
                    failed = 1;
                } else {
                    gone = 1;
                }
            }
        }
        if (gone) json_array_append_new(paths, json_string(expire_roots[r]));
    }
    return failed ? -1 : 0;
}

int artifacts_sweep(struct loomd *ld, int64_t now_ms) {
    struct expired *e = calloc(1, sizeof *e);
    if (!e) return -1;
    e->now = now_ms;
    e->def_ttl = ld->cfg.artifact_ttl;
    int done = 0;
    if (store_read(ld->store, expired_cb, e) != STORE_OK) {
        free(e);
        return -1;
    }
    for (int i = 0; i < e->n; i++) {
        json_t *paths = json_array();
        if (expire_job(ld, e->v[i].id, e->v[i].out_dir, paths) == 0) {
            struct expire_mark m = {e->v[i].id, e->v[i].tenant, now_ms, e->v[i].ttl, paths};
            if (store_write(ld->store, expire_mark_cb, &m) == STORE_OK) {
                log_info("artifacts: job %s: checkpoints and exports deleted (ttl %llds)",
                         e->v[i].id, (long long)e->v[i].ttl);
                done++;
            }
        } else {
            log_warn("artifacts: job %s: retention delete incomplete (a node did not answer); "
                     "retried at the next sweep",
                     e->v[i].id);
        }
        json_decref(paths);
        free(e->v[i].out_dir);
    }
    free(e);
    return done;
}

static void *retention_main(void *arg) {
    struct loomd *ld = arg;
    struct artifacts_retention *r = ld->retention;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += ld->cfg.artifact_sweep > 0 ? ld->cfg.artifact_sweep : 60;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (r->stop) break;
        pthread_mutex_unlock(&r->mu);
        if (artifacts_sweep(ld, store_now_ms()) < 0)
            log_warn("artifacts: retention sweep failed (the store); retried");
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int artifacts_start(struct loomd *ld) {
    struct artifacts_retention *r = calloc(1, sizeof *r);
    if (!r) return -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    ld->retention = r;
    if (pthread_create(&r->thread, NULL, retention_main, ld) != 0) {
        log_error("artifacts: cannot start the retention thread");
        return -1;
    }
    r->started = 1;
    return 0;
}

void artifacts_stop(struct loomd *ld) {
    struct artifacts_retention *r = ld->retention;
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->started) pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    ld->retention = NULL;
}
