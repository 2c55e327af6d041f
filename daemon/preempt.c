/* Victim choice for preemption (see preempt.h). Depends only on sched.c, so
 * its test compiles the two files alone. */
#include "daemon/preempt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    int idx;
    const struct preempt_victim *v;
};

/* Lowest priority first, then the youngest, then by id. */
static int cand_cmp(const void *a, const void *b) {
    const struct preempt_victim *x = ((const struct cand *)a)->v, *y = ((const struct cand *)b)->v;
    if (x->priority != y->priority) return x->priority < y->priority ? -1 : 1;
    if (x->running_since_ms != y->running_since_ms)
        return x->running_since_ms > y->running_since_ms ? -1 : 1;
    return strcmp(x->job_id, y->job_id);
}

/* Would the head be placed with the victims marked in `on` stopped? */
static int fits_without(const struct sched_cluster *c, const struct sched_job *head,
                        const struct preempt_victim *v, int nv, const int *on,
                        struct sched_node *nodes, struct sched_quota *quotas) {
    memcpy(nodes, c->nodes, sizeof *nodes * (size_t)c->nnodes);
    if (c->nquotas > 0) memcpy(quotas, c->quotas, sizeof *quotas * (size_t)c->nquotas);
    for (int i = 0; i < nv; i++) {
        if (!on[i]) continue;
        for (int r = 0; r < v[i].nranks; r++) {
            int n = v[i].ranks[r].node, d = v[i].ranks[r].device;
            if (n >= 0 && n < c->nnodes && d >= 0 && d < SCHED_MAX_NODE_DEVICES)
                nodes[n].busy &= ~((uint64_t)1 << d);
        }
        for (int q = 0; q < c->nquotas; q++)
            if (v[i].tenant && !strcmp(quotas[q].tenant, v[i].tenant)) {
                quotas[q].used_gpus -= v[i].nranks;
                quotas[q].running--;
            }
    }
    struct sched_cluster cc = {nodes, c->nnodes, quotas, c->nquotas};
    struct sched_decision d;
    int rc = sched_place(&cc, head, 1, &d);
    if (rc < 0) return -1;
    int placed = d.placed;
    sched_decisions_free(&d, 1);
    return placed;
}

int preempt_choose(const struct sched_cluster *c, const struct sched_job *head,
                   const struct preempt_victim *v, int nv, int *chosen, char *why, size_t len) {
    int rc = -1, taken = 0, ncand = 0;
    struct cand *cand = calloc((size_t)(nv > 0 ? nv : 1), sizeof *cand);
    struct sched_node *nodes = calloc((size_t)(c->nnodes > 0 ? c->nnodes : 1), sizeof *nodes);
    struct sched_quota *quotas = calloc((size_t)(c->nquotas > 0 ? c->nquotas : 1), sizeof *quotas);
    int *order = calloc((size_t)(nv > 0 ? nv : 1), sizeof *order);
    if (!cand || !nodes || !quotas || !order) goto out;
    memset(chosen, 0, sizeof *chosen * (size_t)(nv > 0 ? nv : 0));
    for (int i = 0; i < nv; i++)
        if (v[i].eligible && v[i].priority < head->priority && v[i].nranks > 0)
            cand[ncand++] = (struct cand){i, &v[i]};
    if (ncand == 0) {
        snprintf(why, len, "no running job is preemptible with a priority below %d",
                 head->priority);
        rc = 0;
        goto out;
    }
    qsort(cand, (size_t)ncand, sizeof *cand, cand_cmp);
    int fit = 0;
    for (int k = 0; k < ncand && !fit; k++) {
        chosen[cand[k].idx] = 1;
        order[taken++] = cand[k].idx;
        fit = fits_without(c, head, v, nv, chosen, nodes, quotas);
        if (fit < 0) goto out;
    }
    if (!fit) {
        memset(chosen, 0, sizeof *chosen * (size_t)nv);
        snprintf(why, len,
                 "stopping all %d preemptible job(s) below priority %d would not free room for "
                 "%d device(s)",
                 ncand, head->priority, head->world);
        rc = 0;
        goto out;
    }
    /* Give back victims that are not needed, latest taken first (never the
     * last one: the head did not fit before it was taken). */
    int n = taken;
    for (int k = taken - 2; k >= 0; k--) {
        chosen[order[k]] = 0;
        int f = fits_without(c, head, v, nv, chosen, nodes, quotas);
        if (f < 0) goto out;
        if (f)
            n--;
        else
            chosen[order[k]] = 1;
    }
    snprintf(why, len, "%d job(s) below priority %d stopped for %s", n, head->priority, head->id);
    rc = n;
out:
    free(cand);
    free(nodes);
    free(quotas);
    free(order);
    return rc;
}
