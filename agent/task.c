/* Worker supervision: start (fork + execve), stop (process-group signals),
 * reap, re-adopt after an agent restart, and read the per-rank log files.
 * See task.h for the on-disk layout. */
#define _GNU_SOURCE
#include "agent/task.h"

#include "api/exit_codes.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Exited tasks older than this are not reloaded after a restart. */
#define TASK_FORGET_S 600

void task_dir_path(const char *work_dir, const char *job, int attempt, int rank, char *out,
                   size_t len) {
    snprintf(out, len, "%s/tasks/%s.%d.%d", work_dir, job, attempt, rank);
}

/* Kernel start time (clock ticks since boot) of pid, or -1; *zombie set when
 * the process is a zombie. */
static long long proc_starttime(pid_t pid, int *zombie) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    char state = 0;
    long long st = -1;
    /* after ") ": state(3) ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime cutime cstime priority nice threads
     * itrealvalue starttime(22) */
    int field = 2;
    for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " ")) {
        field++;
        if (field == 3) state = tok[0];
        if (field == 22) {
            st = atoll(tok);
            break;
        }
    }
    if (zombie) *zombie = state == 'Z';
    return st;
}

static char *read_small(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = calloc(1, 4096);
    if (buf && fread(buf, 1, 4095, f) == 0 && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static void write_exit_file(struct task *t) {
    char path[1100], line[256];
    snprintf(path, sizeof path, "%s/exit", t->dir);
    int n = snprintf(line, sizeof line, "%d %s\n", t->exit_code, t->exit_reason);
    if (fs_write_atomic(path, line, (size_t)n, 0644, FS_NO_FSYNC) != 0)
        log_warn("task %s: cannot write %s: %s", t->key, path, strerror(errno));
}

static struct task *task_alloc(const char *work_dir, const char *job, int attempt, int rank) {
    /* A job id longer than the field is not one loomd issued (a stray
     * directory under tasks/): refused rather than truncated. */
    size_t jl = strlen(job);
    if (jl >= sizeof((struct task *)0)->job) return NULL;
    struct task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    memcpy(t->job, job, jl + 1);
    t->attempt = attempt;
    t->rank = rank;
    /* The precision bounds the id for the compiler too (-Wformat-truncation). */
    snprintf(t->key, sizeof t->key, "%.*s.%d.%d", (int)(sizeof t->job - 1), t->job, attempt, rank);
    task_dir_path(work_dir, job, attempt, rank, t->dir, sizeof t->dir);
    t->last_step = -1;
    t->exit_code = LOOM_EXIT_UNKNOWN;
    return t;
}

/* Contract variables the agent sets: 9 always, 6 comm and timing, OMP_NUM_THREADS,
 * LOOM_CPU_PEAK_GFLOPS. */
#define TASK_ENV_VARS 18

static int is_contract_var(const char *e) {
    static const char *const names[] = {
        "LOOM_JOB=",         "LOOM_ATTEMPT=",    "LOOM_RANK=",        "LOOM_WORLD=",
        "LOOM_LOCAL_RANK=",  "LOOM_RDZV=",       "LOOM_RDZV_TOKEN=",  "CUDA_VISIBLE_DEVICES=",
        "NCCL_NVLS_ENABLE=", "LOOM_JOIN_TOKEN=", "LOOM_TOKEN=",       "LOOM_ADMIN_TOKEN=",
        "LOOM_COMM_HOST=",   "LOOM_COMM_IFACE=", "LOOM_MASTER_ADDR=", "LOOM_RANK_STEPS=",
        "LOOM_DIAG="};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strncmp(e, names[i], strlen(names[i]))) return 1;
    return !strncmp(e, "LOOM_CPU_PEAK_GFLOPS=", 21); /* agent/cpupeak.h */
}

/* The worker's environment: ours without the contract variables, then
 * the contract's for this rank. The strings made here go into vars[] (the
 * caller frees them, also on failure); NULL when out of memory. */
static char **task_env(const struct task_spec *s, char *vars[TASK_ENV_VARS]) {
    int ne = 0;
    while (environ[ne])
        ne++;
    char **envp = calloc((size_t)ne + TASK_ENV_VARS + 2, sizeof *envp);
    if (!envp) return NULL;
    int k = 0;
    for (int i = 0; i < ne; i++)
        if (!is_contract_var(environ[i])) envp[k++] = environ[i];
    int cpu = s->device_kind && !strcmp(s->device_kind, "cpu");
    if (asprintf(&vars[0], "LOOM_JOB=%s", s->job) < 0 ||
        asprintf(&vars[1], "LOOM_ATTEMPT=%d", s->attempt) < 0 ||
        asprintf(&vars[2], "LOOM_RANK=%d", s->rank) < 0 ||
        asprintf(&vars[3], "LOOM_WORLD=%d", s->world) < 0 ||
        asprintf(&vars[4], "LOOM_LOCAL_RANK=%d", s->local_rank) < 0 ||
        asprintf(&vars[5], "LOOM_RDZV=%s", s->rdzv ? s->rdzv : "") < 0 ||
        asprintf(&vars[6], "LOOM_RDZV_TOKEN=%s", s->rdzv_token ? s->rdzv_token : "") < 0 ||
        asprintf(&vars[7], "CUDA_VISIBLE_DEVICES=%s",
                 cpu ? "" : (s->device_uuid && *s->device_uuid ? s->device_uuid : "0")) < 0 ||
        asprintf(&vars[8], "NCCL_NVLS_ENABLE=0") < 0) {
        memset(vars, 0, TASK_ENV_VARS * sizeof *vars);
        free(envp);
        return NULL;
    }
    int nv = 9;
    /* The listen address (agent/commaddr.h). The agent's own LOOM_COMM_*
     * values were its overrides and are already folded into these. */
    int cuda = s->device_kind && !strcmp(s->device_kind, "cuda");
    const char *user_nccl = getenv("NCCL_SOCKET_IFNAME");
    struct {
        int on;
        const char *fmt, *val;
    } comm[] = {
        {s->comm_iface && *s->comm_iface, "LOOM_COMM_IFACE=%s", s->comm_iface},
        {s->comm_host && *s->comm_host, "LOOM_COMM_HOST=%s", s->comm_host},
        /* "=name": NCCL matches the exact name, not every name with the prefix */
        {cuda && s->comm_ifname && *s->comm_ifname && !(user_nccl && *user_nccl),
         "NCCL_SOCKET_IFNAME==%s", s->comm_ifname},
        {s->master_addr && *s->master_addr, "LOOM_MASTER_ADDR=%s", s->master_addr},
        /* every rank reports its step timing (loomd's straggler diagnosis),
         * unless diagnosis sampling is off (A/B runs, docs/perf.md) */
        {s->diag, "LOOM_RANK_STEPS=%s", "1"},
        {!s->diag, "LOOM_DIAG=%s", "0"},
    };
    for (size_t i = 0; i < sizeof comm / sizeof *comm; i++) {
        if (!comm[i].on) continue;
        if (asprintf(&vars[nv++], comm[i].fmt, comm[i].val) < 0) {
            vars[--nv] = NULL;
            free(envp);
            return NULL;
        }
    }
    /* CPU ranks share the node's cores: without a limit every rank starts one
     * OpenMP thread per core and N ranks oversubscribe the machine N times. */
    if (cpu && s->threads > 0 && !getenv("OMP_NUM_THREADS") &&
        asprintf(&vars[nv++], "OMP_NUM_THREADS=%d", s->threads) < 0) {
        vars[--nv] = NULL;
        free(envp);
        return NULL;
    }
    /* The node's measured peak (agent/cpupeak.h): the worker's mfu on cpu. */
    if (cpu && s->cpu_peak_gflops > 0 &&
        asprintf(&vars[nv++], "LOOM_CPU_PEAK_GFLOPS=%.3f", s->cpu_peak_gflops) < 0) {
        vars[--nv] = NULL;
        free(envp);
        return NULL;
    }
    for (int i = 0; i < nv; i++)
        envp[k++] = vars[i];
    envp[k] = NULL;
    return envp;
}

/* In the forked child: async-signal-safe calls only (the agent has threads). */
__attribute__((noreturn)) static void exec_child(const char *dir, const char *worker,
                                                 const char **argv, char **envp, int nullfd,
                                                 int outfd, int errfd) {
    sigset_t empty;
    sigemptyset(&empty);
    setpgid(0, 0);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGHUP, &dfl, NULL);
    sigprocmask(SIG_SETMASK, &empty, NULL);
    dup2(nullfd, 0);
    dup2(outfd, 1);
    dup2(errfd, 2);
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
    if (chdir(dir) != 0) _exit(126);
    execve(worker, (char *const *)argv, envp);
    static const char msg[] = "loom-agent: execve of the worker failed\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127);
}

