/* Table-driven tests of the job-dependency decision (daemon/deps.c): each
 * case is the states of a job's `after` entries and the verdict and reason
 * expected (exact text). */
#include "daemon/deps.h"

#include "tests/check.h"

#include <stdio.h>
#include <string.h>

#define MAXD 4

struct tcase {
    const char *name;
    int n;
    const char *ids[MAXD];
    const char *states[MAXD]; /* NULL: no such job */
    enum deps_verdict verdict;
    const char *reason;
};

static const struct tcase cases[] = {
    {"no after: ready", 0, {NULL}, {NULL}, DEPS_READY, ""},
    {"one succeeded: ready", 1, {"j-a"}, {"succeeded"}, DEPS_READY, ""},
    {"all succeeded: ready",
     3,
     {"j-a", "j-b", "j-c"},
     {"succeeded", "succeeded", "succeeded"},
     DEPS_READY,
     ""},
    {"one queued: wait", 1, {"j-a"}, {"queued"}, DEPS_WAIT, "waiting for j-a (queued)"},
    {"one running, one succeeded: wait",
     2,
     {"j-a", "j-b"},
     {"succeeded", "running"},
     DEPS_WAIT,
     "waiting for j-b (running)"},
    {"several waiting: the first is named, the rest counted",
     3,
     {"j-a", "j-b", "j-c"},
     {"starting", "succeeded", "cancelling"},
     DEPS_WAIT,
     "waiting for j-a (starting) and 1 more of after"},
    {"failed: dependency failed",
     1,
     {"j-a"},
     {"failed"},
     DEPS_FAILED,
     "DEPENDENCY_FAILED j-a (failed); this job will not run"},
    {"cancelled: dependency failed",
     1,
     {"j-a"},
     {"cancelled"},
     DEPS_FAILED,
     "DEPENDENCY_FAILED j-a (cancelled); this job will not run"},
    {"missing job: dependency failed",
     1,
     {"j-gone"},
     {NULL},
     DEPS_FAILED,
     "DEPENDENCY_FAILED j-gone (no such job); this job will not run"},
    {"a failure wins over others still running",
     3,
     {"j-a", "j-b", "j-c"},
     {"running", "succeeded", "failed"},
     DEPS_FAILED,
     "DEPENDENCY_FAILED j-c (failed); this job will not run"},
    {"the first dead entry in after order is named",
     3,
     {"j-a", "j-b", "j-c"},
     {"queued", "cancelled", "failed"},
     DEPS_FAILED,
     "DEPENDENCY_FAILED j-b (cancelled); this job will not run"},
    {"cancelling is not yet dead: wait",
     1,
     {"j-a"},
     {"cancelling"},
     DEPS_WAIT,
     "waiting for j-a (cancelling)"},
};

int main(void) {
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        const struct tcase *tc = &cases[i];
        char reason[256];
        memset(reason, 'x', sizeof reason); /* the answer must not depend on what was there */
        enum deps_verdict v = deps_decide(tc->ids, tc->states, tc->n, reason, sizeof reason);
        CHECK(v == tc->verdict, "[%s] verdict %d, expected %d", tc->name, v, tc->verdict);
        CHECK(!strcmp(reason, tc->reason), "[%s] reason '%s', expected '%s'", tc->name, reason,
              tc->reason);
    }
    /* A short buffer truncates, never overflows. */
    const char *ids[1] = {"j-0123456789ab"};
    const char *st[1] = {"failed"};
    char small[12];
    CHECK(deps_decide(ids, st, 1, small, sizeof small) == DEPS_FAILED && strlen(small) == 11 &&
              !strncmp(small, "DEPENDENCY_", 11),
          "truncated reason '%s'", small);
    printf("test_deps: %d cases\n", n);
    return check_summary("test_deps");
}
