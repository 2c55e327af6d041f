/* CPU peak calibration at agent start (agent/cpupeak.h). */
#define _GNU_SOURCE
#include "agent/cpupeak.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double cpupeak_parse(const char *out) {
    double g = 0;
    const char *line = out;
    while (line && *line && g == 0) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        json_t *j = json_loadb(line, len, 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        json_t *v = json_object_get(j, "gflops");
        if (type && !strcmp(type, "cpu_peak") && json_is_number(v)) g = json_number_value(v);
        json_decref(j);
        line = nl ? nl + 1 : NULL;
    }
    return g > 0 && g <= 1e7 ? g : 0;
}

double cpupeak_measure(const char *worker, int threads, int timeout_ms) {
    char tbuf[16], out[4096];
    snprintf(tbuf, sizeof tbuf, "%d", threads > 0 ? threads : 1);
    const char *argv[] = {worker, "--bench-gemm", "--threads", tbuf, "--log-level", "warn", NULL};
    size_t used = 0;
    int fds[2] = {-1, -1};
    if (pipe2(fds, O_CLOEXEC) != 0) {
        log_warn("cpu peak: pipe: %s", strerror(errno));
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0) {
        log_warn("cpu peak: fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 0;
    }
    if (pid == 0) { /* async-signal-safe calls only: the agent may have threads */
        dup2(fds[1], 1);
        execve(worker, (char *const *)argv, environ);
        _exit(127);
    }
    close(fds[1]);
    long long deadline = mono_ms() + timeout_ms;
    int timed_out = 0;
    for (;;) {
        long long left = deadline - mono_ms();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        int pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            timed_out = pr == 0;
            break;
        }
        ssize_t n = read(fds[0], out + used, sizeof out - 1 - used);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        used += (size_t)n;
        if (used == sizeof out - 1) break;
    }
    out[used] = 0;
    close(fds[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    double g = timed_out ? 0 : cpupeak_parse(out);
    if (timed_out)
        log_warn("cpu peak: %s --bench-gemm ran past %d ms: killed, mfu not reported", worker,
                 timeout_ms);
    else if (g <= 0)
        log_warn("cpu peak: %s --bench-gemm gave no number (exit status %d): mfu not reported",
                 worker, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return g;
}