struct task *task_start(const char *work_dir, const struct task_spec *s, int64_t now_ms) {
    struct task *t = NULL;
    char **envp = NULL;
    char *vars[TASK_ENV_VARS] = {0};
    int outfd = -1, errfd = -1, nullfd = -1;
    char path[1100], spec_path[1100], tasks[1100];

    t = task_alloc(work_dir, s->job, s->attempt, s->rank);
    if (!t) goto fail;
    t->world = s->world;
    t->local_rank = s->local_rank;
    t->device = s->device;
    snprintf(tasks, sizeof tasks, "%s/tasks", work_dir);
    if (fs_mkdir_p(tasks, 0755, 0) != 0) {
        log_error("task %s: cannot create %s: %s", t->key, tasks, strerror(errno));
        goto fail;
    }
    if (mkdir(t->dir, 0755) != 0) {
        log_error("task %s: %s: %s (never started twice)", t->key, t->dir, strerror(errno));
        goto fail;
    }
    snprintf(spec_path, sizeof spec_path, "%s/spec.json", t->dir);
    if (fs_write_atomic(spec_path, s->spec_json, strlen(s->spec_json), 0644, FS_NO_FSYNC) != 0) {
        log_error("task %s: cannot write %s", t->key, spec_path);
        goto fail;
    }
    char meta[256];
    int mn = snprintf(meta, sizeof meta, "%d %d %d\n", s->world, s->local_rank, s->device);
    snprintf(path, sizeof path, "%s/meta", t->dir);
    fs_write_atomic(path, meta, (size_t)mn, 0644, FS_NO_FSYNC);
    snprintf(path, sizeof path, "%s/stdout.log", t->dir);
    outfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    snprintf(path, sizeof path, "%s/stderr.log", t->dir);
    errfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (outfd < 0 || errfd < 0 || nullfd < 0) {
        log_error("task %s: cannot open log files in %s", t->key, t->dir);
        goto fail;
    }

