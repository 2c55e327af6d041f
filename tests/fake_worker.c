/* fake_worker: a stand-in for loom-worker that follows the same contract
 * (command line, LOOM_* environment, JSON lines on stdout, exit codes) but
 * trains nothing, so cluster tests run in seconds and can inject faults.
 *
 * Behaviour comes from the job spec's labels (string values, so any job-spec
 * validator accepts them), or from FAKE_* environment variables as fallback:
 *   fake_steps        steps to run (default: train.steps, else 10)
 *   fake_step_ms      milliseconds per step (default 100)
 *   fake_crash_step   step at which to exit with fake_crash_code (default 3)
 *   fake_crash_rank   rank that crashes (default: every rank)
 *   fake_crash_attempt attempt that crashes (default: every attempt)
 *   fake_hang_step    step at which to stop making progress (sleep forever)
 *   fake_hang_rank / fake_hang_attempt: as above
 *   fake_exit_code    exit code at the end (default 0)
 *   fake_ignore_term  "1": ignore SIGTERM (tests the SIGKILL escalation)
 *   fake_child        "1": fork a child that sleeps in the same process group
 * FAKE_PID_DIR (environment): each process writes a file named by its pid
 * there holding "JOB ATTEMPT RANK RDZV_TOKEN", so tests can check that no
 * worker process is left behind, none was started twice, and probe the
 * rendezvous with a real attempt token.
 * With --out DIR it checkpoints (DIR/fake-ckpt.RANK holds the step) every
 * checkpoint.every_steps and resumes from it, like the real worker.
 * With world > 1 and an http LOOM_RDZV, rank 0 publishes a value and the
 * other ranks wait for it, exercising the rendezvous endpoint.
 *   fake_artifacts    "1": rank 0 also writes the real worker's artifact layout
 *                     (OUT/checkpoints/step_NNNNNNNN/{rank_00000.bin,manifest.json}
 *                     at each checkpoint, OUT/export/hf and OUT/export/lora at
 *                     the end, with "export" records), pseudo-random bytes. */
#include "api/client.h"
#include "common/clock.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static json_t *labels;

static long opt(const char *name, long def) {
    const char *v = json_string_value(json_object_get(labels, name));
    if (!v) {
        char env[64];
        snprintf(env, sizeof env, "%s", name);
        for (char *p = env; *p; p++)
            if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
        v = getenv(env);
    }
    return v && *v ? strtol(v, NULL, 10) : def;
}

static void note_pid(void) {
    const char *dir = getenv("FAKE_PID_DIR");
    if (!dir || !*dir) return;
    char path[512];
    snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) return;
    const char *tok = getenv("LOOM_RDZV_TOKEN");
    fprintf(f, "%s %s %s %s\n", getenv("LOOM_JOB") ? getenv("LOOM_JOB") : "-",
            getenv("LOOM_ATTEMPT") ? getenv("LOOM_ATTEMPT") : "-",
            getenv("LOOM_RANK") ? getenv("LOOM_RANK") : "-", tok && *tok ? tok : "-");
    fclose(f);
}

static int rendezvous(const char *rdzv, const char *token, int rank, int world) {
    if (world <= 1 || !rdzv || !*rdzv) return 0;
    if (strncmp(rdzv, "http://", 7) && strncmp(rdzv, "https://", 8)) {
        fprintf(stderr, "fake_worker: LOOM_RDZV=%s is not an http URL\n", rdzv);
        return -1;
    }
    client_global_init();
    struct client *c = client_new(rdzv, token);
    if (!c) return -1;
    client_set_timeout_ms(c, 15000);
    long status = 0;
    json_t *reply = NULL;
    char err[256];
    int rc = -1;
    if (rank == 0) {
        json_t *body = json_pack("{s:s}", "value", "ZmFrZQ==");
        for (int i = 0; i < 50 && rc != 0; i++) {
            if (client_request(c, "PUT", "/fake-addr", body, &status, NULL, NULL, err,
                               sizeof err) == 0 &&
                status / 100 == 2)
                rc = 0;
            else
                clock_sleep_ms_full(200);
        }
        json_decref(body);
    } else {
        for (int i = 0; i < 60 && rc != 0; i++) {
            if (client_request(c, "GET", "/fake-addr?wait_ms=5000", NULL, &status, &reply, NULL,
                               err, sizeof err) == 0 &&
                status == 200) {
                const char *v = json_string_value(json_object_get(reply, "value"));
                rc = v && !strcmp(v, "ZmFrZQ==") ? 0 : -2;
                if (rc == -2) fprintf(stderr, "fake_worker: rendezvous value mismatch\n");
            } else if (status != 404) {
                clock_sleep_ms_full(200);
            }
            json_decref(reply);
            reply = NULL;
            if (rc == -2) break;
        }
    }
    if (rc != 0)
        fprintf(stderr, "fake_worker: rendezvous failed (status %ld)\n", status);
    else
        fprintf(stderr, "fake_worker: rendezvous ok\n");
    client_free(c);
    return rc;
}

