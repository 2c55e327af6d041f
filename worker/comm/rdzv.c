/* Rendezvous stores (see rdzv.h): a shared directory or loomd's HTTP
 * endpoint. Both poll with a growing back-off (1 ms doubling to 50 ms for
 * files, 50 ms to 500 ms for HTTP without long-poll) until a deadline, so a
 * rank that never arrives turns into a clear timeout instead of a hang. */
#include "worker/comm/rdzv.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "api/client.h"
#include "common/clock.h"

enum rdzv_kind { RDZV_FILE, RDZV_HTTP };

struct rdzv {
    enum rdzv_kind kind;
    char *dir; /* file: */
    struct client *http;
    pthread_mutex_t mu;
};

int rdzv_escape_key(const char *key, char *out, size_t outlen) {
    static const char hex[] = "0123456789abcdef";
    size_t j = 0;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                    (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-';
        if (plain) {
            if (j + 1 >= outlen) return -1;
            out[j++] = (char)*p;
        } else {
            if (j + 3 >= outlen) return -1;
            out[j++] = '~';
            out[j++] = hex[*p >> 4];
            out[j++] = hex[*p & 15];
        }
    }
    if (j >= outlen) return -1;
    out[j] = '\0';
    return 0;
}

struct rdzv *rdzv_open(const char *spec, const char *token, char *err, size_t errlen) {
    struct rdzv *r = NULL;
    if (!spec || !*spec) {
        snprintf(err, errlen, "rendezvous: no rendezvous given (--rdzv file:DIR or LOOM_RDZV)");
        return NULL;
    }
    r = calloc(1, sizeof(*r));
    if (!r) goto nomem;
    pthread_mutex_init(&r->mu, NULL);
    if (strncmp(spec, "file:", 5) == 0) {
        r->kind = RDZV_FILE;
        r->dir = strdup(spec + 5);
        if (!r->dir) goto nomem;
        if (mkdir(r->dir, 0700) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "rendezvous: cannot create directory %s: %s", r->dir,
                     strerror(errno));
            rdzv_free(r);
            return NULL;
        }
    } else if (strncmp(spec, "http://", 7) == 0 || strncmp(spec, "https://", 8) == 0) {
        r->kind = RDZV_HTTP;
        /* Strip one trailing slash so BASE + "/KEY" is well formed. */
        char *base = strdup(spec);
        if (!base) goto nomem;
        size_t n = strlen(base);
        if (n > 0 && base[n - 1] == '/') base[n - 1] = '\0';
        r->http = client_new(base, token);
        free(base);
        if (!r->http) goto nomem;
    } else {
        snprintf(err, errlen, "rendezvous: unsupported rendezvous '%s' (want file:DIR or http://)",
                 spec);
        free(r);
        return NULL;
    }
    return r;
nomem:
    snprintf(err, errlen, "rendezvous: out of memory");
    rdzv_free(r);
    return NULL;
}

