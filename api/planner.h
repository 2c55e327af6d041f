/* Planner: memory, communication, time and cost of a job before it runs, and
 * the best parallel layout for a cluster. A pure library (no I/O, no
 * globals): loomd answers POST /v1/plan and checks fit at submit with it,
 * loomctl prints it, the worker logs its estimate next to the measured peak.
 *
 * Memory is counted from api/model.h's layout table (the one the engine
 * allocates from) and the engine's activation buffers (worker/model.c), so
 * estimate and reality cannot drift apart silently. Communication uses ring
 * collectives over the link bandwidths, hierarchical across nodes; compute
 * uses FLOPs at a stated efficiency; the 1F1B bubble and the overlap the
 * engine can do (gradient reduction under backward, ZeRO-3 prefetch under
 * compute) are modelled; everything else is exposed. docs/planner.md gives
 * the formulas and their sources. */
#ifndef LOOM_API_PLANNER_H
#define LOOM_API_PLANNER_H

#include <jansson.h>

#include "api/gpu_types.h"
#include "api/jobspec.h"
#include "api/model.h"

#define PLANNER_NAME_MAX 32

/* Accelerator types (memory, peak FLOP/s, bandwidth, usual link) come from
 * api/gpu_types.h: cluster.gpu names a gpu_type (or an alias such as
 * "H100-80GB"). */
/* Known links: nominal GB/s as usually quoted and the fraction collectives
 * reach (NVLink figures count both directions). */
struct planner_link_type {
    const char *name;
    double nominal_gbps;
    double efficiency;
};
const struct planner_link_type *planner_link_types(size_t *n);
const struct planner_link_type *planner_link_find(const char *name);

/* A cluster description. Zero / empty fields take defaults from the named
 * types when planner_cluster_resolve runs. */
struct planner_cluster {
    int nodes;
    int gpus_per_node;
    char gpu[PLANNER_NAME_MAX];        /* gpu_type, e.g. "H100-SXM"; "cpu" for cpu jobs */
    double gpu_mem_gib;                /* 0: from type */
    double peak_tflops;                /* 0: from type and the spec's precision */
    double hbm_tbps;                   /* 0: from type */
    char intra_link[PLANNER_NAME_MAX]; /* default: the GPU type's ("shm" for cpu) */
    char inter_link[PLANNER_NAME_MAX]; /* default "roce100" */
    int nics_per_node;                 /* default 1 */
    double intra_gbps;    /* effective per-GPU GB/s inside a node (measured overrides; 0: link) */
    double inter_gbps;    /* effective per-node GB/s between nodes (0: link x nics) */
    double host_mem_gib;  /* per node, for optimizer offload (default 1024) */
    double host_mem_gbps; /* host memory bandwidth for the CPU optimizer (default 100) */
    double pcie_gbps;     /* GPU <-> host copies (default 25) */
    double price_per_gpu_hour; /* default 2.50 */
};

/* Tunables, with the defaults planner_options_default sets. */
struct planner_options {
    double compute_efficiency; /* fraction of peak the matmuls reach (0.5) */
    double overlap;            /* fraction of a compute window comm can hide under (0.8) */
    double comm_warn;          /* exposed-communication fraction flagged (0.20) */
    double bucket_mib;         /* dp gradient bucket (25 MiB) */
    double latency_us_intra;   /* per collective hop (5) */
    double latency_us_inter;   /* (15) */
    int max_alternatives;      /* entries in the "alternatives" answer (10) */
};
void planner_options_default(struct planner_options *o);

/* One node of 8 x H100-SXM, NVLink 4, 100 Gb RoCE, 2 TiB host memory. */
void planner_cluster_default(struct planner_cluster *c);
/* Fill defaults from the named types. Errors: UNKNOWN_GPU, UNKNOWN_LINK,
 * OUT_OF_RANGE (field paths under "cluster."). */
int planner_cluster_resolve(struct planner_cluster *c, enum jobspec_device dev,
                            struct loom_error *e);
