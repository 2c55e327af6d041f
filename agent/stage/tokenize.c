/* Tokenizing a job's raw data into the staging cache (see agent/stage/tokenize.h). */
#include "agent/stage/tokenize.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fsutil.h"
#include "data/prepare.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)

static const char *str_at(json_t *spec, const char *obj, const char *key) {
    return json_string_value(json_object_get(json_object_get(spec, obj), key));
}

/* Removes a flat directory (a partial tokenization). */
static void rm_flat(const char *path) {
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(path);
}

/* One split: inputs `list` tokenized into DIR/tokens/KEY (or found there). On success
 * `shards` holds that directory. */
static int one_split(const char *dir, const struct prep_opts *po, const char *list, char *shards,
                     size_t slen, json_t **meta, int *hit, char *err, size_t errlen) {
    struct prep_files in = {0};
    char key[65], tmp[PATH_MAX], mpath[PATH_MAX + 16];
    int rc = PREP_EDATA;
    *hit = 0;
    *meta = NULL;
    if (prep_files_add(&in, list, err, errlen) != 0) goto out;
    if (in.n == 0) {
        ERR("%s holds no file", list);
        goto out;
    }
    if ((rc = prep_cache_key(po, &in, key, err, errlen)) != PREP_OK) goto out;
    snprintf(shards, slen, "%s/tokens/%s", dir, key);
    snprintf(mpath, sizeof mpath, "%s/meta.json", shards);
    json_error_t je;
    if ((*meta = json_load_file(mpath, 0, &je)) != NULL) {
        *hit = 1;
        utimensat(AT_FDCWD, shards, NULL, 0); /* last use */
        rc = PREP_OK;
        goto out;
    }
    snprintf(tmp, sizeof tmp, "%s/tokens/.tmp.%s.%d", dir, key, (int)getpid());
    rm_flat(tmp);
    rc = PREP_EIO;
    if (fs_mkdir_p(tmp, 0755, 0) != 0) {
        ERR("cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = prep_run(po, &in, tmp, meta, err, errlen);
    if (rc == PREP_OK && rename(tmp, shards) != 0) {
        ERR("cannot rename %s to %s: %s", tmp, shards, strerror(errno));
        rc = PREP_EIO;
    }
    if (rc != PREP_OK) {
        rm_flat(tmp);
        json_decref(*meta);
        *meta = NULL;
    }
out:
    prep_files_free(&in);
    return rc;
}

/* Marks the entry `shards` used by this process and the worker it execs: a shared flock on
 * shards/.use through a descriptor left open (no O_CLOEXEC) until that process exits. */
static void hold_entry(const char *shards) {
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/.use", shards);
    int fd = open(p, O_RDWR | O_CREAT, 0644);
    if (fd >= 0 && flock(fd, LOCK_SH) != 0) close(fd);
    /* fd stays open on purpose: the lock is the entry's "in use" mark */
}

struct tok_ent {
    char name[65];
    long long bytes;
    time_t used;
};

static int by_use(const void *a, const void *b) {
    const struct tok_ent *x = a, *y = b;
    if (x->used != y->used) return x->used < y->used ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Bytes of the files in a flat directory. */
static long long flat_bytes(const char *path) {
    long long n = 0;
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[PATH_MAX + 300];
        struct stat st;
        int k = snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (k < 0 || (size_t)k >= sizeof p) continue;
        if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode)) n += st.st_size;
    }
    if (d) closedir(d);
    return n;
}

/* Least recently used entries of DIR/tokens that no process holds are removed until the
 * total is within max_bytes (<= 0: no cap). Called under DIR/lock. */
static void evict_tokens(const char *dir, long long max_bytes, struct stage_tok_report *r) {
    char tdir[PATH_MAX];
    snprintf(tdir, sizeof tdir, "%s/tokens", dir);
    DIR *d = opendir(tdir);
    if (!d) return;
    struct tok_ent *ents = NULL;
    size_t n = 0, cap = 0;
    long long total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[PATH_MAX + 300];
        struct stat st;
        if (strlen(e->d_name) != 64) continue; /* keys only: not .tmp.* or anything else */
        snprintf(p, sizeof p, "%s/%s", tdir, e->d_name);
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            struct tok_ent *g = realloc(ents, nc * sizeof *g);
            if (!g) break;
            ents = g, cap = nc;
        }
        memcpy(ents[n].name, e->d_name, 65);
        ents[n].bytes = flat_bytes(p);
        ents[n].used = st.st_mtime;
        total += ents[n].bytes;
        n++;
    }
    closedir(d);
    qsort(ents, n, sizeof *ents, by_use);
    for (size_t i = 0; i < n && max_bytes > 0 && total > max_bytes; i++) {
        char p[PATH_MAX + 300], u[PATH_MAX + 320];
        snprintf(p, sizeof p, "%s/%s", tdir, ents[i].name);
        snprintf(u, sizeof u, "%s/.use", p);
        int fd = open(u, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) { /* a job is using it */
            close(fd);
            continue;
        }
        rm_flat(p); /* .use goes too, under our exclusive lock */
        if (fd >= 0) close(fd);
        total -= ents[i].bytes;
        r->evicted++;
    }
    r->cache_bytes = total;
    free(ents);
}

