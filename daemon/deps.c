/* Job dependencies: the decision of deps.h. Depends only on libc, so its
 * test compiles this file alone (like supervise.c). */
#include "daemon/deps.h"

#include <stdio.h>
#include <string.h>

/* The end states that mean a dependency will never succeed. */
static const char *const dead_states[] = {"failed", "cancelled"};

static int is_dead(const char *state) {
    if (!state) return 1; /* the job is gone */
    for (size_t i = 0; i < sizeof dead_states / sizeof dead_states[0]; i++)
        if (!strcmp(state, dead_states[i])) return 1;
    return 0;
}

enum deps_verdict deps_decide(const char *const *ids, const char *const *states, int n,
                              char *reason, size_t len) {
    if (len) reason[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (!is_dead(states[i])) continue;
        snprintf(reason, len, "DEPENDENCY_FAILED %s (%s); this job will not run", ids[i],
                 states[i] ? states[i] : "no such job");
        return DEPS_FAILED;
    }
    int first = -1, waiting = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(states[i], "succeeded")) continue;
        if (first < 0) first = i;
        waiting++;
    }
    if (first < 0) return DEPS_READY;
    if (waiting > 1)
        snprintf(reason, len, "waiting for %s (%s) and %d more of after", ids[first], states[first],
                 waiting - 1);
    else
        snprintf(reason, len, "waiting for %s (%s)", ids[first], states[first]);
    return DEPS_WAIT;
}