    /* Everything the child needs is built before fork: the agent has other
     * threads, so the child may only call async-signal-safe functions. */
    envp = task_env(s, vars);
    if (!envp) goto fail;
    int cpu = s->device_kind && !strcmp(s->device_kind, "cpu");
    /* The child changes into the task directory: resolve a relative path. */
    char worker_abs[4096];
    const char *worker = s->worker;
    if (worker[0] != '/' && realpath(worker, worker_abs)) worker = worker_abs;
    const char *argv[10];
    int a = 0;
    argv[a++] = worker;
    argv[a++] = "--spec";
    argv[a++] = spec_path;
    argv[a++] = "--device";
    argv[a++] = cpu ? "cpu" : "cuda";
    if (s->out_dir && *s->out_dir) {
        argv[a++] = "--out";
        argv[a++] = s->out_dir;
    }
    argv[a] = NULL;

    pid_t pid = fork();
    if (pid < 0) {
        log_error("task %s: fork: %s", t->key, strerror(errno));
        goto fail;
    }
    if (pid == 0) exec_child(t->dir, worker, argv, envp, nullfd, outfd, errfd);
    setpgid(pid, pid); /* both sides set it: no race with an early killpg */
    t->pid = pid;
    t->starttime = proc_starttime(pid, NULL);
    t->started_ms = now_ms;
    t->state = TASK_RUNNING;
    char pidline[64];
    int pn = snprintf(pidline, sizeof pidline, "%d %lld\n", (int)pid, t->starttime);
    snprintf(path, sizeof path, "%s/pid", t->dir);
    if (fs_write_atomic(path, pidline, (size_t)pn, 0644, FS_NO_FSYNC) != 0)
        log_warn("task %s: cannot write pid file", t->key);
    log_info("task %s: started pid %d (%s, device %d)", t->key, (int)pid, s->worker, s->device);
    goto out;
fail:
    task_free(t);
    t = NULL;
out:
    for (int i = 0; i < TASK_ENV_VARS; i++)
        free(vars[i]);
    free(envp);
    if (outfd >= 0) close(outfd);
    if (errfd >= 0) close(errfd);
    if (nullfd >= 0) close(nullfd);
    return t;
}

