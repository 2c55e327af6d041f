/* Benchmark of the scheduler's pure decisions at fleet scale: one
 * sched_place() pass over a queue of many jobs from many tenants on many
 * simulated nodes, and one preempt_choose() for the backfill head against
 * every running attempt. These are what loomd's scheduler loop calls each
 * pass (daemon/cluster.c), without the store snapshot around them.
 *
 * The fleet: N nodes of 8 devices (one GPU type), a share of their devices
 * busy (held by running attempts, 1-8 devices each, preemptible ones at low
 * priority); Q queued jobs from T tenants with world 1, 2, 4, 8, 16 or 32
 * (tp 1, 2, 4 or 8 dividing it), priorities 0-100, fair-share usage per
 * tenant, every tenant but one in ten with a GPU quota. A fixed-seed LCG
 * makes every run the same fleet.
 *
 * Besides the times, each pass is checked: no device is given twice or
 * given while busy, and every placed job got `world` ranks; a wrong pass
 * exits 1 (the smoke test, bench.sched_pass_smoke, runs it small).
 *
 * Not a test of speed. Usage:
 *   bench_sched_pass [--nodes 1000] [--jobs 10000] [--tenants 100] [--busy 0.9]
 *                    [--passes 10] */
#include "common/clock.h"
#include "daemon/preempt.h"
#include "daemon/sched.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEV 8

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static unsigned lcg(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(rng >> 33);
}

struct fleet {
    int nn, nq, nt, nv;
    struct sched_node *nodes;
    char (*node_names)[16];
    struct sched_job *jobs;
    char (*job_ids)[24];
    char (*tenants)[16];
    struct sched_quota *quotas;
    int nquotas;
    struct preempt_victim *victims;
    struct sched_rank *victim_ranks;
    char (*victim_ids)[24];
};

static void fleet_free(struct fleet *f) {
    free(f->nodes);
    free(f->node_names);
    free(f->jobs);
    free(f->job_ids);
    free(f->tenants);
    free(f->quotas);
    free(f->victims);
    free(f->victim_ranks);
    free(f->victim_ids);
}

