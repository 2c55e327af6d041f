/* Token shards (.bin) and the deterministic, rank-disjoint batch loader.
 *
 * Shards are mmap'ed read-only and validated at open (header, exact size and,
 * optionally, every token against the vocabulary). The loader keeps only an
 * immutable index (samples per shard, prefix sums), so a batch is a pure
 * function of (seed, step, micro_step, dp_rank) and any thread may ask for
 * one. The shuffle is a keyed Feistel bijection over [0, N) with cycle
 * walking, so no permutation table is stored and any position is O(1).
 * Assumes a little-endian host, like the llm.c format it reads. */
#define _GNU_SOURCE /* asprintf */
#include "worker/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/fsutil.h"
#include "common/hash.h"

struct data_shard {
    char *path;
    int version;
    uint64_t ntok;
    const unsigned char *map; /* whole file */
    size_t map_len;
    int64_t nsamples;
    const unsigned char *mask; /* the .mask shard beside it (whole file), or NULL */
    size_t mask_len;
};

struct data_loader {
    struct data_loader_opts o; /* pattern not kept */
    struct data_shard *shards;
    size_t nshards;
    int64_t *first;  /* first[i]: global index of shard i's first sample; first[n] = N */
    int64_t N;       /* samples per epoch */
    int64_t G;       /* samples per optimizer step */
    uint64_t tokens; /* total tokens of all shards */
    uint64_t fingerprint;
    int scanned; /* every token was checked against vocab_size at open */
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static size_t token_bytes(int version) {
    return version == 1 ? 2 : version == 2 ? 4 : 0;
}

/* ---- shard writing --------------------------------------------------------- */

int data_mask_write(const char *path, const uint8_t *mask, size_t n, char *err, size_t errlen) {
    if (!path || (n && !mask) || n > INT32_MAX) {
        seterr(err, errlen, "%s: invalid mask shard (%zu tokens)", path ? path : "(null)", n);
        return DATA_EINVAL;
    }
    unsigned char *b = malloc(DATA_HEADER_BYTES + n);
    if (!b) {
        seterr(err, errlen, "out of memory");
        return DATA_EIO;
    }
    int32_t header[DATA_HEADER_INTS] = {0};
    header[0] = DATA_MASK_MAGIC;
    header[1] = 1;
    header[2] = (int32_t)n;
    memcpy(b, header, sizeof header);
    for (size_t i = 0; i < n; i++)
        b[DATA_HEADER_BYTES + i] = mask[i] ? 1 : 0;
    int rc = fs_write_atomic(path, b, DATA_HEADER_BYTES + n, 0644, 0);
    if (rc != 0) seterr(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    free(b);
    return rc == 0 ? 0 : DATA_EIO;
}

int data_shard_write(const char *path, int version, const uint32_t *tokens, size_t n, char *err,
                     size_t errlen) {
    int rc = DATA_EIO;
    char *tmp = NULL;
    FILE *f = NULL;
    void *buf = NULL;
    if (!path || (version != 1 && version != 2) || (n && !tokens) || n > INT32_MAX) {
        seterr(err, errlen, "%s: invalid shard (version %d, %zu tokens)", path ? path : "(null)",
               version, n);
        return DATA_EINVAL;
    }
    for (size_t i = 0; version == 1 && i < n; i++)
        if (tokens[i] > UINT16_MAX) {
            seterr(err, errlen,
                   "%s: token %" PRIu32 " at index %zu does not fit version 1 (uint16)", path,
                   tokens[i], i);
            return DATA_EINVAL;
        }
    if (asprintf(&tmp, "%s.tmp", path) < 0) {
        tmp = NULL;
        seterr(err, errlen, "out of memory");
        goto out;
    }
    f = fopen(tmp, "wb");
    if (!f) {
        seterr(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    int32_t header[DATA_HEADER_INTS] = {0};
    header[0] = DATA_MAGIC;
    header[1] = version;
    header[2] = (int32_t)n;
    if (fwrite(header, sizeof header, 1, f) != 1) goto werr;
    /* Convert in chunks so large shards do not need a second full copy. */
    enum { CHUNK = 1 << 16 };
    size_t tb = token_bytes(version);
    buf = malloc(CHUNK * tb);
    if (!buf) goto werr;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        if (version == 1)
            for (size_t j = 0; j < m; j++)
                ((uint16_t *)buf)[j] = (uint16_t)tokens[i + j];
        else
            memcpy(buf, tokens + i, m * 4);
        if (fwrite(buf, tb, m, f) != m) goto werr;
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) goto werr;
    if (fclose(f) != 0) {
        f = NULL;
        goto werr;
    }
    f = NULL;
    if (rename(tmp, path) != 0) {
        seterr(err, errlen, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
        goto out;
    }
    rc = 0;
    goto out;
werr:
    seterr(err, errlen, "%s: write failed: %s", tmp, strerror(errno ? errno : EIO));
out:
    if (f) fclose(f);
    if (rc != 0 && tmp) unlink(tmp);
    free(buf);
    free(tmp);
    return rc;
}

/* ---- shard reading --------------------------------------------------------- */

/* Validate the header of an open file of `size` bytes. */
static int check_header(const char *path, const int32_t *h, uint64_t size, int *version,
                        uint64_t *ntok, char *err, size_t errlen) {
    if (size < DATA_HEADER_BYTES) {
        seterr(err, errlen,
               "%s: truncated or not a token shard: %" PRIu64 " bytes, shorter than the %d-byte "
               "header",
               path, size, DATA_HEADER_BYTES);
        return DATA_EFORMAT;
    }
    if (h[0] != DATA_MAGIC) {
        seterr(err, errlen,
               "%s: not a token shard: magic number is %" PRId32 ", expected %d (the .bin "
               "format: 256 int32 header, then tokens)",
               path, h[0], DATA_MAGIC);
        return DATA_EFORMAT;
    }
    size_t tb = token_bytes(h[1]);
    if (!tb) {
        seterr(err, errlen,
               "%s: unsupported shard version %" PRId32 " (1 = uint16 tokens, 2 = uint32 tokens)",
               path, h[1]);
        return DATA_EFORMAT;
    }
    uint64_t n = (uint32_t)h[2];
    uint64_t want = DATA_HEADER_BYTES + n * tb;
    if (size < want) {
        seterr(err, errlen,
               "%s: truncated: header says %" PRIu64 " tokens (%" PRIu64 " bytes) but the file "
               "has %" PRIu64 " bytes",
               path, n, want, size);
        return DATA_EFORMAT;
    }
    if (size > want) {
        seterr(err, errlen,
               "%s: %" PRIu64 " unexpected trailing bytes: header says %" PRIu64 " tokens (%" PRIu64
               " bytes) but the file has %" PRIu64 " bytes",
               path, size - want, n, want, size);
        return DATA_EFORMAT;
    }
    *version = h[1];
    *ntok = n;
    return 0;
}

/* Open, validate and map one shard into *s (path copied). */
static int shard_open(const char *path, struct data_shard *s, char *err, size_t errlen) {
    int rc = DATA_EIO;
    int32_t h[DATA_HEADER_INTS];
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return DATA_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        seterr(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        seterr(err, errlen, "%s: not a regular file", path);
        rc = DATA_EFORMAT;
        goto out;
    }
    memset(h, 0, sizeof h);
    uint64_t size = (uint64_t)st.st_size;
    if (size >= DATA_HEADER_BYTES && pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        seterr(err, errlen, "%s: cannot read header: %s", path, strerror(errno ? errno : EIO));
        goto out;
    }
    rc = check_header(path, h, size, &s->version, &s->ntok, err, errlen);
    if (rc) goto out;
    s->map_len = (size_t)size;
    void *m = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        seterr(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        rc = DATA_EIO;
        goto out;
    }
    s->map = m;
    s->path = strdup(path);
    if (!s->path) {
        munmap(m, s->map_len);
        s->map = NULL;
        seterr(err, errlen, "out of memory");
        rc = DATA_EIO;
        goto out;
    }
    rc = 0;
out:
    close(fd);
    return rc;
}

/* Map the loss mask X.mask of shard X.bin when there is one (see data_mask_write). */
static int mask_open(struct data_shard *s, char *err, size_t errlen) {
    size_t l = strlen(s->path);
    if (l < 4 || strcmp(s->path + l - 4, ".bin") != 0) return 0;
    char *mp = NULL;
    if (asprintf(&mp, "%.*s.mask", (int)(l - 4), s->path) < 0) {
        seterr(err, errlen, "out of memory");
        return DATA_EIO;
    }
    int rc = DATA_EIO;
    int32_t h[DATA_HEADER_INTS] = {0};
    struct stat st;
    int fd = open(mp, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = errno == ENOENT ? 0 : DATA_EIO;
        if (rc) seterr(err, errlen, "%s: cannot open: %s", mp, strerror(errno));
        free(mp);
        return rc;
    }
    if (fstat(fd, &st) != 0 ||
        (st.st_size >= DATA_HEADER_BYTES && pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h)) {
        seterr(err, errlen, "%s: cannot read: %s", mp, strerror(errno ? errno : EIO));
        goto out;
    }
    rc = DATA_EFORMAT;
    if (h[0] != DATA_MASK_MAGIC || h[1] != 1) {
        seterr(err, errlen, "%s: not a loss-mask shard (magic %d, version %d; expected %d, 1)", mp,
               h[0], h[1], DATA_MASK_MAGIC);
        goto out;
    }
    if ((uint64_t)(uint32_t)h[2] != s->ntok ||
        (uint64_t)st.st_size != DATA_HEADER_BYTES + s->ntok) {
        seterr(err, errlen,
               "%s: %" PRId64 " bytes with a header of %d tokens, but %s holds %" PRIu64
               " tokens (expected %" PRIu64 " bytes)",
               mp, (int64_t)st.st_size, h[2], s->path, s->ntok, DATA_HEADER_BYTES + s->ntok);
        goto out;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        seterr(err, errlen, "%s: mmap failed: %s", mp, strerror(errno));
        rc = DATA_EIO;
        goto out;
    }
    s->mask = m;
    s->mask_len = (size_t)st.st_size;
    rc = 0;
out:
    close(fd);
    free(mp);
    return rc;
}

static void shard_close(struct data_shard *s) {
    if (s->mask) munmap((void *)s->mask, s->mask_len);
    if (s->map) munmap((void *)s->map, s->map_len);
    free(s->path);
    memset(s, 0, sizeof *s);
}

static inline uint32_t shard_token(const struct data_shard *s, uint64_t i) {
    const unsigned char *p = s->map + DATA_HEADER_BYTES;
    if (s->version == 1) {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

int data_shard_check(const char *path, int *version, uint64_t *ntokens, char *err, size_t errlen) {
    struct data_shard s;
    int rc = shard_open(path, &s, err, errlen);
    if (rc) return rc;
    if (version) *version = s.version;
    if (ntokens) *ntokens = s.ntok;
    shard_close(&s);
    return 0;
}

/* First token >= vocab in [from, from + n) of s, or -1. */
static int64_t find_bad_token(const struct data_shard *s, uint64_t from, uint64_t n,
                              uint32_t vocab) {
    for (uint64_t i = from; i < from + n; i++)
        if (shard_token(s, i) >= vocab) return (int64_t)i;
    return -1;
}

/* ---- glob ------------------------------------------------------------------ */

static int paths_push(char ***v, size_t *n, size_t *cap, const char *p) {
    if (buf_grow_array(v, cap, *n + 2, sizeof **v, 16) != 0) return -1;
    (*v)[*n] = strdup(p);
    if (!(*v)[*n]) return -1;
    (*n)++;
    (*v)[*n] = NULL;
    return 0;
}

void data_paths_free(char **paths) {
    if (!paths) return;
    for (char **p = paths; *p; p++)
        free(*p);
    free(paths);
}

int data_glob(const char *pattern, char ***paths, size_t *count, char *err, size_t errlen) {
    int rc = DATA_EIO;
    char **v = NULL;
    size_t n = 0, cap = 0;
    char *copy = NULL;
    *paths = NULL;
    *count = 0;
    if (!pattern || !*pattern) {
        seterr(err, errlen, "empty data path");
        return DATA_EINVAL;
    }
    copy = strdup(pattern);
    if (!copy) goto oom;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (!*tok) continue;
        char *pat = NULL;
        struct stat st;
        if (stat(tok, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (asprintf(&pat, "%s/*.bin", tok) < 0) goto oom;
        } else {
            pat = strdup(tok);
            if (!pat) goto oom;
        }
        glob_t g;
        int grc = glob(pat, 0, NULL, &g);
        if (grc == GLOB_NOMATCH) {
            seterr(err, errlen, "no data file matches \"%s\"", pat);
            free(pat);
            rc = DATA_EEMPTY;
            goto out;
        }
        if (grc != 0) {
            seterr(err, errlen, "cannot expand \"%s\" (glob error %d)", pat, grc);
            free(pat);
            goto out;
        }
        free(pat);
        for (size_t i = 0; i < g.gl_pathc; i++)
            if (paths_push(&v, &n, &cap, g.gl_pathv[i]) != 0) {
                globfree(&g);
                goto oom;
            }
        globfree(&g);
    }
    if (n == 0) {
        seterr(err, errlen, "no data file matches \"%s\"", pattern);
        rc = DATA_EEMPTY;
        goto out;
    }
    *paths = v;
    *count = n;
    v = NULL;
    rc = 0;
    goto out;
oom:
    seterr(err, errlen, "out of memory");
    rc = DATA_EIO;
out:
    data_paths_free(v);
    free(copy);
    return rc;
}

/* ---- permutation ----------------------------------------------------------- */

static uint64_t mix64(uint64_t z) {
    /* splitmix64 finaliser: a fixed, well-distributed 64-bit mixer. */
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t data_permute(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch) {
    if (n <= 1) return 0;
    /* Balanced Feistel network on 2*h bits, 2^(2h) >= n; cycle walking maps
     * the bijection of [0, 2^(2h)) to one of [0, n). 2^(2h) < 4n, so the
     * expected number of walks is below 4. */
    int bits = 64 - __builtin_clzll(n - 1);
    if (bits & 1) bits++;
    int h = bits / 2;
    uint64_t mask = (1ULL << h) - 1;
    uint64_t key = mix64(seed ^ mix64(epoch ^ 0x6c6f6f6d64617461ULL)); /* "loomdata" */
    uint64_t x = i;
    do {
        uint64_t l = x >> h, r = x & mask;
        for (int round = 0; round < 6; round++) {
            uint64_t f = mix64(key + (uint64_t)round * 0x9e3779b97f4a7c15ULL + r) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        x = (l << h) | r;
    } while (x >= n);
    return x;
}

/* ---- loader ---------------------------------------------------------------- */

void data_loader_free(struct data_loader *dl) {
    if (!dl) return;
    for (size_t i = 0; i < dl->nshards; i++)
        shard_close(&dl->shards[i]);
    free(dl->shards);
    free(dl->first);
    free(dl);
}

int data_loader_open(const struct data_loader_opts *opts, struct data_loader **out, char *err,
                     size_t errlen) {
    int rc = DATA_EIO;
    char **paths = NULL;
    size_t npaths = 0;
    struct data_loader *dl = NULL;
    *out = NULL;
    if (!opts || opts->B <= 0 || opts->T <= 0 || opts->dp_size <= 0 || opts->grad_accum <= 0) {
        seterr(err, errlen, "invalid loader options (B=%d T=%d dp=%d grad_accum=%d)",
               opts ? opts->B : 0, opts ? opts->T : 0, opts ? opts->dp_size : 0,
               opts ? opts->grad_accum : 0);
        return DATA_EINVAL;
    }
    rc = data_glob(opts->pattern, &paths, &npaths, err, errlen);
    if (rc) return rc;
    rc = DATA_EIO;
    dl = calloc(1, sizeof *dl);
    if (!dl) goto oom;
    dl->o = *opts;
    dl->o.pattern = NULL;
    dl->shards = calloc(npaths, sizeof *dl->shards);
    dl->first = calloc(npaths + 1, sizeof *dl->first);
    if (!dl->shards || !dl->first) goto oom;
    dl->fingerprint = LOOM_FNV1A_INIT;
    for (size_t i = 0; i < npaths; i++) {
        rc = shard_open(paths[i], &dl->shards[i], err, errlen);
        if (rc) goto out;
        dl->nshards++;
        rc = mask_open(&dl->shards[i], err, errlen);
        if (rc) goto out;
        dl->tokens += dl->shards[i].ntok;
    }
    dl->scanned =
        opts->vocab_size && (opts->token_check == DATA_CHECK_OPEN ||
                             (opts->token_check == DATA_CHECK_AUTO && dl->tokens <= DATA_SCAN_MAX));
    for (size_t i = 0; i < npaths; i++) {
        struct data_shard *s = &dl->shards[i];
        if (dl->scanned) {
            int64_t bad = find_bad_token(s, 0, s->ntok, opts->vocab_size);
            if (bad >= 0) {
                seterr(err, errlen,
                       "%s: token %" PRIu32 " at index %" PRId64
                       " is out of range for the model's vocab_size %" PRIu32,
                       s->path, shard_token(s, (uint64_t)bad), bad, opts->vocab_size);
                rc = DATA_EVOCAB;
                goto out;
            }
        }
        s->nsamples = s->ntok > (uint64_t)opts->T ? (int64_t)((s->ntok - 1) / opts->T) : 0;
        dl->first[i + 1] = dl->first[i] + s->nsamples;
        const char *base = strrchr(s->path, '/');
        base = base ? base + 1 : s->path;
        dl->fingerprint = loom_fnv1a(dl->fingerprint, base, strlen(base) + 1);
        dl->fingerprint = loom_fnv1a(dl->fingerprint, &s->ntok, sizeof s->ntok);
    }
    dl->N = dl->first[dl->nshards];
    dl->G = (int64_t)opts->grad_accum * opts->dp_size * opts->B;
    if (dl->N == 0) {
        seterr(err, errlen,
               "data \"%s\": %" PRIu64 " tokens in %zu file(s) hold no sequence of seq_len+1 = %d "
               "tokens",
               opts->pattern, dl->tokens, dl->nshards, opts->T + 1);
        rc = DATA_EEMPTY;
        goto out;
    }
    *out = dl;
    dl = NULL;
    rc = 0;
    goto out;
oom:
    seterr(err, errlen, "out of memory");
    rc = DATA_EIO;
out:
    data_loader_free(dl);
    data_paths_free(paths);
    return rc;
}

int64_t data_loader_samples(const struct data_loader *dl) {
    return dl->N;
}
int64_t data_loader_samples_per_step(const struct data_loader *dl) {
    return dl->G;
}
int64_t data_loader_steps_per_epoch(const struct data_loader *dl) {
    return dl->N / dl->G > 0 ? dl->N / dl->G : 1;
}
uint64_t data_loader_tokens(const struct data_loader *dl) {
    return dl->tokens;
}
size_t data_loader_num_masked(const struct data_loader *dl) {
    size_t n = 0;
    for (size_t i = 0; i < dl->nshards; i++)
        n += dl->shards[i].mask != NULL;
    return n;
}

size_t data_loader_num_shards(const struct data_loader *dl) {
    return dl->nshards;
}

static int args_ok(const struct data_loader *dl, int64_t step, int micro_step, int dp_rank) {
    return step >= 0 && micro_step >= 0 && micro_step < dl->o.grad_accum && dp_rank >= 0 &&
           dp_rank < dl->o.dp_size;
}

int64_t data_loader_sample(const struct data_loader *dl, int64_t step, int micro_step, int dp_rank,
                           int b) {
    if (!args_ok(dl, step, micro_step, dp_rank) || b < 0 || b >= dl->o.B) return -1;
    int64_t p = step * dl->G + ((int64_t)micro_step * dl->o.dp_size + dp_rank) * dl->o.B + b;
    uint64_t epoch = (uint64_t)(p / dl->N), idx = (uint64_t)(p % dl->N);
    if (!dl->o.shuffle) return (int64_t)idx;
    return (int64_t)data_permute(idx, (uint64_t)dl->N, dl->o.seed, epoch);
}

/* Shard holding global sample g (binary search over the prefix sums). */
static size_t shard_of(const struct data_loader *dl, int64_t g) {
    size_t lo = 0, hi = dl->nshards; /* first[lo] <= g < first[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (dl->first[mid] <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int data_loader_window(const struct data_loader *dl, int64_t step, int micro_step, int dp_rank,
                       int32_t *window, char *err, size_t errlen) {
    if (!args_ok(dl, step, micro_step, dp_rank) || !window) {
        seterr(err, errlen,
               "invalid batch request (step %" PRId64 ", micro_step %d/%d, dp_rank %d/%d)", step,
               micro_step, dl->o.grad_accum, dp_rank, dl->o.dp_size);
        return DATA_EINVAL;
    }
    const int T = dl->o.T;
    for (int b = 0; b < dl->o.B; b++) {
        int64_t g = data_loader_sample(dl, step, micro_step, dp_rank, b);
        size_t si = shard_of(dl, g);
        const struct data_shard *s = &dl->shards[si];
        uint64_t from = (uint64_t)(g - dl->first[si]) * (uint64_t)T;
        int32_t *w = window + (size_t)b * (T + 1);
        for (int t = 0; t <= T; t++)
            w[t] = (int32_t)shard_token(s, from + t);
        if (dl->o.vocab_size && !dl->scanned) {
            int64_t bad = find_bad_token(s, from, (uint64_t)T + 1, dl->o.vocab_size);
            if (bad >= 0) {
                seterr(err, errlen,
                       "%s: token %" PRIu32 " at index %" PRId64
                       " is out of range for the model's vocab_size %" PRIu32,
                       s->path, shard_token(s, (uint64_t)bad), bad, dl->o.vocab_size);
                return DATA_EVOCAB;
            }
        }
    }
    return 0;
}

int data_loader_batch(const struct data_loader *dl, int64_t step, int micro_step, int dp_rank,
                      int32_t *inputs, int32_t *targets, char *err, size_t errlen) {
    const int B = dl->o.B, T = dl->o.T;
    if (!inputs || !targets) {
        seterr(err, errlen, "invalid batch request: NULL buffer");
        return DATA_EINVAL;
    }
    int32_t *w = malloc((size_t)B * (T + 1) * sizeof *w);
    if (!w) {
        seterr(err, errlen, "out of memory");
        return DATA_EIO;
    }
    int rc = data_loader_window(dl, step, micro_step, dp_rank, w, err, errlen);
    if (rc == 0)
        for (int b = 0; b < B; b++) {
            memcpy(inputs + (size_t)b * T, w + (size_t)b * (T + 1), (size_t)T * sizeof *w);
            memcpy(targets + (size_t)b * T, w + (size_t)b * (T + 1) + 1, (size_t)T * sizeof *w);
            /* A masked target becomes -1, which every backend's classifier skips (no loss,
             * no gradient, not counted). */
            int64_t g = data_loader_sample(dl, step, micro_step, dp_rank, b);
            size_t si = shard_of(dl, g);
            const struct data_shard *s = &dl->shards[si];
            if (!s->mask) continue;
            const unsigned char *mk =
                s->mask + DATA_HEADER_BYTES + (uint64_t)(g - dl->first[si]) * (uint64_t)T + 1;
            for (int t = 0; t < T; t++)
                if (!mk[t]) targets[(size_t)b * T + t] = -1;
        }
    free(w);
    return rc;
}

int64_t data_loader_step_loss_tokens(const struct data_loader *dl, int64_t step) {
    const int T = dl->o.T;
    int64_t n = 0;
    if (step < 0) return -1;
    for (int m = 0; m < dl->o.grad_accum; m++)
        for (int r = 0; r < dl->o.dp_size; r++)
            for (int b = 0; b < dl->o.B; b++) {
                int64_t g = data_loader_sample(dl, step, m, r, b);
                size_t si = shard_of(dl, g);
                const struct data_shard *s = &dl->shards[si];
                if (!s->mask) {
                    n += T;
                    continue;
                }
                /* the mask bytes of the window's targets (its tokens 1..T) */
                const unsigned char *mk =
                    s->mask + DATA_HEADER_BYTES + (uint64_t)(g - dl->first[si]) * (uint64_t)T + 1;
                for (int t = 0; t < T; t++)
                    n += mk[t] != 0;
            }
    return n;
}

int data_meta_eos(const char *pattern, int64_t *eos, char *err, size_t errlen) {
    char **paths = NULL, mp[4200];
    size_t n = 0;
    int rc = data_glob(pattern, &paths, &n, err, errlen);
    if (rc != 0) return rc;
    const char *slash = strrchr(paths[0], '/');
    snprintf(mp, sizeof mp, "%.*smeta.json", slash ? (int)(slash - paths[0] + 1) : 0, paths[0]);
    data_paths_free(paths);
    json_error_t je;
    json_t *m = json_load_file(mp, 0, &je), *v = json_object_get(m, "eos_token");
    rc = json_is_integer(v) && json_integer_value(v) >= 0 ? 0 : DATA_EINVAL;
    if (rc == 0)
        *eos = (int64_t)json_integer_value(v);
    else
        seterr(err, errlen,
               "train.packing \"document\" needs the EOS id that ends each document: %s %s "
               "(write the shards with `loom-data prepare --tokenizer`, or let the job "
               "tokenize its data)",
               mp, m ? "has no integer \"eos_token\"" : "cannot be read");
    json_decref(m);
    return rc;
}

/* ---- position -------------------------------------------------------------- */

void data_loader_position(const struct data_loader *dl, int64_t step, struct data_position *pos) {
    memset(pos, 0, sizeof *pos);
    int64_t p = step * dl->G;
    pos->step = step;
    pos->epoch = p / dl->N;
    pos->sample_in_epoch = p % dl->N;
    pos->samples_consumed = p;
    pos->samples_per_epoch = dl->N;
    pos->samples_per_step = dl->G;
    pos->seed = dl->o.seed;
    pos->tokens = dl->tokens;
    pos->fingerprint = dl->fingerprint;
    pos->shards = (int64_t)dl->nshards;
}

static json_t *u64_json(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return json_string(buf);
}

json_t *data_position_to_json(const struct data_position *p) {
    return json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s:o,s:I}", "step", (json_int_t)p->step, "epoch",
        (json_int_t)p->epoch, "sample_in_epoch", (json_int_t)p->sample_in_epoch, "samples_consumed",
        (json_int_t)p->samples_consumed, "samples_per_epoch", (json_int_t)p->samples_per_epoch,
        "samples_per_step", (json_int_t)p->samples_per_step, "seed", u64_json(p->seed), "tokens",
        u64_json(p->tokens), "fingerprint", u64_json(p->fingerprint), "shards",
        (json_int_t)p->shards);
}

static int json_u64(const json_t *obj, const char *key, uint64_t *v) {
    const json_t *j = json_object_get(obj, key);
    if (json_is_integer(j) && json_integer_value(j) >= 0) {
        *v = (uint64_t)json_integer_value(j);
        return 0;
    }
    if (!json_is_string(j)) return -1;
    const char *s = json_string_value(j);
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-') return -1;
    *v = x;
    return 0;
}

int data_position_from_json(const json_t *obj, struct data_position *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    static const struct {
        const char *key;
        size_t off;
    } i64s[] = {
        {"step", offsetof(struct data_position, step)},
        {"epoch", offsetof(struct data_position, epoch)},
        {"sample_in_epoch", offsetof(struct data_position, sample_in_epoch)},
        {"samples_consumed", offsetof(struct data_position, samples_consumed)},
        {"samples_per_epoch", offsetof(struct data_position, samples_per_epoch)},
        {"samples_per_step", offsetof(struct data_position, samples_per_step)},
        {"shards", offsetof(struct data_position, shards)},
    };
    static const struct {
        const char *key;
        size_t off;
    } u64s[] = {
        {"seed", offsetof(struct data_position, seed)},
        {"tokens", offsetof(struct data_position, tokens)},
        {"fingerprint", offsetof(struct data_position, fingerprint)},
    };
    if (!json_is_object(obj)) {
        seterr(err, errlen, "data position: not a JSON object");
        return DATA_EINVAL;
    }
    for (size_t i = 0; i < sizeof i64s / sizeof *i64s; i++) {
        const json_t *j = json_object_get(obj, i64s[i].key);
        if (!json_is_integer(j) || json_integer_value(j) < 0) {
            seterr(err, errlen, "data position: \"%s\" missing or not a non-negative integer",
                   i64s[i].key);
            return DATA_EINVAL;
        }
        *(int64_t *)((char *)p + i64s[i].off) = json_integer_value(j);
    }
    for (size_t i = 0; i < sizeof u64s / sizeof *u64s; i++)
        if (json_u64(obj, u64s[i].key, (uint64_t *)((char *)p + u64s[i].off)) != 0) {
            seterr(err, errlen, "data position: \"%s\" missing or not an unsigned integer",
                   u64s[i].key);
            return DATA_EINVAL;
        }
    return 0;
}

int data_loader_check_position(const struct data_loader *dl, const struct data_position *pos,
                               char *err, size_t errlen) {
    struct data_position cur;
    data_loader_position(dl, pos->step, &cur);
    static const struct {
        const char *what;
        size_t off;
    } fields[] = {
        {"samples per epoch", offsetof(struct data_position, samples_per_epoch)},
        {"samples per step", offsetof(struct data_position, samples_per_step)},
        {"seed", offsetof(struct data_position, seed)},
        {"total tokens", offsetof(struct data_position, tokens)},
        {"fingerprint", offsetof(struct data_position, fingerprint)},
        {"shard count", offsetof(struct data_position, shards)},
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        uint64_t a, b;
        memcpy(&a, (const char *)pos + fields[i].off, 8);
        memcpy(&b, (const char *)&cur + fields[i].off, 8);
        if (a != b) {
            seterr(err, errlen,
                   "data changed since the checkpoint: %s was %" PRIu64 ", is now %" PRIu64,
                   fields[i].what, a, b);
            return DATA_EMISMATCH;
        }
    }
    return 0;
}
