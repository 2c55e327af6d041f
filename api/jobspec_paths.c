/* Data-path confinement of the job spec (api/jobspec.h): the lexical rules
 * every data path meets at parse time, and the realpath-based check that a
 * path, its directory and every file its glob matches stay under a tenant's
 * data roots (symlinks followed). Reads the filesystem; no state. */
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"

/* Absolute path, no '.'/'..' components, glob characters only in the last
 * component, no empty last component. */
int jobspec_path_lexical(const char *p, const char *field, struct loom_error *e) {
    if (p[0] != '/')
        return loom_err(e, LOOM_E_DATA_PATH_INVALID, field,
                        "%s=\"%.200s\" must be an absolute path", field, p);
    const char *last = strrchr(p, '/') + 1;
    if (*last == '\0')
        return loom_err(e, LOOM_E_DATA_PATH_INVALID, field,
                        "%s=\"%.200s\" names a directory; give a file or a glob such as "
                        "dir/train_*.bin",
                        field, p);
    const char *c = p;
    while (*c) {
        while (*c == '/')
            c++;
        const char *end = strchr(c, '/');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return loom_err(e, LOOM_E_DATA_PATH_INVALID, field,
                            "%s=\"%.200s\" has a '%.*s' component; give a normalised path", field,
                            p, (int)len, c);
        if (c < last)
            for (size_t i = 0; i < len; i++)
                if (c[i] == '*' || c[i] == '?' || c[i] == '[')
                    return loom_err(e, LOOM_E_DATA_PATH_INVALID, field,
                                    "%s=\"%.200s\": glob characters are allowed only in the "
                                    "file name",
                                    field, p);
        c += len;
    }
    return 0;
}

/* 1 when `p` equals `root` or lies below it (both resolved, no trailing '/'
 * except for "/" itself). */
static int under_root(const char *p, const char *root) {
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/')
        rl--;
    if (rl == 1 && root[0] == '/') return p[0] == '/';
    return strncmp(p, root, rl) == 0 && (p[rl] == '\0' || p[rl] == '/');
}

/* realpath of the longest existing prefix of `dir` followed by the rest of
 * `dir` (which has no '.' or '..' components). */
static int resolve_prefix(const char *dir, char *out, size_t n) {
    char *work = strdup(dir);
    if (!work) return -1;
    char *real = NULL;
    for (;;) {
        real = realpath(work, NULL);
        if (real) break;
        char *slash = strrchr(work, '/');
        if (!slash || slash == work) {
            real = realpath("/", NULL);
            work[0] = '\0';
            break;
        }
        *slash = '\0';
    }
    size_t used = strlen(work);
    const char *rest = dir + used;
    int rc = 0;
    if (!real)
        rc = -1;
    else if ((size_t)snprintf(out, n, "%s%s", strcmp(real, "/") == 0 && rest[0] == '/' ? "" : real,
                              rest) >= n)
        rc = -1;
    free(real);
    free(work);
    return rc;
}

static int has_glob(const char *s) {
    return strpbrk(s, "*?[") != NULL;
}