static int fleet_make(struct fleet *f, int nn, int nq, int nt, double busy) {
    memset(f, 0, sizeof *f);
    f->nn = nn, f->nq = nq, f->nt = nt;
    f->nodes = calloc((size_t)nn, sizeof *f->nodes);
    f->node_names = calloc((size_t)nn, sizeof *f->node_names);
    f->jobs = calloc((size_t)nq, sizeof *f->jobs);
    f->job_ids = calloc((size_t)nq, sizeof *f->job_ids);
    f->tenants = calloc((size_t)nt, sizeof *f->tenants);
    f->quotas = calloc((size_t)nt, sizeof *f->quotas);
    f->victims = calloc((size_t)nn * DEV, sizeof *f->victims);
    f->victim_ranks = calloc((size_t)nn * DEV, sizeof *f->victim_ranks);
    f->victim_ids = calloc((size_t)nn * DEV, sizeof *f->victim_ids);
    if (!f->nodes || !f->node_names || !f->jobs || !f->job_ids || !f->tenants || !f->quotas ||
        !f->victims || !f->victim_ranks || !f->victim_ids)
        return -1;
    for (int t = 0; t < nt; t++) {
        snprintf(f->tenants[t], sizeof f->tenants[t], "t-%03d", t);
        if (t % 10 == 9) continue; /* no quota */
        f->quotas[f->nquotas++] =
            (struct sched_quota){f->tenants[t], 16 + (int)(lcg() % 256), 0, NULL, 0, 0};
    }
    /* Busy devices come as running attempts of 1-8 devices on one node. */
    int nr = 0;
    for (int n = 0; n < nn; n++) {
        snprintf(f->node_names[n], sizeof f->node_names[n], "node-%04d", n);
        f->nodes[n] = (struct sched_node){.name = f->node_names[n],
                                          .kind = "cuda",
                                          .ndev = DEV,
                                          .state = SCHED_NODE_READY,
                                          .gpu_type = "H100-SXM"};
        int d = 0;
        while (d < DEV) {
            int len = 1 << (lcg() % 4);
            if (d + len > DEV) len = DEV - d;
            if ((double)(lcg() % 1000) / 1000.0 < busy) {
                struct preempt_victim *v = &f->victims[f->nv];
                snprintf(f->victim_ids[f->nv], sizeof f->victim_ids[f->nv], "j-run-%06d", f->nv);
                for (int k = 0; k < len; k++) {
                    f->nodes[n].busy |= (uint64_t)1 << (d + k);
                    f->victim_ranks[nr + k] = (struct sched_rank){n, d + k};
                }
                *v = (struct preempt_victim){f->victim_ids[f->nv],
                                             f->tenants[lcg() % (unsigned)nt],
                                             (int)(lcg() % 60),
                                             1000000 + (int64_t)(lcg() % 100000),
                                             lcg() % 2 == 0,
                                             &f->victim_ranks[nr],
                                             len};
                nr += len;
                f->nv++;
            }
            d += len;
        }
    }
    for (int i = 0; i < f->nv; i++) /* running attempts count against their tenants */
        for (int q = 0; q < f->nquotas; q++)
            if (!strcmp(f->quotas[q].tenant, f->victims[i].tenant)) {
                f->quotas[q].used_gpus += f->victims[i].nranks;
                f->quotas[q].running++;
            }
    static const int worlds[] = {1, 2, 4, 8, 16, 32};
    for (int j = 0; j < nq; j++) {
        int w = worlds[lcg() % 6], tp = 1 << (lcg() % 4);
        while (tp > w || tp > DEV)
            tp /= 2;
        int t = (int)(lcg() % (unsigned)nt);
        snprintf(f->job_ids[j], sizeof f->job_ids[j], "j-q-%06d", j);
        f->jobs[j] = (struct sched_job){.id = f->job_ids[j],
                                        .tenant = f->tenants[t],
                                        .kind = "cuda",
                                        .priority = (int)(lcg() % 101),
                                        .submit_ms = 2000000 + j,
                                        .world = w,
                                        .tp = tp,
                                        .avoid_node = -1,
                                        .fair_usage = (double)(t % 17) * 3.5};
    }
    return 0;
}

/* 0 when the pass is consistent (see the file comment). */
static int verify(const struct fleet *f, const struct sched_decision *d) {
    uint64_t *taken = calloc((size_t)f->nn, sizeof *taken);
    if (!taken) return -1;
    int rc = 0;
    for (int j = 0; j < f->nq && !rc; j++) {
        if (!d[j].placed) continue;
        if (!d[j].ranks) rc = -1;
        for (int r = 0; !rc && r < f->jobs[j].world; r++) {
            int n = d[j].ranks[r].node, dev = d[j].ranks[r].device;
            uint64_t bit = (uint64_t)1 << dev;
            if (n < 0 || n >= f->nn || dev < 0 || dev >= DEV || (f->nodes[n].busy & bit) ||
                (taken[n] & bit)) {
                fprintf(stderr, "job %s rank %d: device %d of node %d given wrongly\n",
                        f->jobs[j].id, r, dev, n);
                rc = -1;
            }
            taken[n] |= bit;
        }
    }
    free(taken);
    return rc;
}

