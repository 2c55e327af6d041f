/* loom-worker end to end on the CPU backend (argv[1] = path of loom-worker).
 *
 * Writes a small byte-level corpus as .bin shards in a temporary directory and
 * checks, by running the real binary and parsing its JSON lines:
 *  1. a run trains (last loss < first loss) and ends with a summary line;
 *  2. the same spec twice gives bit-identical losses (all 17 digits);
 *  3. resume: with the newest checkpoint removed, a re-run starts from the
 *     previous one and reproduces the uninterrupted run's losses bit for bit;
 *  4. a corrupt newest checkpoint (truncated shard) is skipped, not loaded;
 *  5. SIGTERM mid-run: exit 143, a checkpoint of the last finished step, and
 *     the resumed run matches the uninterrupted losses;
 *  6. exit code 2 with an error line for: malformed spec, unknown field,
 *     truncated data shard, world mismatch, and --device cuda on a build
 *     without CUDA (skipped when CUDA is built in). */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/data.h"
#include "tests/check.h"

static const char *worker;
static char dir[256];

/* Start the worker with stdout to `outfile`, stderr to outfile.err. */
static pid_t start(const char *spec, const char *out, const char *outfile, const char *extra) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char errfile[600];
        snprintf(errfile, sizeof errfile, "%s.err", outfile);
        if (!freopen(outfile, "w", stdout) || !freopen(errfile, "w", stderr)) _exit(99);
        const char *argv[12] = {worker, "--spec", spec, "--out", out, "--threads", "1"};
        int n = 7;
        if (extra) {
            argv[n++] = "--device";
            argv[n++] = extra;
        }
        argv[n] = NULL;
        execv(worker, (char *const *)argv);
        _exit(98);
    }
    return pid;
}

static int wait_rc(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int run(const char *spec, const char *out, const char *outfile, const char *device) {
    return wait_rc(start(spec, out, outfile, device));
}

/* Loss text per step (exact digits as printed) and line types. */
struct lines {
    char loss[512][40];
    int nsteps, first_step, ckpts, summary, errors;
    double mem_planned, mem_allocated; /* totals of the {"type":"memory"} line, GiB */
};

static void parse(const char *outfile, struct lines *l) {
    memset(l, 0, sizeof *l);
    l->first_step = -1;
    FILE *f = fopen(outfile, "r");
    char buf[8192];
    while (f && fgets(buf, sizeof buf, f)) {
        json_t *j = json_loads(buf, 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "step") == 0) {
            int step = (int)json_integer_value(json_object_get(j, "step"));
            const char *p = strstr(buf, "\"loss\":");
            if (step >= 1 && step < 512 && p) {
                sscanf(p + 7, "%39[^,]", l->loss[step]);
                if (l->first_step < 0) l->first_step = step;
                l->nsteps++;
            }
        } else if (type && strcmp(type, "checkpoint") == 0) {
            l->ckpts++;
        } else if (type && strcmp(type, "summary") == 0) {
            l->summary++;
        } else if (type && strcmp(type, "error") == 0) {
            l->errors++;
        } else if (type && strcmp(type, "memory") == 0) {
            l->mem_planned = json_real_value(json_object_get(j, "planned_total_gib"));
            l->mem_allocated = json_real_value(json_object_get(j, "allocated_total_gib"));
        }
        json_decref(j);
    }
    if (f) fclose(f);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void make_spec(const char *path, int steps, int every, const char *extra_model) {
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"name\":\"t\",\"model\":{\"family\":\"llama\",\"n_layer\":2,\"n_head\":4,"
             "\"n_kv_head\":2,\"d_model\":32,\"d_ff\":64,\"vocab_size\":256,\"seq_len\":32%s},"
             "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"%s/val.bin\"},"
             "\"train\":{\"steps\":%d,\"global_batch_tokens\":256,\"micro_batch\":4,"
             "\"lr\":0.003,\"min_lr\":0.0003,\"warmup_steps\":2,\"seed\":5,\"eval_every\":4,"
             "\"eval_batches\":2},\"checkpoint\":{\"every_steps\":%d,\"keep\":10},"
             "\"resources\":{\"device\":\"cpu\"}}",
             extra_model, dir, dir, steps, every);
    write_file(path, buf);
}

