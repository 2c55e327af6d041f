/* Table-driven tests of the preemption choice (daemon/preempt.c): each case is
 * a cluster (nodes with the devices running jobs hold), the running jobs
 * (priority, start time, eligibility, devices), optional tenant quotas, and a
 * waiting head job; the expectation is the set of victims ("v1 v3") or, when
 * none, a fragment of the reason. */
#include "daemon/preempt.h"

#include "tests/check.h"

#include <stdlib.h>
#include <string.h>

#define MAXV 5

struct tvictim {
    const char *id, *tenant;
    int prio;
    int64_t since;
    int eligible;
    const char *devs; /* "a0 a1 b3": node letter, device */
};

struct tcase {
    const char *name;
    int nnodes, ndev;         /* nodes a, b, ... each with ndev cuda devices */
    struct sched_quota quota; /* tenant "" : none */
    int head_prio, head_world, head_tp;
    const char *head_tenant;
    struct tvictim v[MAXV];
    const char *expect; /* victims, space-separated, or "-fragment" */
};

static const struct tcase cases[] = {
    {"lowest priority first",
     1,
     2,
     {0},
     80,
     1,
     1,
     "t9",
     {{"v1", "t1", 10, 100, 1, "a0"}, {"v2", "t2", 5, 100, 1, "a1"}},
     "v2"},
    {"youngest at equal priority",
     1,
     2,
     {0},
     80,
     1,
     1,
     "t9",
     {{"v1", "t1", 10, 100, 1, "a0"}, {"v2", "t2", 10, 200, 1, "a1"}},
     "v2"},
    {"id breaks the last tie",
     1,
     2,
     {0},
     80,
     1,
     1,
     "t9",
     {{"v2", "t1", 10, 100, 1, "a0"}, {"v1", "t2", 10, 100, 1, "a1"}},
     "v1"},
    {"never a victim of equal priority",
     1,
     1,
     {0},
     50,
     1,
     1,
     "t9",
     {{"v1", "t1", 50, 100, 1, "a0"}},
     "-no running job is preemptible with a priority below 50"},
    {"not eligible (not preemptible or too young)",
     1,
     1,
     {0},
     90,
     1,
     1,
     "t9",
     {{"v1", "t1", 10, 100, 0, "a0"}},
     "-no running job is preemptible"},
    {"two needed for a world of 2",
     1,
     2,
     {0},
     90,
     2,
     1,
     "t9",
     {{"v1", "t1", 10, 100, 1, "a0"}, {"v2", "t2", 20, 100, 1, "a1"}},
     "v1 v2"},
    {"an unneeded victim is given back",
     2,
     2,
     {0},
     90,
     2,
     2,
     "t9",
     /* tp=2 needs a whole node. v1 (lowest) is taken first but frees only a0
      * (a1 holds v4); v2 then v3 free b, so v1 is given back. */
     {{"v1", "t1", 10, 100, 1, "a0"},
      {"v2", "t1", 20, 100, 1, "b0"},
      {"v3", "t1", 30, 100, 1, "b1"},
      {"v4", "t2", 40, 100, 1, "a1"}},
     "v2 v3"},
    {"all preemptible are not enough",
     1,
     4,
     {0},
     90,
     4,
     1,
     "t9",
     {{"v1", "t1", 10, 100, 1, "a0"}, {"v2", "t2", 99, 100, 1, "a1 a2 a3"}},
     "-would not free room for 4 device(s)"},
    {"the victim's quota is freed with it",
     1,
     2,
     {"t9", 1, 0, "t9", 0, 0},
     90,
     1,
     1,
     "t9",
     /* t9 holds one of its one-GPU quota through v1: stopping its own
      * low-priority job lets its high-priority one start */
     {{"v1", "t9", 10, 100, 1, "a0"}, {"v2", "t2", 5, 100, 0, "a1"}},
     "v1"},
    {"the head's quota still binds",
     1,
     2,
     {"t9", 1, 0, "t9", 0, 0},
     90,
     1,
     1,
     "t9",
     {{"v1", "t2", 10, 100, 1, "a0"}, {"v2", "t9", 95, 100, 0, "a1"}},
     "-would not free room"},
};

static int parse_devs(const char *s, struct sched_rank *r) {
    int n = 0;
    for (const char *p = s; *p;) {
        while (*p == ' ')
            p++;
        if (!*p) break;
        r[n].node = p[0] - 'a';
        r[n].device = atoi(p + 1);
        n++;
        while (*p && *p != ' ')
            p++;
    }
    return n;
}

static void run_case(const struct tcase *tc) {
    struct sched_node nodes[4];
    char names[4][2];
    memset(nodes, 0, sizeof nodes);
    for (int i = 0; i < tc->nnodes; i++) {
        names[i][0] = (char)('a' + i);
        names[i][1] = 0;
        nodes[i] = (struct sched_node){
            names[i], "cuda", tc->ndev, 0, SCHED_NODE_READY, NULL, NULL, 0, NULL, NULL, NULL, 0, 0};
    }
    struct preempt_victim v[MAXV];
    struct sched_rank ranks[MAXV][8];
    int nv = 0;
    struct sched_quota q = tc->quota;
    for (int i = 0; i < MAXV && tc->v[i].id; i++, nv++) {
        int n = parse_devs(tc->v[i].devs, ranks[i]);
        v[i] = (struct preempt_victim){tc->v[i].id,
                                       tc->v[i].tenant,
                                       tc->v[i].prio,
                                       tc->v[i].since,
                                       tc->v[i].eligible,
                                       ranks[i],
                                       n};
        for (int r = 0; r < n; r++)
            nodes[ranks[i][r].node].busy |= (uint64_t)1 << ranks[i][r].device;
        if (q.tenant && !strcmp(q.tenant, tc->v[i].tenant)) {
            q.used_gpus += n;
            q.running++;
        }
    }
    struct sched_cluster c = {nodes, tc->nnodes, q.tenant ? &q : NULL, q.tenant ? 1 : 0};
    struct sched_job head = {.id = "head",
                             .tenant = tc->head_tenant,
                             .kind = "cuda",
                             .priority = tc->head_prio,
                             .submit_ms = 1000,
                             .world = tc->head_world,
                             .tp = tc->head_tp,
                             .avoid_node = -1};
    int chosen[MAXV];
    char why[256] = "";
    int n = preempt_choose(&c, &head, v, nv, chosen, why, sizeof why);
    char got[128] = "";
    for (int i = 0; i < nv; i++)
        if (chosen[i])
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", got[0] ? " " : "",
                     v[i].job_id);
    if (tc->expect[0] == '-') {
        CHECK(n == 0, "%s: expected no victims, got %d (%s)", tc->name, n, got);
        CHECK(strstr(why, tc->expect + 1) != NULL, "%s: reason '%s' lacks '%s'", tc->name, why,
              tc->expect + 1);
    } else {
        CHECK(n > 0, "%s: no victims: %s", tc->name, why);
        CHECK(!strcmp(got, tc->expect), "%s: victims '%s', expected '%s'", tc->name, got,
              tc->expect);
        int cnt = 0;
        for (int i = 0; i < nv; i++)
            cnt += chosen[i];
        CHECK_EQ_INT(n, cnt);
    }
}

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
    return check_summary("test_preempt");
}
