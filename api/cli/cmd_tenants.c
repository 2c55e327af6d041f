/* loomctl admin commands (tenants, tokens) and health. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli/cli.h"

static int finish(struct cli *cli, int rc, json_t *out, void (*table)(json_t *)) {
    if (rc) return rc == -3 ? 3 : 1;
    if (cli->json || !table)
        cli_print_json(out);
    else
        table(out);
    json_decref(out);
    return 0;
}

static void tenant_row(json_t *t) {
    printf("%-16s %s\n", cli_str(t, "id"), cli_str(t, "name"));
}

static void tenant_table(json_t *out) {
    printf("%-16s %s\n", "ID", "NAME");
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(out, "items"), i, t) tenant_row(t);
}

int cmd_tenants_create(struct cli *cli, int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: loomctl tenant-create NAME [--data-root DIR]... [--gpu-quota N]\n");
        return 2;
    }
    json_t *body = json_pack("{s:s}", "name", argv[1]);
    json_t *roots = json_array();
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--data-root")) {
            json_array_append_new(roots, json_string(argv[i + 1]));
        } else if (!strcmp(argv[i], "--gpu-quota")) {
            json_object_set_new(body, "gpu_quota", json_integer(atoll(argv[i + 1])));
        } else {
            fprintf(stderr, "loomctl: unknown option %s\n", argv[i]);
            json_decref(body);
            json_decref(roots);
            return 2;
        }
    }
    if (json_array_size(roots)) json_object_set(body, "data_roots", roots);
    json_decref(roots);
    json_t *out = NULL;
    int rc = cli_call(cli, "POST", "/v1/tenants", body, &out);
    json_decref(body);
    return finish(cli, rc, out, tenant_row);
}

int cmd_tenants_update(struct cli *cli, int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr,
                "usage: loomctl tenant-update TENANT_ID [--gpu-quota N] [--data-root DIR]...\n");
        return 2;
    }
    json_t *body = json_object();
    json_t *roots = NULL;
    for (int i = 2; i < argc; i += 2) {
        if (i + 1 < argc && !strcmp(argv[i], "--data-root")) {
            if (!roots) roots = json_array();
            json_array_append_new(roots, json_string(argv[i + 1]));
        } else if (i + 1 < argc && !strcmp(argv[i], "--gpu-quota")) {
            json_object_set_new(body, "gpu_quota", json_integer(atoll(argv[i + 1])));
        } else {
            fprintf(stderr, "loomctl: unknown option %s\n", argv[i]);
            json_decref(body);
            json_decref(roots);
            return 2;
        }
    }
    if (roots) json_object_set_new(body, "data_roots", roots);
    char enc[256], path[320];
    cli_urlencode(argv[1], enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/tenants/%s", enc);
    json_t *out = NULL;
    int rc = cli_call(cli, "PATCH", path, body, &out);
    json_decref(body);
    return finish(cli, rc, out, NULL);
}

int cmd_tenants_list(struct cli *cli, int argc, char **argv) {
    json_t *out = NULL;
    int rc = cli_call(cli, "GET", "/v1/tenants", NULL, &out);
    return finish(cli, rc, out, tenant_table);
}

static void token_row(json_t *t) {
    printf("token id %s for tenant %s (shown once):\n%s\n", cli_str(t, "id"),
           cli_str(t, "tenant_id"), cli_str(t, "token"));
}

int cmd_tenants_token_create(struct cli *cli, int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: loomctl token-create TENANT_ID\n");
        return 2;
    }
    char enc[256], path[320];
    cli_urlencode(argv[1], enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/tenants/%s/tokens", enc);
    json_t *out = NULL;
    int rc = cli_call(cli, "POST", path, NULL, &out);
    return finish(cli, rc, out, token_row);
}

static void revoked_row(json_t *t) {
    printf("revoked %s\n", cli_str(t, "id"));
}

int cmd_tenants_token_revoke(struct cli *cli, int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: loomctl token-revoke TENANT_ID TOKEN_ID\n");
        return 2;
    }
    char e1[256], e2[256], path[600];
    cli_urlencode(argv[1], e1, sizeof e1);
    cli_urlencode(argv[2], e2, sizeof e2);
    snprintf(path, sizeof path, "/v1/tenants/%s/tokens/%s", e1, e2);
    json_t *out = NULL;
    int rc = cli_call(cli, "DELETE", path, NULL, &out);
    return finish(cli, rc, out, revoked_row);
}

static void rotated_row(json_t *t) {
    json_t *old = json_object_get(t, "rotated_from");
    printf("token id %s for tenant %s (shown once):\n%s\n", cli_str(t, "id"),
           cli_str(t, "tenant_id"), cli_str(t, "token"));
    printf("old token %s: %s %s\n", cli_str(old, "id"),
           json_is_true(json_object_get(old, "revoked")) ? "revoked at" : "valid until",
           cli_str(old, "expires_at"));
}

int cmd_tenants_token_rotate(struct cli *cli, int argc, char **argv) {
    if (argc != 3 && !(argc == 5 && !strcmp(argv[3], "--grace"))) {
        fprintf(stderr, "usage: loomctl token-rotate TENANT_ID TOKEN_ID [--grace SECONDS]\n");
        return 2;
    }
    char e1[256], e2[256], path[640];
    cli_urlencode(argv[1], e1, sizeof e1);
    cli_urlencode(argv[2], e2, sizeof e2);
    snprintf(path, sizeof path, "/v1/tenants/%s/tokens/%s/rotate", e1, e2);
    char *end = NULL;
    long grace = argc == 5 ? strtol(argv[4], &end, 10) : 0;
    if (argc == 5 && (!*argv[4] || *end || grace < 0)) {
        fprintf(stderr, "loomctl: --grace takes a number of seconds, not '%s'\n", argv[4]);
        return 2;
    }
    json_t *body = json_pack("{s:I}", "grace_s", (json_int_t)grace);
    json_t *out = NULL;
    int rc = cli_call(cli, "POST", path, body, &out);
    json_decref(body);
    return finish(cli, rc, out, rotated_row);
}

static void health_row(json_t *t) {
    printf("loomd %s\n", cli_str(t, "status"));
}

int cmd_health(struct cli *cli, int argc, char **argv) {
    json_t *out = NULL;
    int rc = cli_call(cli, "GET", "/healthz", NULL, &out);
    return finish(cli, rc, out, health_row);
}
