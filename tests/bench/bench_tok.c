/* Benchmark (not a test) of Loom's tokenizer encode speed.
 *
 *   bench_tok TOKENIZER TEXT [THREADS...]      e.g. bench_tok gpt2.json corpus.txt 1 2
 *
 * TEXT is cut into chunks of about 64 KiB, each ending before a line that starts with an ASCII
 * letter (a pre-token boundary of the GPT-2 and Llama 3 regexes, so chunked encoding gives
 * the ids of encoding the whole text; the ids are compared with the one-thread run). For each
 * thread count the chunks are dealt round-robin to pthreads, each with its own encoder
 * (tok_enc_new), after an untimed warm-up over the first 16 chunks. Prints one JSON line per
 * thread count: bytes, tokens, wall seconds and MB/s (10^6 bytes), and the process's CPU
 * seconds and MB per CPU-second (what a loaded machine does not distort), then one line
 *   RESULT bench_tok impl=loom threads=N mb_per_s=X speedup=S ...
 * per thread count (S: MB/s over the first thread count's). tests/bench/bench_tok.sh runs it
 * beside the JS tokenizers, tests/gpu/device/bench_tok.sh on 1-16 threads; results in
 * docs/perf.md. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/tok.h"

struct chunk {
    size_t off, len;
};

struct job {
    struct tok *t;
    const char *text;
    const struct chunk *chunks;
    size_t nchunks;
    int tid, nthreads;
    struct tok_ids *out; /* one per chunk */
    int failed;
};

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
    struct job *j = arg;
    struct tok_enc *e = tok_enc_new(j->t);
    char err[1024];
    if (!e) {
        j->failed = 1;
        return NULL;
    }
    for (size_t c = (size_t)j->tid; c < j->nchunks; c += (size_t)j->nthreads) {
        /* Encode into a local array and hand it over once: the out[] entries of neighbouring
         * chunks share cache lines, and every push updates n. */
        struct tok_ids ids = j->out[c];
        ids.n = 0;
        int rc = tok_encode_with(e, j->text + j->chunks[c].off, j->chunks[c].len, 0, &ids, err,
                                 sizeof err);
        j->out[c] = ids;
        if (rc != 0) {
            fprintf(stderr, "bench_tok: %s\n", err);
            j->failed = 1;
            break;
        }
    }
    tok_enc_free(e);
    return NULL;
}

static int run(struct tok *t, const char *text, const struct chunk *ch, size_t nch, int nthreads,
               struct tok_ids *out, double *secs, double *cpu) {
    /* A fresh encoder per run: the timed run starts with an empty merge cache too. */
    pthread_t th[256];
    struct job jobs[256];
    double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < nthreads; i++) {
        jobs[i] = (struct job){t, text, ch, nch, i, nthreads, out, 0};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    int failed = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        failed |= jobs[i].failed;
    }
    *secs = clock_s(CLOCK_MONOTONIC) - t0;
    *cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    return failed ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tok TOKENIZER TEXT [THREADS...]\n");
        return 2;
    }
    char err[1024];
    struct tok *t = NULL;
    if (tok_open(argv[1], &t, err, sizeof err) != 0) {
        fprintf(stderr, "bench_tok: %s\n", err);
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(len + 1);
    if (!text || fread(text, 1, len, f) != len) {
        fprintf(stderr, "bench_tok: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    size_t cap = len / 32768 + 16, nch = 0;
    struct chunk *ch = malloc(cap * sizeof *ch);
    for (size_t at = 0; at < len;) {
        size_t end = at + 65536 < len ? at + 65536 : len;
        while (end < len &&
               !(text[end - 1] == '\n' && ((text[end] | 0x20) >= 'a' && (text[end] | 0x20) <= 'z')))
            end++;
        if (nch == cap) ch = realloc(ch, (cap *= 2) * sizeof *ch);
        ch[nch++] = (struct chunk){at, end - at};
        at = end;
    }
    struct tok_ids *ref = calloc(nch, sizeof *ref), *out = calloc(nch, sizeof *out);
    int rc = 0;
    double first_mbs = 0;
    for (int a = 3; a < argc || a == 3; a++) {
        int nthreads = a < argc ? atoi(argv[a]) : 1;
        if (nthreads < 1 || nthreads > 256) nthreads = 1;
        struct tok_ids *dst = a == 3 ? ref : out;
        double secs = 0, cpu = 0, warm = 0, warm_cpu = 0;
        if (run(t, text, ch, nch < 16 ? nch : 16, nthreads, dst, &warm, &warm_cpu) != 0 ||
            run(t, text, ch, nch, nthreads, dst, &secs, &cpu) != 0) {
            rc = 1;
            break;
        }
        size_t tokens = 0;
        int same = 1;
        for (size_t c = 0; c < nch; c++) {
            tokens += dst[c].n;
            if (dst != ref)
                same &= dst[c].n == ref[c].n &&
                        memcmp(dst[c].v, ref[c].v, dst[c].n * sizeof *dst[c].v) == 0;
        }
        printf("{\"impl\":\"loom\",\"tokenizer\":\"%s\",\"threads\":%d,\"bytes\":%zu,"
               "\"tokens\":%zu,\"seconds\":%.3f,\"mb_per_s\":%.2f,\"cpu_seconds\":%.3f,"
               "\"mb_per_cpu_s\":%.2f,\"same_ids_as_first\":%s}\n",
               tok_kind(t), nthreads, len, tokens, secs, (double)len / secs / 1e6, cpu,
               (double)len / cpu / 1e6, same ? "true" : "false");
        double mbs = (double)len / secs / 1e6;
        if (a == 3) first_mbs = mbs;
        printf("RESULT bench_tok impl=loom tokenizer=%s threads=%d bytes=%zu tokens=%zu "
               "seconds=%.3f mb_per_s=%.2f speedup=%.2f mb_per_cpu_s=%.2f same_ids=%s\n",
               tok_kind(t), nthreads, len, tokens, secs, mbs, first_mbs > 0 ? mbs / first_mbs : 0,
               (double)len / cpu / 1e6, same ? "yes" : "no");
        fflush(stdout);
        if (!same) rc = 1;
        if (a >= argc) break;
    }
    for (size_t c = 0; c < nch; c++) {
        tok_ids_free(&ref[c]);
        tok_ids_free(&out[c]);
    }
    free(ref);
    free(out);
    free(ch);
    free(text);
    tok_free(t);
    return rc;
}