int jobspec_path_confined(const char *pattern, const char *const *roots, size_t nroots,
                          unsigned flags, const char *field, struct loom_error *e) {
    if (jobspec_path_lexical(pattern, field, e) != 0) return -1;
    if (nroots == 0)
        return loom_err(e, LOOM_E_DATA_PATH_FORBIDDEN, field,
                        "%s=\"%.200s\": no data roots are allowed for this tenant", field, pattern);
    int rc = -1;
    char **rr = calloc(nroots, sizeof *rr);
    char *dir = strdup(pattern);
    char *dreal = NULL;
    glob_t g;
    int have_glob = 0;
    if (!rr || !dir) {
        loom_err(e, LOOM_E_INTERNAL, field, "out of memory");
        goto out;
    }
    /* Resolve the roots themselves; a root that does not exist here is kept
     * as written (lexical comparison only). */
    for (size_t i = 0; i < nroots; i++) {
        char *r = realpath(roots[i], NULL);
        if (!r) {
            r = strdup(roots[i]);
            if (!r) {
                loom_err(e, LOOM_E_INTERNAL, field, "out of memory");
                goto out;
            }
            size_t l = strlen(r);
            while (l > 1 && r[l - 1] == '/')
                r[--l] = '\0';
        }
        rr[i] = r;
    }
    char *slash = strrchr(dir, '/');
    const char *base = pattern + (slash - dir) + 1;
    if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    dreal = realpath(dir, NULL);
    if (!dreal) {
        if (flags & JOBSPEC_PATH_MUST_EXIST) {
            loom_err(e, LOOM_E_DATA_PATH_NOT_FOUND, field,
                     "%s=\"%.200s\": directory %.200s does not exist (%s)", field, pattern, dir,
                     strerror(errno));
            goto out;
        }
        /* Resolve the longest existing prefix and append the rest: a symlink
         * higher up that points outside is still caught. */
        char cand[PATH_MAX + JOBSPEC_PATH_MAX];
        if (resolve_prefix(dir, cand, sizeof cand) != 0) {
            loom_err(e, LOOM_E_DATA_PATH_INVALID, field, "%s=\"%.200s\" cannot be resolved", field,
                     pattern);
            goto out;
        }
        for (size_t i = 0; i < nroots; i++)
            if (under_root(cand, rr[i])) {
                rc = 0;
                goto out;
            }
        loom_err(e, LOOM_E_DATA_PATH_FORBIDDEN, field,
                 "%s=\"%.200s\" resolves to %.200s, outside the allowed data roots", field, pattern,
                 cand);
        goto out;
    }
    size_t root = nroots;
    for (size_t i = 0; i < nroots && root == nroots; i++)
        if (under_root(dreal, rr[i])) root = i;
    if (root == nroots) {
        loom_err(e, LOOM_E_DATA_PATH_FORBIDDEN, field,
                 "%s=\"%.200s\" resolves to %.200s, outside the allowed data roots", field, pattern,
                 dreal);
        goto out;
    }
    char full[PATH_MAX + JOBSPEC_PATH_MAX];
    snprintf(full, sizeof full, "%s/%s", strcmp(dreal, "/") == 0 ? "" : dreal, base);
    int grc = glob(full, has_glob(base) ? 0 : GLOB_NOESCAPE, NULL, &g);
    have_glob = grc == 0;
    if (grc != 0 && grc != GLOB_NOMATCH) {
        loom_err(e, LOOM_E_DATA_PATH_NOT_FOUND, field, "%s=\"%.200s\": cannot list %.200s", field,
                 pattern, dreal);
        goto out;
    }
    size_t nmatch = have_glob ? g.gl_pathc : 0;
    for (size_t i = 0; i < nmatch; i++) {
        char *fr = realpath(g.gl_pathv[i], NULL);
        if (!fr) {
            loom_err(e, LOOM_E_DATA_PATH_NOT_FOUND, field, "%s: %.200s cannot be resolved (%s)",
                     field, g.gl_pathv[i], strerror(errno));
            goto out;
        }
        int ok = 0;
        for (size_t k = 0; k < nroots && !ok; k++)
            ok = under_root(fr, rr[k]);
        if (!ok) {
            loom_err(e, LOOM_E_DATA_PATH_FORBIDDEN, field,
                     "%s: %.200s resolves to %.200s, outside the allowed data roots", field,
                     g.gl_pathv[i], fr);
            free(fr);
            goto out;
        }
        free(fr);
    }
    if (nmatch == 0 && (flags & JOBSPEC_PATH_MUST_EXIST)) {
        loom_err(e, LOOM_E_DATA_PATH_NOT_FOUND, field, "%s=\"%.200s\" matches no file", field,
                 pattern);
        goto out;
    }
    rc = 0;
out:
    if (have_glob) globfree(&g);
    free(dreal);
    free(dir);
    if (rr)
        for (size_t i = 0; i < nroots; i++)
            free(rr[i]);
    free(rr);
    return rc;
}

int jobspec_check_paths(const struct loom_spec *s, const char *const *roots, size_t nroots,
                        unsigned flags, struct loom_error *e) {
    if (s->data.train[0] &&
        jobspec_path_confined(s->data.train, roots, nroots, flags, "data.train", e) != 0)
        return -1;
    if (s->data.val[0] &&
        jobspec_path_confined(s->data.val, roots, nroots, flags, "data.val", e) != 0)
        return -1;
    if (s->data.tokenizer[0] &&
        jobspec_path_confined(s->data.tokenizer, roots, nroots, flags, "data.tokenizer", e) != 0)
        return -1;
    if (s->init_from[0] == '/' &&
        jobspec_path_confined(s->init_from, roots, nroots, flags, "model.init_from", e) != 0)
        return -1;
    if (s->init_hf[0] &&
        jobspec_path_confined(s->init_hf, roots, nroots, flags, "model.init_hf", e) != 0)
        return -1;
    return 0;
}
