/* safetensors reader and writer (format described in safetensors.h).
 *
 * The writer builds the JSON header first (offsets follow from the shapes),
 * then streams every tensor through a 1 MiB staging buffer that also feeds
 * SHA-256, converting F32 -> BF16 and transposing where asked, so a tensor is
 * never copied whole. The reader validates the complete header before any
 * tensor is used: a file whose ranges overlap, leave holes or do not end at
 * the end of the file is refused. Assumes a little-endian host. */
#include "worker/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "api/model.h"

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */
#define STAGE_BYTES   (1u << 20)

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_NDTYPES] = {
    [ST_F64] = {"F64", 8},   [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
    [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2}, [ST_I8] = {"I8", 1},
    [ST_U64] = {"U64", 8},   [ST_U32] = {"U32", 4}, [ST_U16] = {"U16", 2}, [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(enum st_dtype d) {
    return (unsigned)d < ST_NDTYPES ? dtypes[d].name : NULL;
}

size_t st_dtype_size(enum st_dtype d) {
    return (unsigned)d < ST_NDTYPES ? dtypes[d].size : 0;
}

int st_dtype_parse(const char *name) {
    for (int i = 0; name && i < ST_NDTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0) return i;
    return -1;
}

uint16_t st_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float st_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t st_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (a < 0x38800000u) { /* fp16 subnormal or zero: value / 2^-24, rounded to even */
        if (a < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14 .. 24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u; /* rebias the exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e) {
        u = sign | ((e + 112) << 23) | (m << 13);
    } else if (m) { /* subnormal: normalise */
        int k = 0;
        while (!(m & 0x400u)) {
            m <<= 1;
            k++;
        }
        u = sign | ((uint32_t)(113 - k) << 23) | ((m & 0x3ffu) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void st_hex(const unsigned char sha256[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[sha256[i] >> 4];
        hex[2 * i + 1] = digits[sha256[i] & 15];
    }
    hex[64] = '\0';
}

/* Elements of a shape, or -1 on a negative dimension or overflow. */
static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

/* ---- writing --------------------------------------------------------------- */

struct sink {
    int fd;
    EVP_MD_CTX *md;
    uint64_t bytes;
};

static int sink_write(struct sink *s, const void *p, size_t n) {
    const char *c = p;
    if (EVP_DigestUpdate(s->md, p, n) != 1) return -1;
    while (n) {
        ssize_t w = write(s->fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
        s->bytes += (uint64_t)w;
    }
    return 0;
}

/* Write one tensor's bytes (converted / transposed as asked). */
static int write_tensor(struct sink *s, const struct st_tensor *t, unsigned char *stage) {
    int64_t n = numel(t->ndim, t->shape);
    size_t ssz = st_dtype_size(t->src_dtype), dsz = st_dtype_size(t->dtype);
    int convert = t->src_dtype != t->dtype;
    if (!convert && !t->transpose) return sink_write(s, t->data, (size_t)n * ssz);
    const unsigned char *src = t->data;
    size_t per = STAGE_BYTES / dsz, k = 0;
    int64_t rows = t->transpose ? t->shape[0] : 1, cols = t->transpose ? t->shape[1] : n;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            /* Element (i, j) of the file comes from memory (j, i) when transposed. */
            size_t from = t->transpose ? (size_t)(j * rows + i) : (size_t)j;
            const unsigned char *e = src + from * ssz;
            if (convert) {
                float f;
                memcpy(&f, e, 4);
                uint16_t h = t->dtype == ST_F16 ? st_f32_to_f16(f) : st_f32_to_bf16(f);
                memcpy(stage + k * dsz, &h, 2);
            } else {
                memcpy(stage + k * dsz, e, dsz);
            }
            if (++k == per) {
                if (sink_write(s, stage, k * dsz) != 0) return -1;
                k = 0;
            }
        }
    return k ? sink_write(s, stage, k * dsz) : 0;
}

static int check_tensor(const struct st_tensor *t, char *err, size_t errlen) {
    const char *name = t->name ? t->name : "(null)";
    if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0) {
        seterr(err, errlen, "invalid tensor name \"%s\"", name);
        return ST_EINVAL;
    }
    if (!st_dtype_name(t->dtype) || !st_dtype_name(t->src_dtype) ||
        (t->src_dtype != t->dtype &&
         !(t->src_dtype == ST_F32 && (t->dtype == ST_BF16 || t->dtype == ST_F16)))) {
        seterr(err, errlen, "tensor %s: unsupported dtype conversion %d -> %d", name,
               (int)t->src_dtype, (int)t->dtype);
        return ST_EINVAL;
    }
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || numel(t->ndim, t->shape) < 0 ||
        (t->transpose && t->ndim != 2)) {
        seterr(err, errlen, "tensor %s: invalid shape (ndim %d%s)", name, t->ndim,
               t->transpose ? ", transpose needs 2 dims" : "");
        return ST_EINVAL;
    }
    if (!t->data && numel(t->ndim, t->shape) > 0) {
        seterr(err, errlen, "tensor %s: NULL data", name);
        return ST_EINVAL;
    }
    return 0;
}

/* The header JSON, padded with spaces to a multiple of 8 (with the length
 * prefix). Returns a malloc'ed string and its length, or NULL. */
static char *build_header(const struct st_tensor *t, size_t n, const json_t *metadata, size_t *len,
                          char *err, size_t errlen) {
    json_t *h = json_object();
    char *s = NULL, *out = NULL;
    if (!h) goto out;
    if (metadata) {
        const char *k;
        json_t *v;
        if (!json_is_object(metadata)) {
            seterr(err, errlen, "metadata must be a JSON object of strings");
            goto out;
        }
        json_object_foreach((json_t *)metadata, k, v) {
            if (!json_is_string(v)) {
                seterr(err, errlen, "metadata \"%s\" is not a string", k);
                goto out;
            }
        }
        json_object_set(h, "__metadata__", (json_t *)metadata);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (json_object_get(h, t[i].name)) {
            seterr(err, errlen, "duplicate tensor name \"%s\"", t[i].name);
            goto out;
        }
        uint64_t bytes = (uint64_t)numel(t[i].ndim, t[i].shape) * st_dtype_size(t[i].dtype);
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", st_dtype_name(t[i].dtype),
                                      "shape", shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + bytes)));
        off += bytes;
    }
    s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) goto out;
    size_t sl = strlen(s), pad = (8 - (8 + sl) % 8) % 8;
    out = malloc(sl + pad + 1);
    if (!out) goto out;
    memcpy(out, s, sl);
    memset(out + sl, ' ', pad);
    out[sl + pad] = '\0';
    *len = sl + pad;
out:
    if (!out && err && !*err) seterr(err, errlen, "out of memory building the header");
    free(s);
    json_decref(h);
    return out;
}

