/* Benchmark of the data area (not a ctest; run by hand, numbers go to
 * docs/perf.md): shard write, loader open with a full vocab scan, shuffled
 * batch reads, and a checkpoint save / verify / load of fp32 buffers.
 * Usage: bench_data [DIR] (default /tmp); writes ~100 MB of shard and
 * ~300 MB of checkpoint there and removes them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/data.h"

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    char shard[512], out[512], err[512] = "", cmd[1200];
    snprintf(shard, sizeof shard, "%s/bench_data_shard.bin", dir);
    snprintf(out, sizeof out, "%s/bench_data_ckpt", dir);
    log_init("bench_data", LOG_WARN);

    const size_t ntok = 50 * 1000 * 1000;
    uint32_t *tok = malloc(ntok * sizeof *tok);
    for (size_t i = 0; i < ntok; i++)
        tok[i] = (uint32_t)((i * 2654435761u) % 50257);
    double t0 = clock_mono_s();
    if (data_shard_write(shard, 1, tok, ntok, err, sizeof err) != 0)
        return fprintf(stderr, "%s\n", err), 1;
    double t1 = clock_mono_s();
    free(tok);
    printf("shard write: %zu tokens in %.3f s (%.0f Mtok/s, fsynced)\n", ntok, t1 - t0,
           ntok / (t1 - t0) / 1e6);

    struct data_loader_opts o = {.pattern = shard,
                                 .vocab_size = 50257,
                                 .B = 8,
                                 .T = 1024,
                                 .dp_size = 1,
                                 .grad_accum = 1,
                                 .seed = 1,
                                 .shuffle = 1,
                                 .token_check = DATA_CHECK_OPEN};
    struct data_loader *dl = NULL;
    t0 = clock_mono_s();
    if (data_loader_open(&o, &dl, err, sizeof err) != 0) return fprintf(stderr, "%s\n", err), 1;
    t1 = clock_mono_s();
    printf("loader open with vocab scan: %.3f s (%.0f Mtok/s)\n", t1 - t0, ntok / (t1 - t0) / 1e6);
    int32_t *in = malloc(8 * 1024 * 4), *tg = malloc(8 * 1024 * 4);
    const int steps = 2000;
    t0 = clock_mono_s();
    for (int s = 0; s < steps; s++)
        data_loader_batch(dl, s, 0, 0, in, tg, err, sizeof err);
    t1 = clock_mono_s();
    printf("shuffled batches B=8 T=1024: %d in %.3f s = %.0f Mtok/s (%.1f us per batch)\n", steps,
           t1 - t0, steps * 8192.0 / (t1 - t0) / 1e6, (t1 - t0) / steps * 1e6);
    data_loader_free(dl);
    free(in);
    free(tg);

    const size_t n = 25 * 1000 * 1000; /* 3 x 100 MB */
    float *p = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        p[i] = m[i] = v[i] = (float)i;
    struct ckpt_opts co = {.out_dir = out, .rank = 0, .world = 1, .keep = 1};
    struct ckpt_writer *w = NULL;
    char path[1024];
    t0 = clock_mono_s();
    ckpt_begin(&co, 1, &w, err, sizeof err);
    ckpt_add_f32(w, "params", p, n);
    ckpt_add_f32(w, "adam_m", m, n);
    ckpt_add_f32(w, "adam_v", v, n);
    if (ckpt_commit(w, NULL, path, sizeof path, err, sizeof err) != 0)
        return fprintf(stderr, "%s\n", err), 1;
    t1 = clock_mono_s();
    double mb = 3.0 * n * 4 / 1e6;
    printf("checkpoint save %.0f MB (SHA-256, fsync): %.3f s (%.0f MB/s)\n", mb, t1 - t0,
           mb / (t1 - t0));
    t0 = clock_mono_s();
    int64_t step;
    int found = ckpt_find_latest(out, 1, path, sizeof path, &step);
    t1 = clock_mono_s();
    printf("find_latest + verify: %.3f s (%.0f MB/s) found=%d\n", t1 - t0, mb / (t1 - t0), found);
    struct ckpt_reader *r = NULL;
    t0 = clock_mono_s();
    ckpt_open(path, 0, &r, err, sizeof err);
    ckpt_read_f32(r, "params", p, n, err, sizeof err);
    ckpt_read_f32(r, "adam_m", m, n, err, sizeof err);
    ckpt_read_f32(r, "adam_v", v, n, err, sizeof err);
    t1 = clock_mono_s();
    printf("open (verifies shard) + load: %.3f s (%.0f MB/s)\n", t1 - t0, mb / (t1 - t0));
    ckpt_close(r);
    free(p);
    free(m);
    free(v);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", out, shard);
    return system(cmd);
}
