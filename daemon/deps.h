/* Job dependencies (`after` in the job spec): a pure decision over the
 * states of the jobs a queued job waits for.
 *
 * The scheduler loop (daemon/cluster.c) reads the state of each job named in
 * `after` and asks deps_decide() whether the queued job may be placed, must
 * keep waiting, or can never run. No I/O, no allocation: tests/unit/test_deps.c
 * runs it as a table.
 *
 * Rules, in order: a dependency that failed, was cancelled or no longer exists
 * fails the job (reason "DEPENDENCY_FAILED <id> ..."; the first such entry in
 * `after` order is named); else one that has not succeeded yet keeps it
 * queued (pending reason "waiting for <id> (<state>)", the first such entry,
 * plus how many others wait); else (all succeeded, or no `after`) it is ready. */
#ifndef LOOM_DAEMON_DEPS_H
#define LOOM_DAEMON_DEPS_H

#include <stddef.h>

enum deps_verdict {
    DEPS_READY = 0, /* every dependency succeeded: the scheduler may place it */
    DEPS_WAIT,      /* some dependency is still queued or running */
    DEPS_FAILED,    /* a dependency failed, was cancelled or is missing */
};

/* ids[i] is the i-th `after` entry and states[i] its job's state name
 * ("queued", "running", "succeeded", "failed", "cancelled", ...; NULL: no
 * such job). Writes the pending reason (DEPS_WAIT) or the failure reason
 * (DEPS_FAILED) to `reason`; "" when ready. Pure; any thread. */
enum deps_verdict deps_decide(const char *const *ids, const char *const *states, int n,
                              char *reason, size_t len);

#endif
