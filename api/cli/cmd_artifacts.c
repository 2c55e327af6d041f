/* loomctl artifacts (a job's checkpoints, exports and logs) and download
 * (one artifact file to disk with a progress bar on stderr). A download is
 * written to FILE.part and renamed when complete, and its SHA-256 is checked
 * against the ETag loomd sends (the artifact's sha256). */
#include "api/cli/cli.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void human(double b, char *out, size_t n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(out, n, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

int cmd_artifacts(struct cli *cli, int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: loomctl artifacts JOB_ID\n");
        return 2;
    }
    char enc[256], path[400];
    cli_urlencode(argv[1], enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", enc);
    json_t *r = NULL;
    if (cli_call(cli, "GET", path, NULL, &r) != 0) return 1;
    if (cli->json) {
        cli_print_json(r);
        json_decref(r);
        return 0;
    }
    printf("%-56s %-10s %8s %10s  %s\n", "PATH", "KIND", "STEP", "SIZE", "SHA256");
    size_t i;
    json_t *it;
    json_array_foreach(json_object_get(r, "items"), i, it) {
        char size[32], step[24] = "-";
        human((double)json_integer_value(json_object_get(it, "size")), size, sizeof size);
        json_t *s = json_object_get(it, "step");
        if (json_is_integer(s))
            snprintf(step, sizeof step, "%lld", (long long)json_integer_value(s));
        const char *sha = json_string_value(json_object_get(it, "sha256"));
        printf("%-56s %-10s %8s %10s  %.12s\n", cli_str(it, "path"), cli_str(it, "kind"), step,
               size, sha ? sha : "-");
    }
    json_decref(r);
    return 0;
}

struct dl {
    FILE *out;
    CURL *h;
    EVP_MD_CTX *md;
    char *err; /* the body of an error reply */
    size_t errlen;
    int failed; /* HTTP status >= 400 */
    int tty;
    double last_draw;
};

static size_t dl_write(char *p, size_t size, size_t n, void *ud) {
    struct dl *d = ud;
    size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 400) {
        d->failed = 1;
        char *e = realloc(d->err, d->errlen + len + 1);
        if (!e) return 0;
        d->err = e;
        memcpy(d->err + d->errlen, p, len);
        d->errlen += len;
        d->err[d->errlen] = 0;
        return len;
    }
    EVP_DigestUpdate(d->md, p, len);
    return fwrite(p, 1, len, d->out) == len ? len : 0;
}

static int dl_progress(void *ud, curl_off_t total, curl_off_t now, curl_off_t ut, curl_off_t un) {
    (void)ut;
    (void)un;
    struct dl *d = ud;
    if (d->failed || !d->tty) return 0;
    double t = 0;
    curl_easy_getinfo(d->h, CURLINFO_TOTAL_TIME, &t);
    if (t - d->last_draw < 0.1 && (total == 0 || now < total)) return 0;
    d->last_draw = t;
    char a[32], b[32], rate[32];
    human((double)now, a, sizeof a);
    human((double)total, b, sizeof b);
    human(t > 0 ? (double)now / t : 0, rate, sizeof rate);
    int width = 30, fill = total > 0 ? (int)((double)now / (double)total * width) : 0;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %3.0f%% %s / %s  %s/s ", bar,
            total > 0 ? 100.0 * (double)now / (double)total : 0.0, a, b, rate);
    return 0;
}

