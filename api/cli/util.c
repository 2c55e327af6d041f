/* loomctl helpers: one request with error reporting, JSON output, files. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli/cli.h"

int cli_call(struct cli *cli, const char *method, const char *path, json_t *body, json_t **out) {
    long status = 0;
    json_t *reply = NULL;
    char *raw = NULL;
    char err[256];
    *out = NULL;
    if (client_request(cli->c, method, path, body, &status, &reply, &raw, err, sizeof err) != 0) {
        fprintf(stderr, "loomctl: cannot reach loomd at %s: %s\n", cli->url, err);
        return -3;
    }
    if (status >= 400) {
        const char *code = client_error_code(reply), *msg = client_error_message(reply);
        json_t *field = json_object_get(json_object_get(reply, "error"), "field");
        fprintf(stderr, "loomctl: %ld %s: %s", status, code ? code : "ERROR",
                msg ? msg : (raw ? raw : "no message"));
        if (json_is_string(field)) fprintf(stderr, " (field %s)", json_string_value(field));
        fprintf(stderr, "\n");
        json_decref(reply);
        free(raw);
        return -1;
    }
    free(raw);
    *out = reply;
    return 0;
}

int cli_get(struct cli *cli, const char *path, json_t **out) {
    if (cli_call(cli, "GET", path, NULL, out)) return -1;
    if (!cli->json) return 0;
    cli_print_json(*out);
    json_decref(*out);
    *out = NULL;
    return 1;
}

void cli_print_json(json_t *j) {
    if (!j) return;
    char *s = json_dumps(j, JSON_INDENT(2));
    if (s) puts(s);
    free(s);
}

json_t *cli_read_json_file(const char *path) {
    json_error_t e;
    json_t *j = strcmp(path, "-") == 0 ? json_loadf(stdin, 0, &e) : json_load_file(path, 0, &e);
    if (!j) fprintf(stderr, "loomctl: %s:%d:%d: %s\n", path, e.line, e.column, e.text);
    return j;
}

const char *cli_str(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : "-";
}

void cli_urlencode(const char *s, char *out, size_t len) {
    size_t n = 0;
    for (; *s && n + 4 < len; s++) {
        unsigned char ch = (unsigned char)*s;
        if (isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~')
            out[n++] = (char)ch;
        else
            n += (size_t)snprintf(out + n, len - n, "%%%02X", ch);
    }
    out[n] = 0;
}
