/* loomctl logs (with -f to follow while the job runs) and metrics (the step
 * series). Logs are plain text streamed straight to stdout with libcurl, so
 * -f prints lines as they arrive instead of buffering the whole reply. */
#include "api/cli/cli.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t to_stdout(char *p, size_t size, size_t n, void *ud) {
    size_t w = fwrite(p, size, n, stdout);
    fflush(stdout);
    return w * size;
}

int cmd_logs(struct cli *cli, int argc, char **argv) {
    const char *job = NULL, *rank = "0", *attempt = NULL, *stream = "stderr";
    int follow = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow"))
            follow = 1;
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc)
            rank = argv[++i];
        else if (!strcmp(argv[i], "--attempt") && i + 1 < argc)
            attempt = argv[++i];
        else if (!strcmp(argv[i], "--stream") && i + 1 < argc)
            stream = argv[++i];
        else if (argv[i][0] != '-' && !job)
            job = argv[i];
        else
            job = NULL, i = argc;
    }
    if (!job) {
        fprintf(stderr, "usage: loomctl logs JOB_ID [--rank R] [--attempt A] "
                        "[--stream stderr|stdout] [-f]\n");
        return 2;
    }
    char enc[256], url[2048], auth[600], err[CURL_ERROR_SIZE] = "";
    cli_urlencode(job, enc, sizeof enc);
    int n = snprintf(url, sizeof url, "%s/v1/jobs/%s/logs?rank=%s&stream=%s%s", cli->url, enc, rank,
                     stream, follow ? "&follow=1" : "");
    if (attempt) snprintf(url + n, sizeof url - (size_t)n, "&attempt=%s", attempt);
    CURL *h = curl_easy_init();
    if (!h) return 1;
    struct curl_slist *hdrs = NULL;
    if (cli->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", cli->token);
        hdrs = curl_slist_append(hdrs, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    /* Following has no total timeout; a plain read gets one. */
    if (!follow) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
    curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, to_stdout);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    if (cc != CURLE_OK) {
        fprintf(stderr, "loomctl: logs: %s\n", err[0] ? err : curl_easy_strerror(cc));
        return 1;
    }
    return 0;
}

int cmd_metrics(struct cli *cli, int argc, char **argv) {
    const char *job = NULL, *rank = "0";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rank") && i + 1 < argc)
            rank = argv[++i];
        else if (argv[i][0] != '-' && !job)
            job = argv[i];
        else
            job = NULL, i = argc;
    }
    if (!job) {
        fprintf(stderr, "usage: loomctl metrics JOB_ID [--rank R]\n");
        return 2;
    }
    char enc[256], path[512];
    cli_urlencode(job, enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?rank=%s", enc, rank);
    json_t *out = NULL;
    int got = cli_get(cli, path, &out);
    if (got != 0) return got < 0;
    printf("%7s %7s %10s %10s %9s %12s %6s %5s %8s\n", "STEP", "ATTEMPT", "LOSS", "LR", "GRAD_NORM",
           "TOKENS/S", "MFU", "UTIL", "MEM_GIB");
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(out, "series"), i, s) {
        printf("%7lld %7lld %10.5f %10.3g %9.4f %12.1f %6.3f %4lld%% %8.3f\n",
               (long long)json_integer_value(json_object_get(s, "step")),
               (long long)json_integer_value(json_object_get(s, "attempt")),
               json_number_value(json_object_get(s, "loss")),
               json_number_value(json_object_get(s, "lr")),
               json_number_value(json_object_get(s, "grad_norm")),
               json_number_value(json_object_get(s, "tokens_per_s")),
               json_number_value(json_object_get(s, "mfu")),
               (long long)json_integer_value(json_object_get(s, "util_pct")),
               json_number_value(json_object_get(s, "mem_gib")));
    }
    json_decref(out);
    return 0;
}
