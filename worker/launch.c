/* Local launcher (see launch.h): fork/exec N ranks with a file: rendezvous,
 * supervise them, stop all when one fails. */
#include "worker/launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

#define LAUNCH_GRACE_S 10

static volatile sig_atomic_t g_forward; /* signal to pass on, 0 when none */

static void on_signal(int sig) {
    g_forward = sig;
}

/* 1 when argv[i] is one of the flags the launcher sets itself; *skip is the
 * number of argv entries it occupies. */
static int launcher_flag(char **argv, int argc, int i, int *skip) {
    static const char *flags[] = {"--nproc", "--rank", "--world", "--rdzv", "--local-rank"};
    for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++) {
        size_t n = strlen(flags[k]);
        if (strncmp(argv[i], flags[k], n) == 0) {
            if (argv[i][n] == '=') {
                *skip = 1;
                return 1;
            }
            if (argv[i][n] == '\0') {
                *skip = i + 1 < argc ? 2 : 1;
                return 1;
            }
        }
    }
    return 0;
}

static void rm_rf(const char *dir) {
    pid_t p = fork();
    if (p == 0) {
        execlp("rm", "rm", "-rf", dir, (char *)NULL);
        _exit(127);
    }
    if (p > 0) waitpid(p, NULL, 0);
}

/* The n-th comma-separated entry of list (copied into out), or -1. */
static int nth_entry(const char *list, int n, char *out, size_t outlen) {
    const char *p = list;
    for (int i = 0; i < n && p; i++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    if (!p || !*p) return -1;
    size_t len = strcspn(p, ",");
    if (len >= outlen) return -1;
    memcpy(out, p, len);
    out[len] = '\0';
    return 0;
}

int launch_local(int argc, char **argv, int nproc) {
    char dir[256], rdzv[300];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/loom-rdzv-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        log_error("launch: cannot create a rendezvous directory: %s", strerror(errno));
        return 1;
    }
    snprintf(rdzv, sizeof(rdzv), "file:%s", dir);
    char *visible = getenv("CUDA_VISIBLE_DEVICES") ? strdup(getenv("CUDA_VISIBLE_DEVICES")) : NULL;

    /* Child argv: exe, the caller's arguments minus ours, then ours. */
    char **cargv = calloc((size_t)argc + 12, sizeof(char *));
    pid_t *pids = calloc((size_t)nproc, sizeof(pid_t));
    int *status = calloc((size_t)nproc, sizeof(int));
    if (!cargv || !pids || !status) {
        log_error("launch: out of memory");
        free(cargv);
        free(pids);
        free(status);
        free(visible);
        rm_rf(dir);
        return 1;
    }
    int n = 0;
    cargv[n++] = argv[0];
    for (int i = 1; i < argc;) {
        int skip = 1;
        if (!launcher_flag(argv, argc, i, &skip)) cargv[n++] = argv[i];
        i += skip;
    }
    char rank_s[16], world_s[16];
    snprintf(world_s, sizeof(world_s), "%d", nproc);
    cargv[n++] = "--world";
    cargv[n++] = world_s;
    cargv[n++] = "--rdzv";
    cargv[n++] = rdzv;
    cargv[n++] = "--rank";
    cargv[n++] = rank_s;
    cargv[n++] = "--local-rank";
    cargv[n++] = rank_s;
    cargv[n] = NULL;

    struct sigaction sa, old_term, old_int;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    fflush(stdout);
    fflush(stderr);
    int started = 0;
    for (int r = 0; r < nproc; r++) {
        snprintf(rank_s, sizeof(rank_s), "%d", r);
        pid_t p = fork();
        if (p < 0) {
            log_error("launch: fork of rank %d failed: %s", r, strerror(errno));
            break;
        }
        if (p == 0) {
            sigaction(SIGTERM, &old_term, NULL);
            sigaction(SIGINT, &old_int, NULL);
            setenv("LOOM_NPROC", "1", 1);
            char dev[64];
            if (visible && nth_entry(visible, r, dev, sizeof(dev)) == 0) {
                setenv("CUDA_VISIBLE_DEVICES", dev, 1);
            } else if (!visible) { /* all GPUs visible: rank r takes GPU r */
                snprintf(dev, sizeof(dev), "%d", r);
                setenv("CUDA_VISIBLE_DEVICES", dev, 1);
            }
            if (r > 0 && dup2(STDERR_FILENO, STDOUT_FILENO) < 0) _exit(126);
            execv("/proc/self/exe", cargv);
            execvp(argv[0], cargv);
            fprintf(stderr, "launch: cannot exec %s: %s\n", argv[0], strerror(errno));
            _exit(127);
        }
        pids[r] = p;
        started++;
    }
    log_info("launch: %d rank(s) started, rendezvous %s", started, rdzv);

    int left = started, first_bad = -1, code = started == nproc ? 0 : 1;
    double stop_at = 0; /* when the grace period for SIGTERM ends */
    int forwarded = 0;  /* a signal to the launcher was passed on */
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < nproc; r++) {
                if (pids[r] != p) continue;
                pids[r] = 0;
                left--;
                status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                if (status[r] != 0 && first_bad < 0) {
                    first_bad = r;
                    code = status[r];
                    if (forwarded)
                        log_info("launch: rank %d stopped (exit %d)", r, status[r]);
                    else
                        log_error("launch: rank %d exited with %d; stopping the other ranks", r,
                                  status[r]);
                }
            }
            continue;
        }
        if (p < 0 && errno != EINTR && errno != 0) break;
        int fwd = g_forward;
        if ((first_bad >= 0 || fwd) && stop_at == 0) {
            g_forward = 0;
            forwarded = fwd != 0;
            for (int r = 0; r < nproc; r++)
                if (pids[r] > 0) kill(pids[r], fwd ? fwd : SIGTERM);
            stop_at = clock_mono_s() + LAUNCH_GRACE_S;
        } else if (stop_at > 0 && clock_mono_s() > stop_at) {
            for (int r = 0; r < nproc; r++)
                if (pids[r] > 0) kill(pids[r], SIGKILL);
            stop_at = clock_mono_s() + 3600;
        }
        usleep(20000);
    }
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    rm_rf(dir);
    free(cargv);
    free(pids);
    free(status);
    free(visible);
    return code;
}