/* Parse {"nodes","gpus_per_node","gpu","gpu_mem_gib","peak_tflops","hbm_tbps","intra_link",
 * "inter_link","nics_per_node","intra_gbps","inter_gbps","host_mem_gib","host_mem_gbps",
 * "pcie_gbps","price_per_gpu_hour"} strictly over `base` (fields absent keep base's value).
 * Does not resolve. */
int planner_cluster_from_json(const json_t *j, struct planner_cluster *c, struct loom_error *e);
json_t *planner_cluster_to_json(const struct planner_cluster *c);

/* ---- estimate ---- */

/* Bytes per GPU by category, for the most loaded pipeline stage. */
struct planner_mem {
    double params, grads, optimizer, activations, comm, workspace, reserved, total;
    double act_attention, act_mlp, act_norm_residual, act_other; /* split of activations */
    int inflight;         /* micro-batches whose activations the stage holds (1F1B) */
    int worst_stage;      /* stage these numbers are for */
    double stage_params;  /* parameters (elements) of that stage on one tp rank, before ZeRO */
    double gpu_bytes;     /* the GPU's memory */
    double host_per_node; /* offloaded optimizer state + staging per node */
    double host_per_rank; /* of which one rank's (worker/offload.h: shard * (12 + e)) */
    double host_bytes;    /* the node's host memory */
    /* train.recompute {"budget_gib": N}: blocks of the stage kept whole (the
     * rest recomputed in full), the stage's blocks, and the memory with every
     * block recomputed (the least the budget can be); keep = -1 otherwise */
    int keep, layers;
    double budget_floor;
};

#define PLANNER_MAX_COMM 8
struct planner_comm {
    char group[8]; /* "tp", "dp", "pp", "embed" */
    char op[24];   /* "all_reduce", "reduce_scatter", "all_gather", "send_recv" */
    int ranks;     /* group size */
    int cross_node;
    double bytes;   /* per call, per rank */
    double count;   /* calls per step */
    double gbps;    /* effective bandwidth used */
    double seconds; /* per step, all calls */
    double exposed; /* seconds not hidden under compute */
};

struct planner_estimate {
    /* layout evaluated */
    int dp, tp, pp, zero_stage, offload, micro_batch, world, nodes;
    enum jobspec_recompute recompute;
    int64_t grad_accum;

    struct planner_mem mem;
    int n_comm;
    struct planner_comm comm[PLANNER_MAX_COMM];

    double flops_per_token; /* model FLOPs (the MFU numerator), no recompute */
    double compute_s;       /* GA micro-steps on the slowest stage, with recompute */
    double bubble_s;        /* 1F1B: (pp - 1) micro-steps */
    double comm_s;          /* all communication */
    double comm_exposed_s;  /* what overlap cannot hide */
    double optimizer_s;     /* AdamW on GPU, or offload copies + CPU step */
    double step_s;
    double tokens_per_s, mfu, comm_fraction, bubble_fraction;
    double run_hours, gpu_hours, cost;

    int fits;           /* memory fits the GPU (and host memory when offloading) */
    char reason[256];   /* "does not fit: 96.3 GiB/GPU > 80 GiB", or "" */
    char notes[4][128]; /* warnings: communication share, bubble, offload, ... */
    int n_notes;
};

/* The budget mode (train.recompute {"budget_gib": N}) for the spec's own
 * layout and pipeline stage `stage`: *keep = the most blocks of the stage that
 * can keep every activation (the others recompute in full) with the stage's
 * memory at most N GiB, as worker/model.c allocates them (model_opts.keep);
 * *floor_gib = the stage's memory with every block recomputed. Returns 0, or
 * -1 with *e set (the spec's errors, or 422 RECOMPUTE_BUDGET_TOO_SMALL when
 * the budget is under the floor). */
int planner_recompute_keep(const struct loom_spec *s, int stage, int *keep, double *floor_gib,
                           struct loom_error *e);

/* The offloaded optimizer step (seconds) for a shard of `shard` parameters of
 * element size e (2 bf16, 4 fp32), ranks_per_node ranks sharing the host's
 * memory bandwidth, hide_s seconds of backward the gradient download can hide
 * under (ZeRO-2/3), PCIe and host memory bandwidths in GB/s: the slowest of
 * the download (minus hide_s), the CPU AdamW (24 + 2e bytes per parameter at
 * the host bandwidth) and the upload, which pipeline over chunks. Pure. */
