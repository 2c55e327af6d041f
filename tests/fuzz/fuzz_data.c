/* Deterministic mutation fuzzing of the file parsers that read untrusted
 * input: st_open / st_read (safetensors, checkpoint shards) and the .bin shard
 * loader. A valid file is mutated (byte flips, JSON-significant bytes, length
 * prefix changes, truncation, appended bytes) a few thousand times with a fixed
 * seed; every result must be either refused with a message or accepted with
 * consistent invariants (ranges inside the file, back to back, reads succeed).
 * Run under the sanitizer build (label sanitize) it also catches memory errors.
 * Usage: fuzz_data [iterations] (default 2000). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/data.h"
#include "worker/safetensors.h"
#include "tests/check.h"

static uint64_t rng = 0x243f6a8885a308d3ULL;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static unsigned char *load(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 64);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

static void save(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

/* Mutate b[0..*n) in place (capacity *n + 64). */
static void mutate(unsigned char *b, size_t *n, size_t header_end) {
    static const char specials[] = "{}[]\",:0123456789-e.";
    int k = 1 + (int)(next() % 4);
    for (int i = 0; i<k && * n> 0; i++) {
        size_t at = (size_t)(next() % (next() % 2 ? header_end : *n));
        switch (next() % 6) {
        case 0:
            b[at] ^= (unsigned char)(1u << (next() % 8));
            break;
        case 1:
            b[at] = (unsigned char)specials[next() % (sizeof specials - 1)];
            break;
        case 2: /* length prefix / header field */
            b[next() % 8] = (unsigned char)next();
            break;
        case 3:
            *n = at;
            break;
        case 4: {
            size_t add = next() % 16;
            for (size_t j = 0; j < add; j++)
                b[*n + j] = (unsigned char)next();
            *n += add;
            break;
        }
        default:
            b[at] = (unsigned char)next();
        }
    }
}

static void fuzz_safetensors(const char *dir, int iters) {
    char path[600], mpath[600], err[512];
    snprintf(path, sizeof path, "%s/valid.safetensors", dir);
    snprintf(mpath, sizeof mpath, "%s/mut.safetensors", dir);
    float a[12], b[5];
    for (int i = 0; i < 12; i++)
        a[i] = (float)i;
    for (int i = 0; i < 5; i++)
        b[i] = -(float)i;
    int64_t c = 42;
    struct st_tensor t[] = {
        {.name = "a", .dtype = ST_F32, .src_dtype = ST_F32, .ndim = 2, .shape = {3, 4}, .data = a},
        {.name = "b.bf", .dtype = ST_BF16, .src_dtype = ST_F32, .ndim = 1, .shape = {5}, .data = b},
        {.name = "c", .dtype = ST_I64, .src_dtype = ST_I64, .ndim = 0, .data = &c},
    };
    json_t *md = json_pack("{s:s}", "format", "pt");
    CHECK(st_write(path, t, 3, md, NULL, NULL, err, sizeof err) == 0);
    json_decref(md);
    size_t n0;
    unsigned char *orig = load(path, &n0);
    uint64_t hlen;
    memcpy(&hlen, orig, 8);
    unsigned char *buf = malloc(n0 + 64 * 8);
    int accepted = 0;
    for (int it = 0; it < iters; it++) {
        size_t n = n0;
        memcpy(buf, orig, n0);
        mutate(buf, &n, 8 + (size_t)hlen);
        save(mpath, buf, n);
        struct st_file *f = NULL;
        err[0] = '\0';
        int rc = st_open(mpath, &f, err, sizeof err);
        if (rc != 0) {
            CHECK(f == NULL && err[0] != '\0');
            continue;
        }
        accepted++;
        /* Accepted: ranges back to back inside the file, every tensor readable. */
        uint64_t end = 0;
        for (size_t i = 0; i < st_count(f); i++) {
            const struct st_info *in = st_at(f, i);
            CHECK(in->offset + in->nbytes <= n);
            if (i > 0) CHECK(in->offset == end);
            end = in->offset + in->nbytes;
            void *dst = malloc(in->nbytes ? in->nbytes : 1);
            CHECK(st_read(f, in->name, in->dtype, dst, in->nbytes, err, sizeof err) == 0);
            free(dst);
        }
        if (st_count(f) > 0) CHECK(end == n);
        st_close(f);
    }
    printf("safetensors: %d mutations, %d accepted\n", iters, accepted);
    free(buf);
    free(orig);
}

static void fuzz_shards(const char *dir, int iters) {
    char path[600], mpath[600], err[512];
    snprintf(path, sizeof path, "%s/valid.bin", dir);
    snprintf(mpath, sizeof mpath, "%s/mut.bin", dir);
    uint32_t tok[300];
    for (int i = 0; i < 300; i++)
        tok[i] = (uint32_t)(i * 7 % 256);
    CHECK(data_shard_write(path, 1, tok, 300, err, sizeof err) == 0);
    size_t n0;
    unsigned char *orig = load(path, &n0);
    unsigned char *buf = malloc(n0 + 64 * 8);
    int accepted = 0;
    for (int it = 0; it < iters; it++) {
        size_t n = n0;
        memcpy(buf, orig, n0);
        /* Mutate the header fields (magic, version, count) or the size. */
        mutate(buf, &n, 12);
        save(mpath, buf, n);
        struct data_loader_opts o = {.pattern = mpath,
                                     .vocab_size = 256,
                                     .B = 2,
                                     .T = 16,
                                     .dp_size = 2,
                                     .grad_accum = 1,
                                     .shuffle = 1,
                                     .token_check = (int)(next() % 3)};
        struct data_loader *dl = NULL;
        err[0] = '\0';
        int rc = data_loader_open(&o, &dl, err, sizeof err);
        if (rc != 0) {
            CHECK(dl == NULL && err[0] != '\0');
            continue;
        }
        accepted++;
        int32_t in[32], tg[32];
        for (int64_t s = 0; s < 20; s++)
            for (int r = 0; r < 2; r++) {
                int brc = data_loader_batch(dl, s, 0, r, in, tg, err, sizeof err);
                CHECK(brc == 0 || brc == DATA_EVOCAB);
            }
        data_loader_free(dl);
    }
    printf("shards: %d mutations, %d accepted\n", iters, accepted);
    free(buf);
    free(orig);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    /* Thousands of small files: prefer tmpfs. */
    char dir[64];
    snprintf(dir, sizeof dir, "%s/loom_fuzz_data_XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) return 1;
    fuzz_safetensors(dir, iters);
    fuzz_shards(dir, iters);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("fuzz_data");
}