static int same_losses(const struct lines *a, const struct lines *b, int from, int to) {
    for (int s = from; s <= to; s++)
        if (!a->loss[s][0] || strcmp(a->loss[s], b->loss[s]) != 0) return 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    worker = argv[1];
    snprintf(dir, sizeof dir, "/tmp/loom-test-worker-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char p[512], q[512], spec[512], out[512], o1[512], o2[512], err[256];

    /* corpus: some text repeated with variations, byte tokens */
    uint32_t *tok = malloc(60000 * sizeof *tok);
    const char *words[] = {"the ",   "loom ", "weaves ", "threads ", "into ",
                           "cloth ", "and ",  "a ",      "shuttle ", "moves "};
    size_t n = 0;
    for (uint32_t s = 1; n < 59000; s = s * 1103515245u + 12345u)
        for (const char *c = words[(s >> 16) % 10]; *c && n < 59000; c++)
            tok[n++] = (unsigned char)*c;
    snprintf(p, sizeof p, "%s/train_000.bin", dir);
    CHECK(data_shard_write(p, 1, tok, 50000, err, sizeof err) == 0, "%s", err);
    snprintf(p, sizeof p, "%s/val.bin", dir);
    CHECK(data_shard_write(p, 1, tok + 50000, 9000, err, sizeof err) == 0, "%s", err);

    /* 1 + 2: train, determinism */
    snprintf(spec, sizeof spec, "%s/spec.json", dir);
    make_spec(spec, 12, 4, "");
    struct lines a, b;
    snprintf(out, sizeof out, "%s/runA", dir);
    snprintf(o1, sizeof o1, "%s/a.out", dir);
    int rc = run(spec, out, o1, NULL);
    parse(o1, &a);
    CHECK(rc == 0 && a.nsteps == 12 && a.summary == 1, "run: rc=%d steps=%d summary=%d", rc,
          a.nsteps, a.summary);
    CHECK(a.ckpts == 3, "checkpoints every 4 of 12 steps: got %d", a.ckpts);
    /* the planner's estimate is logged beside the allocation and agrees within 10% */
    CHECK(a.mem_allocated > 0 && a.mem_planned > 0.9 * a.mem_allocated &&
              a.mem_planned < 1.1 * a.mem_allocated,
          "memory line: planned %.6f GiB, allocated %.6f GiB", a.mem_planned, a.mem_allocated);
    CHECK(atof(a.loss[12]) < atof(a.loss[1]) * 0.9, "loss did not fall: %s -> %s", a.loss[1],
          a.loss[12]);
    snprintf(out, sizeof out, "%s/runB", dir);
    snprintf(o2, sizeof o2, "%s/b.out", dir);
    rc = run(spec, out, o2, NULL);
    parse(o2, &b);
    CHECK(rc == 0 && same_losses(&a, &b, 1, 12), "same spec, different losses");

    /* 3: resume after removing the newest checkpoint (step 12): starts at 8 */
    snprintf(p, sizeof p, "rm -rf %s/runB/checkpoints/step_00000012", dir);
    CHECK(system(p) == 0, "rm");
    rc = run(spec, out, o2, NULL);
    parse(o2, &b);
    CHECK(rc == 0 && b.first_step == 9 && same_losses(&a, &b, 9, 12),
          "resume from 8: rc=%d first=%d losses %s", rc, b.first_step,
          same_losses(&a, &b, 9, 12) ? "same" : "differ");

    /* 4: corrupt the newest (step 12, just rewritten): truncate its shard */
    snprintf(p, sizeof p, "%s/runB/checkpoints/step_00000012/rank_00000.safetensors", dir);
    CHECK(truncate(p, 100) == 0, "truncate %s", p);
    rc = run(spec, out, o2, NULL);
    parse(o2, &b);
    CHECK(rc == 0 && b.first_step == 9 && same_losses(&a, &b, 9, 12),
          "corrupt newest checkpoint not skipped: rc=%d first=%d", rc, b.first_step);

    /* 5: SIGTERM after the first step line; then resume */
    make_spec(spec, 400, 1000, "");
    snprintf(out, sizeof out, "%s/runC", dir);
    snprintf(o1, sizeof o1, "%s/c.out", dir);
    pid_t pid = start(spec, out, o1, NULL);
    /* poll every 20 ms; the limits (2-3 minutes) only matter on a very busy machine */
    for (int i = 0; i < 6000; i++) {
        usleep(20000);
        parse(o1, &b);
        if (b.nsteps >= 2) break;
    }
    kill(pid, SIGTERM);
    rc = wait_rc(pid);
    parse(o1, &b);
    int stopped_at = b.first_step + b.nsteps - 1;
    CHECK(rc == 143 && b.ckpts == 1 && b.summary == 1,
          "SIGTERM: rc=%d ckpts=%d summary=%d (want 143, 1, 1)", rc, b.ckpts, b.summary);
    printf("SIGTERM stopped the run after step %d\n", stopped_at);
    CHECK(stopped_at >= 2 && stopped_at < 390, "stopped at %d", stopped_at);
    if (stopped_at >= 2 && stopped_at < 390) {
        struct lines c, d;
        snprintf(o2, sizeof o2, "%s/c2.out", dir);
        make_spec(spec, 400, 1000, "");
        /* stop the resumed run too, a few steps later, to keep the test short */
        pid = start(spec, out, o2, NULL);
        for (int i = 0; i < 6000; i++) {
            usleep(20000);
            parse(o2, &c);
            if (c.nsteps >= 3) break;
        }
        kill(pid, SIGTERM);
        wait_rc(pid);
        parse(o2, &c);
        /* uninterrupted reference for the same steps */
        snprintf(out, sizeof out, "%s/runD", dir);
        snprintf(q, sizeof q, "%s/d.out", dir);
        pid = start(spec, out, q, NULL);
        int want = c.first_step + 2;
        for (int i = 0; i < 9000; i++) {
            usleep(20000);
            parse(q, &d);
            if (d.nsteps >= want) break;
        }
        kill(pid, SIGTERM);
        wait_rc(pid);
        parse(q, &d);
        printf("resumed at step %d, compared through step %d\n", c.first_step, want);
        CHECK(c.first_step == stopped_at + 1 && want < 512 &&
                  same_losses(&c, &d, c.first_step, want),
              "resume after SIGTERM at %d: first=%d, losses %s", stopped_at, c.first_step,
              same_losses(&c, &d, c.first_step, want) ? "same" : "differ");
    }

    /* 6: exit 2 cases */
    snprintf(o1, sizeof o1, "%s/e.out", dir);
    snprintf(out, sizeof out, "%s/runE", dir);
    write_file(spec, "{\"name\": ");
    rc = run(spec, out, o1, NULL);
    parse(o1, &b);
    CHECK(rc == 2 && b.errors == 1, "malformed spec: rc=%d errors=%d", rc, b.errors);
    make_spec(spec, 4, 2, ",\"n_layerz\":3");
    rc = run(spec, out, o1, NULL);
    CHECK(rc == 2, "unknown field: rc=%d", rc);
    make_spec(spec, 4, 2, "");
    rc = run(spec, out, o1, "gpu");
    CHECK(rc == 2, "--device gpu: rc=%d", rc);
#ifndef LOOM_HAVE_CUDA
    rc = run(spec, out, o1, "cuda");
    parse(o1, &b);
    CHECK(rc == 2 && b.errors == 1, "--device cuda without CUDA: rc=%d", rc);
#else
    printf("skip: --device cuda check (this build has CUDA)\n");
#endif
    char bad[1024];
    snprintf(bad, sizeof bad,
             "{\"name\":\"t\",\"model\":{\"family\":\"gpt2\",\"preset\":\"tiny\"},"
             "\"data\":{\"train\":\"%s/train_*.bin\"},\"parallel\":{\"dp\":2},"
             "\"train\":{\"steps\":2,\"global_batch_tokens\":256,\"micro_batch\":2},"
             "\"resources\":{\"device\":\"cpu\"}}",
             dir);
    write_file(spec, bad);
    rc = run(spec, out, o1, NULL);
    CHECK(rc == 2, "world mismatch (dp=2, world 1): rc=%d", rc);
    snprintf(p, sizeof p, "%s/train_000.bin", dir);
    CHECK(truncate(p, 5000) == 0, "truncate shard");
    make_spec(spec, 4, 2, "");
    rc = run(spec, out, o1, NULL);
    parse(o1, &b);
    CHECK(rc == 2 && b.errors == 1, "truncated shard: rc=%d errors=%d", rc, b.errors);

    free(tok);
    snprintf(p, sizeof p, "rm -rf %s", dir);
    if (!check_failures && system(p) != 0) check_failures++;
    printf("%s: %d failure(s)\n", check_failures ? "FAIL" : "PASS", check_failures);
    return check_failures ? 1 : 0;
}