int st_write(const char *path, const struct st_tensor *t, size_t n, const json_t *metadata,
             unsigned char sha256[32], uint64_t *bytes, char *err, size_t errlen) {
    int rc = ST_EIO;
    char *header = NULL, *tmp = NULL;
    unsigned char *stage = NULL;
    struct sink s = {.fd = -1};
    if (err && errlen) err[0] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((rc = check_tensor(&t[i], err, errlen)) != 0) return rc;
    rc = ST_EINVAL;
    size_t hlen = 0;
    header = build_header(t, n, metadata, &hlen, err, errlen);
    if (!header) goto out;
    rc = ST_EIO;
    size_t pl = strlen(path);
    tmp = malloc(pl + 5);
    stage = malloc(STAGE_BYTES);
    s.md = EVP_MD_CTX_new();
    if (!tmp || !stage || !s.md || EVP_DigestInit_ex(s.md, EVP_sha256(), NULL) != 1) {
        seterr(err, errlen, "out of memory");
        goto out;
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    s.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (s.fd < 0) {
        seterr(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    uint64_t le = hlen; /* little-endian host */
    if (sink_write(&s, &le, 8) != 0 || sink_write(&s, header, hlen) != 0) goto werr;
    for (size_t i = 0; i < n; i++)
        if (write_tensor(&s, &t[i], stage) != 0) goto werr;
    if (fsync(s.fd) != 0) goto werr;
    if (close(s.fd) != 0) {
        s.fd = -1;
        goto werr;
    }
    s.fd = -1;
    if (rename(tmp, path) != 0) {
        seterr(err, errlen, "%s: rename failed: %s", path, strerror(errno));
        goto out;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(s.md, md, &mdlen);
    if (sha256) memcpy(sha256, md, 32);
    if (bytes) *bytes = s.bytes;
    rc = 0;
    goto out;
werr:
    seterr(err, errlen, "%s: write failed: %s", tmp, strerror(errno ? errno : EIO));
out:
    if (s.fd >= 0) close(s.fd);
    if (rc != 0 && tmp) unlink(tmp);
    EVP_MD_CTX_free(s.md);
    free(stage);
    free(header);
    free(tmp);
    return rc;
}

/* ---- reading --------------------------------------------------------------- */

struct st_file {
    int fd;
    void *map; /* whole-file read-only mapping (st_data), or NULL */
    size_t map_size;
    char *path;
    struct st_info *infos; /* sorted by offset */
    size_t n;
    json_t *header; /* owns the names */
};

void st_close(struct st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->infos);
    json_decref(f->header);
    free(f);
}

static int cmp_offset(const void *a, const void *b) {
    const struct st_info *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static int parse_entry(const char *path, const char *name, json_t *v, struct st_info *info,
                       uint64_t data_start, char *err, size_t errlen) {
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    int d = json_is_string(dt) ? st_dtype_parse(json_string_value(dt)) : -1;
    if (json_is_string(dt) && d < 0) {
        seterr(err, errlen, "%s: tensor \"%s\": bad header entry (unknown dtype \"%s\")", path,
               name, json_string_value(dt));
        return ST_EDTYPE;
    }
    if (!json_is_object(v) || d < 0 || !json_is_array(shape) ||
        json_array_size(shape) > ST_MAX_DIMS || !json_is_array(offs) ||
        json_array_size(offs) != 2) {
        seterr(err, errlen, "%s: tensor \"%s\": bad header entry (dtype, shape or data_offsets)",
               path, name);
        return ST_EFORMAT;
    }
    memset(info, 0, sizeof *info);
    info->name = name;
    info->dtype = (enum st_dtype)d;
    info->ndim = (int)json_array_size(shape);
    for (int i = 0; i < info->ndim; i++) {
        json_t *x = json_array_get(shape, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0) {
            seterr(err, errlen, "%s: tensor \"%s\": bad shape", path, name);
            return ST_EFORMAT;
        }
        info->shape[i] = json_integer_value(x);
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    int64_t ne = numel(info->ndim, info->shape);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b) || ne < 0 ||
        (uint64_t)(json_integer_value(e) - json_integer_value(b)) !=
            (uint64_t)ne * st_dtype_size(info->dtype)) {
        seterr(err, errlen,
               "%s: tensor \"%s\": data_offsets do not match dtype %s and shape (%" PRId64
               " elements)",
               path, name, st_dtype_name(info->dtype), ne);
        return ST_EFORMAT;
    }
    info->offset = data_start + (uint64_t)json_integer_value(b);
    info->nbytes = (uint64_t)(json_integer_value(e) - json_integer_value(b));
    return 0;
}

int st_open(const char *path, struct st_file **out, char *err, size_t errlen) {
    int rc = ST_EIO;
    char *hbuf = NULL;
    struct st_file *f = calloc(1, sizeof *f);
    *out = NULL;
    if (!f || !(f->path = strdup(path))) {
        seterr(err, errlen, "out of memory");
        goto out;
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        seterr(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size, hlen = 0;
    rc = ST_EHEADER;
    if (size < 8 || pread(f->fd, &hlen, 8, 0) != 8) {
        seterr(err, errlen, "%s: not a safetensors file: %" PRIu64 " bytes", path, size);
        goto out;
    }
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > size - 8) {
        seterr(err, errlen,
               "%s: not a safetensors file or truncated: header length %" PRIu64 ", file %" PRIu64
               " bytes",
               path, hlen, size);
        goto out;
    }
    rc = ST_EFORMAT;
    hbuf = malloc(hlen);
    if (!hbuf || pread(f->fd, hbuf, hlen, 8) != (ssize_t)hlen) {
        seterr(err, errlen, "%s: cannot read the header", path);
        rc = ST_EIO;
        goto out;
    }
    json_error_t je;
    f->header = json_loadb(hbuf, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(f->header)) {
        seterr(err, errlen, "%s: header is not a JSON object (%s)", path, je.text);
        goto out;
    }
    json_t *meta = json_object_get(f->header, "__metadata__");
    if (meta) {
        const char *k;
        json_t *v;
        int ok = json_is_object(meta);
        if (ok) json_object_foreach(meta, k, v) ok &= json_is_string(v);
        if (!ok) {
            seterr(err, errlen, "%s: __metadata__ must be an object of strings", path);
            goto out;
        }
    }
    size_t cap = json_object_size(f->header);
    f->infos = calloc(cap ? cap : 1, sizeof *f->infos);
    if (!f->infos) {
        rc = ST_EIO;
        goto out;
    }
    uint64_t data_start = 8 + hlen;
    const char *k;
    json_t *v;
    json_object_foreach(f->header, k, v) {
        if (strcmp(k, "__metadata__") == 0) continue;
        if ((rc = parse_entry(path, k, v, &f->infos[f->n], data_start, err, errlen)) != 0) goto out;
        f->n++;
    }
    rc = ST_EFORMAT;
    qsort(f->infos, f->n, sizeof *f->infos, cmp_offset);
    uint64_t at = data_start;
    for (size_t i = 0; i < f->n; i++) {
        if (f->infos[i].offset != at) {
            seterr(err, errlen,
                   "%s: tensor \"%s\" starts at data offset %" PRIu64 ", expected %" PRIu64
                   " (overlap or hole)",
                   path, f->infos[i].name, f->infos[i].offset - data_start, at - data_start);
            goto out;
        }
        at += f->infos[i].nbytes;
    }
    if (at != size) {
        seterr(err, errlen,
               "%s: %s: tensors end at byte %" PRIu64 " but the file has %" PRIu64 " bytes", path,
               at > size ? "truncated" : "trailing bytes", at, size);
        goto out;
    }
    *out = f;
    f = NULL;
    rc = 0;
out:
    free(hbuf);
    st_close(f);
    return rc;
}

size_t st_count(const struct st_file *f) {
    return f->n;
}

const struct st_info *st_at(const struct st_file *f, size_t i) {
    return i < f->n ? &f->infos[i] : NULL;
}

const struct st_info *st_find(const struct st_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->infos[i].name, name) == 0) return &f->infos[i];
    return NULL;
}

const void *st_data(struct st_file *f, const struct st_info *in, char *err, size_t errlen) {
    if (!f->map) {
        struct stat st;
        if (fstat(f->fd, &st) != 0 || st.st_size <= 0) {
            seterr(err, errlen, "%s: cannot stat: %s", f->path, strerror(errno));
            return NULL;
        }
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, f->fd, 0);
        if (p == MAP_FAILED) {
            seterr(err, errlen, "%s: cannot map: %s", f->path, strerror(errno));
            return NULL;
        }
        f->map = p;
        f->map_size = (size_t)st.st_size;
    }
    if (in->offset + in->nbytes > f->map_size) {
        seterr(err, errlen, "%s: tensor \"%s\" lies past the end of the mapping", f->path,
               in->name);
        return NULL;
    }
    return (const unsigned char *)f->map + in->offset;
}

void st_release(struct st_file *f, const struct st_info *in) {
    if (!f->map || in->nbytes == 0) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)f->map + in->offset, b = a + in->nbytes;
    a = a / page * page; /* the pages a tensor touches, shared edges included (re-read on use) */
    b = (b + page - 1) / page * page;
    madvise((void *)a, b - a, MADV_DONTNEED);
}