/* A file of n pseudo-random bytes (xorshift seeded by `seed`). */
static int write_noise(const char *path, long n, unsigned seed) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned x = seed * 2654435761u + 1;
    for (long i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        fputc((int)(x & 0xff), f);
    }
    return fclose(f);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* fake_artifacts: one checkpoint directory, written aside and renamed. */
static void fake_checkpoint_dir(const char *out, long step) {
    char dir[1100], tmp[1100], file[1200], man[1300];
    snprintf(dir, sizeof dir, "%s/checkpoints", out);
    mkdir(dir, 0755);
    snprintf(tmp, sizeof tmp, "%s/checkpoints/.tmp.step_%08ld", out, step);
    snprintf(dir, sizeof dir, "%s/checkpoints/step_%08ld", out, step);
    mkdir(tmp, 0755);
    snprintf(file, sizeof file, "%s/rank_00000.bin", tmp);
    long bytes = 65536 + step * 1000;
    if (write_noise(file, bytes, (unsigned)step) != 0) return;
    snprintf(man, sizeof man,
             "{\"format\":\"loom-checkpoint\",\"version\":1,\"step\":%ld,\"world\":1,"
             "\"shards\":[{\"rank\":0,\"file\":\"rank_00000.bin\",\"bytes\":%ld}]}\n",
             step, bytes);
    snprintf(file, sizeof file, "%s/manifest.json", tmp);
    write_text(file, man);
    if (rename(tmp, dir) == 0)
        printf("{\"type\":\"checkpoint\",\"step\":%ld,\"path\":\"%s\"}\n", step, dir);
}

/* fake_artifacts: the exports at the end of the job. */
static void fake_exports(const char *out) {
    char dir[1100], file[1200];
    snprintf(dir, sizeof dir, "%s/export", out);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/export/hf", out);
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/config.json", dir);
    write_text(file, "{\"model_type\":\"gpt2\"}\n");
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    write_noise(file, 300000, 7);
    printf("{\"type\":\"export\",\"kind\":\"hf\",\"path\":\"%s\"}\n", dir);
    snprintf(dir, sizeof dir, "%s/export/lora", out);
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    write_text(file, "{\"r\":8,\"lora_alpha\":16}\n");
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    write_noise(file, 50000, 11);
    printf("{\"type\":\"export\",\"kind\":\"lora\",\"path\":\"%s\"}\n", dir);
}

