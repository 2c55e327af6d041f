/* Config tables: defaults < file < environment < flags. See config.h. */
#include "common/config.h"
#include "common/version.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[] = {"string", "int", "float", "bool"};

static enum config_type base_type(const struct config_entry *e) {
    return (enum config_type)(e->type & CONFIG_TYPE_MASK);
}

static int is_hidden(const struct config_entry *e) {
    return (e->type & (CONFIG_TUNING | CONFIG_DEBUG)) != 0;
}

static int set_value(const struct config_entry *e, void *out, const char *val, const char *src) {
    char *base = (char *)out + e->offset;
    char *end = NULL;
    switch (base_type(e)) {
    case CONFIG_STR: {
        char **p = (char **)base;
        free(*p);
        *p = val ? strdup(val) : NULL;
        return 0;
    }
    case CONFIG_INT: {
        errno = 0;
        long v = strtol(val, &end, 0);
        if (errno || end == val || *end) {
            fprintf(stderr, "config: %s: '%s' for %s is not an integer\n", src, val, e->name);
            return -1;
        }
        if (e->min <= e->max && (v < e->min || v > e->max)) {
            fprintf(stderr, "config: %s: %s=%ld is outside [%.0f, %.0f]\n", src, e->name, v, e->min,
                    e->max);
            return -1;
        }
        *(long *)base = v;
        return 0;
    }
    case CONFIG_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v)) {
            fprintf(stderr, "config: %s: '%s' for %s is not a number\n", src, val, e->name);
            return -1;
        }
        if (e->min <= e->max && (v < e->min || v > e->max)) {
            fprintf(stderr, "config: %s: %s=%g is outside [%g, %g]\n", src, e->name, v, e->min,
                    e->max);
            return -1;
        }
        *(double *)base = v;
        return 0;
    }
    case CONFIG_BOOL:
        if (!strcmp(val, "1") || !strcmp(val, "true") || !strcmp(val, "yes") ||
            !strcmp(val, "on")) {
            *(int *)base = 1;
        } else if (!strcmp(val, "0") || !strcmp(val, "false") || !strcmp(val, "no") ||
                   !strcmp(val, "off")) {
            *(int *)base = 0;
        } else {
            fprintf(stderr, "config: %s: '%s' for %s is not a boolean\n", src, val, e->name);
            return -1;
        }
        return 0;
    default:
        break;
    }
    return -1;
}

static int is_bool_word(const char *s) {
    static const char *const w[] = {"1", "0", "true", "false", "yes", "no", "on", "off"};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        if (!strcmp(s, w[i])) return 1;
    return 0;
}

static const struct config_entry *find(const struct config_entry *t, size_t n, const char *name,
                                       size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(t[i].name) == len && strncmp(t[i].name, name, len) == 0) return &t[i];
    return NULL;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

static int load_file(const struct config_entry *t, size_t n, void *out, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "config: cannot open config file %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[4096], src[4200];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        snprintf(src, sizeof src, "%s:%d", path, lineno);
        if (!eq) {
            fprintf(stderr, "config: %s: expected 'name = value'\n", src);
            rc = -1;
            break;
        }
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        const struct config_entry *e = find(t, n, key, strlen(key));
        if (!e) {
            fprintf(stderr, "config: %s: unknown setting '%s'\n", src, key);
            rc = -1;
            break;
        }
        if (set_value(e, out, val, src) < 0) {
            rc = -1;
            break;
        }
    }
    fclose(f);
    return rc;
}

static void print_rows(const struct config_entry *t, size_t n, const char *prog, const char *usage,
                       int all, FILE *f) {
    fprintf(f,
            "usage: %s %s\n\nsettings (flag --name, env LOOM_NAME, or 'name = value' in "
            "--config FILE):\n",
            prog, usage ? usage : "[options]");
    size_t hidden = 0;
    for (size_t i = 0; i < n; i++) {
        const struct config_entry *e = &t[i];
        if (is_hidden(e) && !all) {
            hidden++;
            continue;
        }
        enum config_type ty = base_type(e);
        char range[64] = "";
        if ((ty == CONFIG_INT || ty == CONFIG_DOUBLE) && e->min <= e->max)
            snprintf(range, sizeof range, " [%g..%g]", e->min, e->max);
        const char *kind = e->type & CONFIG_DEBUG    ? " (debug)"
                           : e->type & CONFIG_TUNING ? " (tuning)"
                                                     : "";
        fprintf(f, "  --%-22s %-6s default %s%s%s\n      %s\n", e->name, type_names[ty],
                e->def ? e->def : "(none)", range, kind, e->help);
    }
    if (hidden)
        fprintf(f, "\n%zu tuning and debug settings are not shown: --help-all lists them\n",
                hidden);
}

void config_print_help(const struct config_entry *t, size_t n, const char *prog, const char *usage,
                       FILE *f) {
    print_rows(t, n, prog, usage, 0, f);
}

void config_print_help_all(const struct config_entry *t, size_t n, const char *prog,
                           const char *usage, FILE *f) {
    print_rows(t, n, prog, usage, 1, f);
}

int config_load(const struct config_entry *t, size_t n, void *out, const char *prog,
                const char *usage, int argc, char **argv, char **positional, int *npositional) {
    int maxpos = npositional ? *npositional : 0, npos = 0;
    for (size_t i = 0; i < n; i++)
        if (t[i].def && set_value(&t[i], out, t[i].def, "default") < 0) return -1;

    /* --help first, then the config file, so that file < env < flags. */
    const char *cfgfile = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            config_print_help(t, n, prog, usage, stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--help-all")) {
            config_print_help_all(t, n, prog, usage, stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("%s %s\n", prog, LOOM_VERSION);
            return 1;
        }
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            cfgfile = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            cfgfile = argv[i] + 9;
    }
    if (!cfgfile && find(t, n, "config", 6)) cfgfile = getenv("LOOM_CONFIG");
    if (cfgfile && load_file(t, n, out, cfgfile) < 0) return -1;

    for (size_t i = 0; i < n; i++) {
        char env[128] = "LOOM_";
        size_t k = 5;
        for (const char *p = t[i].name; *p && k < sizeof env - 1; p++)
            env[k++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        env[k] = 0;
        const char *v = getenv(env);
        if (v && set_value(&t[i], out, v, env) < 0) return -1;
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) {
            if (npos >= maxpos) {
                fprintf(stderr, "%s: unexpected argument '%s' (try --help)\n", prog, a);
                return -1;
            }
            positional[npos++] = argv[i];
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct config_entry *e = find(t, n, name, len);
        if (!e) {
            fprintf(stderr, "%s: unknown flag '--%.*s' (try --help)\n", prog, (int)len, name);
            return -1;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (base_type(e) == CONFIG_BOOL && !(i + 1 < argc && is_bool_word(argv[i + 1]))) {
                val = "true";
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                fprintf(stderr, "%s: flag --%s needs a value\n", prog, e->name);
                return -1;
            }
        }
        if (set_value(e, out, val, "flag") < 0) return -1;
    }
    if (npositional) *npositional = npos;
    return 0;
}

void config_free(const struct config_entry *t, size_t n, void *out) {
    for (size_t i = 0; i < n; i++)
        if (base_type(&t[i]) == CONFIG_STR) {
            char **p = (char **)((char *)out + t[i].offset);
            free(*p);
            *p = NULL;
        }
}
