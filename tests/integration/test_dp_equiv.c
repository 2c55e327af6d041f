/* Data-parallel / ZeRO equivalence of the real loom-worker on the cpu
 * backend (Gloo), launched with --nproc (worker/launch.c).
 *
 * The oracle is the single-process run with the same global batch: for each
 * layout (dp, zero_stage, grad accumulation) the per-step loss and global
 * grad norm must match it within REL_TOL relative over all STEPS steps, and
 * the final weights (--export) within PARAM_TOL. grad_clip is set low enough
 * that clipping is active, so the global norm across shards matters.
 * Also checked: the per-rank memory report follows the ZeRO formulas
 * (worker/zero.h), a resume on the same layout is bit-exact, and a
 * checkpoint written at dp=4 zero=3 resumes at dp=2 zero=1 on the
 * single-process curve (reshard on load).
 *
 * The launcher (--nproc): SIGTERM to it stops every rank at the same step
 * with a checkpoint (exit 143), and a rank killed outright makes the launcher
 * stop the others and fail within the comm timeout, leaving no process.
 *
 * Usage: test_dp_equiv LOOM_WORKER dp2|dp4|reshard|launcher */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "worker/data.h"
#include "worker/safetensors.h"
#include "tests/integration/equiv_harness.h"

#define STEPS   20
#define REL_TOL 1e-5
#define PARAM_TOL                                                                                  \
    5e-5 /* max |a - b| / (1 + |b|) over all weights (Adam amplifies tiny grad differences) */

/* tiny GPT-2: tied embeddings, biases, LayerNorm, GELU */
#define N_LAYER 3
#define D_MODEL 16
#define D_FF    33 /* odd sizes: 11155 parameters, not divisible by 2 or 4 (uneven shards) */
#define VOCAB   256
#define SEQ     16
#define MICRO   2

static const char *worker;
static char dir[256];

struct run {
    int ok;
    double loss[STEPS + 1], norm[STEPS + 1];
    char loss_s[STEPS + 1][40];
    double mem[5]; /* params, grads, optimizer, activations, comm (GiB) of the last step */
    int steps_seen;
};

static void write_spec(const char *path, int dp, int zero, int gbt_micro) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f,
            "{\"name\":\"dp-equiv\",\"model\":{\"family\":\"gpt2\",\"n_layer\":%d,\"n_head\":2,"
            "\"d_model\":%d,\"d_ff\":%d,\"vocab_size\":%d,\"seq_len\":%d},"
            "\"data\":{\"train\":\"%s/train_*.bin\"},"
            "\"parallel\":{\"dp\":%d,\"tp\":1,\"pp\":1,\"zero_stage\":%d},"
            "\"train\":{\"steps\":%d,\"global_batch_tokens\":%d,\"micro_batch\":%d,"
            "\"lr\":0.01,\"min_lr\":0.001,\"warmup_steps\":3,\"weight_decay\":0.1,"
            "\"grad_clip\":0.5,\"seed\":7},"
            "\"checkpoint\":{\"every_steps\":10,\"keep\":5},"
            "\"resources\":{\"device\":\"cpu\"}}",
            N_LAYER, D_MODEL, D_FF, VOCAB, SEQ, dir, dp, zero, STEPS, gbt_micro * MICRO * SEQ,
            MICRO);
    fclose(f);
}

static void parse(const char *path, struct run *r) {
    memset(r, 0, sizeof(*r));
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "step") == 0) {
            int s = (int)json_integer_value(json_object_get(j, "step"));
            if (s >= 1 && s <= STEPS) {
                r->loss[s] = json_real_value(json_object_get(j, "loss"));
                r->norm[s] = json_real_value(json_object_get(j, "grad_norm"));
                /* the exact text for bit-exact comparisons */
                const char *p = strstr(line, "\"loss\":");
                if (p) sscanf(p + 7, "%39[^,]", r->loss_s[s]);
                r->steps_seen++;
                json_t *m = json_object_get(j, "mem");
                static const char *keys[] = {"params", "grads", "optimizer", "activations", "comm"};
                for (int k = 0; k < 5; k++)
                    r->mem[k] = json_real_value(json_object_get(m, keys[k]));
            }
        }
        json_decref(j);
    }
    fclose(f);
}

/* Train a layout from scratch; returns the parsed run. */
static void train(const char *tag, int dp, int zero, int gbt_micro, struct run *r,
                  const char *export_path) {
    char spec[512], out[512], of[512];
    snprintf(spec, sizeof(spec), "%s/%s.json", dir, tag);
    snprintf(out, sizeof(out), "%s/%s.out", dir, tag);
    snprintf(of, sizeof(of), "%s/%s.jsonl", dir, tag);
    write_spec(spec, dp, zero, gbt_micro);
    int rc = equiv_run_worker(worker, spec, out, of, dp, NULL, export_path, 0);
    CHECK(rc == 0, "%s: loom-worker exited %d (see stderr)", tag, rc);
    parse(of, r);
    r->ok = rc == 0 && r->steps_seen == STEPS;
    CHECK(r->steps_seen == STEPS, "%s: %d step lines, want %d", tag, r->steps_seen, STEPS);
}