void task_free(struct task *t) {
    free(t);
}

void task_stop(struct task *t, int64_t now_ms, int grace_ms, const char *reason) {
    if (t->state != TASK_RUNNING) return;
    log_info("task %s: stopping pid %d (%s)", t->key, (int)t->pid, reason);
    if (killpg(t->pid, SIGTERM) != 0 && errno != ESRCH)
        log_warn("task %s: killpg: %s", t->key, strerror(errno));
    t->state = TASK_STOPPING;
    t->stop_deadline_ms = now_ms + grace_ms;
    snprintf(t->exit_reason, sizeof t->exit_reason, "stopped: %s", reason);
}

static void finish(struct task *t, int64_t now_ms, int code, const char *why) {
    /* The leader is gone; anything left in its group is an orphan: kill it.
     * The group id cannot be reused while members remain. */
    killpg(t->pid, SIGKILL);
    t->exit_code = code;
    if (t->state == TASK_STOPPING) {
        size_t n = strlen(t->exit_reason);
        snprintf(t->exit_reason + n, sizeof t->exit_reason - n, " (%s)", why);
    } else {
        snprintf(t->exit_reason, sizeof t->exit_reason, "%s", why);
    }
    t->state = TASK_EXITED;
    t->exited_ms = now_ms;
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    t->exited_wall_ms = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000;
    write_exit_file(t);
    log_info("task %s: pid %d %s", t->key, (int)t->pid, t->exit_reason);
}

int task_poll(struct task *t, int64_t now_ms) {
    if (t->state == TASK_EXITED) return 0;
    char why[96];
    if (!t->adopted) {
        int st = 0;
        pid_t r = waitpid(t->pid, &st, WNOHANG);
        if (r == t->pid) {
            int code;
            if (WIFEXITED(st)) {
                code = WEXITSTATUS(st);
                snprintf(why, sizeof why, "exited with code %d", code);
            } else {
                code = LOOM_EXIT_SIGNAL_BASE + WTERMSIG(st);
                snprintf(why, sizeof why, "killed by signal %d (%s)", WTERMSIG(st),
                         strsignal(WTERMSIG(st)));
            }
            finish(t, now_ms, code, why);
            return 1;
        }
        if (r < 0 && errno == ECHILD) {
            finish(t, now_ms, LOOM_EXIT_UNKNOWN, "exit status lost");
            return 1;
        }
    } else {
        int zombie = 0;
        long long st = proc_starttime(t->pid, &zombie);
        if (st < 0 || st != t->starttime || zombie) {
            /* Not our child: the exit status is not ours to read. A worker
             * that printed its summary line finished its work. */
            if (t->summary_seen)
                finish(t, now_ms, 0, "adopted worker exited after its summary");
            else
                finish(t, now_ms, LOOM_EXIT_UNKNOWN, "adopted worker exited; status unknown");
            return 1;
        }
    }
    if (t->state == TASK_STOPPING && now_ms >= t->stop_deadline_ms) {
        log_warn("task %s: pid %d ignored SIGTERM; sending SIGKILL", t->key, (int)t->pid);
        killpg(t->pid, SIGKILL);
        t->stop_deadline_ms = INT64_MAX;
    }
    return 0;
}

void task_scan_stdout(struct task *t, int64_t now_ms,
                      void (*cb)(struct task *, void *ud, void *obj), void *ud) {
    char path[1100];
    snprintf(path, sizeof path, "%s/stdout.log", t->dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    enum { CHUNK = 256 * 1024 };
    char *buf = malloc(CHUNK + 1);
    if (!buf) {
        close(fd);
        return;
    }
    ssize_t n = pread(fd, buf, CHUNK, t->parse_off);
    close(fd);
    if (n <= 0) {
        free(buf);
        return;
    }
    buf[n] = 0;
    char *p = buf, *end = buf + n;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) {
            /* A line longer than the chunk is skipped rather than stalling. */
            if (p == buf && n == CHUNK) t->parse_off += n;
            break;
        }
        *nl = 0;
        json_t *o = json_loads(p, 0, NULL);
        if (json_is_object(o)) {
            const char *type = json_string_value(json_object_get(o, "type"));
            if (type && !strcmp(type, "step")) {
                json_int_t step = json_integer_value(json_object_get(o, "step"));
                if (step > t->last_step) {
                    t->last_step = (long)step;
                    t->last_step_ms = now_ms;
                }
            } else if (type && !strcmp(type, "summary")) {
                t->summary_seen = 1;
            }
            if (cb) cb(t, ud, o);
        }
        json_decref(o);
        t->parse_off += (long)(nl - p) + 1;
        p = nl + 1;
    }
    free(buf);
}