int cmd_download(struct cli *cli, int argc, char **argv) {
    const char *job = NULL, *art = NULL, *outp = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc)
            outp = argv[++i];
        else if (argv[i][0] != '-' && !job)
            job = argv[i];
        else if (argv[i][0] != '-' && !art)
            art = argv[i];
        else
            job = NULL, i = argc;
    }
    if (!job || !art) {
        fprintf(stderr, "usage: loomctl download JOB_ID PATH [-o FILE|-]\n");
        return 2;
    }
    if (!outp) {
        const char *slash = strrchr(art, '/');
        outp = slash ? slash + 1 : art;
    }
    int to_stdout = !strcmp(outp, "-");
    char enc[256], url[4096], auth[600], part[4096], err[CURL_ERROR_SIZE] = "", etag[128] = "";
    cli_urlencode(job, enc, sizeof enc);
    /* The artifact path keeps its slashes: each segment is encoded alone. */
    int n = snprintf(url, sizeof url, "%s/v1/jobs/%s/artifacts", cli->url, enc);
    char *copy = strdup(art);
    for (char *save = NULL, *seg = strtok_r(copy, "/", &save); seg && n < (int)sizeof url;
         seg = strtok_r(NULL, "/", &save)) {
        char e[1024];
        cli_urlencode(seg, e, sizeof e);
        n += snprintf(url + n, sizeof url - (size_t)n, "/%s", e);
    }
    free(copy);
    snprintf(part, sizeof part, "%s.part", outp);
    struct dl d = {0};
    d.tty = isatty(2);
    d.out = to_stdout ? stdout : fopen(part, "wb");
    if (!d.out) {
        fprintf(stderr, "loomctl: download: cannot write %s: %s\n", part, strerror(errno));
        return 1;
    }
    d.md = EVP_MD_CTX_new();
    d.h = curl_easy_init();
    if (!d.md || !d.h || EVP_DigestInit_ex(d.md, EVP_sha256(), NULL) != 1) return 1;
    struct curl_slist *hdrs = NULL;
    if (cli->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", cli->token);
        hdrs = curl_slist_append(hdrs, auth);
    }
    curl_easy_setopt(d.h, CURLOPT_URL, url);
    curl_easy_setopt(d.h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(d.h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(d.h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    /* Large files: no total timeout, but give up on a stalled transfer. */
    curl_easy_setopt(d.h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(d.h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(d.h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(d.h, CURLOPT_WRITEFUNCTION, dl_write);
    curl_easy_setopt(d.h, CURLOPT_WRITEDATA, &d);
    curl_easy_setopt(d.h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(d.h, CURLOPT_XFERINFOFUNCTION, dl_progress);
    curl_easy_setopt(d.h, CURLOPT_XFERINFODATA, &d);
    CURLcode cc = curl_easy_perform(d.h);
    long status = 0;
    curl_off_t got = 0;
    curl_easy_getinfo(d.h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(d.h, CURLINFO_SIZE_DOWNLOAD_T, &got);
    struct curl_header *eh = NULL;
    if (curl_easy_header(d.h, "ETag", 0, CURLH_HEADER, -1, &eh) == CURLHE_OK && eh)
        snprintf(etag, sizeof etag, "%s", eh->value);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(d.h);
    if (d.tty && !d.failed && cc == CURLE_OK) fprintf(stderr, "\n");
    int rc = 0;
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(d.md, md, &mdlen);
    EVP_MD_CTX_free(d.md);
    char hex[65] = "";
    for (unsigned i = 0; i < mdlen && i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    if (cc != CURLE_OK) {
        fprintf(stderr, "loomctl: download: %s\n", err[0] ? err : curl_easy_strerror(cc));
        rc = cc == CURLE_COULDNT_CONNECT ? 3 : 1;
    } else if (d.failed) {
        json_t *j = d.err ? json_loads(d.err, 0, NULL) : NULL;
        fprintf(stderr, "loomctl: %ld %s: %s\n", status,
                client_error_code(j) ? client_error_code(j) : "",
                client_error_message(j) ? client_error_message(j) : "request failed");
        json_decref(j);
        rc = 1;
    } else if (etag[0] && (strlen(etag) != 66 || strncmp(etag + 1, hex, 64))) {
        fprintf(stderr, "loomctl: download: sha256 %s does not match the server's %s\n", hex, etag);
        rc = 1;
    }
    free(d.err);
    if (to_stdout) {
        fflush(stdout);
    } else {
        if (fclose(d.out) != 0 && rc == 0) rc = 1;
        if (rc == 0 && rename(part, outp) != 0) {
            fprintf(stderr, "loomctl: download: cannot rename %s: %s\n", part, strerror(errno));
            rc = 1;
        }
        if (rc != 0) unlink(part);
        if (rc == 0) {
            char size[32];
            human((double)got, size, sizeof size);
            fprintf(stderr, "%s: %s, sha256 %s\n", outp, size, hex);
        }
    }
    return rc;
}
