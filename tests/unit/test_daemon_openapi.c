/* Checks that api/openapi.yaml and loomd's route table (daemon/routes.c)
 * list the same set of (method, path) pairs, and that every route pattern
 * is well formed; and that the JobSpec schema lists exactly the fields of
 * the job-spec table (api/jobspec.h), each with the table's type, names,
 * range and default; and that components.x-error-codes lists the rows of
 * api/errors.h with their statuses. The YAML is read line by line: path keys are two-space
 * indented lines starting with '/', methods four-space indented keys.
 * Usage: test_daemon_openapi path/to/openapi.yaml */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"
#include "api/jobspec.h"
#include "daemon/http.h"

#define MAXR 256

static int failures;

static void upper(char *s) {
    for (; *s; s++)
        *s = (char)toupper((unsigned char)*s);
}

/* ---- the JobSpec schema against the job-spec field table ----
 * A reader for the subset of YAML the JobSpec schema is written in: block
 * mappings by indentation, flow mappings {k: v, ...} and flow lists [a, b]
 * on one line, "- " list items (oneOf). A key whose parent is "properties"
 * is a spec field; its path joins the field keys above it
 * ("train.lora.rank"). Its attributes are the keys of its flow mapping or
 * of its block, and those of its oneOf items. (PyYAML checks the whole file
 * in unit.openapi_yaml; this reader needs no library.) */

#define MAXP 160

struct prop {
    char path[96];
    char types[64];  /* " integer number ..." */
    char enums[256]; /* "a|b|c" */
    int has_min, has_max, min_excl, max_excl, has_def;
    double min, max;
    char def[64];
};

struct frame {
    int indent;
    char key[64];
    int prop; /* index in props, or -1 */
};

struct schema {
    struct prop p[MAXP];
    int n;
    struct frame st[32];
    int depth;
};

