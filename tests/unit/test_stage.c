/* Unit tests of data staging (agent/stage.c): a glob of shards and a val file
 * are copied into the cache, the spec is rewritten to a view that expands to
 * the same names in the same order, the staged bytes equal the sources
 * (SHA-256), a second job hits the cache (nothing copied), equal content under
 * another path is shared, a changed source is copied again, LRU eviction
 * keeps the current job's files within the size limit, and bad patterns
 * leave the spec untouched. */
#include "agent/stage.h"
#include "tests/check.h"

#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void write_file(const char *path, size_t n, unsigned seed) {
    FILE *f = fopen(path, "wb");
    for (size_t i = 0; i < n; i++)
        fputc((int)((i * 131 + seed * 7919) % 251), f);
    fclose(f);
}

static json_t *spec_for(const char *train, const char *val) {
    json_t *s = json_pack("{s:{s:s}}", "data", "train", train);
    if (val) json_object_set_new(json_object_get(s, "data"), "val", json_string(val));
    return s;
}

static int count_blobs(const char *cache) {
    char pat[600];
    snprintf(pat, sizeof pat, "%s/blobs/*", cache);
    glob_t g;
    int n = glob(pat, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    globfree(&g);
    return n;
}

int main(void) {
    char root[] = "/tmp/loom-stage-test.XXXXXX";
    if (!mkdtemp(root)) return 1;
    char src[300], cache[300], p[700], q[600];
    snprintf(src, sizeof src, "%s/src", root);
    snprintf(cache, sizeof cache, "%s/cache", root);
    mkdir(src, 0755);
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/train_%03d.bin", src, i);
        write_file(p, 100000 + (size_t)i * 1000, (unsigned)i);
    }
    snprintf(p, sizeof p, "%s/val_000.bin", src);
    write_file(p, 5000, 9);
    snprintf(p, sizeof p, "%s/train_*.bin", src);
    snprintf(q, sizeof q, "%s/val_000.bin", src);

    /* 1. first job copies everything */
    struct stage_opts o = {cache, 0};
    struct stage_report r;
    char err[512] = "";
    json_t *s1 = spec_for(p, q);
    CHECK(stage_spec(&o, "j-1", s1, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.files == 4 && r.hits == 0 && r.copied == 308000 && r.bytes == 308000,
          "files %d hits %d copied %lld", r.files, r.hits, r.copied);
    const char *nt = json_string_value(json_object_get(json_object_get(s1, "data"), "train"));
    CHECK(nt && strstr(nt, "/views/j-1/train/train_*.bin"), "rewritten: %s", nt ? nt : "-");
    glob_t g;
    CHECK(nt && glob(nt, 0, NULL, &g) == 0 && g.gl_pathc == 3, "view expands to 3 files");
    for (size_t i = 0; nt && i < g.gl_pathc && i < 3; i++) {
        char a[65], b[65], orig[600];
        snprintf(orig, sizeof orig, "%s/train_%03zu.bin", src, i);
        CHECK(strstr(g.gl_pathv[i], orig + strlen(src)) != NULL, "order/name %s", g.gl_pathv[i]);
        CHECK(stage_file_sha256(g.gl_pathv[i], a) == 0 && stage_file_sha256(orig, b) == 0 &&
                  !strcmp(a, b),
              "staged bytes equal the source for %s", orig);
    }
    if (nt) globfree(&g);
    CHECK(count_blobs(cache) == 4, "4 blobs");

    /* 2. a second job with the same data: all hits, nothing copied */
    json_t *s2 = spec_for(p, q);
    CHECK(stage_spec(&o, "j-2", s2, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.files == 4 && r.hits == 4 && r.copied == 0, "hits %d copied %lld", r.hits, r.copied);

    /* 3. the same content under another path is shared by content */
    char dup[600];
    snprintf(dup, sizeof dup, "%s/copy_of_val.bin", src);
    write_file(dup, 5000, 9);
    json_t *s3 = spec_for(dup, NULL);
    CHECK(stage_spec(&o, "j-3", s3, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.files == 1 && r.hits == 1 && r.copied == 0 && count_blobs(cache) == 4,
          "dedup by content: hits %d blobs %d", r.hits, count_blobs(cache));

    /* 4. a changed source is copied again */
    snprintf(q, sizeof q, "%s/train_001.bin", src);
    write_file(q, 101000, 42);
    json_t *s4 = spec_for(p, NULL);
    CHECK(stage_spec(&o, "j-4", s4, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.hits == 2 && r.copied == 101000, "changed file recopied: hits %d copied %lld", r.hits,
          r.copied);

    /* 5. LRU: with a 250 kB limit only this job's files (and nothing older) fit */
    struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    snprintf(q, sizeof q, "%s/blobs", cache);
    glob_t bg;
    snprintf(p, sizeof p, "%s/*", q);
    if (glob(p, 0, NULL, &bg) == 0) {
        for (size_t i = 0; i < bg.gl_pathc; i++)
            utimensat(AT_FDCWD, bg.gl_pathv[i], old, 0);
        globfree(&bg);
    }
    struct stage_opts small = {cache, 250000};
    snprintf(p, sizeof p, "%s/val_000.bin", src);
    json_t *s5 = spec_for(p, NULL);
    CHECK(stage_spec(&small, "j-5", s5, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.evicted >= 2 && r.cache_bytes <= 250000, "evicted %d, cache %lld", r.evicted,
          r.cache_bytes);
    const char *v5 = json_string_value(json_object_get(json_object_get(s5, "data"), "train"));
    char a[65];
    CHECK(v5 && stage_file_sha256(v5, a) == 0, "the current job's file survived eviction");

    /* 6. errors leave the spec untouched */
    static const char *const bad[] = {"/nonexistent/train_*.bin", "relative.bin",
                                      "/tmp/*/train.bin"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *sb = spec_for(bad[i], NULL);
        err[0] = 0;
        CHECK(stage_spec(&o, "j-bad", sb, &r, err, sizeof err) != 0 && err[0], "%s accepted",
              bad[i]);
        CHECK(!strcmp(json_string_value(json_object_get(json_object_get(sb, "data"), "train")),
                      bad[i]),
              "spec changed on error");
        json_decref(sb);
    }
    json_t *sj = spec_for(p, NULL);
    CHECK(stage_spec(&o, "../x", sj, &r, err, sizeof err) != 0, "job id with a slash refused");
    json_decref(sj);

    json_decref(s1);
    json_decref(s2);
    json_decref(s3);
    json_decref(s4);
    json_decref(s5);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (!check_failures && system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    if (!check_failures) printf("test_stage: ok\n");
    return check_failures ? 1 : 0;
}