char *task_read_log(struct task *t, int stream, long max, long *n) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", t->dir, stream == 0 ? "stdout.log" : "stderr.log");
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    char *buf = malloc((size_t)max);
    ssize_t r = buf ? pread(fd, buf, (size_t)max, t->ship_off[stream]) : -1;
    close(fd);
    if (r <= 0) {
        free(buf);
        return NULL;
    }
    *n = r;
    return buf;
}

struct task *task_scan_dir(const char *work_dir, int adopt, int64_t now_ms) {
    char path[1100];
    snprintf(path, sizeof path, "%s/tasks", work_dir);
    DIR *d = opendir(path);
    if (!d) return NULL;
    struct task *list = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char name[256];
        snprintf(name, sizeof name, "%s", e->d_name);
        char *r = strrchr(name, '.');
        if (!r) continue;
        *r = 0;
        char *a = strrchr(name, '.');
        if (!a) continue;
        *a = 0;
        if (strlen(name) >= sizeof((struct task *)0)->job) continue; /* not a task of ours */
        struct task *t = task_alloc(work_dir, name, atoi(a + 1), atoi(r + 1));
        if (!t) break;
        char fpath[1200];
        snprintf(fpath, sizeof fpath, "%s/meta", t->dir);
        char *meta = read_small(fpath);
        if (meta) sscanf(meta, "%d %d %d", &t->world, &t->local_rank, &t->device);
        free(meta);
        snprintf(fpath, sizeof fpath, "%s/exit", t->dir);
        struct stat est;
        if (stat(fpath, &est) == 0 && time(NULL) - est.st_mtime > TASK_FORGET_S) {
            /* Long finished and long reported: the directory alone keeps it
             * from ever starting again; no need to carry it in memory. */
            task_free(t);
            continue;
        }
        char *ex = read_small(fpath);
        if (ex) {
            int off = 0;
            if (sscanf(ex, "%d %n", &t->exit_code, &off) >= 1) {
                char *nl = strchr(ex + off, '\n');
                if (nl) *nl = 0;
                snprintf(t->exit_reason, sizeof t->exit_reason, "%s", ex + off);
            }
            free(ex);
            t->state = TASK_EXITED;
            t->exited_ms = now_ms;
            t->next = list;
            list = t;
            continue;
        }
        snprintf(fpath, sizeof fpath, "%s/pid", t->dir);
        char *pl = read_small(fpath);
        int pid = 0;
        long long st = -1;
        if (pl) sscanf(pl, "%d %lld", &pid, &st);
        free(pl);
        int zombie = 0;
        long long now_st = pid > 0 ? proc_starttime(pid, &zombie) : -1;
        t->pid = pid;
        t->starttime = st;
        t->adopted = 1;
        t->started_ms = now_ms;
        task_scan_stdout(t, now_ms, NULL, NULL); /* learn last_step, summary */
        t->parse_off = 0;                        /* metrics are re-shipped (deduplicated) */
        if (pid <= 0 || now_st < 0 || now_st != st || zombie) {
            t->state = TASK_RUNNING;
            finish(t, now_ms, t->summary_seen ? 0 : -1,
                   t->summary_seen ? "worker exited while the agent was down, after its summary"
                                   : "worker exited while the agent was down; status unknown");
        } else if (adopt) {
            t->state = TASK_RUNNING;
            log_info("task %s: re-adopted running worker pid %d", t->key, pid);
        } else {
            t->state = TASK_RUNNING;
            killpg(pid, SIGKILL);
            for (int i = 0; i < 100; i++) {
                long long s2 = proc_starttime(pid, &zombie);
                if (s2 < 0 || s2 != st || zombie) break;
                usleep(20000);
            }
            finish(t, now_ms, 137, "killed: agent restarted without --adopt");
        }
        t->next = list;
        list = t;
    }
    closedir(d);
    return list;
}