/* CPU seconds of this process: on a shared machine the wall time of a pass
 * includes the time other processes held the core. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int nn = 1000, nq = 10000, nt = 100, passes = 10;
    double busy = 0.9;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--nodes"))
            nn = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--jobs"))
            nq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tenants"))
            nt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--busy"))
            busy = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--passes"))
            passes = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (nn < 1 || nq < 1 || nt < 1 || passes < 1) {
        fprintf(stderr, "--nodes, --jobs, --tenants and --passes must be >= 1\n");
        return 2;
    }
    struct fleet f;
    int rc = 1;
    double *ms = calloc((size_t)passes, sizeof *ms), *pms = calloc((size_t)passes, sizeof *pms);
    double *cms = calloc((size_t)passes, sizeof *cms);
    struct sched_decision *d = calloc((size_t)nq, sizeof *d);
    int *chosen = NULL;
    if (!ms || !pms || !cms || !d || fleet_make(&f, nn, nq, nt, busy) != 0) {
        fprintf(stderr, "out of memory\n");
        goto out;
    }
    chosen = calloc((size_t)(f.nv > 0 ? f.nv : 1), sizeof *chosen);
    if (!chosen) goto out;
    int busy_dev = 0;
    for (int n = 0; n < nn; n++)
        busy_dev += __builtin_popcountll(f.nodes[n].busy);
    struct sched_cluster cl = {f.nodes, nn, f.quotas, f.nquotas};
    int placed = 0, head = -1, victims = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = clock_mono_s(), c0 = cpu_s();
        placed = sched_place(&cl, f.jobs, nq, d);
        double t1 = clock_mono_s();
        cms[p] = (cpu_s() - c0) * 1000.0;
        if (placed < 0 || verify(&f, d) != 0) {
            fprintf(stderr, "pass %d: wrong result\n", p);
            sched_decisions_free(d, nq);
            goto out;
        }
        ms[p] = (t1 - t0) * 1000.0;
        head = -1;
        for (int j = 0; j < nq && head < 0; j++)
            if (d[j].reserved) head = j;
        /* The head looks for victims among the running attempts; the
         * devices placed in this pass are taken first, as the loop does. */
        struct sched_node *sn = malloc(sizeof *sn * (size_t)nn);
        if (!sn) {
            sched_decisions_free(d, nq);
            goto out;
        }
        memcpy(sn, f.nodes, sizeof *sn * (size_t)nn);
        for (int j = 0; j < nq; j++)
            for (int r = 0; d[j].placed && r < f.jobs[j].world; r++)
                sn[d[j].ranks[r].node].busy |= (uint64_t)1 << d[j].ranks[r].device;
        struct sched_cluster pc = {sn, nn, f.quotas, f.nquotas};
        char why[256];
        double t2 = clock_mono_s();
        victims = head >= 0
                      ? preempt_choose(&pc, &f.jobs[head], f.victims, f.nv, chosen, why, sizeof why)
                      : 0;
        double t3 = clock_mono_s();
        pms[p] = (t3 - t2) * 1000.0;
        free(sn);
        sched_decisions_free(d, nq);
        if (victims < 0) goto out;
    }
    qsort(ms, (size_t)passes, sizeof *ms, cmp_double);
    qsort(pms, (size_t)passes, sizeof *pms, cmp_double);
    qsort(cms, (size_t)passes, sizeof *cms, cmp_double);
    printf("fleet: %d nodes x %d devices (%d busy in %d running attempts), %d queued jobs from "
           "%d tenants (%d with a quota)\n",
           nn, DEV, busy_dev, f.nv, nq, nt, f.nquotas);
    printf("sched_place: %d placed, head %s; ms per pass: median %.2f, min %.2f, max %.2f "
           "(%d passes); CPU ms per pass: median %.2f, min %.2f\n",
           placed, head >= 0 ? f.jobs[head].id : "none", ms[passes / 2], ms[0], ms[passes - 1],
           passes, cms[passes / 2], cms[0]);
    printf("preempt_choose for the head over %d running attempts: %d victim(s); ms: median "
           "%.3f, max %.3f\n",
           f.nv, victims, pms[passes / 2], pms[passes - 1]);
    rc = 0;
out:
    free(ms);
    free(pms);
    free(cms);
    free(d);
    free(chosen);
    fleet_free(&f);
    return rc;
}
