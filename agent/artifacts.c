/* The agent's artifact server: when the nodes keep job directories on their
 * own disks (--job-root, no storage shared with loomd), loomd proxies
 * GET /v1/jobs/{id}/artifacts[/{path}] to the agent that holds the files,
 * through two routes served here (libmicrohttpd, thread per connection):
 *
 *   GET /v1/node/artifacts/{job}          {"items":[{"path","size","mtime_ms","sha256"}]}
 *   GET /v1/node/artifacts/{job}/{path*}  the bytes; Range, ETag = "sha256"
 *   DELETE /v1/node/artifacts/{job}/{path*}  removes that file or directory
 *                                        (the tree, symlinks not followed)
 *
 * Only loomd calls them, with `Authorization: Bearer <artifact token>`: a
 * random token the agent makes at start and reports at registration (over
 * the join-token-authenticated channel; loomd keeps only hashes of the join
 * token, so it could not present that one), compared in constant time. A request
 * reads files under <job-root>/<job> only: the job id is a plain name, every
 * path segment is checked (no empty, "." or ".." segment) and the resolved
 * path (realpath, symlinks followed) must lie under the resolved job
 * directory; anything else is 404 like a missing file. Nothing is run: the
 * server opens, stats and reads files. Which files are artifacts is loomd's
 * decision (daemon/artifacts.h); the listing returns every regular file. */
#define _GNU_SOURCE
#include "agent/artifacts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <microhttpd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/byterange.h"
#include "common/log.h"
#include "common/token.h"

#define ROUTE      "/v1/node/artifacts/"
#define MAX_DEPTH  8
#define MAX_ITEMS  100000
#define CONN_LIMIT 64

struct agent_artifacts {
    struct MHD_Daemon *mhd;
    char root[PATH_MAX]; /* realpath of --job-root */
    char token[65];
    int port;
};

static int safe_name(const char *s, size_t n) {
    if (n == 0 || n > 63) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return !(n == 1 && s[0] == '.') && !(n == 2 && s[0] == '.' && s[1] == '.');
}

/* Every segment of rel is non-empty and neither "." nor "..". */
static int segments_ok(const char *rel) {
    if (!*rel) return 0;
    for (const char *p = rel;;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
        if (!e) return 1;
        p = e + 1;
    }
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             char *body) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result error(struct MHD_Connection *c, unsigned status, const char *code,
                             const char *msg) {
    json_t *j = json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s ? reply(c, status, "application/json", s) : MHD_NO;
}

static enum MHD_Result not_found(struct MHD_Connection *c) {
    return error(c, 404, "ARTIFACT_NOT_FOUND", "no such file in the job's directory");
}

/* Appends the regular files under abs (rel is their name prefix). */
static void scan(json_t *items, const char *abs, const char *rel, int depth) {
    DIR *d = opendir(abs);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && json_array_size(items) < MAX_ITEMS) {
        if (e->d_name[0] == '.') continue; /* ".", "..", and temporary ".tmp.*" saves */
        char a[PATH_MAX], r[PATH_MAX];
        struct stat st;
        if (snprintf(a, sizeof a, "%s/%s", abs, e->d_name) >= (int)sizeof a) continue;
        if (snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", e->d_name) >= (int)sizeof r)
            continue;
        if (lstat(a, &st) != 0) continue; /* symlinks are not followed while listing */
        if (S_ISDIR(st.st_mode) && depth > 0) {
            scan(items, a, r, depth - 1);
        } else if (S_ISREG(st.st_mode)) {
            char sha[65];
            json_t *it =
                json_pack("{s:s, s:I, s:I}", "path", r, "size", (json_int_t)st.st_size, "mtime_ms",
                          (json_int_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000);
            /* Read in full per listing: loomd lists rarely, and keeping no
             * cache keeps the agent stateless across restarts. */
            if (byterange_sha256_file(a, sha) == 0)
                json_object_set_new(it, "sha256", json_string(sha));
            json_array_append_new(items, it);
        }
    }
    closedir(d);
}

static enum MHD_Result serve_list(struct MHD_Connection *c, const char *dir) {
    json_t *items = json_array();
    scan(items, dir, "", MAX_DEPTH);
    json_t *j = json_pack("{s:o}", "items", items);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s ? reply(c, 200, "application/json", s) : MHD_NO;
}

static enum MHD_Result serve_file(struct MHD_Connection *c, const char *dir, const char *rel) {
    char joined[PATH_MAX * 2], file[PATH_MAX];
    snprintf(joined, sizeof joined, "%s/%s", dir, rel);
    size_t n = strlen(dir);
    struct stat st;
    if (!realpath(joined, file) || strncmp(file, dir, n) || file[n] != '/' ||
        stat(file, &st) != 0 || !S_ISREG(st.st_mode))
        return not_found(c);
    char sha[65], etag[70];
    if (byterange_sha256_file(file, sha) != 0) return not_found(c);
    snprintf(etag, sizeof etag, "\"%s\"", sha);
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    if (inm && !strcmp(inm, etag)) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
        enum MHD_Result ret = MHD_queue_response(c, 304, r);
        MHD_destroy_response(r);
        return ret;
    }
    uint64_t size = (uint64_t)st.st_size, off = 0, len = size;
    int rr =
        byterange_parse(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"), size, &off, &len);
    char cr[96];
    if (rr < 0) {
        snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)size);
        json_t *j = json_pack("{s:{s:s, s:s}}", "error", "code", "RANGE_NOT_SATISFIABLE", "message",
                              "not one satisfiable byte range of the file");
        char *s = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        struct MHD_Response *r =
            MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Range", cr);
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        enum MHD_Result ret = MHD_queue_response(c, 416, r);
        MHD_destroy_response(r);
        return ret;
    }
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return not_found(c);
    struct MHD_Response *r = MHD_create_response_from_fd_at_offset64(len, fd, off);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
    MHD_add_response_header(r, "Accept-Ranges", "bytes");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    if (rr == 1) {
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)off,
                 (unsigned long long)(off + len - 1), (unsigned long long)size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    enum MHD_Result ret = MHD_queue_response(c, rr == 1 ? 206 : 200, r);
    MHD_destroy_response(r);
    return ret;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* DELETE of one file or directory under the job directory. The entry itself
 * is not resolved (a symlink is removed, never its target); its parent is,
 * and must be the job directory or lie under it. nftw with FTW_PHYS does not
 * follow symlinks inside a tree either. Which paths are artifacts (and may
 * go) is loomd's decision, as for reads. */
