/* Exit codes of loom-worker as the agent reports them and loomd judges them,
 * and loomctl's (enum loomctl_exit, below).
 *
 * The worker exits with one of these; the agent reports a worker killed by a
 * signal as LOOM_EXIT_SIGNAL_BASE + signal (the shell's convention) and one
 * whose status it could not learn as LOOM_EXIT_UNKNOWN. loomd's supervisor
 * (daemon/supervise.c) never retries LOOM_EXIT_BAD_SPEC: the same spec and
 * data would fail the same way. Header only: no code, no dependencies. */
#ifndef LOOM_API_EXIT_CODES_H
#define LOOM_API_EXIT_CODES_H

enum loom_exit {
    LOOM_EXIT_UNKNOWN = -1,      /* agent: not started, or the exit status was lost */
    LOOM_EXIT_OK = 0,            /* trained to the last step */
    LOOM_EXIT_FAILED = 1,        /* any other failure (device, comm, I/O, ...) */
    LOOM_EXIT_BAD_SPEC = 2,      /* bad spec, bad data or an unsupported request: not retried */
    LOOM_EXIT_SIGNAL_BASE = 128, /* agent: killed by signal N is reported as 128 + N */
    LOOM_EXIT_STOPPED = 143,     /* stopped by SIGTERM/SIGINT after saving a checkpoint */
};

/* loomctl's exit codes. `submit --wait`, `submit --follow` and `wait` end
 * with the job's outcome; every command uses the first four. */
enum loomctl_exit {
    LOOMCTL_EXIT_SUCCEEDED = 0,     /* done; for a job: it succeeded */
    LOOMCTL_EXIT_ERROR = 1,         /* loomd answered an error (printed) */
    LOOMCTL_EXIT_USAGE = 2,         /* bad command line or input file */
    LOOMCTL_EXIT_UNREACHABLE = 3,   /* loomd could not be reached */
    LOOMCTL_EXIT_JOB_FAILED = 4,    /* the job ended failed */
    LOOMCTL_EXIT_JOB_CANCELLED = 5, /* the job ended cancelled */
    LOOMCTL_EXIT_WAIT_TIMEOUT = 6,  /* --timeout passed before the job ended */
};

#endif