int main(int argc, char **argv) {
    const char *spec_path = NULL, *out = NULL;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--spec"))
            spec_path = argv[++i];
        else if (!strcmp(argv[i], "--out"))
            out = argv[++i];
    }
    if (!spec_path) {
        printf("{\"type\":\"error\",\"message\":\"--spec FILE is required\"}\n");
        return 2;
    }
    json_error_t jerr;
    json_t *spec = json_load_file(spec_path, 0, &jerr);
    if (!spec) {
        printf("{\"type\":\"error\",\"message\":\"bad spec: %s\"}\n", jerr.text);
        return 2;
    }
    labels = json_object_get(spec, "labels");
    int rank = atoi(getenv("LOOM_RANK") ? getenv("LOOM_RANK") : "0");
    int world = atoi(getenv("LOOM_WORLD") ? getenv("LOOM_WORLD") : "1");
    int attempt = atoi(getenv("LOOM_ATTEMPT") ? getenv("LOOM_ATTEMPT") : "1");
    const char *job = getenv("LOOM_JOB") ? getenv("LOOM_JOB") : "standalone";
    json_int_t spec_steps =
        json_integer_value(json_object_get(json_object_get(spec, "train"), "steps"));
    long steps = opt("fake_steps", spec_steps > 0 ? (long)spec_steps : 10);
    long step_ms = opt("fake_step_ms", 100);
    long ckpt_every = (long)json_integer_value(
        json_object_get(json_object_get(spec, "checkpoint"), "every_steps"));
    long crash_step = opt("fake_crash_step", -1), crash_rank = opt("fake_crash_rank", -1);
    long crash_attempt = opt("fake_crash_attempt", -1), crash_code = opt("fake_crash_code", 3);
    long hang_step = opt("fake_hang_step", -1), hang_rank = opt("fake_hang_rank", -1);
    long hang_attempt = opt("fake_hang_attempt", -1);
    int artifacts = opt("fake_artifacts", 0) != 0;
    if (opt("fake_ignore_term", 0)) signal(SIGTERM, SIG_IGN);
    note_pid();
    if (opt("fake_child", 0) && fork() == 0) {
        note_pid();
        for (;;)
            pause();
    }

    long start = 0;
    char ckpt[1024] = "";
    if (out && *out) {
        snprintf(ckpt, sizeof ckpt, "%s/fake-ckpt.%d", out, rank);
        FILE *f = fopen(ckpt, "r");
        if (f) {
            if (fscanf(f, "%ld", &start) != 1) start = 0;
            fclose(f);
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("{\"type\":\"start\",\"job\":\"%s\",\"attempt\":%d,\"rank\":%d,\"world\":%d,"
           "\"resume_step\":%ld}\n",
           job, attempt, rank, world, start);
    fprintf(stderr,
            "fake_worker: job %s attempt %d rank %d/%d starting at step %ld, omp %s, cpu peak %s\n",
            job, attempt, rank, world, start,
            getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "-",
            getenv("LOOM_CPU_PEAK_GFLOPS") ? getenv("LOOM_CPU_PEAK_GFLOPS") : "-");
    if (rendezvous(getenv("LOOM_RDZV"), getenv("LOOM_RDZV_TOKEN"), rank, world) != 0) {
        printf("{\"type\":\"error\",\"message\":\"rendezvous failed\"}\n");
        json_decref(spec);
        return 1;
    }
    for (long s = start + 1; s <= steps; s++) {
        clock_sleep_ms_full(step_ms);
        if (s == crash_step && (crash_rank < 0 || crash_rank == rank) &&
            (crash_attempt < 0 || crash_attempt == attempt)) {
            fprintf(stderr, "fake_worker: injected crash at step %ld (code %ld)\n", s, crash_code);
            printf("{\"type\":\"error\",\"message\":\"injected crash at step %ld\"}\n", s);
            json_decref(spec);
            return (int)crash_code;
        }
        if (s == hang_step && (hang_rank < 0 || hang_rank == rank) &&
            (hang_attempt < 0 || hang_attempt == attempt)) {
            fprintf(stderr, "fake_worker: injected hang at step %ld\n", s);
            for (;;)
                pause();
        }
        double loss = 10.0 / (double)(s + 1);
        printf("{\"type\":\"step\",\"step\":%ld,\"loss\":%.6f,\"lr\":0.001,\"grad_norm\":1.0,"
               "\"tokens\":%ld,\"tokens_per_s\":%.1f,\"mfu\":0.0,\"ms\":{\"compute\":%ld,"
               "\"comm_exposed\":0},\"mem_gib\":0.01}\n",
               s, loss, s * 1024, 1024.0 * 1000.0 / (double)(step_ms > 0 ? step_ms : 1), step_ms);
        fprintf(stderr, "step %ld loss %.4f\n", s, loss);
        if (ckpt[0] && ckpt_every > 0 && s % ckpt_every == 0) {
            /* Written aside and renamed, like the real worker: a SIGTERM
             * between truncate and write must not leave an empty checkpoint
             * that the next attempt reads as step 0. */
            char tmp[1100];
            snprintf(tmp, sizeof tmp, "%s.tmp", ckpt);
            FILE *f = fopen(tmp, "w");
            if (f) {
                fprintf(f, "%ld\n", s);
                if (fclose(f) == 0 && rename(tmp, ckpt) == 0 && !(artifacts && rank == 0))
                    printf("{\"type\":\"checkpoint\",\"step\":%ld,\"path\":\"%s\"}\n", s, ckpt);
            }
            if (artifacts && rank == 0) fake_checkpoint_dir(out, s);
        }
    }
    if (artifacts && rank == 0 && out && *out) fake_exports(out);
    printf("{\"type\":\"summary\",\"steps\":%ld,\"resumed_from\":%ld}\n", steps, start);
    fprintf(stderr, "fake_worker: done\n");
    int code = (int)opt("fake_exit_code", 0);
    json_decref(spec); /* after the last opt(): labels point into spec */
    return code;
}