static double rel(double a, double b) {
    return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12);
}

static void compare(const char *tag, const struct run *a, const struct run *ref, int from) {
    double worst = 0, worst_norm = 0;
    for (int s = from; s <= STEPS; s++) {
        double d = rel(a->loss[s], ref->loss[s]), dn = rel(a->norm[s], ref->norm[s]);
        worst = d > worst ? d : worst;
        worst_norm = dn > worst_norm ? dn : worst_norm;
    }
    CHECK(worst <= REL_TOL, "%s: loss differs from the single-process run by %.3g relative", tag,
          worst);
    CHECK(worst_norm <= REL_TOL, "%s: grad norm differs by %.3g relative", tag, worst_norm);
    fprintf(stderr, "%-14s loss rel diff max %.2e, grad-norm %.2e (steps %d..%d)\n", tag, worst,
            worst_norm, from, STEPS);
}

/* Memory report vs the ZeRO formulas (worker/zero.h), from the single-process
 * figures (stage 0 at dp 1: everything whole). */
static void check_memory(const char *tag, const struct run *a, const struct run *ref, int dp,
                         int zero) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    double P = ref->mem[0] * GiB / 4; /* fp32 elements */
    double S = ceil(P / dp);
    double C = D_MODEL, F = D_FF, Vp = 256, T = SEQ;
    double head = Vp * C + T * C + 2 * C; /* wte (tied head), wpe, ln_f */
    double block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + C * F + F + F * C + C;
    CHECK(fabs(head + N_LAYER * block - P) < 0.5, "%s: model has %.0f params, formula %.0f", tag, P,
          head + N_LAYER * block);
    CHECK(fmod(P, dp) != 0, "%s: %.0f params divide evenly by dp=%d: uneven shards untested", tag,
          P, dp);
    /* stage 3 keeps the embeddings/head group gathered plus two block gather
     * slots; stage >= 2 likewise the group's gradients plus two block scratch
     * slots (the engine allocates exactly this) */
    double work = head + (N_LAYER < 2 ? N_LAYER : 2) * block;
    double want[5] = {
        (zero == 3 ? S + work : P) * 4, (zero >= 2 ? S + work : P) * 4,
        8 * (zero >= 1 ? S : P) + 16,   ref->mem[3] * GiB,
        zero >= 1 ? 2 * S * 4 : 0,
    };
    static const char *names[] = {"params", "grads", "optimizer", "activations", "comm"};
    for (int k = 0; k < 5; k++)
        CHECK(fabs(a->mem[k] * GiB - want[k]) <= 0.5 + 1e-9 * want[k],
              "%s: mem.%s = %.0f bytes, formula %.0f", tag, names[k], a->mem[k] * GiB, want[k]);
}

static void equivalence(int dp) {
    for (int accum = 1; accum <= 2; accum++) {
        int micro = dp * accum; /* micro-batches per global batch */
        char tag[64], ex_ref[512], ex[512];
        struct run ref, r;
        snprintf(tag, sizeof(tag), "ref-g%d", micro);
        snprintf(ex_ref, sizeof(ex_ref), "%s/%s.safetensors", dir, tag);
        train(tag, 1, 0, micro, &ref, ex_ref);
        if (!ref.ok) continue;
        int clipped = 0;
        for (int s = 1; s <= STEPS; s++)
            clipped += ref.norm[s] > 0.5; /* grad_clip in write_spec */
        CHECK(clipped > 0, "%s: clipping never active; the norm check would be weak", tag);
        for (int zero = 0; zero <= 3; zero++) {
            snprintf(tag, sizeof(tag), "dp%d-z%d-acc%d", dp, zero, accum);
            snprintf(ex, sizeof(ex), "%s/%s.safetensors", dir, tag);
            train(tag, dp, zero, micro, &r, ex);
            if (!r.ok) continue;
            compare(tag, &r, &ref, 1);
            equiv_compare_exports(tag, ex, ex_ref, PARAM_TOL);
            check_memory(tag, &r, &ref, dp, zero);
        }
    }
}