const json_t *st_metadata(const struct st_file *f) {
    return json_object_get(f->header, "__metadata__");
}

static int read_at(int fd, void *dst, size_t n, uint64_t off) {
    char *p = dst;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int st_read(const struct st_file *f, const char *name, enum st_dtype dtype, void *dst,
            size_t dst_bytes, char *err, size_t errlen) {
    const struct st_info *in = st_find(f, name);
    if (!in) {
        seterr(err, errlen, "%s: no tensor \"%s\"", f->path, name);
        return ST_ENOTFOUND;
    }
    int convert = in->dtype == ST_BF16 && dtype == ST_F32;
    if (in->dtype != dtype && !convert) {
        seterr(err, errlen, "%s: tensor \"%s\" is %s, cannot read as %s", f->path, name,
               st_dtype_name(in->dtype), st_dtype_name(dtype) ? st_dtype_name(dtype) : "?");
        return ST_EINVAL;
    }
    uint64_t want = convert ? in->nbytes * 2 : in->nbytes;
    if (dst_bytes != want) {
        seterr(err, errlen, "%s: tensor \"%s\" has %" PRIu64 " bytes as %s, buffer has %zu",
               f->path, name, want, st_dtype_name(dtype), dst_bytes);
        return ST_EINVAL;
    }
    if (!convert) {
        if (read_at(f->fd, dst, in->nbytes, in->offset) != 0) goto ioerr;
        return 0;
    }
    /* BF16 -> F32 through a small staging buffer. */
    uint16_t h[4096];
    float *o = dst;
    for (uint64_t i = 0, n = in->nbytes / 2; i < n;) {
        uint64_t m = n - i < 4096 ? n - i : 4096;
        if (read_at(f->fd, h, m * 2, in->offset + i * 2) != 0) goto ioerr;
        for (uint64_t j = 0; j < m; j++)
            o[i + j] = st_bf16_to_f32(h[j]);
        i += m;
    }
    return 0;
ioerr:
    seterr(err, errlen, "%s: cannot read tensor \"%s\": %s", f->path, name,
           errno ? strerror(errno) : "short read");
    return ST_EIO;
}

int st_sha256_file(const char *path, char hex[65], uint64_t *bytes, char *err, size_t errlen) {
    int rc = ST_EIO;
    unsigned char *buf = malloc(STAGE_BYTES);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint64_t total = 0;
    if (fd < 0) {
        seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    if (!buf || !md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        seterr(err, errlen, "out of memory");
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf, STAGE_BYTES);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            seterr(err, errlen, "%s: read failed: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0) break;
        EVP_DigestUpdate(md, buf, (size_t)r);
        total += (uint64_t)r;
    }
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    EVP_DigestFinal_ex(md, d, &dl);
    st_hex(d, hex);
    if (bytes) *bytes = total;
    rc = 0;
out:
    if (fd >= 0) close(fd);
    EVP_MD_CTX_free(md);
    free(buf);
    return rc;
}

/* ---- model export ---------------------------------------------------------- */

int st_export_model(const char *path, const struct model_config *c,
                    const struct model_layout *layout, const float *params, enum st_dtype dtype,
                    const json_t *metadata, char *err, size_t errlen) {
    if (!c || !layout || !params || layout->tp != 1 || (dtype != ST_F32 && dtype != ST_BF16)) {
        seterr(err, errlen, "export: needs a tp = 1 layout, parameters and dtype F32 or BF16");
        return ST_EINVAL;
    }
    struct st_tensor *t = calloc((size_t)layout->n, sizeof *t);
    json_t *md = json_object();
    int rc = ST_EIO;
    size_t n = 0;
    if (!t || !md) {
        seterr(err, errlen, "out of memory");
        goto out;
    }
    if (json_is_object(metadata)) json_object_update(md, (json_t *)metadata);
    json_object_set_new(md, "format", json_string("pt"));
    for (int i = 0; i < layout->n; i++) {
        const struct model_tensor *mt = &layout->t[i];
        struct st_tensor *o = &t[n];
        o->name = mt->name;
        o->dtype = dtype;
        o->src_dtype = ST_F32;
        o->data = params + mt->offset;
        o->ndim = mt->ndim;
        o->shape[0] = mt->shape[0];
        o->shape[1] = mt->shape[1];
        if (mt->kind == MODEL_T_EMBED || mt->kind == MODEL_T_LM_HEAD) {
            /* Rows are [padded_vocab, d]; the first vocab_size rows are the real ones. */
            if (mt->kind == MODEL_T_LM_HEAD && c->tied_embeddings) continue;
            o->shape[0] = c->vocab_size;
        } else if (mt->kind == MODEL_T_LINEAR_W && c->family == MODEL_GPT2) {
            o->shape[0] = mt->shape[1]; /* file [in, out] from memory [out, in] */
            o->shape[1] = mt->shape[0];
            o->transpose = 1;
        }
        n++;
    }
    rc = st_write(path, t, n, md, NULL, NULL, err, errlen);
out:
    json_decref(md);
    free(t);
    return rc;
}
