/* loomctl logs (with -f to follow while the job runs) and metrics (the step
 * series). Logs stream to stdout with libcurl, so -f prints lines as they
 * arrive; by default the worker's JSON records (stdout stream) are printed as
 * text lines ("step 12/200 loss 3.2100 ..."), --raw / --json keeps them. */
#include "api/cli/cli.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The write callback's state: with `human`, complete lines are turned from
 * the worker's JSON records into text; a reply with an error status is kept
 * to print its code and message. */
struct logs_out {
    CURL *h;
    int human;
    long long total; /* from the "start" record, for "step N/T" */
    char line[65536];
    size_t n;
    char err[4096];
    size_t nerr;
};

static double num(json_t *o, const char *k) {
    return json_number_value(json_object_get(o, k));
}

/* One record as a line of text; other lines unchanged. */
static void print_line(struct logs_out *o, const char *line) {
    json_t *r = line[0] == '{' ? json_loads(line, 0, NULL) : NULL;
    const char *type = json_string_value(json_object_get(r, "type"));
    if (!type) {
        fputs(line, stdout);
        json_decref(r);
        return;
    }
    if (!strcmp(type, "start")) {
        o->total = json_integer_value(json_object_get(r, "steps"));
        printf("start: rank %lld/%lld on %s, %lld parameters, steps %lld..%lld, %lld tokens a "
               "step\n",
               (long long)json_integer_value(json_object_get(r, "rank")),
               (long long)json_integer_value(json_object_get(r, "world")), cli_str(r, "device"),
               (long long)json_integer_value(json_object_get(r, "params")),
               (long long)json_integer_value(json_object_get(r, "start_step")) + 1, o->total,
               (long long)json_integer_value(json_object_get(r, "tokens_per_step")));
    } else if (!strcmp(type, "step")) {
        char tot[32] = "";
        if (o->total > 0) snprintf(tot, sizeof tot, "/%lld", o->total);
        printf("step %lld%s loss %.4f lr %.3g grad_norm %.3f %.0f tok/s",
               (long long)json_integer_value(json_object_get(r, "step")), tot, num(r, "loss"),
               num(r, "lr"), num(r, "grad_norm"), num(r, "tokens_per_s"));
        if (json_is_number(json_object_get(r, "mfu"))) printf(" mfu %.3f", num(r, "mfu"));
        json_t *ms = json_object_get(r, "ms");
        if (ms) printf(" %.1f ms", num(ms, "step"));
        if (json_is_number(json_object_get(r, "mem_gib")))
            printf(" mem %.3f GiB", num(r, "mem_gib"));
        printf("\n");
    } else if (!strcmp(type, "eval")) {
        printf("eval step %lld val_loss %.4f (%lld tokens)\n",
               (long long)json_integer_value(json_object_get(r, "step")), num(r, "val_loss"),
               (long long)json_integer_value(json_object_get(r, "tokens")));
    } else if (!strcmp(type, "checkpoint")) {
        printf("checkpoint step %lld %s\n",
               (long long)json_integer_value(json_object_get(r, "step")), cli_str(r, "path"));
    } else if (!strcmp(type, "summary")) {
        printf("done: %lld steps (resumed from step %lld)\n",
               (long long)json_integer_value(json_object_get(r, "steps")),
               (long long)json_integer_value(json_object_get(r, "resumed_from")));
    } else if (!strcmp(type, "error")) {
        printf("error: %s\n", cli_str(r, "message"));
    } else {
        char name[64];
        snprintf(name, sizeof name, "%s", type); /* deleting the key frees `type` */
        json_object_del(r, "type");
        char *rest = json_dumps(r, JSON_COMPACT);
        printf("%s: %s\n", name, rest ? rest : "");
        free(rest);
    }
    json_decref(r);
}

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    struct logs_out *o = ud;
    size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(o->h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 400) {
        size_t k = len < sizeof o->err - 1 - o->nerr ? len : sizeof o->err - 1 - o->nerr;
        memcpy(o->err + o->nerr, p, k);
        o->nerr += k;
        o->err[o->nerr] = 0;
        return len;
    }
    if (!o->human) {
        fwrite(p, 1, len, stdout);
        fflush(stdout);
        return len;
    }
    for (size_t i = 0; i < len; i++) {
        if (o->n < sizeof o->line - 2) o->line[o->n++] = p[i];
        if (p[i] == '\n') {
            o->line[o->n] = 0;
            print_line(o, o->line);
            o->n = 0;
        }
    }
    fflush(stdout);
    return len;
}

