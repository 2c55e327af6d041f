/* Checks that api/openapi.yaml and loomd's route table (daemon/routes.c)
 * list the same set of (method, path) pairs, and that every route pattern
 * is well formed. The YAML is read line by line: path keys are two-space
 * indented lines starting with '/', methods four-space indented keys.
 * Usage: test_daemon_openapi path/to/openapi.yaml */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/http.h"

#define MAXR 256

static int failures;

static void upper(char *s) {
    for (; *s; s++)
        *s = (char)toupper((unsigned char)*s);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    char spec[MAXR][1100];
    int nspec = 0, in_paths = 0;
    char line[1024], path[1024] = "";
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strncmp(line, "paths:", 6)) {
            in_paths = 1;
            continue;
        }
        if (in_paths && line[0] && line[0] != ' ' && line[0] != '#') in_paths = 0;
        if (!in_paths) continue;
        if (!strncmp(line, "  /", 3)) {
            char *colon = strrchr(line, ':');
            if (colon) *colon = 0;
            snprintf(path, sizeof path, "%s", line + 2);
            continue;
        }
        static const char *const methods[] = {"get", "post", "put", "delete", "patch"};
        for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
            char key[32];
            snprintf(key, sizeof key, "    %s:", methods[m]);
            if (!strcmp(line, key) && path[0] && nspec < MAXR) {
                char meth[16];
                snprintf(meth, sizeof meth, "%s", methods[m]);
                upper(meth);
                snprintf(spec[nspec++], 1100, "%s %s", meth, path);
            }
        }
    }
    fclose(f);
    int in_spec[MAXR] = {0};
    for (size_t i = 0; i < http_routes_count; i++) {
        const struct http_route *r = &http_routes[i];
        char want[320];
        snprintf(want, sizeof want, "%s %s", r->method, r->pattern);
        /* OpenAPI has no multi-segment template: {name*} is {name} there. */
        char *star = strstr(want, "*}");
        if (star) memmove(star, star + 1, strlen(star + 1) + 1);
        int found = 0;
        for (int k = 0; k < nspec; k++)
            if (!strcmp(spec[k], want)) {
                found = 1;
                in_spec[k] = 1;
            }
        if (!found) {
            fprintf(stderr, "route %s is served but missing from openapi.yaml\n", want);
            failures++;
        }
        /* patterns: absolute, no empty segment, braces only as whole segments */
        if (r->pattern[0] != '/' || strstr(r->pattern, "//")) {
            fprintf(stderr, "route pattern '%s' is malformed\n", r->pattern);
            failures++;
        }
        for (size_t j = i + 1; j < http_routes_count; j++)
            if (!strcmp(r->method, http_routes[j].method) &&
                !strcmp(r->pattern, http_routes[j].pattern)) {
                fprintf(stderr, "route %s listed twice\n", want);
                failures++;
            }
        if (!r->handler) {
            fprintf(stderr, "route %s has no handler\n", want);
            failures++;
        }
    }
    for (int k = 0; k < nspec; k++)
        if (!in_spec[k]) {
            fprintf(stderr, "openapi.yaml lists %s, which loomd does not serve\n", spec[k]);
            failures++;
        }
    /* the matcher agrees with the patterns */
    char *names[HTTP_MAX_PARAMS], *values[HTTP_MAX_PARAMS];
    int n = 0;
    if (!http_match("/v1/jobs/{id}/cancel", "/v1/jobs/j-1/cancel", names, values, HTTP_MAX_PARAMS,
                    &n) ||
        n != 1 || strcmp(names[0], "id") || strcmp(values[0], "j-1")) {
        fprintf(stderr, "http_match failed on /v1/jobs/{id}/cancel\n");
        failures++;
    }
    for (int i = 0; i < n; i++) {
        free(names[i]);
        free(values[i]);
    }
    static const char *const nomatch[] = {"/v1/jobs/", "/v1/jobs//cancel", "/v1/jobs/a/b/cancel",
                                          "/v1/jobs/a/cancel/x", "v1/jobs/a/cancel"};
    for (size_t i = 0; i < sizeof nomatch / sizeof *nomatch; i++)
        if (http_match("/v1/jobs/{id}/cancel", nomatch[i], names, values, HTTP_MAX_PARAMS, &n)) {
            fprintf(stderr, "http_match wrongly matched %s\n", nomatch[i]);
            failures++;
            for (int k = 0; k < n; k++) {
                free(names[k]);
                free(values[k]);
            }
        }
    printf("openapi: %d paths+methods in the spec, %zu routes served\n", nspec, http_routes_count);
    if (nspec == 0) failures++;
    return failures ? 1 : 0;
}