double planner_offload_s(double shard, double e, int ranks_per_node, double hide_s,
                         double pcie_gbps, double host_mem_gbps);

/* Estimate the spec's own layout on cluster `c` (resolved or not; resolved
 * internally on a copy). Errors: 422 LAYOUT_EXCEEDS_CLUSTER (dp*tp*pp more
 * than nodes x gpus_per_node), the cluster codes above, and the spec's
 * rules (the spec is validated again). */
int planner_estimate(const struct loom_spec *s, const struct planner_cluster *c,
                     const struct planner_options *o, struct planner_estimate *out,
                     struct loom_error *e);

/* The estimate a worker logs at start (next to engine.mem): the cluster is
 * sized to the job (the spec's gpus_per_node, enough nodes for dp*tp*pp),
 * the GPU named by `gpu` (NULL: "H100-SXM" on cuda, "cpu" on cpu) and, when
 * gpu_mem_gib > 0, that much memory (e.g. from cudaMemGetInfo). Compare
 * est->mem.{params,grads,optimizer,activations,comm} (bytes) with
 * engine.mem. */
int planner_estimate_job(const struct loom_spec *s, const char *gpu, double gpu_mem_gib,
                         struct planner_estimate *est, struct loom_error *e);

/* ---- recommendation ---- */

struct planner_candidate {
    struct planner_estimate est;
    char why[320];  /* why it wins, or why it fails */
    int scaling_ok; /* 0: less than 1.2x faster than the best on the next smaller GPU count */
    double score;   /* sort key: step time with a small complexity penalty */
};

/* Enumerate layouts of the spec's model and global batch on the cluster:
 * GPU counts (1, 2, 4, .. up to a node, then 1, 2, 4, .. nodes and all of
 * them), tp dividing the heads and a node, pp dividing the layers, ZeRO 0-3,
 * offload, recompute, micro-batch halvings that keep global_batch_tokens.
 * For each (GPUs, dp, tp, pp, zero, offload) the best recompute and
 * micro-batch is kept. Feasible ones come first by score; then infeasible
 * ones by memory. *out is malloc'ed (caller frees), *n entries. */
int planner_recommend(const struct loom_spec *s, const struct planner_cluster *c,
                      const struct planner_options *o, struct planner_candidate **out, int *n,
                      struct loom_error *e);
/* Index of the recommended candidate in a planner_recommend list: the first
 * feasible one whose GPUs are not wasted (scaling_ok), or -1. */
int planner_pick(const struct planner_candidate *list, int n);

/* A full fine-tune's spec as LoRA or QLoRA (planner_check_fit's message and
 * planner_plan_json's "lora_options"). */
struct planner_lora_option {
    int qlora;                   /* 1: train.quantize_base nf4 as well */
    int as_submitted;            /* the spec's own layout fits */
    struct loom_spec spec;       /* the variant */
    struct planner_estimate est; /* its layout's, or its recommended layout's */
};

/* Submit-time check: 0 when the spec's layout fits cluster `c`'s GPUs, else
 * -1 with 422 DOES_NOT_FIT naming the estimate per category, the best
 * feasible alternative on the same number of GPUs (or any, if none) and, for
 * a full fine-tune, what it would need as LoRA and as QLoRA (train.lora rank
 * 16 on every projection; with quantize_base nf4). */
int planner_check_fit(const struct loom_spec *s, const struct planner_cluster *c,
                      const struct planner_options *o, struct loom_error *e);

/* ---- the real fleet: one pool per GPU type ---- */