static char *trim(char *s) {
    while (*s == ' ')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

/* Split "k: v, k: [a, b], k: \"x, y\"" at top-level commas; calls back per
 * item. */
static void flow_items(char *s, void (*cb)(struct prop *, char *), struct prop *p) {
    int depth = 0, quote = 0;
    char *start = s;
    for (char *c = s;; c++) {
        if (*c == '"') quote = !quote;
        if (!quote && (*c == '[' || *c == '{')) depth++;
        if (!quote && (*c == ']' || *c == '}')) depth--;
        if (*c == '\0' || (!quote && depth == 0 && *c == ',')) {
            char end = *c;
            *c = '\0';
            cb(p, trim(start));
            if (end == '\0') break;
            start = c + 1;
        }
    }
}

static void set_attr(struct prop *p, char *kv) {
    char *colon = strstr(kv, ": ");
    if (!colon) return;
    *colon = '\0';
    char *k = trim(kv), *v = trim(colon + 2);
    if (!strcmp(k, "type")) {
        size_t l = strlen(p->types);
        snprintf(p->types + l, sizeof p->types - l, " %s", v);
    } else if (!strcmp(k, "enum") && v[0] == '[') {
        p->enums[0] = '\0';
        v[strlen(v) - 1] = '\0';
        char *save = NULL;
        for (char *t = strtok_r(v + 1, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            size_t l = strlen(p->enums);
            snprintf(p->enums + l, sizeof p->enums - l, "%s%s", l ? "|" : "", trim(t));
        }
    } else if (!strcmp(k, "exclusiveMinimum") && (!strcmp(v, "true") || !strcmp(v, "false"))) {
        p->min_excl = v[0] == 't'; /* OpenAPI 3.0: a flag on minimum */
    } else if (!strcmp(k, "exclusiveMaximum") && (!strcmp(v, "true") || !strcmp(v, "false"))) {
        p->max_excl = v[0] == 't';
    } else if (!strcmp(k, "minimum") || !strcmp(k, "exclusiveMinimum")) {
        p->has_min = 1;
        if (k[0] == 'e') p->min_excl = 1; /* the 3.1 form: the bound itself */
        p->min = strtod(v, NULL);
    } else if (!strcmp(k, "maximum") || !strcmp(k, "exclusiveMaximum")) {
        p->has_max = 1;
        if (k[0] == 'e') p->max_excl = 1;
        p->max = strtod(v, NULL);
    } else if (!strcmp(k, "default")) {
        p->has_def = 1;
        snprintf(p->def, sizeof p->def, "%s", v);
    }
}

/* The property whose attributes a key under `parent` sets: the parent
 * itself, or the property owning the oneOf list the parent is an item of. */
static int attr_owner(const struct schema *sc) {
    if (sc->depth == 0) return -1;
    const struct frame *t = &sc->st[sc->depth - 1];
    if (t->prop >= 0) return t->prop;
    if (!strcmp(t->key, "-") && sc->depth >= 3 && !strcmp(sc->st[sc->depth - 2].key, "oneOf"))
        return sc->st[sc->depth - 3].prop;
    return -1;
}

static const char *prop_parent_path(const struct schema *sc) {
    for (int i = sc->depth - 1; i >= 0; i--)
        if (sc->st[i].prop >= 0) return sc->p[sc->st[i].prop].path;
    return "";
}

static void schema_line(struct schema *sc, int indent, char *content) {
    while (sc->depth && sc->st[sc->depth - 1].indent >= indent)
        sc->depth--;
    if (content[0] == '-' && content[1] == ' ') {
        char *rest = trim(content + 2);
        if (rest[0] == '{') { /* - {flow}: an item of a oneOf */
            int owner = (sc->depth >= 2 && !strcmp(sc->st[sc->depth - 1].key, "oneOf"))
                            ? sc->st[sc->depth - 2].prop
                            : -1;
            if (owner >= 0) {
                rest[strlen(rest) - 1] = '\0';
                flow_items(rest + 1, set_attr, &sc->p[owner]);
            }
            return;
        }
        if (sc->depth < 32) sc->st[sc->depth++] = (struct frame){indent, "-", -1};
        schema_line(sc, indent + 2, rest);
        return;
    }
    char *colon = strchr(content, ':');
    if (!colon) return;
    *colon = '\0';
    char *key = trim(content), *rest = trim(colon + 1);
    int is_prop = sc->depth && !strcmp(sc->st[sc->depth - 1].key, "properties");
    int idx = -1;
    if (is_prop && sc->n < MAXP) {
        idx = sc->n++;
        struct prop *p = &sc->p[idx];
        memset(p, 0, sizeof *p);
        const char *up = prop_parent_path(sc);
        snprintf(p->path, sizeof p->path, "%s%s%s", up, up[0] ? "." : "", key);
        if (rest[0] == '{') {
            rest[strlen(rest) - 1] = '\0';
            flow_items(rest + 1, set_attr, p);
        }
    } else {
        int owner = attr_owner(sc);
        if (owner >= 0 && rest[0] && rest[0] != '{') {
            char kv[512];
            snprintf(kv, sizeof kv, "%s: %s", key, rest);
            set_attr(&sc->p[owner], kv);
        }
    }
    if (sc->depth < 32) {
        struct frame fr = {.indent = indent, .prop = idx};
        snprintf(fr.key, sizeof fr.key, "%s", key);
        sc->st[sc->depth++] = fr;
    }
}

/* Read components.schemas.JobSpec of the file. 0 when found. */
static int schema_read(const char *file, struct schema *sc) {
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char line[1024];
    int in = 0, found = 0;
    memset(sc, 0, sizeof *sc);
    while (fgets(line, sizeof line, f)) {
        int indent = (int)strspn(line, " ");
        char *c = trim(line);
        if (!c[0] || c[0] == '#') continue;
        if (!in) {
            in = indent == 4 && !strcmp(c, "JobSpec:");
            found |= in;
            continue;
        }
        if (indent <= 4) break;
        if (c[0] == '|' || (sc->depth && strchr(c, ':') == NULL && c[0] != '-'))
            continue; /* text of a block scalar */
        schema_line(sc, indent, c);
    }
    fclose(f);
    return found ? 0 : -1;
}

static const struct prop *schema_find(const struct schema *sc, const char *path) {
    for (int i = 0; i < sc->n; i++)
        if (!strcmp(sc->p[i].path, path)) return &sc->p[i];
    return NULL;
}

static int has_type(const struct prop *p, const char *t) {
    char w[24];
    snprintf(w, sizeof w, " %s", t);
    const char *at = strstr(p->types, w);
    return at && (at[strlen(w)] == ' ' || at[strlen(w)] == '\0');
}

#define SCHEMA_FAIL(...)                                                                           \
    do {                                                                                           \
        fprintf(stderr, "openapi JobSpec: " __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                                       \
        failures++;                                                                                \
    } while (0)

/* The names a user may give ("a|b|c"), as the parser's message lists them. */
static void row_names(const struct jobspec_field *f, char *out, size_t n) {
    int first = (f->flags & JOBSPEC_FL_ENUM_UNSET) ? 1 : 0;
    out[0] = '\0';
    for (int i = first; f->names && f->names[i]; i++) {
        size_t l = strlen(out);
        snprintf(out + l, n - l, "%s%s", l ? "|" : "", f->names[i]);
    }
}

static void check_row(const struct jobspec_field *f, const struct prop *p) {
    static const struct {
        enum jobspec_ftype t;
        const char *json;
    } types[] = {
        {JOBSPEC_F_I32, "integer"},   {JOBSPEC_F_I64, "integer"},      {JOBSPEC_F_U64, "integer"},
        {JOBSPEC_F_DBL, "number"},    {JOBSPEC_F_BOOL, "boolean"},     {JOBSPEC_F_STR, "string"},
        {JOBSPEC_F_ENUM, "string"},   {JOBSPEC_F_OBJ, "object"},       {JOBSPEC_F_LABELS, "object"},
        {JOBSPEC_F_STRLIST, "array"}, {JOBSPEC_F_RECOMPUTE, "string"}, {JOBSPEC_F_ARRAY, "object"}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (types[i].t == f->type && !has_type(p, types[i].json))
            SCHEMA_FAIL("%s is %s in the table, the schema says '%s'", f->path, types[i].json,
                        p->types);
    if ((f->flags & JOBSPEC_FL_ONE_OR_LIST) && !has_type(p, "string"))
        SCHEMA_FAIL("%s takes a string too; the schema says '%s'", f->path, p->types);
    if (f->type == JOBSPEC_F_RECOMPUTE && !has_type(p, "object"))
        SCHEMA_FAIL("%s takes an object too; the schema says '%s'", f->path, p->types);
    if (f->type == JOBSPEC_F_ENUM || f->type == JOBSPEC_F_RECOMPUTE) {
        char names[256];
        row_names(f, names, sizeof names);
        if (strcmp(names, p->enums) != 0)
            SCHEMA_FAIL("%s names %s in the table, the schema's enum is [%s]", f->path, names,
                        p->enums);
    }
    int number = f->type == JOBSPEC_F_I32 || f->type == JOBSPEC_F_I64 || f->type == JOBSPEC_F_U64 ||
                 f->type == JOBSPEC_F_DBL;
    if (number) {
        int min_excl = (f->flags & JOBSPEC_FL_MIN_EXCL) != 0,
            max_excl = (f->flags & JOBSPEC_FL_MAX_EXCL) != 0;
        if (!p->has_min || p->min != f->min || p->min_excl != min_excl)
            SCHEMA_FAIL("%s: the table's minimum is %s%g, the schema's %s%g", f->path,
                        min_excl ? "exclusive " : "", f->min, p->min_excl ? "exclusive " : "",
                        p->has_min ? p->min : NAN);
        if (!p->has_max || p->max != f->max || p->max_excl != max_excl)
            SCHEMA_FAIL("%s: the table's maximum is %s%g, the schema's %s%g", f->path,
                        max_excl ? "exclusive " : "", f->max, p->max_excl ? "exclusive " : "",
                        p->has_max ? p->max : NAN);
    }
    if (p->has_def && !(f->flags & JOBSPEC_FL_DERIVED)) {
        char want[64] = "";
        if (number && strtod(p->def, NULL) != f->def)
            SCHEMA_FAIL("%s: default %g in the table, %s in the schema", f->path, f->def, p->def);
        if (f->type == JOBSPEC_F_BOOL)
            snprintf(want, sizeof want, "%s", f->def ? "true" : "false");
        else if (f->type == JOBSPEC_F_ENUM || f->type == JOBSPEC_F_RECOMPUTE)
            snprintf(want, sizeof want, "%s", f->names[(int)f->def]);
        else if (f->type == JOBSPEC_F_STR)
            snprintf(want, sizeof want, "%s", f->def_s ? f->def_s : "");
        if (want[0] && strcmp(want, p->def) != 0)
            SCHEMA_FAIL("%s: default %s in the table, %s in the schema", f->path, want, p->def);
    }
}

static void check_spec_schema(const char *file) {
    static struct schema sc;
    if (schema_read(file, &sc) != 0) {
        SCHEMA_FAIL("no components.schemas.JobSpec in %s", file);
        return;
    }
    size_t n;
    const struct jobspec_field *f = jobspec_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const struct prop *p = schema_find(&sc, f[i].path);
        if (!p)
            SCHEMA_FAIL("field %s (%s) is missing from the schema", f[i].path, f[i].help);
        else
            check_row(&f[i], p);
    }
    for (int i = 0; i < sc.n; i++)
        if (!jobspec_field_find(sc.p[i].path))
            SCHEMA_FAIL("the schema lists %s, which the job spec does not have", sc.p[i].path);
    printf("openapi: JobSpec schema has %d fields, the table %zu\n", sc.n, n);
}

/* components.x-error-codes lists exactly the rows of api/errors.h, each
 * with its status. */
static void check_error_codes(const char *file) {
    FILE *f = fopen(file, "r");
    if (!f) {
        SCHEMA_FAIL("cannot read %s", file);
        return;
    }
    size_t n;
    const struct loom_errdef *rows = loom_errors(&n);
    char seen[LOOM_E_COUNT] = {0};
    char line[1024];
    int in = 0, listed = 0;
    while (fgets(line, sizeof line, f)) {
        int indent = (int)strspn(line, " ");
        char *c = trim(line);
        if (!c[0] || c[0] == '#') continue;
        if (!in) {
            in = indent == 2 && !strcmp(c, "x-error-codes:");
            continue;
        }
        if (indent <= 2) break;
        char code[64];
        int status;
        if (sscanf(c, "%63[A-Z0-9_]: {status: %d", code, &status) != 2) {
            SCHEMA_FAIL("x-error-codes: cannot read '%s'", c);
            continue;
        }
        listed++;
        const struct loom_errdef *d = loom_errdef_find(code);
        if (!d)
            SCHEMA_FAIL("x-error-codes lists %s, which api/errors.h does not have", code);
        else if (d->status != status)
            SCHEMA_FAIL("x-error-codes: %s has status %d, api/errors.h says %d", code, status,
                        d->status);
        else
            seen[d - rows] = 1;
    }
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (!seen[i])
            SCHEMA_FAIL("%s (%d) is missing from x-error-codes", rows[i].code, rows[i].status);
    printf("openapi: %d error codes listed, %zu in api/errors.h\n", listed, n);
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
    check_spec_schema(argv[1]);
    check_error_codes(argv[1]);
    if (nspec == 0) failures++;
    return failures ? 1 : 0;
}
