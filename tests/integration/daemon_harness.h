/* Test harness for integration tests that run the real loomd: start it on an
 * ephemeral loopback port (--listen 127.0.0.1:0; the URL is read from
 * <data-dir>/loomd.addr), stop or kill it, and make HTTP requests with
 * libcurl (one keep-alive handle per thread). Also used by other areas'
 * integration tests (cluster tests start loomd the same way). */
#ifndef LOOM_TESTS_DAEMON_HARNESS_H
#define LOOM_TESTS_DAEMON_HARNESS_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

struct loomd_proc {
    pid_t pid;
    char url[128];
    char data_dir[512];
};

/* Starts `bin` (path to loomd) with --data-dir data_dir --listen 127.0.0.1:0
 * plus extra args (NULL-terminated, may be NULL); LOOM_ADMIN_TOKEN and
 * LOOM_JOIN_TOKEN are set to admin_token / "join-test". Waits up to 10 s for
 * the address file. 0 or -1 (message on stderr). */
int loomd_spawn(struct loomd_proc *p, const char *bin, const char *data_dir,
                const char *admin_token, const char *const *extra_args);
/* Sends sig and waits for the exit; returns the exit status as waitpid
 * reports it (WIFEXITED...), or -1. For SIGTERM waits up to 20 s. */
int loomd_signal_wait(struct loomd_proc *p, int sig);

struct hresp {
    long status;
    char *body; /* NUL-terminated */
    size_t len;
    json_t *json;    /* parsed body or NULL */
    char hdrs[2048]; /* raw response headers */
};
void hresp_free(struct hresp *r);
/* Error code from {"error":{"code"}} or "" */
const char *hresp_code(const struct hresp *r);

/* One request. token may be NULL; ctype NULL means none for a body-less
 * request and "application/json" when body is non-NULL; extra_header
 * ("Idempotency-Key: x") may be NULL. Returns 0 on transport success. */
int hreq(const char *url, const char *method, const char *path, const char *token,
         const char *ctype, const char *body, size_t len, const char *extra_header,
         struct hresp *out);
/* Frees this thread's curl handle (call at thread end). */
void hreq_thread_done(void);

/* CPU time (user + system, ms) process pid has used so far, from
 * /proc/PID/stat: a cost measure that does not depend on how busy the machine
 * is, unlike latencies. 0 when unreadable. */
double proc_cpu_ms(pid_t pid);

/* Jobs submitted by several threads at one rate: each thread runs
 * paced_submit_main(&ps), takes the next job number k and POSTs spec to
 * /v1/jobs at t0 + k / rate (t0: the thread's start); acked counts the 201s. */
struct paced_submits {
    const char *url, *token, *spec;
    int jobs, rate;
    _Atomic int submitted; /* jobs handed out */
    _Atomic int acked;     /* 201 replies */
};
void *paced_submit_main(void *arg);

/* Creates a tenant with a fresh token through the admin API; writes the
 * tenant id and token. 0 or -1. */
int make_tenant(const char *url, const char *admin, const char *name, char *tenant_id, size_t tlen,
                char *token, size_t toklen);

#endif