static enum MHD_Result delete_entry(struct MHD_Connection *c, const char *dir, const char *rel) {
    char joined[PATH_MAX * 2], parent[PATH_MAX * 2], real[PATH_MAX];
    snprintf(joined, sizeof joined, "%s/%s", dir, rel);
    snprintf(parent, sizeof parent, "%s", joined);
    char *slash = strrchr(parent, '/');
    *slash = 0;
    size_t n = strlen(dir);
    struct stat st;
    if (!realpath(parent, real) || strncmp(real, dir, n) || (real[n] != '/' && real[n] != 0) ||
        lstat(joined, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)))
        return not_found(c);
    int rc =
        S_ISDIR(st.st_mode) ? nftw(joined, rm_entry, 16, FTW_DEPTH | FTW_PHYS) : unlink(joined);
    if (rc != 0) {
        log_warn("artifacts: delete %s: %s", joined, strerror(errno));
        return error(c, 500, "ARTIFACT_DELETE_FAILED", "could not delete the path");
    }
    log_info("artifacts: deleted %s", joined);
    char *body = strdup("{\"deleted\":true}");
    return body ? reply(c, 200, "application/json", body) : MHD_NO;
}

static int authorized(struct agent_artifacts *s, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    return token_equal(h + 7, s->token);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload;
    struct agent_artifacts *s = cls;
    if (!*con_cls) { /* first call: only the head is in */
        *con_cls = s;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0; /* no route takes a body */
        return MHD_YES;
    }
    int del = !strcmp(method, "DELETE");
    if (strcmp(method, "GET") && strcmp(method, "HEAD") && !del)
        return error(c, 405, "METHOD_NOT_ALLOWED", "only GET and DELETE are served");
    if (!authorized(s, c)) return error(c, 401, "UNAUTHORIZED", "invalid artifact token");
    if (strncmp(url, ROUTE, strlen(ROUTE)) != 0) return error(c, 404, "NOT_FOUND", "no route");
    const char *job = url + strlen(ROUTE), *slash = strchr(job, '/');
    size_t jn = slash ? (size_t)(slash - job) : strlen(job);
    if (!safe_name(job, jn)) return not_found(c);
    char dir[PATH_MAX], joined[PATH_MAX + 80];
    snprintf(joined, sizeof joined, "%s/%.*s", s->root, (int)jn, job);
    if (!realpath(joined, dir) || strncmp(dir, s->root, strlen(s->root)) ||
        dir[strlen(s->root)] != '/')
        return not_found(c);
    if (!slash)
        return del ? error(c, 405, "METHOD_NOT_ALLOWED", "DELETE names a path")
                   : serve_list(c, dir);
    if (!segments_ok(slash + 1)) return not_found(c);
    return del ? delete_entry(c, dir, slash + 1) : serve_file(c, dir, slash + 1);
}

struct agent_artifacts *agent_artifacts_start(const char *listen, const char *job_root) {
    char host[256];
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host) {
        log_error("artifacts: --artifact-listen '%s' is not HOST:PORT", listen ? listen : "");
        return NULL;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) {
        log_error("artifacts: --artifact-listen '%s': bad port", listen);
        return NULL;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    struct agent_artifacts *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (!job_root || !realpath(job_root, s->root)) {
        log_error("artifacts: --job-root '%s': %s", job_root ? job_root : "",
                  job_root ? strerror(errno) : "needed by --artifact-listen");
        free(s);
        return NULL;
    }
    if (token_hex(s->token, sizeof s->token, 32) != 0) {
        log_error("artifacts: no random token");
        free(s);
        return NULL;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        log_error("artifacts: --artifact-listen '%s': host must be an IPv4 address", listen);
        agent_artifacts_stop(s);
        return NULL;
    }
    s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                  MHD_USE_POLL | MHD_USE_ERROR_LOG,
                              0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &sa,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_LIMIT,
                              MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_END);
    if (!s->mhd) {
        log_error("artifacts: cannot listen on %s", listen);
        agent_artifacts_stop(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : (int)port;
    log_info("artifacts: serving %s on %s:%d", s->root, host, s->port);
    return s;
}

const char *agent_artifacts_token(const struct agent_artifacts *s) {
    return s ? s->token : "";
}

int agent_artifacts_port(const struct agent_artifacts *s) {
    return s ? s->port : 0;
}

void agent_artifacts_stop(struct agent_artifacts *s) {
    if (!s) return;
    if (s->mhd) MHD_stop_daemon(s->mhd);
    free(s);
}