/* The nodes of one gpu_type (or of the cpu kind) as loomd knows them. */
struct planner_pool {
    char gpu[GPU_TYPE_NAME_MAX]; /* gpu_type, or "cpu" */
    int nodes;                   /* nodes of the type, in any state (drained or lost ones return) */
    int gpus;                    /* their devices in total */
    int gpus_per_node;           /* the largest node's devices */
    double gpu_mem_gib;          /* the least memory a device reports (cpu: host memory / devices);
                                    0: the type's */
    double host_mem_gib;         /* the smallest node's host memory (0: planner default) */
    double price_per_gpu_hour;   /* 0: no price set for the type */
    char currency[8];            /* of the price ("" when none) */
    double peak_tflops;          /* one device's measured peak (cpu: the slowest node's
                                    cpu_peak_gflops / 1000); 0: the type table's */
    int cc; /* least compute capability x10 its nodes report, for a type the table lacks
               ("unknown"); 0: not known */
};

#define PLANNER_MAX_POOLS 16
struct planner_fleet {
    int n;
    struct planner_pool pool[PLANNER_MAX_POOLS];
};

/* The planner cluster of one pool (nodes, devices, type, memory, price). */
void planner_pool_cluster(const struct planner_pool *p, struct planner_cluster *c);

/* The job's candidate pools: the spec's device kind, restricted to `types`
 * (normalized gpu_type names, ntypes of them; 0: any) in that order, else in
 * fleet order. Returns how many indexes were written to idx (at most
 * PLANNER_MAX_POOLS). */
int planner_fleet_candidates(const struct loom_spec *s, const struct planner_fleet *f,
                             const char (*types)[GPU_TYPE_NAME_MAX], int ntypes, int *idx);

/* Submit-time check against the real fleet. 0 when the spec's layout fits the
 * memory of some candidate pool that can hold its ranks (or when the fleet has
 * no node of the job's kind yet: then the memory check runs on a default node
 * of the first listed type, H100-SXM without one, sized to the job). Else -1:
 *  - 422 UNSCHEDULABLE: no candidate pool could ever hold the ranks (world more
 *    than its devices, allow_mixed: than all candidates' devices; tp more than
 *    its largest node) or the listed types are absent; names the capacity;
 *  - 422 DOES_NOT_FIT: the per-GPU estimate (planner_check_fit's message on the
 *    first pool that holds the ranks) plus the best alternative: a layout that
 *    fits there (ZeRO-3 over n GPUs, recompute, offload), or another GPU type
 *    present in the cluster on which the layout fits as submitted. */
int planner_fleet_check(const struct loom_spec *s, const struct planner_fleet *f,
                        const char (*types)[GPU_TYPE_NAME_MAX], int ntypes, int allow_mixed,
                        struct loom_error *e);

/* What the spec costs on each pool of its device kind: [{"gpu_type","nodes","gpus",
 * "gpu_mem_gib","fits","layout":"as submitted"|"recommended"|null,"step_s","hours",
 * "gpu_hours","per_gpu_hour","currency","cost"}] (a pool the submitted layout
 * does not fit is priced at its recommended layout; cost null without a price),
 * and *cheapest (borrowed from f, NULL: none) the type of the lowest cost among
 * pools where the layout fits as submitted. Caller owns the array. */
json_t *planner_fleet_costs(const struct loom_spec *s, const struct planner_fleet *f,
                            const char **cheapest);

/* ---- JSON ---- */

json_t *planner_estimate_to_json(const struct planner_estimate *est);

/* The whole POST /v1/plan answer. `body` is a job spec (data optional) that
 * may also carry "cluster" (see planner_cluster_from_json) and "options"
 * ({"compute_efficiency","overlap","max_alternatives"}) objects; `dflt` is the
 * cluster used when the body has none (NULL: planner_cluster_default).
 * Returns 0 with *out = {"valid":true,"spec","derived","cluster","estimate",
 * "fits","reasons","recommended","alternatives","lora_options"} (caller owns;
 * lora_options: a full fine-tune that does not fit as submitted planned as
 * LoRA and as QLoRA, each an estimate with "kind", "train" (the spec fields to
 * add), "fits", "as_submitted" and "why"; [] otherwise), or -1 with
 * `e` filled (400/422: answer with loom_error_to_json). */
int planner_plan_json(const json_t *body, const struct planner_cluster *dflt, json_t **out,
                      struct loom_error *e);

#endif
