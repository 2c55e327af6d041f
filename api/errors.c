/* The error-code table of api/errors.h, expanded once. */
#include "api/errors.h"

#include <string.h>

static const struct loom_errdef rows[] = {
#define LOOM_ERRORS_ROW(code, status, meaning) {#code, status, meaning},
    LOOM_ERRORS(LOOM_ERRORS_ROW)
#undef LOOM_ERRORS_ROW
};

const struct loom_errdef *loom_errors(size_t *n) {
    *n = sizeof rows / sizeof *rows;
    return rows;
}

const struct loom_errdef *loom_errdef_of(enum loom_errcode c) {
    return &rows[c];
}

const struct loom_errdef *loom_errdef_find(const char *code) {
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (strcmp(rows[i].code, code) == 0) return &rows[i];
    return NULL;
}
