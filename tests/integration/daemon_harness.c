/* Integration-test harness: spawn/kill loomd and libcurl requests. See
 * daemon_harness.h. */
#include "common/clock.h"
#include "daemon_harness.h"

#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int loomd_spawn(struct loomd_proc *p, const char *bin, const char *data_dir,
                const char *admin_token, const char *const *extra_args) {
    memset(p, 0, sizeof *p);
    snprintf(p->data_dir, sizeof p->data_dir, "%s", data_dir);
    char addr[600];
    snprintf(addr, sizeof addr, "%s/loomd.addr", data_dir);
    unlink(addr);
    const char *argv[40];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--data-dir";
    argv[n++] = data_dir;
    argv[n++] = "--log-level";
    argv[n++] = getenv("LOOM_TEST_LOG") ? getenv("LOOM_TEST_LOG") : "warn";
    for (int i = 0; extra_args && extra_args[i] && n < 38; i++)
        argv[n++] = extra_args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setenv("LOOM_ADMIN_TOKEN", admin_token, 1);
        setenv("LOOM_JOIN_TOKEN", "join-test", 1);
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    p->pid = pid;
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(addr, "r");
        if (f) {
            int ok = fgets(p->url, sizeof p->url, f) != NULL;
            fclose(f);
            p->url[strcspn(p->url, "\r\n")] = 0;
            if (ok && p->url[0]) return 0;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "harness: loomd exited during start-up (status %d)\n", st);
            p->pid = 0;
            return -1;
        }
        clock_sleep_ms(10);
    }
    fprintf(stderr, "harness: loomd did not write %s\n", addr);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    p->pid = 0;
    return -1;
}

int loomd_signal_wait(struct loomd_proc *p, int sig) {
    if (p->pid <= 0) return -1;
    kill(p->pid, sig);
    int st = 0;
    for (int i = 0; i < 2000; i++) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            p->pid = 0;
            return st;
        }
        clock_sleep_ms(10);
    }
    fprintf(stderr, "harness: loomd did not exit after signal %d; killing\n", sig);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
    return -1;
}

void hresp_free(struct hresp *r) {
    free(r->body);
    json_decref(r->json);
    memset(r, 0, sizeof *r);
}

const char *hresp_code(const struct hresp *r) {
    json_t *c = json_object_get(json_object_get(r->json, "error"), "code");
    return json_is_string(c) ? json_string_value(c) : "";
}

static __thread CURL *tl_curl;

void hreq_thread_done(void) {
    if (tl_curl) curl_easy_cleanup(tl_curl);
    tl_curl = NULL;
}

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    struct hresp *r = ud;
    size_t k = sz * n;
    char *b = realloc(r->body, r->len + k + 1);
    if (!b) return 0;
    r->body = b;
    memcpy(r->body + r->len, p, k);
    r->len += k;
    r->body[r->len] = 0;
    return k;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
    struct hresp *r = ud;
    size_t k = sz * n, have = strlen(r->hdrs);
    if (have + k + 1 < sizeof r->hdrs) {
        memcpy(r->hdrs + have, p, k);
        r->hdrs[have + k] = 0;
    }
    return k;
}

int hreq(const char *url, const char *method, const char *path, const char *token,
         const char *ctype, const char *body, size_t len, const char *extra_header,
         struct hresp *out) {
    memset(out, 0, sizeof *out);
    if (!tl_curl) tl_curl = curl_easy_init();
    CURL *h = tl_curl;
    curl_easy_reset(h);
    char full[4096], auth[512], ct[256];
    snprintf(full, sizeof full, "%s%s", url, path);
    struct curl_slist *hd = NULL;
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        hd = curl_slist_append(hd, auth);
    }
    if (!ctype && body) ctype = "application/json";
    if (ctype) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
        hd = curl_slist_append(hd, ct);
    }
    if (extra_header) hd = curl_slist_append(hd, extra_header);
    /* no "Expect: 100-continue": bodies go with the head, as from most clients */
    hd = curl_slist_append(hd, "Expect:");
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, out);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    } else if (!strcmp(method, "POST") || !strcmp(method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hd);
    if (rc != CURLE_OK) {
        out->status = -1;
        return -1;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    if (out->body) out->json = json_loads(out->body, 0, NULL);
    return 0;
}

int make_tenant(const char *url, const char *admin, const char *name, char *tenant_id, size_t tlen,
                char *token, size_t toklen) {
    char body[256], path[256];
    snprintf(body, sizeof body, "{\"name\":\"%s\"}", name);
    struct hresp r;
    if (hreq(url, "POST", "/v1/tenants", admin, NULL, body, strlen(body), NULL, &r) ||
        r.status != 201) {
        fprintf(stderr, "make_tenant: create %s: %ld %s\n", name, r.status, r.body ? r.body : "");
        hresp_free(&r);
        return -1;
    }
    snprintf(tenant_id, tlen, "%s", json_string_value(json_object_get(r.json, "id")));
    hresp_free(&r);
    snprintf(path, sizeof path, "/v1/tenants/%s/tokens", tenant_id);
    if (hreq(url, "POST", path, admin, NULL, NULL, 0, NULL, &r) || r.status != 201) {
        fprintf(stderr, "make_tenant: token: %ld\n", r.status);
        hresp_free(&r);
        return -1;
    }
    snprintf(token, toklen, "%s", json_string_value(json_object_get(r.json, "token")));
    hresp_free(&r);
    return 0;
}

double proc_cpu_ms(pid_t pid) {
    char path[64], line[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = 0;
    const char *p = strrchr(line, ')'); /* the command name may hold spaces */
    unsigned long long ut = 0, st = 0;
    /* fields after ')': state(3) ... utime(14) stime(15) */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

void *paced_submit_main(void *arg) {
    struct paced_submits *ps = arg;
    double t0 = clock_mono_msf();
    int k;
    while ((k = atomic_fetch_add(&ps->submitted, 1)) < ps->jobs) {
        double due = t0 + 1000.0 * k / ps->rate;
        while (clock_mono_msf() < due)
            clock_sleep_us(200);
        struct hresp r;
        if (hreq(ps->url, "POST", "/v1/jobs", ps->token, NULL, ps->spec, strlen(ps->spec), NULL,
                 &r) == 0 &&
            r.status == 201)
            atomic_fetch_add(&ps->acked, 1);
        hresp_free(&r);
    }
    hreq_thread_done();
    return NULL;
}
