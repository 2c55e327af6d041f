/* HTTP+JSON client over libcurl. One easy handle per client so connections
 * are reused (keep-alive); every request has connect and total timeouts and
 * CURLOPT_NOSIGNAL so it is safe in threaded programs. */
#include "api/client.h"

#include "common/buf.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

struct client {
    CURL *curl;
    char *base;
    char *auth;   /* "Authorization: Bearer ..." or NULL */
    char *header; /* one extra header or NULL */
    char *ca;     /* CA bundle (PEM) for https:// URLs, from LOOM_CA; NULL: system CAs */
    long timeout_ms;
    char local_ip[64]; /* this end's address on the last connection ("" before one) */
};

void client_global_init(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct client *client_new(const char *base_url, const char *token) {
    struct client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->curl = curl_easy_init();
    c->base = strdup(base_url);
    size_t n = strlen(c->base);
    while (n > 0 && c->base[n - 1] == '/')
        c->base[--n] = 0;
    if (token && *token) {
        size_t len = strlen(token) + 32;
        c->auth = malloc(len);
        if (c->auth) snprintf(c->auth, len, "Authorization: Bearer %s", token);
    }
    c->timeout_ms = 30000;
    /* The CA comes from the environment so that every program (loomctl,
     * loom-agent and the workers it starts) trusts the same one; their --ca
     * options set LOOM_CA. */
    const char *ca = getenv("LOOM_CA");
    if (ca && *ca) c->ca = strdup(ca);
    if (!c->curl || !c->base || (token && *token && !c->auth)) {
        client_free(c);
        return NULL;
    }
    return c;
}

void client_free(struct client *c) {
    if (!c) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    free(c->base);
    free(c->auth);
    free(c->header);
    free(c->ca);
    free(c);
}

void client_set_timeout_ms(struct client *c, long total_ms) {
    c->timeout_ms = total_ms;
}

void client_set_header(struct client *c, const char *header) {
    free(c->header);
    c->header = header ? strdup(header) : NULL;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    size_t add = size * nmemb;
    return buf_append(ud, ptr, add) == 0 ? add : 0;
}

int client_request(struct client *c, const char *method, const char *path, json_t *body,
                   long *status, json_t **out, char **raw, char *errbuf, size_t errlen) {
    int rc = -1;
    char *url = NULL, *payload = NULL;
    struct curl_slist *hdrs = NULL;
    struct buf buf = BUF_INIT;
    char cerr[CURL_ERROR_SIZE] = "";

    if (out) *out = NULL;
    if (raw) *raw = NULL;
    *status = 0;
    size_t ulen = strlen(c->base) + strlen(path) + 1;
    url = malloc(ulen);
    if (!url) goto out;
    snprintf(url, ulen, "%s%s", c->base, path);

    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->timeout_ms < 5000 ? c->timeout_ms : 5000L);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &buf);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    /* curl_easy_reset restores peer and host verification on; only the CA
     * changes. */
    if (c->ca) curl_easy_setopt(h, CURLOPT_CAINFO, c->ca);
    if (c->auth) hdrs = curl_slist_append(hdrs, c->auth);
    if (c->header) hdrs = curl_slist_append(hdrs, c->header);
    if (body) {
        payload = json_dumps(body, JSON_COMPACT);
        if (!payload) goto out;
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(payload));
    } else if (!strcmp(method, "POST") || !strcmp(method, "PUT")) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    CURLcode cc = curl_easy_perform(h);
    if (cc != CURLE_OK) {
        if (errbuf)
            snprintf(errbuf, errlen, "%s %s: %s", method, url,
                     cerr[0] ? cerr : curl_easy_strerror(cc));
        goto out;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    /* libcurl's getsockname() of the connection it used, kept before the
     * next request resets the handle */
    char *lip = NULL;
    if (curl_easy_getinfo(h, CURLINFO_LOCAL_IP, &lip) == CURLE_OK && lip)
        snprintf(c->local_ip, sizeof c->local_ip, "%s", lip);
    if (buf.len > 0 && out) *out = json_loadb(buf.p, buf.len, 0, NULL);
    if (raw && buf.p && (!out || !*out)) {
        *raw = buf_release(&buf);
    }
    rc = 0;
out:
    curl_slist_free_all(hdrs);
    free(payload);
    free(url);
    buf_free(&buf);
    return rc;
}

const char *client_local_ip(const struct client *c) {
    return c->local_ip;
}

static json_t *error_obj(json_t *reply) {
    return reply ? json_object_get(reply, "error") : NULL;
}

const char *client_error_message(json_t *reply) {
    return json_string_value(json_object_get(error_obj(reply), "message"));
}

const char *client_error_code(json_t *reply) {
    return json_string_value(json_object_get(error_obj(reply), "code"));
}
