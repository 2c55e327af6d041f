/* Worker supervision for loom-agent: one task = one rank of one attempt.
 *
 * A task lives in its own directory WORK/tasks/JOB.ATTEMPT.RANK/ holding
 * spec.json (the job spec given to the worker), pid ("PID STARTTIME", the
 * kernel start time guards against pid reuse), stdout.log and stderr.log (the
 * worker writes them directly, so workers survive an agent restart) and,
 * once the worker is gone, exit ("CODE REASON"). The directory is also the
 * "started once" marker: a task whose directory exists is never started again.
 *
 * The worker runs via fork + execve (no shell) as the leader of its own
 * process group; stop = SIGTERM to the group, then SIGKILL after the grace
 * period; the agent reaps its children (no zombies) and SIGKILLs what is left
 * of the group after the leader exits (no orphans). Called from the agent's
 * main thread only. */
#ifndef LOOM_AGENT_TASK_H
#define LOOM_AGENT_TASK_H

#include <stdint.h>
#include <sys/types.h>

enum task_state { TASK_RUNNING = 0, TASK_STOPPING = 1, TASK_EXITED = 2 };

struct task {
    char job[64];
    int attempt, rank, world, local_rank, device;
    char key[128];  /* "JOB.ATTEMPT.RANK" */
    char dir[1024]; /* task directory */
    pid_t pid;      /* process group id too */
    long long starttime;
    int adopted; /* found running after an agent restart: not our child */
    enum task_state state;
    int exit_code; /* exit status, 128+signal, or -1 unknown */
    char exit_reason[160];
    int64_t started_ms, stop_deadline_ms, exited_ms;
    int64_t exited_wall_ms; /* wall clock of the exit (ordering failures across ranks) */
    long last_step;
    int64_t last_step_ms;
    int summary_seen;
    long parse_off;     /* stdout bytes parsed for JSON lines */
    long ship_off[2];   /* stdout, stderr bytes acknowledged by loomd */
    int final_reported; /* loomd acknowledged the exit */
    struct task *next;
};

/* Everything needed to start one rank. Strings are borrowed. */
struct task_spec {
    const char *job;
    int attempt, rank, world, local_rank, device;
    const char *device_kind; /* "cuda" or "cpu" */
    const char *device_uuid; /* CUDA_VISIBLE_DEVICES value for cuda */
    const char *spec_json;   /* written to spec.json */
    const char *out_dir;     /* --out (may be NULL or "") */
    const char *rdzv, *rdzv_token;
    const char *worker; /* path of the worker binary */
    int threads;        /* cpu tasks: OMP_NUM_THREADS when the agent's env has none (0: unset) */
    double cpu_peak_gflops; /* cpu tasks: LOOM_CPU_PEAK_GFLOPS, one device's peak (0: unset) */
    /* Where the worker listens (agent/commaddr.h), each NULL or "" to leave
     * the worker's own default: LOOM_COMM_IFACE (an interface override),
     * else LOOM_COMM_HOST (an address); NCCL_SOCKET_IFNAME on cuda unless
     * the agent's environment has one; LOOM_MASTER_ADDR, rank 0's advertised
     * address as loomd gave it. */
    const char *comm_iface, *comm_host, *comm_ifname, *master_addr;
    /* Diagnosis sampling (agent config diag): 1 sets LOOM_RANK_STEPS=1 (every
     * rank reports its step timing), 0 sets LOOM_DIAG=0 (worker/tuning.c). */
    int diag;
};

/* Path of the task directory for (job, attempt, rank) under work_dir. */
void task_dir_path(const char *work_dir, const char *job, int attempt, int rank, char *out,
                   size_t len);

/* Start the worker. Returns a new task (caller owns, task_free) or NULL with a
 * message logged; a task whose directory already exists is refused (NULL). */
struct task *task_start(const char *work_dir, const struct task_spec *s, int64_t now_ms);
void task_free(struct task *t); /* accepts NULL */

/* Ask the worker's group to stop: SIGTERM now, SIGKILL after grace_ms. */
void task_stop(struct task *t, int64_t now_ms, int grace_ms, const char *reason);

/* Reap / check liveness, escalate to SIGKILL past the deadline. Returns 1
 * when the task just became TASK_EXITED (exit file written), else 0. */
int task_poll(struct task *t, int64_t now_ms);

/* Parse new complete JSON lines of stdout.log; calls cb for each object
 * (borrowed) and updates last_step / summary_seen. */
void task_scan_stdout(struct task *t, int64_t now_ms,
                      void (*cb)(struct task *, void *ud, void *obj), void *ud);

/* Read up to max bytes of stream (0 stdout, 1 stderr) from ship_off. Returns
 * a malloc'ed buffer (caller frees) and its length in *n, NULL when nothing. */
char *task_read_log(struct task *t, int stream, long max, long *n);

/* Scan WORK/tasks after a restart: tasks with an exit file come back as
 * EXITED; live workers are re-adopted (adopt != 0) or killed and recorded
 * as exited with reason "killed: agent restarted". Tasks that exited more
 * than 10 minutes ago are skipped (their directories still block a second
 * start). Returns the list. */
struct task *task_scan_dir(const char *work_dir, int adopt, int64_t now_ms);

#endif