int cmd_logs(struct cli *cli, int argc, char **argv) {
    const char *job = NULL, *rank = "0", *attempt = NULL, *stream = "stdout";
    int follow = 0, raw = cli->json, bad = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow"))
            follow = 1;
        else if (!strcmp(argv[i], "--raw"))
            raw = 1;
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc)
            rank = argv[++i];
        else if (!strcmp(argv[i], "--attempt") && i + 1 < argc)
            attempt = argv[++i];
        else if (!strcmp(argv[i], "--stream") && i + 1 < argc)
            stream = argv[++i];
        else if (argv[i][0] != '-' && !job)
            job = argv[i];
        else
            bad = 1;
    }
    if (!job || bad) {
        fprintf(stderr, "usage: loomctl logs JOB_ID [--rank R] [--attempt A] "
                        "[--stream stdout|stderr] [-f] [--raw]\n");
        return 2;
    }
    char enc[256], url[2048], auth[600], err[CURL_ERROR_SIZE] = "", renc[64], senc[64];
    cli_urlencode(job, enc, sizeof enc);
    cli_urlencode(rank, renc, sizeof renc);
    cli_urlencode(stream, senc, sizeof senc);
    int n = snprintf(url, sizeof url, "%s/v1/jobs/%s/logs?rank=%s&stream=%s%s", cli->url, enc, renc,
                     senc, follow ? "&follow=1" : "");
    if (attempt) snprintf(url + n, sizeof url - (size_t)n, "&attempt=%s", attempt);
    struct logs_out *o = calloc(1, sizeof *o);
    CURL *h = o ? curl_easy_init() : NULL;
    if (!h) {
        free(o);
        return 1;
    }
    o->h = h;
    o->human = !raw;
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
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, o);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    int rc = 0;
    if (cc != CURLE_OK) {
        fprintf(stderr, "loomctl: cannot reach loomd at %s: %s\n", cli->url,
                err[0] ? err : curl_easy_strerror(cc));
        rc = 3;
    } else if (status >= 400) {
        /* The API's error object, printed like every other command's. */
        json_t *e = json_loads(o->err, 0, NULL);
        const char *code = client_error_code(e), *msg = client_error_message(e);
        fprintf(stderr, "loomctl: %ld %s: %s\n", status, code ? code : "ERROR",
                msg ? msg : (o->nerr ? o->err : "no message"));
        json_decref(e);
        rc = 1;
    } else if (o->human && o->n) {
        o->line[o->n] = 0;
        print_line(o, o->line);
        printf("\n");
    }
    free(o);
    return rc;
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
    printf("%7s %7s %10s %10s %10s %9s %12s %6s %5s %8s\n", "STEP", "ATTEMPT", "LOSS", "VAL_LOSS",
           "LR", "GRAD_NORM", "TOKENS/S", "MFU", "UTIL", "MEM_GIB");
    size_t i;
    json_t *s, *evals = json_object_get(out, "evals");
    json_array_foreach(json_object_get(out, "series"), i, s) {
        /* The evaluation at this step, if one ran (evals are few: a scan is fine). */
        char val[32] = "-";
        size_t k;
        json_t *e;
        json_array_foreach(evals, k, e) {
            if (json_integer_value(json_object_get(e, "step")) ==
                    json_integer_value(json_object_get(s, "step")) &&
                json_is_number(json_object_get(e, "val_loss")))
                snprintf(val, sizeof val, "%.5f",
                         json_number_value(json_object_get(e, "val_loss")));
        }
        printf("%7lld %7lld %10.5f %10s %10.3g %9.4f %12.1f %6.3f %4lld%% %8.3f\n",
               (long long)json_integer_value(json_object_get(s, "step")),
               (long long)json_integer_value(json_object_get(s, "attempt")),
               json_number_value(json_object_get(s, "loss")), val,
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