void rdzv_free(struct rdzv *r) {
    if (!r) return;
    free(r->dir);
    client_free(r->http);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* ---- file: */

static int file_set(struct rdzv *r, const char *ekey, const void *val, size_t len, char *err,
                    size_t errlen) {
    char tmp[4096], path[4096];
    snprintf(path, sizeof(path), "%s/%s", r->dir, ekey);
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp.%ld", r->dir, ekey, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "rendezvous: cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    const char *p = val;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            snprintf(err, errlen, "rendezvous: write %s: %s", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "rendezvous: rename to %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* 1 found, 0 absent, -1 error. */
static int file_try_get(struct rdzv *r, const char *ekey, void **val, size_t *len, char *err,
                        size_t errlen) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", r->dir, ekey);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "rendezvous: open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "rendezvous: stat %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n ? n : 1);
    size_t got = 0;
    while (buf && got < n) {
        ssize_t rd = read(fd, buf + got, n - got);
        if (rd < 0 && errno == EINTR) continue;
        if (rd <= 0) break;
        got += (size_t)rd;
    }
    close(fd);
    if (!buf || got != n) {
        free(buf);
        snprintf(err, errlen, "rendezvous: short read of %s", path);
        return -1;
    }
    *val = buf;
    *len = n;
    return 1;
}

/* ---- http */

static int http_set(struct rdzv *r, const char *ekey, const void *val, size_t len, char *err,
                    size_t errlen) {
    int rc = -1;
    char path[1024];
    snprintf(path, sizeof(path), "/%s", ekey);
    size_t b64len = 4 * ((len + 2) / 3) + 1;
    char *b64 = malloc(b64len);
    json_t *body = NULL, *reply = NULL;
    if (!b64) goto out;
    EVP_EncodeBlock((unsigned char *)b64, val, (int)len);
    body = json_pack("{s:s}", "value", b64);
    long status = 0;
    char cerr[256] = "";
    client_set_timeout_ms(r->http, 10000);
    if (client_request(r->http, "PUT", path, body, &status, &reply, NULL, cerr, sizeof(cerr)) !=
        0) {
        snprintf(err, errlen, "rendezvous: PUT %.200s failed: %s", path, cerr);
        goto out;
    }
    if (status < 200 || status >= 300) {
        const char *m = client_error_message(reply);
        snprintf(err, errlen, "rendezvous: PUT %.200s answered HTTP %ld%s%s", path, status,
                 m ? ": " : "", m ? m : "");
        goto out;
    }
    rc = 0;
out:
    free(b64);
    json_decref(body);
    json_decref(reply);
    return rc;
}

static int b64_decode(const char *s, void **val, size_t *len) {
    size_t n = strlen(s);
    if (n % 4 != 0) return -1;
    unsigned char *buf = malloc(n / 4 * 3 + 1);
    if (!buf) return -1;
    int m = n ? EVP_DecodeBlock(buf, (const unsigned char *)s, (int)n) : 0;
    if (m < 0) {
        free(buf);
        return -1;
    }
    /* EVP_DecodeBlock counts padding bytes as data: drop them. */
    if (n >= 1 && s[n - 1] == '=') m--;
    if (n >= 2 && s[n - 2] == '=') m--;
    *val = buf;
    *len = (size_t)m;
    return 0;
}

/* 1 found, 0 absent (or transient failure, retried), -1 error. */
static int http_try_get(struct rdzv *r, const char *ekey, int wait_ms, void **val, size_t *len,
                        char *err, size_t errlen) {
    char path[1024];
    snprintf(path, sizeof(path), "/%s?wait_ms=%d", ekey, wait_ms);
    json_t *reply = NULL;
    long status = 0;
    char cerr[256] = "";
    int rc = 0;
    client_set_timeout_ms(r->http, wait_ms + 5000);
    if (client_request(r->http, "GET", path, NULL, &status, &reply, NULL, cerr, sizeof(cerr)) !=
        0) {
        /* loomd may be restarting: the caller retries until its deadline. */
        snprintf(err, errlen, "rendezvous: GET %.200s failed: %s", path, cerr);
        goto out;
    }
    if (status == 404 || status == 408) goto out;
    if (status != 200) {
        const char *m = client_error_message(reply);
        snprintf(err, errlen, "rendezvous: GET %.200s answered HTTP %ld%s%s", path, status,
                 m ? ": " : "", m ? m : "");
        rc = -1;
        goto out;
    }
    const char *v = json_string_value(json_object_get(reply, "value"));
    if (!v || b64_decode(v, val, len) != 0) {
        snprintf(err, errlen, "rendezvous: GET %.200s: reply has no valid base64 \"value\"", path);
        rc = -1;
        goto out;
    }
    rc = 1;
out:
    json_decref(reply);
    return rc;
}

/* ---- interface */

int rdzv_set(struct rdzv *r, const char *key, const void *val, size_t len, char *err,
             size_t errlen) {
    char ekey[768];
    if (rdzv_escape_key(key, ekey, sizeof(ekey)) != 0) {
        snprintf(err, errlen, "rendezvous: key too long: %.64s...", key);
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    int rc = r->kind == RDZV_FILE ? file_set(r, ekey, val, len, err, errlen)
                                  : http_set(r, ekey, val, len, err, errlen);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int rdzv_get(struct rdzv *r, const char *key, void **val, size_t *len, int timeout_ms, char *err,
             size_t errlen) {
    char ekey[768];
    char last[256] = "";
    if (rdzv_escape_key(key, ekey, sizeof(ekey)) != 0) {
        snprintf(err, errlen, "rendezvous: key too long: %.64s...", key);
        return -1;
    }
    long long start = clock_mono_ms(), deadline = start + (timeout_ms > 0 ? timeout_ms : 0);
    int backoff = r->kind == RDZV_FILE ? 1 : 50;
    for (;;) {
        long long left = deadline - clock_mono_ms();
        int rc;
        pthread_mutex_lock(&r->mu);
        if (r->kind == RDZV_FILE) {
            rc = file_try_get(r, ekey, val, len, err, errlen);
        } else {
            int wait = left > 10000 ? 10000 : (left > 0 ? (int)left : 0);
            rc = http_try_get(r, ekey, wait, val, len, last, sizeof(last));
        }
        pthread_mutex_unlock(&r->mu);
        if (rc != 0) {
            if (rc < 0 && r->kind == RDZV_HTTP) snprintf(err, errlen, "%s", last);
            return rc > 0 ? 0 : -1;
        }
        left = deadline - clock_mono_ms();
        if (left <= 0) break;
        clock_sleep_ms(backoff < left ? backoff : (int)left);
        backoff = backoff * 2 > (r->kind == RDZV_FILE ? 50 : 500)
                      ? (r->kind == RDZV_FILE ? 50 : 500)
                      : backoff * 2;
    }
    snprintf(err, errlen, "rendezvous: key '%s' did not appear within %d ms%s%s", key, timeout_ms,
             last[0] ? "; last error: " : "", last);
    return -2;
}