static void reshard(void) {
    char spec[512], out[512], of[512];
    struct run ref, a, b, c;
    /* single-process reference, 4 micro-batches per step */
    train("ref-g4", 1, 0, 4, &ref, NULL);
    /* dp=4 zero=3 for 10 steps (checkpoint at 10), then dp=2 zero=1 resumes */
    snprintf(out, sizeof(out), "%s/reshard.out", dir);
    snprintf(spec, sizeof(spec), "%s/reshard-a.json", dir);
    snprintf(of, sizeof(of), "%s/reshard-a.jsonl", dir);
    write_spec(spec, 4, 3, 4);
    CHECK(equiv_run_worker(worker, spec, out, of, 4, NULL, NULL, 10) == 0,
          "dp4 z3 first half failed");
    parse(of, &a);
    snprintf(spec, sizeof(spec), "%s/reshard-b.json", dir);
    snprintf(of, sizeof(of), "%s/reshard-b.jsonl", dir);
    write_spec(spec, 2, 1, 4);
    CHECK(equiv_run_worker(worker, spec, out, of, 2, NULL, NULL, 0) == 0, "dp2 z1 resume failed");
    parse(of, &b);
    CHECK(a.steps_seen == 10 && b.steps_seen == 10, "reshard: %d + %d steps", a.steps_seen,
          b.steps_seen);
    if (a.steps_seen == 10 && b.steps_seen == 10 && ref.ok) {
        for (int s = 11; s <= STEPS; s++)
            a.loss[s] = b.loss[s], a.norm[s] = b.norm[s];
        compare("reshard 4z3>2z1", &a, &ref, 1);
    }
    /* back to a single process from the dp=2 zero=1 checkpoint of step 10 */
    snprintf(out, sizeof(out), "%s/reshard1.out", dir);
    snprintf(spec, sizeof(spec), "%s/reshard-c.json", dir);
    snprintf(of, sizeof(of), "%s/reshard-c.jsonl", dir);
    write_spec(spec, 2, 2, 4);
    CHECK(equiv_run_worker(worker, spec, out, of, 2, NULL, NULL, 10) == 0,
          "dp2 z2 first half failed");
    parse(of, &a);
    write_spec(spec, 1, 0, 4);
    CHECK(equiv_run_worker(worker, spec, out, of, 1, NULL, NULL, 0) == 0, "dp1 resume failed");
    parse(of, &c);
    if (a.steps_seen == 10 && c.steps_seen == 10 && ref.ok) {
        for (int s = 11; s <= STEPS; s++)
            a.loss[s] = c.loss[s], a.norm[s] = c.norm[s];
        compare("reshard 2z2>1", &a, &ref, 1);
    }
    /* same layout: resume is bit-exact against an uninterrupted run */
    struct run full;
    train("dp2-z2-full", 2, 2, 4, &full, NULL);
    snprintf(out, sizeof(out), "%s/same.out", dir);
    snprintf(spec, sizeof(spec), "%s/same.json", dir);
    write_spec(spec, 2, 2, 4);
    snprintf(of, sizeof(of), "%s/same-a.jsonl", dir);
    CHECK(equiv_run_worker(worker, spec, out, of, 2, NULL, NULL, 10) == 0,
          "dp2 z2 first half failed");
    parse(of, &a);
    snprintf(of, sizeof(of), "%s/same-b.jsonl", dir);
    CHECK(equiv_run_worker(worker, spec, out, of, 2, NULL, NULL, 0) == 0, "dp2 z2 resume failed");
    parse(of, &b);
    int same = a.steps_seen == 10 && b.steps_seen == 10 && full.ok;
    for (int s = 1; same && s <= STEPS; s++)
        same =
            strcmp(s <= 10 ? a.loss_s[s] : b.loss_s[s], full.loss_s[s]) == 0 && full.loss_s[s][0];
    CHECK(same, "resume on the same layout (dp2 z2) is not bit-exact");
    fprintf(stderr, "resume dp2 z2    bit-exact: %s\n", same ? "yes" : "NO");
}

/* Start loom-worker --nproc 2 in the background (stdout to outfile). */
static pid_t start_bg(const char *spec, const char *out, const char *outfile) {
    pid_t p = fork();
    if (p == 0) {
        if (!freopen(outfile, "w", stdout)) _exit(126);
        setenv("LOOM_COMM_TIMEOUT_MS", "4000", 1);
        execl(worker, worker, "--spec", spec, "--out", out, "--threads", "1", "--nproc", "2",
              "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    return p;
}

/* Wait until outfile holds a step line with step >= min_step (or timeout). */
static int wait_step(const char *outfile, int min_step, double timeout_s) {
    double t0 = clock_mono_s();
    while (clock_mono_s() - t0 < timeout_s) {
        FILE *f = fopen(outfile, "r");
        char line[8192];
        int best = 0;
        while (f && fgets(line, sizeof(line), f)) {
            const char *p = strstr(line, "\"type\":\"step\",\"step\":");
            if (p) best = atoi(p + 21) > best ? atoi(p + 21) : best;
        }
        if (f) fclose(f);
        if (best >= min_step) return best;
        usleep(20000);
    }
    return 0;
}

/* Children of `parent` (from /proc), up to max. */
static int children(pid_t parent, pid_t *out, int max) {
    DIR *d = opendir("/proc");
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d)) && n < max) {
        int pid = atoi(de->d_name);
        if (pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = 0;
        const char *rp = strrchr(buf, ')');
        int ppid = 0;
        char state;
        if (rp && sscanf(rp + 2, "%c %d", &state, &ppid) == 2 && ppid == parent && state != 'Z')
            out[n++] = pid;
    }
    if (d) closedir(d);
    return n;
}

