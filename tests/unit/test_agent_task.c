/* Unit tests of loom-agent's supervision (agent/task.c) and inventory
 * (agent/gpu.c), with tests/fake_worker as the worker (path in argv[1]):
 * start with the env contract, JSON-line parsing, stop escalating to
 * SIGKILL for a worker that ignores SIGTERM, no zombie and no orphan left in
 * the process group, pid-file re-adoption and kill-on-restart, the
 * never-start-twice marker, and the cpu / no-driver inventory. */
#include "agent/cpupeak.h"
#include "agent/gpu.h"
#include "agent/task.h"
#include "common/clock.h"
#include "tests/check.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Polls until the task exits or timeout; returns elapsed ms or -1. */
static long run_until_exit(struct task *t, long timeout_ms) {
    int64_t t0 = clock_mono_ms();
    while (clock_mono_ms() - t0 < timeout_ms) {
        if (task_poll(t, clock_mono_ms())) return (long)(clock_mono_ms() - t0);
        clock_sleep_ms(10);
    }
    return -1;
}

static int steps_seen;
static void on_line(struct task *t, void *ud, void *obj) {
    const char *type = json_string_value(json_object_get((json_t *)obj, "type"));
    if (type && !strcmp(type, "step")) steps_seen++;
}

/* Number of live (non-zombie) processes listed in the pid dir. */
static int alive_in(const char *pid_dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s", pid_dir);
    FILE *p = popen(cmd, "r");
    int alive = 0;
    char line[64];
    while (p && fgets(line, sizeof line, p)) {
        int pid = atoi(line);
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *r = strrchr(buf, ')');
        if (r && r[2] != 'Z') alive++;
    }
    if (p) pclose(p);
    return alive;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_agent_task FAKE_WORKER\n");
        return 2;
    }
    const char *worker = argv[1];
    char base[] = "/tmp/loom-agent-test-XXXXXX";
    if (!mkdtemp(base)) return 2;
    char pid_dir[256], work[256];
    snprintf(pid_dir, sizeof pid_dir, "%s/pids", base);
    snprintf(work, sizeof work, "%s/work", base);
    mkdir(pid_dir, 0755);
    mkdir(work, 0755);
    setenv("FAKE_PID_DIR", pid_dir, 1);
    setenv("LOOM_JOIN_TOKEN", "secret", 1); /* must not reach the worker */

    /* 1. A normal run: env contract, JSON lines, exit 0. */
    struct task_spec s = {.job = "j-ok",
                          .attempt = 0,
                          .rank = 1,
                          .world = 1,
                          .local_rank = 0,
                          .device = 0,
                          .device_kind = "cpu",
                          .device_uuid = "cpu-0",
                          .spec_json = "{\"train\":{\"steps\":3},\"labels\":{\"fake_step_ms\":"
                                       "\"10\"}}",
                          .out_dir = NULL,
                          .rdzv = "",
                          .rdzv_token = "tok",
                          .worker = worker,
                          .threads = 3,
                          .cpu_peak_gflops = 41.5,
                          .diag = 1};
    unsetenv("OMP_NUM_THREADS");            /* the agent's own setting would win */
    setenv("LOOM_CPU_PEAK_GFLOPS", "7", 1); /* the agent's override: replaced by the spec's */
    struct task *t = task_start(work, &s, clock_mono_ms());
    CHECK(t != NULL);
    if (t) {
        CHECK(run_until_exit(t, 10000) >= 0);
        CHECK(t->state == TASK_EXITED && t->exit_code == 0);
        task_scan_stdout(t, clock_mono_ms(), on_line, NULL);
        CHECK(steps_seen == 3 && t->last_step == 3 && t->summary_seen);
        char path[1200];
        snprintf(path, sizeof path, "%s/exit", t->dir);
        CHECK(access(path, F_OK) == 0);
        /* never twice: the directory exists */
        struct task *again = task_start(work, &s, clock_mono_ms());
        CHECK(again == NULL);
        task_free(again);
        long n = 0;
        char *log = task_read_log(t, 1, 1 << 16, &n);
        CHECK(log && n > 0 && strstr(log, "rank 1/1"));
        CHECK(log && strstr(log, "omp 3")); /* cpu ranks share the node's cores */
        CHECK(log && strstr(log, "cpu peak 41.500"), "%s", log ? log : ""); /* agent/cpupeak.h */
        free(log);
        task_free(t);
    }
    CHECK(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD); /* reaped: no zombie */

    /* 2. Non-zero exit code and a signal are reported as such. */
    s.job = "j-crash";
    s.spec_json = "{\"labels\":{\"fake_crash_step\":\"1\",\"fake_crash_code\":\"5\","
                  "\"fake_step_ms\":\"1\"}}";
    t = task_start(work, &s, clock_mono_ms());
    CHECK(t && run_until_exit(t, 10000) >= 0 && t->exit_code == 5);
    task_free(t);

    /* 3. Stop: the worker ignores SIGTERM and has a child in its group. */
    s.job = "j-stubborn";
    s.spec_json = "{\"labels\":{\"fake_steps\":\"100000\",\"fake_ignore_term\":\"1\","
                  "\"fake_child\":\"1\",\"fake_step_ms\":\"50\"}}";
    t = task_start(work, &s, clock_mono_ms());
    CHECK(t != NULL);
    if (t) {
        for (int i = 0; i < 200 && alive_in(pid_dir) < 2; i++)
            clock_sleep_ms(10);
        CHECK(alive_in(pid_dir) == 2);
        int64_t t0 = clock_mono_ms();
        task_stop(t, t0, 300, "test");
        long took = run_until_exit(t, 5000);
        CHECK(took >= 250 && took < 3000); /* waited the grace, then SIGKILL */
        CHECK(t->exit_code == 128 + SIGKILL);
        CHECK(strstr(t->exit_reason, "stopped: test") != NULL);
        for (int i = 0; i < 100 && alive_in(pid_dir) > 0; i++)
            clock_sleep_ms(10);
        CHECK(alive_in(pid_dir) == 0); /* the child was killed with the group */
        task_free(t);
    }

    /* 4. Restart: a running worker is found through its pid file and
     *    re-adopted; with adopt=0 it is killed and recorded as exited. */
    for (int adopt = 1; adopt >= 0; adopt--) {
        char job[32];
        snprintf(job, sizeof job, "j-adopt%d", adopt);
        s.job = job;
        s.spec_json = "{\"labels\":{\"fake_steps\":\"100000\",\"fake_step_ms\":\"20\"}}";
        t = task_start(work, &s, clock_mono_ms());
        CHECK(t != NULL);
        if (!t) continue;
        pid_t pid = t->pid;
        clock_sleep_ms(100);
        struct task *list = task_scan_dir(work, adopt, clock_mono_ms());
        struct task *found = NULL;
        for (struct task *x = list; x; x = x->next)
            if (!strcmp(x->job, job)) found = x;
        CHECK(found && found->pid == pid && found->adopted);
        if (found && adopt) {
            CHECK(found->state == TASK_RUNNING);
            task_stop(found, clock_mono_ms(), 1000, "test adopt");
            /* not our child in a real restart; here it still is: reap it */
            CHECK(run_until_exit(found, 5000) >= 0);
            waitpid(pid, NULL, 0);
        } else if (found) {
            CHECK(found->state == TASK_EXITED && found->exit_code == 137);
            waitpid(pid, NULL, 0);
        }
        while (list) {
            struct task *n = list->next;
            task_free(list);
            list = n;
        }
        task_free(t);
    }
    CHECK(alive_in(pid_dir) == 0);

    /* 5. Inventory: cpu devices, and NVML absent or present never crashes. */
    struct gpu_inv *g = gpu_inv_new(3);
    CHECK(g && gpu_inv_count(g) == 3 && !strcmp(gpu_inv_kind(g), "cpu"));
    json_t *tel = g ? gpu_inv_telemetry(g) : NULL;
    CHECK(json_array_size(tel) == 3);
    CHECK(json_integer_value(json_object_get(json_array_get(tel, 0), "mem_total_mib")) > 0);
    json_decref(tel);
    gpu_inv_free(g);
    g = gpu_inv_new(0);
    CHECK(g && !strcmp(gpu_inv_kind(g), "cuda") && gpu_inv_count(g) >= 0);
    gpu_inv_free(g);

    /* The worker's --bench-gemm line (agent/cpupeak.h): the number, or 0. */
    static const struct {
        const char *out;
        double want;
    } peaks[] = {
        {"{\"type\":\"cpu_peak\",\"gflops\":41.25,\"threads\":2}\n", 41.25},
        {"log noise\n{\"type\":\"cpu_peak\",\"gflops\":3}", 3},
        {"{\"type\":\"step\",\"gflops\":41.25}\n", 0},
        {"{\"type\":\"cpu_peak\",\"gflops\":\"fast\"}\n", 0},
        {"{\"type\":\"cpu_peak\",\"gflops\":-1}\n", 0},
        {"{\"type\":\"cpu_peak\",\"gflops\":2e7}\n", 0},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof peaks / sizeof *peaks; i++)
        CHECK_NEAR(cpupeak_parse(peaks[i].out), peaks[i].want, 0);
    /* A worker that knows no bench mode (fake_worker exits 2): no peak, promptly. */
    int64_t m0 = clock_mono_ms();
    CHECK(cpupeak_measure(worker, 1, 2000) == 0);
    CHECK(clock_mono_ms() - m0 < 1500);
    CHECK(cpupeak_measure("/nonexistent/loom-worker", 1, 2000) == 0);
    /* One that hangs is killed at the bound. */
    char slow[1200];
    snprintf(slow, sizeof slow, "%s/slow-worker", base);
    FILE *sf = fopen(slow, "w");
    CHECK(sf != NULL);
    if (sf) {
        fputs("#!/bin/sh\nexec sleep 30\n", sf);
        fclose(sf);
        chmod(slow, 0755);
        m0 = clock_mono_ms();
        CHECK(cpupeak_measure(slow, 1, 300) == 0);
        int64_t took = clock_mono_ms() - m0;
        CHECK(took >= 250 && took < 2000, "took %lld ms", (long long)took);
    }

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base);
    return check_summary("test_agent_task");
}
