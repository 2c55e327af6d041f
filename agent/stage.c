/* Data staging into a node-local, content-addressed cache with LRU eviction
 * (see agent/stage.h). Linked into loom-stage (agent/stage/main.c). */
#include "agent/stage.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK     (1 << 20)
#define MAX_FILES 4096

static void hex(const unsigned char *md, unsigned n, char *out) {
    for (unsigned i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

/* Hashes fd from its current position to EOF; optionally copies to out_fd. */
static int hash_fd(int fd, int out_fd, char out[65], long long *n) {
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char *buf = malloc(CHUNK), dig[EVP_MAX_MD_SIZE];
    unsigned dlen = 0;
    int rc = -1;
    *n = 0;
    if (!md || !buf || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) goto out;
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) goto out;
        if (r == 0) break;
        if (EVP_DigestUpdate(md, buf, (size_t)r) != 1) goto out;
        for (ssize_t off = 0; out_fd >= 0 && off < r;) {
            ssize_t w = write(out_fd, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) goto out;
            off += w;
        }
        *n += r;
    }
    if (EVP_DigestFinal_ex(md, dig, &dlen) != 1) goto out;
    hex(dig, dlen, out);
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    free(buf);
    return rc;
}

int stage_file_sha256(const char *path, char out[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    long long n;
    int rc = hash_fd(fd, -1, out, &n);
    close(fd);
    return rc;
}

static void sha256_str(const char *s, char out[65]) {
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned dlen = 0;
    EVP_Digest(s, strlen(s), dig, &dlen, EVP_sha256(), NULL);
    hex(dig, dlen, out);
}

/* Makes sure blobs/HASH holds `src`; sets *hit when nothing was copied. */
static int stage_one(const char *dir, const char *src, char hash[65], int *hit, long long *size,
                     long long *copied, char *err, size_t errlen) {
    struct stat st;
    if (stat(src, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "cannot stat %s: %s", src, strerror(errno));
        return -1;
    }
    *size = (long long)st.st_size;
    *hit = 0;
    char key[PATH_MAX + 64], keyhash[65], idx[PATH_MAX], blob[PATH_MAX];
    snprintf(key, sizeof key, "%s\n%lld\n%lld.%09ld", src, (long long)st.st_size,
             (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    sha256_str(key, keyhash);
    snprintf(idx, sizeof idx, "%s/index/%s", dir, keyhash);
    /* Index hit: the same source file (path, size, mtime) was staged before. */
    FILE *f = fopen(idx, "r");
    if (f) {
        char h[80] = "";
        int ok = fgets(h, sizeof h, f) != NULL;
        fclose(f);
        h[strcspn(h, "\n")] = 0;
        snprintf(blob, sizeof blob, "%s/blobs/%s", dir, h);
        struct stat bs;
        if (ok && strlen(h) == 64 && stat(blob, &bs) == 0 && bs.st_size == st.st_size) {
            memcpy(hash, h, 65);
            *hit = 1;
            return 0;
        }
    }
    /* Copy while hashing the source, then verify the copy by reading it back. */
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/blobs/.tmp.%d", dir, (int)getpid());
    int in = open(src, O_RDONLY | O_CLOEXEC);
    int out = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    long long n = 0, n2 = 0;
    char h2[65];
    int rc = -1;
    if (in < 0 || out < 0) {
        snprintf(err, errlen, "cannot open %s: %s", in < 0 ? src : tmp, strerror(errno));
        goto out;
    }
    if (hash_fd(in, out, hash, &n) != 0 || fsync(out) != 0) {
        snprintf(err, errlen, "copying %s failed: %s", src, strerror(errno));
        goto out;
    }
    if (lseek(out, 0, SEEK_SET) != 0 || hash_fd(out, -1, h2, &n2) != 0 || n2 != n ||
        strcmp(h2, hash) != 0 || n != (long long)st.st_size) {
        snprintf(err, errlen, "checksum of the copy of %s does not match the source", src);
        goto out;
    }
    snprintf(blob, sizeof blob, "%s/blobs/%s", dir, hash);
    struct stat bs;
    if (stat(blob, &bs) == 0 && bs.st_size == n) {
        unlink(tmp); /* same content already cached under another path: share it */
        *hit = 1;
    } else if (rename(tmp, blob) != 0) {
        snprintf(err, errlen, "cannot rename into %s: %s", blob, strerror(errno));
        goto out;
    } else {
        *copied += n;
    }
    f = fopen(idx, "w");
    if (f) {
        fprintf(f, "%s\n", hash);
        fclose(f);
    }
    rc = 0;
out:
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    if (rc != 0) unlink(tmp);
    return rc;
}

struct blob_ent {
    char name[65];
    long long size;
    time_t used;
};

static int by_use(const void *a, const void *b) {
    const struct blob_ent *x = a, *y = b;
    return x->used < y->used ? -1 : x->used > y->used;
}

/* Evicts least recently used blobs (not in keep) until the total fits. */
static void evict(const char *dir, long long max_bytes, char (*keep)[65], int nkeep,
                  struct stage_report *r) {
    char bdir[PATH_MAX];
    snprintf(bdir, sizeof bdir, "%s/blobs", dir);
    DIR *d = opendir(bdir);
    if (!d) return;
    struct blob_ent *ents = NULL;
    int n = 0, cap = 0;
    long long total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strlen(e->d_name) != 64) continue;
        char p[PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", bdir, e->d_name);
        struct stat st;
        if (stat(p, &st) != 0) continue;
        if (BUF_GROW(ents, cap, n + 1, 64) != 0) break;
        memcpy(ents[n].name, e->d_name, 64); /* length checked above */
        ents[n].name[64] = 0;
        ents[n].size = (long long)st.st_size;
        ents[n].used = st.st_mtime;
        total += ents[n].size;
        n++;
    }
    closedir(d);
    qsort(ents, (size_t)n, sizeof *ents, by_use);
    for (int i = 0; i < n && max_bytes > 0 && total > max_bytes; i++) {
        int kept = 0;
        for (int k = 0; k < nkeep && !kept; k++)
            if (!strcmp(keep[k], ents[i].name)) kept = 1;
        if (kept) continue;
        char p[PATH_MAX + 80];
        snprintf(p, sizeof p, "%.4000s/%.64s", bdir, ents[i].name);
        if (unlink(p) == 0) {
            total -= ents[i].size;
            r->evicted++;
        }
    }
    r->cache_bytes = total;
    free(ents);
}

/* Stages one data field (a path or a glob in its last component) and
 * returns the rewritten pattern (caller frees) or NULL with err set. */
static char *stage_field(const char *dir, const char *job, const char *which, const char *pattern,
                         char (*used)[65], int *nused, struct stage_report *r, char *err,
                         size_t errlen) {
    const char *slash = strrchr(pattern, '/'), *wild = strpbrk(pattern, "*?[");
    if (!slash) {
        snprintf(err, errlen, "%s: not a path", pattern);
        return NULL;
    }
    if (wild && wild < slash) {
        snprintf(err, errlen, "%s: wildcards are supported in the file name only", pattern);
        return NULL;
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    int grc = glob(pattern, GLOB_ERR, NULL, &g);
    if (grc != 0 || g.gl_pathc == 0) {
        snprintf(err, errlen, "%s matches no file", pattern);
        globfree(&g);
        return NULL;
    }
    char view[PATH_MAX];
    snprintf(view, sizeof view, "%s/views/%s/%s", dir, job, which);
    char *result = NULL;
    if (fs_mkdir_p(view, 0755, 0) != 0) {
        snprintf(err, errlen, "cannot create %s: %s", view, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char hash[65];
        int hit;
        long long size;
        if (stage_one(dir, g.gl_pathv[i], hash, &hit, &size, &r->copied, err, errlen) != 0)
            goto out;
        r->files++;
        r->hits += hit;
        r->bytes += size;
        if (*nused < MAX_FILES) memcpy(used[(*nused)++], hash, 65);
        char blob[PATH_MAX], link[PATH_MAX + 256];
        snprintf(blob, sizeof blob, "%s/blobs/%s", dir, hash);
        utimensat(AT_FDCWD, blob, NULL, 0); /* last use, for LRU */
        const char *base = strrchr(g.gl_pathv[i], '/');
        snprintf(link, sizeof link, "%s/%s", view, base ? base + 1 : g.gl_pathv[i]);
        /* Replaced by rename, never unlinked first: the ranks of a node stage the same
         * view at once, and one rank's worker may already be opening the link. The
         * temporary name is hidden, so no glob of the view matches it. */
        char tmp[PATH_MAX + 300];
        snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", view, base ? base + 1 : g.gl_pathv[i],
                 (long)getpid());
        unlink(tmp);
        if (symlink(blob, tmp) != 0 || rename(tmp, link) != 0) {
            snprintf(err, errlen, "cannot link %s: %s", link, strerror(errno));
            unlink(tmp);
            goto out;
        }
    }
    size_t len = strlen(view) + strlen(slash) + 1;
    result = malloc(len);
    if (result) snprintf(result, len, "%s%s", view, slash);
out:
    globfree(&g);
    return result;
}

int stage_spec(const struct stage_opts *o, const char *job, json_t *spec, struct stage_report *r,
               char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    double t0 = clock_mono_s();
    json_t *data = json_object_get(spec, "data");
    const char *train = json_string_value(json_object_get(data, "train"));
    const char *val = json_string_value(json_object_get(data, "val"));
    if (!train) {
        snprintf(err, errlen, "spec has no data.train");
        return -1;
    }
    if (!job || !*job || strchr(job, '/') || job[0] == '.') {
        snprintf(err, errlen, "bad job id");
        return -1;
    }
    char sub[PATH_MAX], lockp[PATH_MAX];
    static const char *const subs[] = {"blobs", "index", "views"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(sub, sizeof sub, "%s/%s", o->dir, subs[i]);
        if (fs_mkdir_p(sub, 0755, 0) != 0) {
            snprintf(err, errlen, "cannot create %s: %s", sub, strerror(errno));
            return -1;
        }
    }
    snprintf(lockp, sizeof lockp, "%s/lock", o->dir);
    int lk = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lk < 0 || flock(lk, LOCK_EX) != 0) {
        snprintf(err, errlen, "cannot lock %s: %s", lockp, strerror(errno));
        if (lk >= 0) close(lk);
        return -1;
    }
    char(*used)[65] = calloc(MAX_FILES, sizeof *used);
    int nused = 0, rc = -1;
    char *ntrain = NULL, *nval = NULL;
    if (!used) goto out;
    ntrain = stage_field(o->dir, job, "train", train, used, &nused, r, err, errlen);
    if (!ntrain) goto out;
    if (val) {
        nval = stage_field(o->dir, job, "val", val, used, &nused, r, err, errlen);
        if (!nval) goto out;
    }
    evict(o->dir, o->max_bytes, used, nused, r);
    json_object_set_new(data, "train", json_string(ntrain));
    if (nval) json_object_set_new(data, "val", json_string(nval));
    rc = 0;
out:
    r->seconds = clock_mono_s() - t0;
    free(ntrain);
    free(nval);
    free(used);
    flock(lk, LOCK_UN);
    close(lk);
    return rc;
}