static int wait_exit(pid_t p, double timeout_s, double *took) {
    double t0 = clock_mono_s();
    int st = 0;
    while (clock_mono_s() - t0 < timeout_s) {
        if (waitpid(p, &st, WNOHANG) == p) {
            *took = clock_mono_s() - t0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(20000);
    }
    kill(p, SIGKILL);
    waitpid(p, &st, 0);
    *took = clock_mono_s() - t0;
    return -1;
}

static void launcher(void) {
    char spec[512], out[512], of[512], ck[600];
    snprintf(spec, sizeof(spec), "%s/long.json", dir);
    snprintf(out, sizeof(out), "%s/long.out", dir);
    snprintf(of, sizeof(of), "%s/long.jsonl", dir);
    FILE *f;
    write_spec(spec, 2, 1, 2);
    /* a long run: rewrite steps to 100000 */
    if ((f = fopen(spec, "r+"))) {
        char buf[4096];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = 0;
        char *p = strstr(buf, "\"steps\":20,");
        if (p) {
            char rest[4096];
            snprintf(rest, sizeof(rest), "%s", p + strlen("\"steps\":20,"));
            snprintf(p, sizeof(buf) - (size_t)(p - buf), "\"steps\":100000,%s", rest);
        }
        rewind(f);
        fputs(buf, f);
        fclose(f);
    }
    /* SIGTERM: both ranks stop at the same step, save, exit 143 */
    pid_t p = start_bg(spec, out, of);
    int s = wait_step(of, 3, 60);
    CHECK(s >= 3, "launcher: no training progress");
    kill(p, SIGTERM);
    double took;
    int rc = wait_exit(p, 60, &took);
    CHECK(rc == 143, "launcher: SIGTERM gave exit %d, want 143", rc);
    int last = wait_step(of, 1, 1);
    snprintf(ck, sizeof(ck), "%s/checkpoints/step_%08d/manifest.json", out, last);
    struct stat st;
    CHECK(stat(ck, &st) == 0, "launcher: no checkpoint of the last step %d (%s)", last, ck);
    fprintf(stderr, "launcher: SIGTERM -> exit %d after %.2f s, checkpoint at step %d\n", rc, took,
            last);
    /* a rank killed outright: the launcher stops the other and fails */
    p = start_bg(spec, out, of);
    s = wait_step(of, last + 2, 60);
    CHECK(s > last, "launcher: resumed run made no progress");
    pid_t kids[8];
    int nk = children(p, kids, 8);
    CHECK(nk == 2, "launcher: %d rank processes, want 2", nk);
    if (nk > 0) kill(kids[nk - 1], SIGKILL);
    rc = wait_exit(p, 30, &took);
    CHECK(rc != 0 && rc != -1, "launcher: exit %d after a rank was killed", rc);
    CHECK(took < 4 + 10 + 5, "launcher: took %.1f s to stop", took);
    for (int i = 0; i < nk; i++)
        CHECK(kill(kids[i], 0) != 0, "launcher: rank process %d still alive", (int)kids[i]);
    fprintf(stderr, "launcher: killed rank -> exit %d after %.2f s, no rank left\n", rc, took);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_dp_equiv LOOM_WORKER dp2|dp4|reshard\n");
        return 2;
    }
#ifndef LOOM_HAVE_GLOO
    printf("SKIP: built without Gloo; dp > 1 on cpu needs it\n");
    return 77;
#endif
    worker = argv[1];
    snprintf(dir, sizeof(dir), "/tmp/loom-test-dp-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char derr[256];
    CHECK(equiv_make_data(dir, derr, sizeof(derr)) == 0, "%s", derr);
    if (strcmp(argv[2], "dp2") == 0)
        equivalence(2);
    else if (strcmp(argv[2], "dp4") == 0)
        equivalence(4);
    else if (strcmp(argv[2], "reshard") == 0)
        reshard();
    else if (strcmp(argv[2], "launcher") == 0)
        launcher();
    else
        return 2;
    if (!check_failures) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        fprintf(stderr, "test_dp_equiv %s: %d failure(s); files kept in %s\n", argv[2],
                check_failures, dir);
    }
    return check_failures ? 1 : 0;
}