static long long meta_int(json_t *m, const char *k) {
    return (long long)json_integer_value(json_object_get(m, k));
}

int stage_tokenize_spec(const char *dir, json_t *spec, int threads, long long max_bytes,
                        stage_tok_progress_fn fn, void *user, struct stage_tok_report *r, char *err,
                        size_t errlen) {
    memset(r, 0, sizeof *r);
    json_t *data = json_object_get(spec, "data");
    const char *format = str_at(spec, "data", "format");
    if (!format || !strcmp(format, "bin")) return 0;
    r->tokenized = 1;
    double t0 = clock_mono_s();
    const char *train = str_at(spec, "data", "train"), *val = str_at(spec, "data", "val");
    const char *tok = str_at(spec, "data", "tokenizer");
    if (!tok || !*tok) tok = str_at(spec, "model", "init_from");
    if (!train || !*train) {
        ERR("data.format %s: data.train names no file", format);
        return PREP_EDATA;
    }
    if (!tok || !*tok) {
        ERR("data.format %s needs data.tokenizer or model.init_from (a local tokenizer.json, "
            "tokenizer.model or HF directory)",
            format);
        return PREP_EDATA;
    }
    if (!dir || !*dir) {
        ERR("data.format %s is tokenized on the node into the staging cache, but "
            "LOOM_STAGE_DIR is not set",
            format);
        return PREP_EIO;
    }
    const char *text_key = str_at(spec, "data", "text_key");
    const char *tpl = str_at(spec, "data", "chat_template");
    if (tpl && (!*tpl || !strcmp(tpl, "none"))) tpl = NULL;
    json_int_t seq_len =
        json_integer_value(json_object_get(json_object_get(spec, "model"), "seq_len"));
    int records =
        !strcmp(format, "jsonl") || !strcmp(format, "chat") || !strcmp(format, "completion");
    struct prep_opts po = {.tokenizer = tok,
                           .format = format,
                           .text_key = text_key,
                           .chat_template = tpl,
                           .loss_on = str_at(spec, "train", "loss_on"),
                           .seq_len = records && seq_len > 0 ? (long)seq_len : 0,
                           .overlong = str_at(spec, "data", "overlong"),
                           .val_fraction = json_number_value(json_object_get(data, "val_fraction")),
                           .threads = threads,
                           .progress = fn,
                           .progress_user = user};
    int rc = prep_check_opts(&po, err, errlen);
    if (rc != PREP_OK) return rc;
    char sub[PATH_MAX], lockp[PATH_MAX], tdir[PATH_MAX], vdir[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/tokens", dir);
    if (fs_mkdir_p(sub, 0755, 0) != 0) {
        ERR("cannot create %s: %s", sub, strerror(errno));
        return PREP_EIO;
    }
    snprintf(lockp, sizeof lockp, "%s/lock", dir);
    int lk = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lk < 0 || flock(lk, LOCK_EX) != 0) {
        ERR("cannot lock %s: %s", lockp, strerror(errno));
        if (lk >= 0) close(lk);
        return PREP_EIO;
    }
    json_t *tm = NULL, *vm = NULL;
    int hit = 0;
    rc = one_split(dir, &po, train, tdir, sizeof tdir, &tm, &hit, err, errlen);
    if (rc != PREP_OK) goto out;
    hold_entry(tdir);
    r->splits = 1;
    r->hits = hit;
    memcpy(r->key, strrchr(tdir, '/') + 1, 65);
    if (val && *val) {
        struct prep_opts vo = po;
        vo.val_fraction = 0;
        rc = one_split(dir, &vo, val, vdir, sizeof vdir, &vm, &hit, err, errlen);
        if (rc != PREP_OK) goto out;
        hold_entry(vdir);
        r->splits++;
        r->hits += hit;
    }
    evict_tokens(dir, max_bytes, r);
    char pat[PATH_MAX + 16];
    snprintf(pat, sizeof pat, "%s/train_*.bin", tdir);
    json_object_set_new(data, "train", json_string(pat));
    if (vm) {
        snprintf(pat, sizeof pat, "%s/train_*.bin", vdir);
        json_object_set_new(data, "val", json_string(pat));
    } else if (meta_int(tm, "val_shards") > 0) {
        snprintf(pat, sizeof pat, "%s/val_*.bin", tdir);
        json_object_set_new(data, "val", json_string(pat));
    }
    if (json_object_get(data, "val_fraction")) /* the split is done: data.val holds it */
        json_object_set_new(data, "val_fraction", json_real(0));
    r->examples = meta_int(json_object_get(tm, "examples"), "kept");
    r->train_tokens = meta_int(tm, "train_tokens");
    r->loss_tokens = meta_int(tm, "train_loss_tokens");
    r->val_tokens = vm ? meta_int(vm, "train_tokens") : meta_int(tm, "val_tokens");
out:
    r->seconds = clock_mono_s() - t0;
    json_decref(tm);
    json_decref(vm);
    flock(lk, LOCK_UN);
    close(lk);
    return rc;
}
