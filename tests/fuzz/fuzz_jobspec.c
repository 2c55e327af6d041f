/* libFuzzer target for the job-spec parser (api/jobspec.c jobspec_parse_text),
 * which reads every POST /v1/jobs and /v1/plan body. Properties checked:
 *   - a refusal names a code of the table (api/errors.h) with its status, and
 *     a message;
 *   - an accepted spec's canonical JSON (jobspec_to_json) is accepted again
 *     and gives the same canonical JSON (the form loomd stores and re-reads).
 * Built with LOOM_FUZZ=ON and clang (tests/fuzz.cmake); the sanitizers
 * (address, undefined) catch memory errors on the way. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"
#include "api/jobspec.h"

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_jobspec: %s: %s\n", what, detail);
    abort();
}

static void check_refusal(const struct loom_error *e) {
    const struct loom_errdef *d = loom_errdef_find(e->code);
    if (!d) fail("refusal with a code outside api/errors.h", e->code);
    if (d->status != e->status) fail("refusal with the wrong status for its code", e->code);
    if (!e->message[0]) fail("refusal without a message", e->code);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const unsigned flag_sets[] = {0, JOBSPEC_FOR_PLAN, JOBSPEC_ARRAY_MEMBERS};
    unsigned flags = flag_sets[size % (sizeof flag_sets / sizeof *flag_sets)];
    struct loom_spec *s = calloc(1, sizeof *s), *s2 = calloc(1, sizeof *s2);
    struct loom_error e;
    if (!s || !s2) goto out;
    memset(&e, 0, sizeof e);
    jobspec_init(s);
    if (jobspec_parse_text(s, (const char *)data, size, flags, &e) != 0) {
        check_refusal(&e);
        goto out;
    }
    json_t *canon = jobspec_to_json(s);
    if (!canon) fail("accepted spec", "no canonical JSON");
    char *text = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(canon);
    if (!text) fail("accepted spec", "canonical JSON does not serialize");
    memset(&e, 0, sizeof e);
    jobspec_init(s2);
    /* Array members were checked on the submitted body; the canonical form
     * is re-read as loomd reads a stored spec. */
    if (jobspec_parse_text(s2, text, strlen(text), flags & JOBSPEC_FOR_PLAN, &e) != 0) {
        fprintf(stderr, "canonical: %s\n", text);
        fail("canonical JSON of an accepted spec refused", e.message);
    }
    json_t *canon2 = jobspec_to_json(s2);
    char *text2 = canon2 ? json_dumps(canon2, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(canon2);
    if (!text2 || strcmp(text, text2) != 0) {
        fprintf(stderr, "first:  %s\nsecond: %s\n", text, text2 ? text2 : "(null)");
        fail("canonical JSON", "not stable under a re-parse");
    }
    free(text);
    free(text2);
out:
    free(s);
    free(s2);
    return 0;
}
