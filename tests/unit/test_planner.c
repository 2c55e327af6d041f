/* Unit tests of api/planner: the 70B arithmetic the field quotes, the
 * decision-table bands on an 8 x 80 GB NVLink node and clusters of them, a
 * communication-bound case where more GPUs stop helping, the submit-time fit
 * check, the POST /v1/plan answer, bad inputs, and consistency with the
 * layout table (stage parameters) and between categories. */
#include "api/planner.h"
#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GB  1e9
#define GIB (1024.0 * 1024.0 * 1024.0)

static char *dequote(const char *s) {
    char *o = strdup(s);
    for (char *p = o; *p; p++)
        if (*p == '\'') *p = '"';
    return o;
}

/* Parse a single-quoted spec for planning; the cluster (may be NULL) too. */
static int load(const char *spec, const char *cluster, struct loom_spec *s,
                struct planner_cluster *c) {
    struct loom_error e;
    char *t = dequote(spec);
    int rc = jobspec_parse_text(s, t, strlen(t), JOBSPEC_FOR_PLAN, &e);
    if (rc) fprintf(stderr, "spec %s: %s %s\n", spec, e.code, e.message);
    free(t);
    planner_cluster_default(c);
    if (cluster) {
        t = dequote(cluster);
        json_t *j = json_loads(t, 0, NULL);
        free(t);
        if (!j || planner_cluster_from_json(j, c, &e) != 0) {
            fprintf(stderr, "cluster %s: bad\n", cluster);
            rc = -1;
        }
        json_decref(j);
    }
    return rc;
}

/* ---- 70B arithmetic ---- */
static void test_70b_arithmetic(void) {
    struct loom_spec s;
    struct planner_cluster c;
    CHECK(load("{'model':{'family':'llama','preset':'70b'},'train':{'micro_batch':1,"
               "'global_batch_tokens':1048576}}",
               NULL, &s, &c) == 0);
    struct planner_estimate est;
    struct loom_error e;
    /* one GPU, no sharding: bf16 weights, bf16 grads, 12 B/param AdamW state */
    c.nodes = 1;
    CHECK(planner_estimate(&s, &c, NULL, &est, &e) == 0);
    double w = est.mem.params, g = est.mem.grads, o = est.mem.optimizer;
    CHECK(fabs(w / GB - 140) / 140 < 0.02);
    CHECK(fabs(g / GB - 140) / 140 < 0.02);
    CHECK(fabs(o / GB - 840) / 840 < 0.02);
    CHECK(fabs((w + g + o) / 1e12 - 1.12) / 1.12 < 0.02);
    CHECK(o == 6 * w); /* 12 bytes vs 2 bytes per parameter */
    CHECK(!est.fits && strstr(est.reason, "does not fit") && strstr(est.reason, "> 80 GiB"));
    printf("70b static: weights %.1f GB, grads %.1f GB, optimizer %.1f GB, total %.3f TB\n", w / GB,
           g / GB, o / GB, (w + g + o) / 1e12);

    /* no 8 x 80 GB node holds it without sharding and offload: every layout
     * on one node without offload fails; with ZeRO-3 + offload one fits */
    struct planner_candidate *list;
    int n;
    CHECK(planner_recommend(&s, &c, NULL, &list, &n, &e) == 0);
    int fits_no_offload = 0, fits_offload = 0;
    for (int i = 0; i < n; i++) {
        if (list[i].est.fits && !list[i].est.offload) fits_no_offload++;
        if (list[i].est.fits && list[i].est.offload) fits_offload++;
    }
    CHECK(n > 20 && fits_no_offload == 0 && fits_offload > 0);
    free(list);
}

/* ---- decision-table bands ---- */
struct band {
    const char *what;
    const char *spec;
    const char *cluster;
    int want_dp_only; /* tp == 1 && pp == 1 */
    int min_zero, max_zero;
    int offload;       /* -1 any, 0 no, 1 yes */
    int want_tp_pp_dp; /* tp > 1 && pp > 1 && dp > 1 */
    int want_gpus;     /* 0: any */
};

#define NODE1  "{'nodes':1,'gpus_per_node':8,'gpu':'H100-80GB','intra_link':'nvlink4'}"
#define NODE8  "{'nodes':8,'gpus_per_node':8,'gpu':'H100-80GB','inter_link':'roce100'}"
#define NODE16 "{'nodes':16,'gpus_per_node':8,'gpu':'A100-80GB','intra_link':'nvlink3'}"

static const struct band bands[] = {
    {"<7B gpt2 124m: DDP / ZeRO-1",
     "{'model':{'family':'gpt2','preset':'124m'},'train':{'micro_batch':16,"
     "'global_batch_tokens':524288}}",
     NODE1, 1, 0, 1, 0, 0, 8},
    {"<7B llama 1b: DDP / ZeRO-1",
     "{'model':{'family':'llama','preset':'1b'},'train':{'micro_batch':4,"
     "'global_batch_tokens':1048576}}",
     NODE1, 1, 0, 1, 0, 0, 8},
    {"<7B gpt2 1558m: DDP / ZeRO-1",
     "{'model':{'family':'gpt2','preset':'1558m'},'train':{'micro_batch':8,"
     "'global_batch_tokens':524288}}",
     NODE1, 1, 0, 1, 0, 0, 8},
    {"7-13B llama 7b: sharded optimizer, no offload",
     "{'model':{'family':'llama','preset':'7b'},'train':{'micro_batch':4,"
     "'global_batch_tokens':1048576}}",
     NODE1, 0, 1, 3, 0, 0, 8},
    {"7-13B llama 13b: sharded optimizer, no offload",
     "{'model':{'family':'llama','preset':'13b'},'train':{'micro_batch':2,"
     "'global_batch_tokens':1048576}}",
     NODE1, 0, 1, 3, 0, 0, 8},
    {"30-70B llama 34b on one node: ZeRO-3 (it fits without offload, just)",
     "{'model':{'family':'llama','preset':'34b'},'train':{'micro_batch':1,"
     "'global_batch_tokens':1048576}}",
     NODE1, 0, 3, 3, -1, 0, 8},
    {"30-70B llama 70b on one node: ZeRO-3 + CPU offload",
     "{'model':{'family':'llama','preset':'70b'},'train':{'micro_batch':1,"
     "'global_batch_tokens':1048576}}",
     NODE1, 0, 3, 3, 1, 0, 8},
    {"70B+ llama 70b on 8 nodes over 100G RoCE: TP + PP + DP",
     "{'model':{'family':'llama','preset':'70b'},'train':{'micro_batch':1,"
     "'global_batch_tokens':4194304}}",
     NODE8, 0, 0, 1, -1, 1, 64},
    {"70B+ 120B-class on 16 A100 nodes: TP + PP + DP",
     "{'model':{'family':'llama','n_layer':96,'n_head':80,'n_kv_head':8,'d_model':10240,"
     "'d_ff':32768,'vocab_size':32000,'seq_len':4096},'train':{'micro_batch':1,"
     "'global_batch_tokens':4194304}}",
     NODE16, 0, 0, 1, -1, 1, 128},
};

static void test_bands(void) {
    for (size_t i = 0; i < sizeof bands / sizeof *bands; i++) {
        const struct band *b = &bands[i];
        struct loom_spec s;
        struct planner_cluster c;
        struct loom_error e;
        CHECK(load(b->spec, b->cluster, &s, &c) == 0);
        struct planner_candidate *list = NULL;
        int n = 0;
        CHECK(planner_recommend(&s, &c, NULL, &list, &n, &e) == 0);
        int k = planner_pick(list, n);
        CHECK(k >= 0);
        if (k < 0) {
            free(list);
            continue;
        }
        const struct planner_estimate *x = &list[k].est;
        int ok = 1;
        if (b->want_dp_only) ok &= x->tp == 1 && x->pp == 1;
        if (b->want_tp_pp_dp) ok &= x->tp > 1 && x->pp > 1 && x->dp > 1;
        ok &= x->zero_stage >= b->min_zero && x->zero_stage <= b->max_zero;
        if (b->offload >= 0) ok &= x->offload == b->offload;
        if (b->want_gpus) ok &= x->world == b->want_gpus;
        ok &= x->fits && list[k].why[0] != '\0' && strstr(list[k].why, "fits") != NULL;
        printf("band %-55s -> dp=%d tp=%d pp=%d zero=%d offload=%d (%s)\n", b->what, x->dp, x->tp,
               x->pp, x->zero_stage, x->offload, list[k].why);
        if (!ok) fprintf(stderr, "band '%s': unexpected pick\n", b->what);
        CHECK(ok);
        /* every infeasible candidate says why, with the numbers */
        for (int j = 0; j < n; j++)
            if (!list[j].est.fits) CHECK(strstr(list[j].why, "does not fit") != NULL);
        /* the list is ordered: feasible first, by score */
        for (int j = 1; j < n; j++) {
            CHECK(list[j - 1].est.fits >= list[j].est.fits);
            if (list[j - 1].est.fits && list[j].est.fits) CHECK(list[j - 1].score <= list[j].score);
        }
        free(list);
    }
    /* 7b without ZeRO on the node does not fit (dp=8, zero 0, no offload) */
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate est;
    struct loom_error e;
    CHECK(load("{'model':{'family':'llama','preset':'7b'},'parallel':{'dp':8},"
               "'train':{'micro_batch':4,'global_batch_tokens':1048576}}",
               NODE1, &s, &c) == 0);
    CHECK(planner_estimate(&s, &c, NULL, &est, &e) == 0 && !est.fits);
}

/* ---- communication-bound: more GPUs stop helping ---- */
static void test_comm_bound(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct loom_error e;
    CHECK(load("{'model':{'family':'gpt2','preset':'124m'},'train':{'micro_batch':16,"
               "'global_batch_tokens':524288}}",
               "{'nodes':16,'gpus_per_node':8,'inter_link':'roce100'}", &s, &c) == 0);
    struct planner_candidate *list = NULL;
    int n = 0;
    CHECK(planner_recommend(&s, &c, NULL, &list, &n, &e) == 0);
    int k = planner_pick(list, n);
    CHECK(k >= 0);
    double best128 = 0, best_pick = k >= 0 ? list[k].est.step_s : 0;
    int n128 = 0;
    for (int i = 0; i < n; i++) {
        if (!list[i].est.fits || list[i].est.world != 128 || list[i].est.offload) continue;
        n128++;
        CHECK(list[i].est.comm_fraction > 0.20);
        CHECK(!list[i].scaling_ok && strstr(list[i].why, "only"));
        CHECK(strstr(list[i].why, "communication") != NULL);
        if (best128 == 0 || list[i].est.step_s < best128) best128 = list[i].est.step_s;
    }
    CHECK(n128 > 0);
    CHECK(k >= 0 && list[k].est.world < 128);
    CHECK(best128 > 0.9 * best_pick); /* 4x+ the GPUs, not even 1.11x faster */
    printf("comm-bound 124m: pick %d GPUs %.4f s/step; best on 128 GPUs %.4f s/step\n",
           k >= 0 ? list[k].est.world : 0, best_pick, best128);
    /* the same job on one NVLink node is compute-bound */
    for (int i = 0; i < n; i++)
        if (list[i].est.fits && list[i].est.world == 8 && list[i].est.tp == 1)
            CHECK(list[i].est.comm_fraction < 0.20);
    free(list);
}

/* ---- consistency with the layout table and between categories ---- */
static void test_consistency(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct loom_error e;
    struct planner_estimate a, b;
    /* pipeline stage parameters equal the layout table's stage sums */
    CHECK(load("{'model':{'family':'llama','preset':'7b'},'parallel':{'tp':2,'pp':4,'dp':1},"
               "'train':{'micro_batch':1,'global_batch_tokens':32768}}",
               NULL, &s, &c) == 0);
    CHECK(planner_estimate(&s, &c, NULL, &a, &e) == 0);
    struct model_layout l;
    CHECK(model_layout_init(&l, &s.model, 2) == 0);
    int64_t st = model_layout_stage_numel(&l, &s.model, 4, a.mem.worst_stage);
    CHECK(fabs(a.mem.params - 2.0 * (double)st) < 1);
    CHECK(a.mem.worst_stage == 3 || a.mem.worst_stage == 0);
    CHECK(a.mem.inflight == (a.mem.worst_stage == 0 ? 4 : 1));
    model_layout_free(&l);
    CHECK(a.n_comm >= 2); /* tp all-reduce and pp send/recv */
    int has_tp = 0, has_pp = 0;
    for (int i = 0; i < a.n_comm; i++) {
        has_tp |= strcmp(a.comm[i].group, "tp") == 0 && !a.comm[i].cross_node;
        has_pp |= strcmp(a.comm[i].group, "pp") == 0;
    }
    CHECK(has_tp && has_pp);
    CHECK(a.bubble_s > 0 && fabs(a.bubble_s / a.compute_s - 3.0 / 8) < 1e-9); /* (pp-1)/ga */

    /* ZeRO stages shrink memory monotonically; full recompute shrinks activations */
    static const char *z[] = {
        "{'model':{'family':'llama','preset':'1b'},'parallel':{'dp':8,'zero_stage':%d},"
        "'train':{'micro_batch':2,'global_batch_tokens':131072,'recompute':'%s'}}"};
    double prev = 1e30;
    for (int zs = 0; zs <= 3; zs++) {
        char buf[512];
        snprintf(buf, sizeof buf, z[0], zs, "none");
        CHECK(load(buf, NULL, &s, &c) == 0);
        CHECK(planner_estimate(&s, &c, NULL, &a, &e) == 0);
        double stat = a.mem.params + a.mem.grads + a.mem.optimizer;
        CHECK(stat < prev);
        prev = stat;
        CHECK(a.mfu > 0 && a.mfu <= 0.5 + 1e-9);
        CHECK(fabs(a.gpu_hours - a.run_hours * 8) < 1e-9 * a.gpu_hours + 1e-12);
        CHECK(fabs(a.cost - a.gpu_hours * 2.5) < 1e-6 * a.cost + 1e-12);
        CHECK(fabs(a.mem.total - (a.mem.params + a.mem.grads + a.mem.optimizer + a.mem.activations +
                                  a.mem.comm + a.mem.workspace + a.mem.reserved)) < 1);
    }
    const char *rcs[] = {"none", "selective", "full"};
    double act_prev = 1e30, compute_prev = 0;
    for (int r = 0; r < 3; r++) {
        char buf[512];
        snprintf(buf, sizeof buf, z[0], 1, rcs[r]);
        CHECK(load(buf, NULL, &s, &c) == 0);
        CHECK(planner_estimate(&s, &c, NULL, &b, &e) == 0);
        /* selective recomputes only norms and the activation: no matmul work */
        CHECK(b.mem.activations < act_prev &&
              (r == 1 ? b.compute_s == compute_prev : b.compute_s > compute_prev));
        act_prev = b.mem.activations;
        compute_prev = b.compute_s;
    }
    /* whole-model numbers agree with api/model.h for every preset */
    size_t np;
    const struct model_preset *pr = model_presets(&np);
    for (size_t i = 0; i < np; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "{'model':{'family':'%s','preset':'%s'}}",
                 model_family_name(pr[i].config.family), pr[i].name);
        CHECK(load(buf, NULL, &s, &c) == 0);
        CHECK(planner_estimate(&s, &c, NULL, &a, &e) == 0);
        CHECK(a.mem.params == 2.0 * (double)model_n_params(&s.model));
        CHECK(fabs(a.flops_per_token - model_flops_per_token(&s.model, s.model.seq_len)) <
              1e-9 * a.flops_per_token);
    }
    /* more tp: fewer parameters per GPU */
    CHECK(load("{'model':{'family':'llama','preset':'13b'},'parallel':{'tp':8},"
               "'train':{'micro_batch':1,'global_batch_tokens':4096}}",
               NULL, &s, &c) == 0);
    CHECK(planner_estimate(&s, &c, NULL, &b, &e) == 0);
    CHECK(load("{'model':{'family':'llama','preset':'13b'},'parallel':{'tp':2},"
               "'train':{'micro_batch':1,'global_batch_tokens':4096}}",
               NULL, &s, &c) == 0);
    CHECK(planner_estimate(&s, &c, NULL, &a, &e) == 0);
    CHECK(b.mem.params < a.mem.params / 3.5);
    /* offload moves the optimizer to host memory and costs CPU time */
    CHECK(load("{'model':{'family':'llama','preset':'7b'},'parallel':{'dp':8,'zero_stage':1},"
               "'train':{'micro_batch':1,'global_batch_tokens':32768,'offload_optimizer':true}}",
               NULL, &s, &c) == 0);
    CHECK(planner_estimate(&s, &c, NULL, &a, &e) == 0);
    CHECK(a.mem.optimizer == 0 && a.mem.host_per_node > 50 * GIB && a.optimizer_s > 0.1);
}

/* ---- the offloaded optimizer's time model (planner_offload_s) ---- */
static void test_offload_model(void) {
    /* 8e9 bf16 parameters on one rank: 16 GB each way over 50 GB/s PCIe
     * (0.32 s), 8e9 x 28 B of host traffic at 100 GB/s (2.24 s): CPU-bound */
    CHECK_NEAR(planner_offload_s(8e9, 2, 1, 0, 50, 100), 2.24, 1e-9);
    /* two ranks share the host bandwidth */
    CHECK_NEAR(planner_offload_s(8e9, 2, 2, 0, 50, 100), 4.48, 1e-9);
    /* PCIe-bound: 1.6 s each way at 10 GB/s; hiding the download under the
     * backward leaves the upload */
    CHECK_NEAR(planner_offload_s(8e9, 2, 1, 0, 10, 1000), 1.6, 1e-9);
    CHECK_NEAR(planner_offload_s(8e9, 2, 1, 1.0, 10, 1000), 1.6, 1e-9);
    /* fp32: 24 + 8 = 32 B per parameter */
    CHECK_NEAR(planner_offload_s(1e9, 4, 1, 0, 1000, 100), 0.32, 1e-9);
    /* the estimate uses it: Llama 3 8B on one H200 with the cluster's measured
     * bandwidths */
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate a;
    struct loom_error e;
    CHECK(load("{'model':{'family':'llama','preset':'8b'},'train':{'micro_batch':2,"
               "'global_batch_tokens':32768,'offload_optimizer':true,'recompute':'selective'}}",
               "{'nodes':1,'gpus_per_node':1,'gpu':'H200','pcie_gbps':50,'host_mem_gbps':100}", &s,
               &c) == 0);
    CHECK(planner_estimate(&s, &c, NULL, &a, &e) == 0);
    double want = planner_offload_s(a.mem.stage_params, 2, 1, 0, 50, 100);
    CHECK_NEAR(a.optimizer_s, want, 1e-9);
    CHECK(fabs(a.optimizer_s - 8.03e9 * 28 / 100e9) < 0.02 * a.optimizer_s, "8b offload %.3f s",
          a.optimizer_s);
    printf("offload model: 8b on one H200 %.2f s of optimizer per step (%.0f tokens/s)\n",
           a.optimizer_s, a.tokens_per_s);
}

/* ---- the worker's start-up estimate ---- */
static void test_estimate_job(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate a;
    struct loom_error e;
    /* 64 ranks: the helper sizes the cluster to the job (8 nodes of 8) */
    CHECK(load("{'model':{'family':'llama','preset':'70b'},'parallel':{'dp':8,'tp':8},"
               "'train':{'micro_batch':1,'global_batch_tokens':32768}}",
               NULL, &s, &c) == 0);
    CHECK(planner_estimate_job(&s, NULL, 0, &a, &e) == 0 && a.world == 64 && a.nodes == 8);
    CHECK(a.mem.gpu_bytes == 80 * GIB);
    CHECK(planner_estimate_job(&s, "H200", 0, &a, &e) == 0 && a.mem.gpu_bytes == 141 * GIB);
    CHECK(planner_estimate_job(&s, "MyGPU", 40, &a, &e) == 0 && a.mem.gpu_bytes == 40 * GIB);
    CHECK(planner_estimate_job(&s, "MyGPU", 0, &a, &e) == -1 && strcmp(e.code, "UNKNOWN_GPU") == 0);
    /* a cpu job gets the nominal cpu device */
    CHECK(load("{'model':{'family':'gpt2','preset':'tiny'},'resources':{'device':'cpu'}}", NULL, &s,
               &c) == 0);
    CHECK(planner_estimate_job(&s, NULL, 0, &a, &e) == 0 && a.fits);
}

/* ---- LoRA / QLoRA memory: a Llama 3 8B job on one 24 GB card ---- */
static double pad64(double n) {
    return ceil(n / 64) * 64;
}

static void test_lora_8b(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate lora, full, nf4, z1;
    struct loom_error e;
    const char *base = "{'model':{'family':'llama','preset':'8b','seq_len':2048},"
                       "'train':{'micro_batch':1,'global_batch_tokens':2048,'recompute':'full'%s}}";
    char spec[512];
    snprintf(spec, sizeof spec, base, "");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "RTX4090", 0, &full, &e) == 0);
    snprintf(spec, sizeof spec, base, ",'lora':{'rank':16,'alpha':32}");
    CHECK(load(spec, NULL, &s, &c) == 0);
    CHECK(s.train.lora.enabled && s.train.lora.n_targets == 7);
    CHECK(planner_estimate_job(&s, "RTX4090", 0, &lora, &e) == 0);
    snprintf(spec, sizeof spec, base, ",'lora':{'rank':16,'alpha':32},'quantize_base':'nf4'");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "RTX4090", 0, &nf4, &e) == 0);
    /* the adapters by hand: r x in + out x r per projection, each tensor padded to 64
     * elements (C 4096, kv 1024, F 14336), 32 blocks */
    double r = 16, C = 4096, KV = 1024, F = 14336;
    double per = pad64(r * C) * 5 + pad64(r * C) + pad64(r * F) + /* A: q k v gate up, o, down */
                 pad64(C * r) * 3 + pad64(KV * r) * 2 +
                 pad64(F * r) * 2; /* B: q o down, k v, gate up */
    double A = 32 * per;
    /* Llama 3 8B: 8,030,261,248 parameters, frozen in bf16 */
    double P = 8030261248.0;
    CHECK_NEAR(lora.mem.params, P * 2 + A * 2, 1);
    CHECK_NEAR(lora.mem.grads, A * 2, 1);
    CHECK_NEAR(lora.mem.optimizer, A * 12 + 20, 1);
    CHECK(full.mem.grads == P * 2 && !full.fits && lora.fits);
    printf("8b lora r16 on RTX4090: %.2f GiB (params %.2f, grads %.3f, optimizer %.3f, activations "
           "%.2f), %.0fM adapter parameters; full fine-tuning %.1f GiB: %s\n",
           lora.mem.total / GIB, lora.mem.params / GIB, lora.mem.grads / GIB,
           lora.mem.optimizer / GIB, lora.mem.activations / GIB, A / 1e6, full.mem.total / GIB,
           full.reason);
    /* NF4: block linear weights at 0.5 + 1/64 + 4/16384 bytes (these shapes fill whole
     * blocks) plus each tensor's fp32 offset and 256-entry fp32 map (worker/nf4_format.h),
     * embeddings, norms and head in bf16, one block dequantized to bf16, the empty params
     * window's one bf16 element */
    double lin = 32 * (C * (C + 2 * KV) + C * C + 3 * C * F);
    double nf4p = lin * (0.5 + 1.0 / 64 + 4.0 / 16384) + 32 * 7 * (4 + 1024) + (P - lin) * 2 +
                  lin / 32 * 2 + 2 + A * 2;
    CHECK_NEAR(nf4.mem.params, nf4p, 1);
    CHECK(nf4.fits && nf4.mem.total < lora.mem.total - 9 * GIB);
    printf("8b qlora nf4: %.2f GiB (params %.2f GiB)\n", nf4.mem.total / GIB, nf4.mem.params / GIB);
    /* train.precision fp8 with LoRA on one GPU: the base held as E4M3 W alone
     * (worker/fp8base.h), 1 byte a block linear weight in place of bf16's 2; in the workspace
     * one E4M3 buffer of N x the widest block width (gate|up, 2F) and one for the widest
     * weight's W^T (2F x C) */
    struct planner_estimate f8;
    snprintf(spec, sizeof spec, base, ",'lora':{'rank':16,'alpha':32},'precision':'fp8'");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "RTX4090", 0, &f8, &e) == 0);
    CHECK_NEAR(f8.mem.params, lora.mem.params - lin, 1);
    CHECK_NEAR(f8.mem.workspace, lora.mem.workspace + 2048 * 2 * F + 2 * F * C + 128, 1);
    CHECK_NEAR(f8.mem.grads + f8.mem.optimizer + f8.mem.activations,
               lora.mem.grads + lora.mem.optimizer + lora.mem.activations, 1);
    printf("8b lora fp8: %.2f GiB (params %.2f GiB, %.2f GiB of E4M3 base)\n", f8.mem.total / GIB,
           f8.mem.params / GIB, lin / GIB);
    /* a full fine-tune in fp8: no copies kept (each weight quantized at each use into one
     * buffer of the largest weight, gate|up 2F x C), and the transposed dY and X of the weight
     * gradient (two more N x 2F buffers) */
    struct planner_estimate ff8;
    snprintf(spec, sizeof spec, base, ",'precision':'fp8'");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "RTX4090", 0, &ff8, &e) == 0);
    CHECK_NEAR(ff8.mem.params, full.mem.params, 1);
    CHECK_NEAR(ff8.mem.workspace, full.mem.workspace + 3 * 2048 * 2 * F + 2 * F * C + 128, 1);
    CHECK_NEAR(ff8.mem.grads + ff8.mem.optimizer, full.mem.grads + full.mem.optimizer, 1);
    /* dp 2 with ZeRO 1: the adapter optimizer state halves, a gradient shard is added */
    snprintf(spec, sizeof spec,
             "{'model':{'family':'llama','preset':'8b','seq_len':2048},'parallel':{'dp':2,"
             "'zero_stage':1},'train':{'micro_batch':1,'global_batch_tokens':4096,"
             "'recompute':'full','lora':{'rank':16,'alpha':32}}}");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "RTX4090", 0, &z1, &e) == 0);
    CHECK_NEAR(z1.mem.optimizer, ceil(A / 2) * 12 + 20, 1);
    CHECK_NEAR(z1.mem.grads, A * 2 + ceil(A / 2) * 2, 1);

    /* time: no weight gradients for the frozen base. Per token, full fine-tuning
     * does 6 FLOPs a matmul weight, LoRA 4 (forward, input gradient) plus 6 an
     * adapter parameter (41,943,040 unpadded: PEFT's count), attention 12 L C T
     * for both; full recompute adds one forward (2 a weight, 2 an adapter
     * parameter, 4 L C T) */
    double mm = lin + 128256.0 * C, att = 12.0 * 32 * C * 2048, ad = 41943040;
    CHECK_NEAR(lora.flops_per_token, 4 * mm + 6 * ad + att, 1);
    CHECK_NEAR(full.flops_per_token, 6 * mm + att, 1);
    double want =
        (4 * mm + 6 * ad + att + 2 * lin + 2 * ad + att / 3) / (6 * mm + att + 2 * lin + att / 3);
    CHECK(fabs(lora.compute_s / full.compute_s - want) < 1e-9, "lora/full compute %.6f, want %.6f",
          lora.compute_s / full.compute_s, want);
    /* QLoRA: on top of the same LoRA step, each block's NF4 weights (nf4p's per-block share)
     * dequantized to bf16 (2 bytes a weight written) before its forward and its backward, the
     * last forward block reused: 63 passes over a block at the GPU's HBM bandwidth */
    struct planner_estimate q0, q1;
    snprintf(spec, sizeof spec, base, ",'lora':{'rank':16,'alpha':32}");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &q0, &e) == 0);
    snprintf(spec, sizeof spec, base, ",'lora':{'rank':16,'alpha':32},'quantize_base':'nf4'");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &q1, &e) == 0);
    double blk = lin / 32 * (0.5 + 1.0 / 64 + 4.0 / 16384) + 7 * (4 + 1024) + lin / 32 * 2;
    CHECK(planner_cluster_resolve(&c, JOBSPEC_DEV_CUDA, &e) == 0);
    double hbm = c.hbm_tbps; /* the default cluster's H100-SXM: 3.35 TB/s */
    CHECK_NEAR(hbm, 3.35, 1e-9);
    CHECK_NEAR(q1.compute_s - q0.compute_s, 63 * blk / (hbm * 1e12), 1e-9);
    printf("8b qlora: %.4f s a step dequantizing (%.2f TB/s)\n", q1.compute_s - q0.compute_s, hbm);
    /* dp 8 on one node: the dp all-reduce carries the adapters' gradients (bf16), not the
     * base's 16 GB, and the optimizer steps the adapters alone */
    struct planner_estimate d8, d8f;
    const char *dp8 =
        "{'model':{'family':'llama','preset':'8b','seq_len':2048},'parallel':{'dp':8},"
        "'resources':{'device':'cuda'},'train':{'micro_batch':1,"
        "'global_batch_tokens':16384,'recompute':'full'%s}}";
    snprintf(spec, sizeof spec, dp8, ",'lora':{'rank':16,'alpha':32}");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &d8, &e) == 0);
    snprintf(spec, sizeof spec, dp8, "");
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &d8f, &e) == 0);
    double dp_bytes = 0, dp_bytes_full = 0;
    for (int i = 0; i < d8.n_comm; i++)
        if (strcmp(d8.comm[i].group, "dp") == 0) dp_bytes = d8.comm[i].bytes;
    for (int i = 0; i < d8f.n_comm; i++)
        if (strcmp(d8f.comm[i].group, "dp") == 0) dp_bytes_full = d8f.comm[i].bytes;
    CHECK_NEAR(dp_bytes, A * 2, 1);
    CHECK_NEAR(dp_bytes_full, P * 2, 1);
    CHECK_NEAR(d8.optimizer_s / d8f.optimizer_s, A / P, 1e-12);
    printf("8b lora r16 dp8 (H100 node): %.0f tokens/s, step %.3f s (compute %.3f, exposed comm "
           "%.4f, optimizer %.5f); full fine-tune %.0f tokens/s (exposed comm %.3f)\n",
           d8.tokens_per_s, d8.step_s, d8.compute_s, d8.comm_exposed_s, d8.optimizer_s,
           d8f.tokens_per_s, d8f.comm_exposed_s);
}

/* ---- QLoRA over pp and dp: a stage's NF4 tensors, a dp rank's whole base ---- */
static void test_qlora_70b_layouts(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate one, pp2, dp2;
    struct loom_error e;
    const char *base = "{'model':{'family':'llama','preset':'70b','seq_len':2048},%s"
                       "'train':{'micro_batch':1,'global_batch_tokens':%d,'recompute':'full',"
                       "'lora':{'rank':16,'alpha':32},'quantize_base':'nf4'}}";
    char spec[640];
    snprintf(spec, sizeof spec, base, "", 2048);
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "H200", 0, &one, &e) == 0);
    snprintf(spec, sizeof spec, base, "'parallel':{'pp':2},", 4096);
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "H200", 0, &pp2, &e) == 0);
    snprintf(spec, sizeof spec, base, "'parallel':{'dp':2},", 4096);
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "H200", 0, &dp2, &e) == 0);
    /* by hand: Llama 2 70B (C 8192, kv 1024, F 28672, V 32000, 80 blocks); every linear
     * weight fills whole 64- and 256-blocks, so nf4_bytes(n) = n/2 + n/64 + 4n/16384 + 4 +
     * 1024 (worker/nf4_format.h); pp 2: 40 blocks a stage, stage 0 the embedding, stage 1
     * the final norm and lm_head; rank-16 adapters on the 7 projections, padded to 64 */
    double r = 16, C = 8192, KV = 1024, F = 28672, V = 32000;
    double mm = 2 * C * C + 2 * C * KV + 3 * C * F, lp = mm + 2 * C;
    double q4 = mm * (0.5 + 1.0 / 64 + 4.0 / 16384) + 7 * (4 + 1024);
    double per =
        pad64(r * C) * 6 + pad64(r * F) + pad64(C * r) * 3 + pad64(KV * r) * 2 + pad64(F * r) * 2;
    double P = 40 * lp + (pp2.mem.worst_stage == 0 ? V * C : V * C + C);
    double want = 40 * q4 + (P - 40 * mm) * 2 + mm * 2 + 2 + 40 * per * 2;
    CHECK_NEAR(pp2.mem.params, want, 1);
    /* dp: every rank holds the whole NF4 base (the same params as one device) */
    CHECK_NEAR(dp2.mem.params, one.mem.params, 1);
    CHECK(pp2.mem.params < 0.55 * one.mem.params && one.fits && pp2.fits);
    /* tp 2, rank 0: each rank quantizes whole tensors and keeps its shard; q, k, v, gate,
     * up (a row range, 16384-weight aligned here) slices of the whole buffer: (n/2)(0.5 +
     * 1/64 + 4/16384) + 4 + 1024; o and down (a column range of every row) the codes and
     * one fp32 absmax a block: (n/2)(0.5 + 4/64). Against the same spec over a bf16 base:
     * the NF4 tensors and the scratch replace the linear weights (the adapters cancel). */
    struct planner_estimate tq, tb;
    snprintf(spec, sizeof spec, base, "'parallel':{'tp':2},", 2048);
    CHECK(load(spec, NULL, &s, &c) == 0 && planner_estimate_job(&s, "H200", 0, &tq, &e) == 0);
    char plain[640];
    snprintf(plain, sizeof plain, "%s", spec);
    const char *qkey = ",'quantize_base':'nf4'";
    char *qb = strstr(plain, qkey);
    CHECK(qb != NULL);
    if (qb) memmove(qb, qb + strlen(qkey), strlen(qb + strlen(qkey)) + 1);
    CHECK(load(plain, NULL, &s, &c) == 0 && planner_estimate_job(&s, "H200", 0, &tb, &e) == 0);
    double col = C * C + 2 * C * KV + 2 * C * F, row = C * C + C * F;
    double q4t =
        col / 2 * (0.5 + 1.0 / 64 + 4.0 / 16384) + 5 * (4 + 1024) + row / 2 * (0.5 + 4.0 / 64);
    double dq = 80 * q4t - 80 * mm / 2 * 2 + mm / 2 * 2 + 2;
    CHECK_NEAR(tq.mem.params - tb.mem.params, dq, 1);
    /* the recommendations for QLoRA on a node of 8 include tp layouts (every shard of 70B
     * on 64-weight blocks at tp 2, 4 and 8) */
    snprintf(spec, sizeof spec, base, "", 8 * 2048);
    CHECK(load(spec, NULL, &s, &c) == 0);
    struct planner_candidate *list;
    int n = 0, tp_used = 0, fit = 0;
    CHECK(planner_recommend(&s, &c, NULL, &list, &n, &e) == 0);
    for (int i = 0; i < n; i++) {
        tp_used += list[i].est.tp > 1;
        fit += list[i].est.fits;
    }
    CHECK(n > 0 && fit > 0 && tp_used > 0);
    free(list);
    /* Llama 2 7B: d_ff 11008 / 8 = 1376 weights of down_proj's rows a rank, not whole
     * 64-weight blocks: tp 8 is never recommended (the worker refuses it), tp 2 and 4 are */
    snprintf(spec, sizeof spec,
             "{'model':{'family':'llama','preset':'7b','seq_len':2048},'train':{'micro_batch':1,"
             "'global_batch_tokens':%d,'recompute':'full','lora':{'rank':16,'alpha':32},"
             "'quantize_base':'nf4'}}",
             8 * 2048);
    CHECK(load(spec, NULL, &s, &c) == 0);
    int tp8 = 0, tp24 = 0;
    n = 0;
    CHECK(planner_recommend(&s, &c, NULL, &list, &n, &e) == 0);
    for (int i = 0; i < n; i++) {
        tp8 += list[i].est.tp == 8;
        tp24 += list[i].est.tp == 2 || list[i].est.tp == 4;
    }
    CHECK(n > 0 && tp8 == 0 && tp24 > 0, "7b qlora: %d candidates, %d with tp 8, %d with tp 2/4", n,
          tp8, tp24);
    free(list);
    printf("70b qlora nf4 r16 on H200: one device %.1f GiB (params %.1f), pp2 %.1f GiB a GPU "
           "(params %.1f, stage %d), dp2 %.1f GiB a GPU\n",
           one.mem.total / GIB, one.mem.params / GIB, pp2.mem.total / GIB, pp2.mem.params / GIB,
           pp2.mem.worst_stage, dp2.mem.total / GIB);
}

/* ---- dp2 ZeRO-0 on one node: the copy-engine receive area ---- */
static void test_pair_area(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate a, b;
    struct loom_error e;
    const char *spec = "{'model':{'family':'gpt2','preset':'124m'},'parallel':{'dp':2,"
                       "'zero_stage':%d},'train':{'micro_batch':16,'global_batch_tokens':32768}}";
    const char *one = "{'nodes':1,'gpus_per_node':2,'gpu':'H200'}";
    const char *two = "{'nodes':2,'gpus_per_node':1,'gpu':'H200'}";
    char buf[512];
    snprintf(buf, sizeof buf, spec, 0);
    CHECK(load(buf, one, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &a, &e) == 0);
    snprintf(buf, sizeof buf, spec, 1);
    CHECK(load(buf, one, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &b, &e) == 0);
    /* ZeRO 0 keeps a bf16 copy of the peer's gradients (124.4M parameters)
     * and two areas of per-token embedding rows (16 x 1024 tokens x 768
     * bf16) plus the peer's token ids */
    double rows = 2.0 * 16 * 1024 * 768 * 2 + 16 * 1024 * 4;
    double extra = a.mem.comm - b.mem.comm - rows;
    CHECK(extra > 124e6 * 2 * 0.99 && extra < 124.5e6 * 2 * 1.01);
    /* one GPU per node: the ranks cannot map each other's memory, NCCL */
    snprintf(buf, sizeof buf, spec, 0);
    CHECK(load(buf, two, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &a, &e) == 0);
    CHECK(fabs(a.mem.comm - b.mem.comm) < 1);
}

/* cuDNN attention's backward workspace: micro-batch x heads x T x T bf16
 * (plus fp32 softmax sums) on CUDA for multi-head attention, none on cpu */
static void test_cudnn_workspace(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate a, b;
    struct loom_error e;
    const char *spec = "{'model':{'family':'gpt2','preset':'124m'},"
                       "'train':{'micro_batch':%d,'global_batch_tokens':16384}}";
    const char *gpu = "{'nodes':1,'gpus_per_node':1,'gpu':'H200'}";
    char buf[512];
    snprintf(buf, sizeof buf, spec, 16);
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &a, &e) == 0);
    snprintf(buf, sizeof buf, spec, 8);
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &b, &e) == 0);
    /* 8 more sequences; the classifier's logits chunk (all N rows fit in 2 GiB:
     * 8 x 1024 more rows of the 50304-wide padded vocabulary, bf16) */
    double want = 8.0 * 12 * 1024 * 1024 * 2 + 8.0 * 12 * 1024 * 4 + 8.0 * 1024 * 50304 * 2;
    CHECK(fabs((a.mem.workspace - b.mem.workspace) - want) < 0.01 * want);
    /* grouped-query attention too (Llama 3.2 1B: 32 query heads, T 2048): per
     * query head */
    const char *gqa = "{'model':{'family':'llama','preset':'1b','seq_len':2048},"
                      "'train':{'micro_batch':%d,'global_batch_tokens':16384}}";
    snprintf(buf, sizeof buf, gqa, 4);
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &a, &e) == 0);
    snprintf(buf, sizeof buf, gqa, 2);
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &b, &e) == 0);
    /* 2 more sequences; logits: 8192 against 4096 rows of 128256 (both fit in 2 GiB) */
    want = 2.0 * 32 * 2048 * 2048 * 2 + 2.0 * 32 * 2048 * 4 + 4096.0 * 128256 * 2;
    CHECK(fabs((a.mem.workspace - b.mem.workspace) - want) < 0.01 * want);
    /* micro-batch 8: 16384 rows do not fit in 2 GiB; the chunk is 8320 rows
     * (2^31 / (128256 x 2) = 8372, rounded down to 64), 128 more than at 4 */
    snprintf(buf, sizeof buf, gqa, 8);
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &b, &e) == 0);
    want = 4.0 * 32 * 2048 * 2048 * 2 + 4.0 * 32 * 2048 * 4 + 128.0 * 128256 * 2;
    CHECK(fabs((b.mem.workspace - a.mem.workspace) - want) < 0.01 * want);
}

/* The classifier chunk on cpu: 64 rows of fp32 logits whatever the batch. */
static void test_classifier_workspace_cpu(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate a, b;
    struct loom_error e;
    const char *spec = "{'model':{'family':'llama','preset':'1b','seq_len':256},"
                       "'resources':{'device':'cpu'},"
                       "'train':{'precision':'fp32','micro_batch':%d,'global_batch_tokens':8192}}";
    char buf[512];
    snprintf(buf, sizeof buf, spec, 4);
    CHECK(load(buf, NULL, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &a, &e) == 0);
    snprintf(buf, sizeof buf, spec, 2);
    CHECK(load(buf, NULL, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &b, &e) == 0);
    CHECK(fabs(a.mem.workspace - b.mem.workspace) < 1);
    CHECK(a.mem.workspace >= 64.0 * 128256 * 4 && a.mem.workspace < 64.0 * 128256 * 4 * 1.5);
}

/* train.recompute {"budget_gib": N}: the most blocks kept (as selective keeps
 * them) that fit N, between every block recomputed (the floor) and selective; under the floor a
 * clear error at submit. Llama 3.2 1B shape (16 blocks) on an H200. */
static void test_recompute_budget(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate none, full, b;
    struct loom_error e;
    const char *gpu = "{'nodes':1,'gpus_per_node':1,'gpu':'H200'}";
    const char *spec = "{'model':{'family':'llama','preset':'1b','seq_len':2048},"
                       "'train':{'micro_batch':4,'global_batch_tokens':16384,'recompute':%s}}";
    char buf[512], rc[64];
    snprintf(buf, sizeof buf, spec, "'none'");
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &none, &e) == 0);
    snprintf(buf, sizeof buf, spec, "'full'");
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &full, &e) == 0);
    CHECK(none.mem.keep == -1 && full.mem.keep == -1);
    CHECK(full.mem.total < none.mem.total);
    double lo = full.mem.total / GIB, hi = none.mem.total / GIB;
    /* a budget a third of the way up keeps some blocks, within the budget */
    snprintf(rc, sizeof rc, "{'budget_gib':%.6f}", lo + (hi - lo) / 3);
    snprintf(buf, sizeof buf, spec, rc);
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &b, &e) == 0);
    CHECK(b.mem.layers == 16 && b.mem.keep > 0 && b.mem.keep < 15);
    CHECK(b.mem.total <= (lo + (hi - lo) / 3) * GIB + 1);
    CHECK(fabs(b.mem.budget_floor - full.mem.total) < 1e-6 * full.mem.total);
    /* one more kept block would not fit: each costs (none - full) / 15 or so */
    double per = (none.mem.total - full.mem.total) / 15;
    CHECK(b.mem.total + per > (lo + (hi - lo) / 3) * GIB);
    CHECK(b.step_s > none.step_s && b.step_s < full.step_s);
    int keep;
    double floor_gib;
    CHECK(planner_recompute_keep(&s, 0, &keep, &floor_gib, &e) == 0 && keep == b.mem.keep);
    CHECK(fabs(floor_gib - lo) < 1e-6 * lo);
    /* the whole model fits: every block kept (as selective keeps it: the norms' outputs and
     * the activation recomputed), the total of selective recompute */
    struct planner_estimate sel;
    snprintf(buf, sizeof buf, spec, "'selective'");
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &sel, &e) == 0);
    snprintf(rc, sizeof rc, "{'budget_gib':%.6f}", hi + 1);
    snprintf(buf, sizeof buf, spec, rc);
    CHECK(load(buf, gpu, &s, &c) == 0 && planner_estimate(&s, &c, NULL, &b, &e) == 0);
    CHECK(b.mem.keep == 16 && fabs(b.mem.total - sel.mem.total) < 1e-6 * sel.mem.total);
    CHECK(sel.mem.total < none.mem.total);
    /* under the floor: refused, naming both numbers */
    snprintf(rc, sizeof rc, "{'budget_gib':%.6f}", lo / 2);
    snprintf(buf, sizeof buf, spec, rc);
    CHECK(load(buf, gpu, &s, &c) == 0);
    CHECK(planner_recompute_keep(&s, 0, &keep, &floor_gib, &e) != 0);
    CHECK(!strcmp(e.code, "RECOMPUTE_BUDGET_TOO_SMALL") && strstr(e.message, "budget_gib"));
    CHECK(planner_check_fit(&s, &c, NULL, &e) != 0 &&
          !strcmp(e.code, "RECOMPUTE_BUDGET_TOO_SMALL"));
}

/* ---- pipeline split by work (parallel.pp_balance) ---- */
static void test_pp_balance(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_estimate even, bal;
    struct loom_error e;
    const char *xl = "{'model':{'family':'gpt2','preset':'1558m'},'parallel':{'pp':2%s},"
                     "'train':{'micro_batch':8,'global_batch_tokens':65536}}";
    char buf[512];
    snprintf(buf, sizeof buf, xl, "");
    CHECK(load(buf, NULL, &s, &c) == 0);
    CHECK(planner_estimate_job(&s, "H200", 0, &even, &e) == 0);
    /* the last stage's 24 blocks + the classifier (~2.4 blocks) set the pace;
     * the planner says what the split by work would save */
    int noted = 0;
    for (int i = 0; i < even.n_notes; i++)
        noted |= strstr(even.notes[i], "pp_balance") != NULL;
    CHECK(noted);
    snprintf(buf, sizeof buf, xl, ",'pp_balance':true");
    CHECK(load(buf, NULL, &s, &c) == 0);
    CHECK(planner_estimate_job(&s, "H200", 0, &bal, &e) == 0);
    /* 25 + 23 blocks: the slowest stage has 23 + 2.4 instead of 24 + 2.4 */
    CHECK(bal.compute_s < even.compute_s && bal.compute_s > 0.9 * even.compute_s);
    CHECK(bal.step_s < even.step_s);
    for (int i = 0; i < bal.n_notes; i++)
        CHECK(strstr(bal.notes[i], "pp_balance") == NULL);
}

/* ---- submit-time fit check ---- */
static void test_check_fit(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct loom_error e;
    CHECK(load("{'model':{'family':'llama','preset':'70b'},'parallel':{'dp':8},"
               "'train':{'micro_batch':1,'global_batch_tokens':1048576}}",
               NODE1, &s, &c) == 0);
    memset(&e, 0, sizeof e);
    CHECK(planner_check_fit(&s, &c, NULL, &e) == -1);
    CHECK(e.status == 422 && strcmp(e.code, "DOES_NOT_FIT") == 0);
    CHECK(strstr(e.message, "GiB/GPU > 80 GiB") && strstr(e.message, "optimizer"));
    CHECK(strstr(e.message, "best feasible on 8 GPUs") && strstr(e.message, "zero_stage=3") &&
          strstr(e.message, "offload_optimizer=true"));
    printf("check_fit: %s\n", e.message);
    CHECK(load("{'model':{'family':'gpt2','preset':'124m'},'parallel':{'dp':8},"
               "'train':{'micro_batch':16,'global_batch_tokens':524288}}",
               NODE1, &s, &c) == 0);
    CHECK(planner_check_fit(&s, &c, NULL, &e) == 0);
    /* a GPU with less memory turns the same job away */
    c.gpu_mem_gib = 4;
    CHECK(planner_check_fit(&s, &c, NULL, &e) == -1 && strstr(e.message, "> 4 GiB"));
}

/* ---- POST /v1/plan ---- */
static void test_plan_json(void) {
    char *t = dequote("{'model':{'family':'llama','preset':'7b'},'parallel':{'dp':8,"
                      "'zero_stage':1},'train':{'micro_batch':2,'global_batch_tokens':1048576,"
                      "'steps':1000},'cluster':{'nodes':2,'gpus_per_node':8,'gpu':'A100-80GB',"
                      "'price_per_gpu_hour':3.0},'options':{'max_alternatives':5}}");
    json_t *body = json_loads(t, 0, NULL);
    free(t);
    json_t *out = NULL;
    struct loom_error e;
    CHECK(body && planner_plan_json(body, NULL, &out, &e) == 0 && out);
    if (out) {
        const char *keys[] = {"valid", "spec",    "derived",     "cluster",     "estimate",
                              "fits",  "reasons", "recommended", "alternatives"};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
            CHECK(json_object_get(out, keys[i]) != NULL);
        json_t *est = json_object_get(out, "estimate");
        json_t *mem = json_object_get(est, "memory_gib");
        CHECK(json_number_value(json_object_get(mem, "gpu")) == 80);
        CHECK(json_number_value(json_object_get(mem, "total")) > 0);
        CHECK(json_is_array(json_object_get(est, "communication")) &&
              json_array_size(json_object_get(est, "communication")) >= 2);
        json_t *run = json_object_get(est, "run");
        double gh = json_number_value(json_object_get(run, "gpu_hours"));
        CHECK(fabs(json_number_value(json_object_get(run, "cost")) - 3.0 * gh) < 1e-6 * gh);
        CHECK(json_array_size(json_object_get(out, "alternatives")) == 5);
        CHECK(json_object_get(json_object_get(out, "recommended"), "why") != NULL);
        CHECK(strcmp(json_string_value(json_object_get(json_object_get(out, "cluster"), "gpu")),
                     "A100-80GB") == 0);
        CHECK(json_integer_value(json_object_get(json_object_get(out, "derived"), "world")) == 8);
        /* it fits as submitted: no adapter options */
        CHECK(json_is_array(json_object_get(out, "lora_options")) &&
              json_array_size(json_object_get(out, "lora_options")) == 0);
    }
    json_decref(out);
    json_decref(body);
    /* a Llama 3 8B full fine-tune on one RTX 4090 fits no layout; as LoRA and as QLoRA it
     * does, each with the spec fields to add; a LoRA spec gets no options */
    for (int lora = 0; lora < 2; lora++) {
        t = dequote(lora ? "{'model':{'family':'llama','preset':'8b','seq_len':2048},'train':{"
                           "'micro_batch':1,'global_batch_tokens':2048,'lora':{'rank':8}},"
                           "'cluster':{'nodes':1,'gpus_per_node':1,'gpu':'RTX4090'}}"
                         : "{'model':{'family':'llama','preset':'8b','seq_len':2048},'train':{"
                           "'micro_batch':1,'global_batch_tokens':2048},"
                           "'cluster':{'nodes':1,'gpus_per_node':1,'gpu':'RTX4090'}}");
        body = json_loads(t, 0, NULL);
        free(t);
        out = NULL;
        CHECK(body && planner_plan_json(body, NULL, &out, &e) == 0 && out);
        json_t *lo = json_object_get(out, "lora_options");
        CHECK(json_is_array(lo) && json_array_size(lo) == (lora ? 0 : 2));
        if (!lora && json_array_size(lo) == 2) {
            CHECK(json_is_null(json_object_get(out, "recommended")));
            json_t *a = json_array_get(lo, 0), *q = json_array_get(lo, 1);
            CHECK(!strcmp(json_string_value(json_object_get(a, "kind")), "lora") &&
                  !strcmp(json_string_value(json_object_get(q, "kind")), "qlora"));
            CHECK(json_is_true(json_object_get(a, "fits")) &&
                  json_is_true(json_object_get(q, "fits")));
            json_t *qt = json_object_get(q, "train");
            CHECK(json_integer_value(json_object_get(json_object_get(qt, "lora"), "rank")) == 16 &&
                  !strcmp(json_string_value(json_object_get(qt, "quantize_base")), "nf4"));
            CHECK(json_object_get(json_object_get(a, "train"), "quantize_base") == NULL);
            double ga =
                json_number_value(json_object_get(json_object_get(a, "memory_gib"), "total"));
            double gq =
                json_number_value(json_object_get(json_object_get(q, "memory_gib"), "total"));
            CHECK(ga > 15 && ga < 24 && gq < ga, "LoRA %.2f GiB, QLoRA %.2f GiB", ga, gq);
            printf("8b full fine-tune on an RTX4090: %s; %s\n",
                   json_string_value(json_object_get(a, "why")),
                   json_string_value(json_object_get(q, "why")));
        }
        json_decref(out);
        json_decref(body);
    }
}

/* ---- bad inputs ---- */
struct bad {
    const char *what;
    const char *body;
    int status;
    const char *code, *field;
};
static const struct bad bads[] = {
    {"zero layers", "{'model':{'family':'gpt2','preset':'124m','n_layer':0}}", 422, "OUT_OF_RANGE",
     "model.n_layer"},
    {"negative d_model",
     "{'model':{'family':'gpt2','n_layer':2,'n_head':2,'d_model':-64,'vocab_size':10,"
     "'seq_len':8}}",
     422, "OUT_OF_RANGE", "model.d_model"},
    {"zero micro_batch", "{'model':{'family':'gpt2','preset':'124m'},'train':{'micro_batch':0}}",
     422, "OUT_OF_RANGE", "train.micro_batch"},
    {"zero nodes", "{'model':{'family':'gpt2','preset':'124m'},'cluster':{'nodes':0}}", 422,
     "OUT_OF_RANGE", "cluster.nodes"},
    {"negative GPUs per node",
     "{'model':{'family':'gpt2','preset':'124m'},'cluster':{'gpus_per_node':-8}}", 422,
     "OUT_OF_RANGE", "cluster.gpus_per_node"},
    {"unknown GPU", "{'model':{'family':'gpt2','preset':'124m'},'cluster':{'gpu':'Z100'}}", 422,
     "UNKNOWN_GPU", "cluster.gpu"},
    {"unknown link",
     "{'model':{'family':'gpt2','preset':'124m'},'cluster':{'inter_link':'carrier-pigeon'}}", 422,
     "UNKNOWN_LINK", "cluster.inter_link"},
    {"unknown cluster field", "{'model':{'family':'gpt2','preset':'124m'},'cluster':{'gpuz':1}}",
     422, "UNKNOWN_FIELD", "cluster.gpuz"},
    {"layout larger than the cluster",
     "{'model':{'family':'gpt2','preset':'124m'},'parallel':{'dp':4,'tp':4},"
     "'cluster':{'nodes':1,'gpus_per_node':8}}",
     422, "LAYOUT_EXCEEDS_CLUSTER", "parallel"},
    {"layout product mismatched to the GPUs",
     "{'model':{'family':'gpt2','preset':'124m'},'parallel':{'dp':3,'pp':3},"
     "'train':{'micro_batch':1,'global_batch_tokens':9216},'cluster':{'nodes':1,"
     "'gpus_per_node':8}}",
     422, "LAYOUT_EXCEEDS_CLUSTER", "parallel"},
    {"tp wider than the cluster's nodes",
     "{'model':{'family':'gpt2','preset':'350m'},'parallel':{'tp':8},"
     "'cluster':{'nodes':2,'gpus_per_node':4}}",
     422, "TP_CROSSES_NODE", "parallel.tp"},
    {"bad option", "{'model':{'family':'gpt2','preset':'124m'},'options':{'overlap':2}}", 422,
     "OUT_OF_RANGE", "options.overlap"},
    {"tp not dividing heads", "{'model':{'family':'gpt2','preset':'124m'},'parallel':{'tp':5}}",
     422, "TP_HEADS", "parallel.tp"},
    {"not an object", "[1,2]", 400, "INVALID_JSON", ""},
};

static void test_bad_inputs(void) {
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
        char *t = dequote(bads[i].body);
        json_t *j = json_loads(t, 0, NULL);
        free(t);
        CHECK(j != NULL);
        json_t *out = NULL;
        struct loom_error e;
        memset(&e, 0, sizeof e);
        int rc = planner_plan_json(j, NULL, &out, &e);
        int ok = rc == -1 && out == NULL && e.status == bads[i].status &&
                 strcmp(e.code, bads[i].code) == 0 && strcmp(e.field, bads[i].field) == 0 &&
                 e.message[0];
        if (!ok)
            fprintf(stderr, "bad '%s': rc=%d %d %s '%s': %s\n", bads[i].what, rc, e.status, e.code,
                    e.field, e.message);
        CHECK(ok);
        json_decref(out);
        json_decref(j);
    }
    /* an explicit GPU description (unknown name with memory and peak) is accepted */
    struct planner_cluster c;
    planner_cluster_default(&c);
    snprintf(c.gpu, sizeof c.gpu, "MyAccel");
    c.gpu_mem_gib = 32;
    c.peak_tflops = 100;
    struct loom_error e;
    CHECK(planner_cluster_resolve(&c, JOBSPEC_DEV_CUDA, &e) == 0 && c.intra_gbps > 0);
}

/* ---- the real fleet (planner_fleet_check / planner_fleet_costs) ---- */

static struct planner_pool pool(const char *type, int nodes, int per_node, double mem_gib,
                                double price) {
    struct planner_pool p;
    memset(&p, 0, sizeof p);
    snprintf(p.gpu, sizeof p.gpu, "%s", type);
    p.nodes = nodes;
    p.gpus_per_node = per_node;
    p.gpus = nodes * per_node;
    p.gpu_mem_gib = mem_gib;
    p.price_per_gpu_hour = price;
    if (price > 0) snprintf(p.currency, sizeof p.currency, "USD");
    return p;
}

/* Full fine-tune of Llama 2 7B (bf16 weights and grads, fp32 AdamW: ~16 B a
 * parameter, ~100 GiB before activations): no single 24 GiB RTX 4090 holds it,
 * one 141 GiB H200 does. */
#define LLAMA7B_FT                                                                                 \
    "{'model':{'family':'llama','preset':'7b'},'parallel':{'dp':1},"                               \
    "'train':{'micro_batch':1,'global_batch_tokens':4096,'recompute':'full','steps':100}}"

static void test_fleet_fit(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct loom_error e;
    char types[2][GPU_TYPE_NAME_MAX];
    struct planner_fleet f = {2,
                              {pool("RTX4090", 1, 1, 23.6, 0.4), pool("H200", 1, 1, 140.4, 3.5)}};
    CHECK(load(LLAMA7B_FT, NULL, &s, &c) == 0);
    /* the estimate itself: > 24 GiB and < 140 GiB per GPU */
    struct planner_pool p1 = pool("H200", 1, 1, 140.4, 0);
    struct planner_estimate est;
    planner_pool_cluster(&p1, &c);
    CHECK(planner_estimate(&s, &c, NULL, &est, &e) == 0);
    printf("llama2-7b full fine-tune: %.1f GiB/GPU\n", est.mem.total / GIB);
    CHECK(est.fits && est.mem.total / GIB > 100 && est.mem.total / GIB < 140.4);

    snprintf(types[0], sizeof types[0], "RTX4090");
    memset(&e, 0, sizeof e);
    CHECK(planner_fleet_check(&s, &f, (const char(*)[GPU_TYPE_NAME_MAX])types, 1, 0, &e) == -1);
    CHECK(e.status == 422 && strcmp(e.code, "DOES_NOT_FIT") == 0);
    CHECK(strstr(e.message, "does not fit RTX4090") != NULL && strstr(e.message, "> 24 GiB"));
    CHECK(strstr(e.message, "fits it as submitted: H200") != NULL);
    CHECK(strstr(e.message, "resources.gpu_type to \"H200\"") != NULL);
    printf("fleet RTX4090: %s\n", e.message);
    /* what the same model needs as LoRA and QLoRA (rank 16, every projection): both fit one
     * 24 GiB card, QLoRA in less */
    const char *lo = strstr(e.message, "as LoRA (train.lora rank 16) it fits");
    const char *qlo = strstr(e.message, "as QLoRA (train.lora rank 16, quantize_base nf4) it fits");
    CHECK(lo && qlo && lo < qlo, "%s", e.message);
    double glo = qlo ? atof(strstr(lo, ": ") + 2) : 0, gq = qlo ? atof(strstr(qlo, ": ") + 2) : 0;
    CHECK(glo > 12.6 && glo < 24 && gq > 3 && gq < glo, "LoRA %.1f GiB, QLoRA %.1f GiB", glo, gq);
    snprintf(types[0], sizeof types[0], "H200");
    CHECK(planner_fleet_check(&s, &f, (const char(*)[GPU_TYPE_NAME_MAX])types, 1, 0, &e) == 0);
    CHECK(planner_fleet_check(&s, &f, NULL, 0, 0, &e) == 0); /* untyped: H200 holds it */

    /* eight RTX 4090 in a node: the alternative is a sharded layout on them */
    struct planner_fleet f8 = {1, {pool("RTX4090", 1, 8, 23.6, 0.4)}};
    CHECK(load("{'model':{'family':'llama','preset':'7b'},'parallel':{'dp':8},"
               "'train':{'micro_batch':1,'global_batch_tokens':32768}}",
               NULL, &s, &c) == 0);
    memset(&e, 0, sizeof e);
    CHECK(planner_fleet_check(&s, &f8, NULL, 0, 0, &e) == -1 && !strcmp(e.code, "DOES_NOT_FIT"));
    CHECK(strstr(e.message, "best feasible on 8 GPUs") && strstr(e.message, "zero_stage=3"));
    printf("fleet 8 x RTX4090: %s\n", e.message);

    /* train.precision fp8 needs FP8 tensor cores (compute capability 8.9+): refused where
     * the job may only use A100s, named by type; any fp8-capable pool lets it through, and
     * the fit is then judged on that pool alone */
    struct planner_fleet fa = {1, {pool("A100-80GB", 1, 8, 79.2, 0)}};
    struct planner_fleet fah = {
        2, {pool("A100-80GB", 1, 8, 79.2, 0), pool("H100-SXM", 1, 8, 79.2, 0)}};
    const char *f8spec = "{'model':{'family':'llama','preset':'1b','seq_len':2048},"
                         "'train':{'micro_batch':1,'global_batch_tokens':2048,'precision':'fp8',"
                         "'lora':{'rank':16,'alpha':32}}}";
    CHECK(load(f8spec, NULL, &s, &c) == 0);
    memset(&e, 0, sizeof e);
    CHECK(planner_fleet_check(&s, &fa, NULL, 0, 0, &e) == -1 && !strcmp(e.code, "PRECISION_GPU"));
    CHECK(e.status == 422 && !strcmp(e.field, "train.precision"));
    CHECK(strstr(e.message, "the cluster has A100-80GB (8.0)") != NULL, "%s", e.message);
    printf("fp8 on A100s: %s\n", e.message);
    CHECK(planner_fleet_check(&s, &fah, NULL, 0, 0, &e) == 0);
    snprintf(types[0], sizeof types[0], "A100-80GB");
    memset(&e, 0, sizeof e);
    CHECK(planner_fleet_check(&s, &fah, (const char(*)[GPU_TYPE_NAME_MAX])types, 1, 0, &e) == -1 &&
          !strcmp(e.code, "PRECISION_GPU"));
    CHECK(strstr(e.message, "resources.gpu_type lists A100-80GB (8.0)") != NULL, "%s", e.message);
    snprintf(types[1], sizeof types[1], "RTX4090");
    CHECK(planner_fleet_check(&s, &fah, (const char(*)[GPU_TYPE_NAME_MAX])types, 2, 0, &e) == -1 &&
          !strcmp(e.code, "UNSCHEDULABLE")); /* an RTX4090 would do, but the cluster has none */
    CHECK(strstr(e.message, "A100-80GB|RTX4090 with FP8 tensor cores") != NULL, "%s", e.message);
    /* a type the table lacks: judged by what its nodes report (planner_pool.cc) */
    struct planner_fleet fu = {2,
                               {pool("A100-80GB", 1, 8, 79.2, 0), pool("unknown", 1, 8, 79.2, 0)}};
    fu.pool[1].cc = 80;
    CHECK(planner_fleet_check(&s, &fu, NULL, 0, 0, &e) == -1 && !strcmp(e.code, "PRECISION_GPU"));
    CHECK(strstr(e.message, "unknown (8.0)") != NULL, "%s", e.message);
    fu.pool[1].cc = 90;
    CHECK(planner_fleet_check(&s, &fu, NULL, 0, 0, &e) == 0);
    int idx[PLANNER_MAX_POOLS];
    CHECK(planner_fleet_candidates(&s, &fu, NULL, 0, idx) == 1 && idx[0] == 1);
    CHECK(planner_fleet_candidates(&s, &fah, NULL, 0, idx) == 1 && idx[0] == 1);
    s.train.precision = JOBSPEC_PREC_BF16;
    CHECK(planner_fleet_candidates(&s, &fah, NULL, 0, idx) == 2);
    CHECK(planner_fleet_check(&s, &fa, NULL, 0, 0, &e) == 0);

    /* capacity: dp=8 on 3 cpu devices is refused, naming the capacity */
    struct planner_fleet cpu3 = {1, {pool("cpu", 2, 2, 16, 0)}};
    cpu3.pool[0].gpus = 3;
    CHECK(load("{'model':{'family':'gpt2','n_layer':2,'n_head':2,'d_model':64,'d_ff':256,"
               "'vocab_size':256,'seq_len':32},'parallel':{'dp':8},'resources':{'device':'cpu'},"
               "'train':{'precision':'fp32','micro_batch':4,'global_batch_tokens':1024}}",
               NULL, &s, &c) == 0);
    memset(&e, 0, sizeof e);
    CHECK(planner_fleet_check(&s, &cpu3, NULL, 0, 0, &e) == -1);
    CHECK(!strcmp(e.code, "UNSCHEDULABLE") && strstr(e.message, "8 ranks") &&
          strstr(e.message, "at most 3 cpu devices"));
    printf("fleet cpu x 3: %s\n", e.message);
    /* the same job before any cpu node joined: accepted (it waits) */
    struct planner_fleet none;
    memset(&none, 0, sizeof none);
    CHECK(planner_fleet_check(&s, &none, NULL, 0, 0, &e) == 0);

    /* types: absent type, tp wider than a node, mixing */
    struct planner_fleet mix = {
        2, {pool("H100-SXM", 1, 4, 79.6, 2.0), pool("A100-80GB", 1, 4, 80, 1.2)}};
    CHECK(load("{'model':{'family':'gpt2','preset':'124m'},'parallel':{'dp':8},"
               "'train':{'micro_batch':8,'global_batch_tokens':65536}}",
               NULL, &s, &c) == 0);
    memset(&e, 0, sizeof e);
    CHECK(planner_fleet_check(&s, &mix, NULL, 0, 0, &e) == -1 && !strcmp(e.code, "UNSCHEDULABLE"));
    CHECK(strstr(e.message, "at most 4 GPUs of one type") != NULL);
    CHECK(planner_fleet_check(&s, &mix, NULL, 0, 1, &e) == 0); /* allow_mixed: 4 + 4 */
    snprintf(types[0], sizeof types[0], "H200");
    CHECK(planner_fleet_check(&s, &mix, (const char(*)[GPU_TYPE_NAME_MAX])types, 1, 0, &e) == -1);
    CHECK(!strcmp(e.code, "UNSCHEDULABLE") && strstr(e.message, "no node of gpu_type H200") &&
          strstr(e.message, "H100-SXM: 4 on 1 node"));
    CHECK(load("{'model':{'family':'gpt2','preset':'350m'},'parallel':{'dp':1,'tp':8},"
               "'train':{'micro_batch':8,'global_batch_tokens':8192}}",
               NULL, &s, &c) == 0);
    CHECK(planner_fleet_check(&s, &mix, NULL, 0, 1, &e) == -1 && !strcmp(e.code, "UNSCHEDULABLE") &&
          strstr(e.message, "tp=8") && strstr(e.message, "largest node has 4"));
}

/* cpu devices plan against the node's real memory: a plan of ~44 GiB a rank is
 * refused on a 24 GiB node and accepted on a 64 GiB one. */
static void test_fleet_cpu_memory(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct loom_error e;
    CHECK(load("{'model':{'family':'gpt2','preset':'1558m'},'parallel':{'dp':1},"
               "'resources':{'device':'cpu'},'train':{'precision':'fp32','micro_batch':4,"
               "'global_batch_tokens':4096}}",
               NULL, &s, &c) == 0);
    struct planner_pool big = pool("cpu", 1, 1, 64, 0);
    struct planner_estimate est;
    planner_pool_cluster(&big, &c);
    CHECK(planner_estimate(&s, &c, NULL, &est, &e) == 0);
    printf("gpt2-1558m fp32 on a cpu device: %.1f GiB\n", est.mem.total / GIB);
    CHECK(est.mem.total / GIB > 24 && est.mem.total / GIB < 64);
    struct planner_fleet small = {1, {pool("cpu", 1, 1, 24, 0)}}, large = {1, {big}};
    memset(&e, 0, sizeof e);
    CHECK(planner_fleet_check(&s, &small, NULL, 0, 0, &e) == -1 &&
          !strcmp(e.code, "DOES_NOT_FIT") && strstr(e.message, "> 24 GiB"));
    CHECK(planner_fleet_check(&s, &large, NULL, 0, 0, &e) == 0);
}

/* cost per GPU type and the cheapest that fits as submitted */
static void test_fleet_costs(void) {
    struct loom_spec s;
    struct planner_cluster c;
    struct planner_fleet f = {3,
                              {pool("RTX4090", 1, 1, 23.6, 0.4), pool("H200", 1, 1, 140.4, 3.5),
                               pool("A100-80GB", 1, 1, 80, 0)}};
    CHECK(load(LLAMA7B_FT, NULL, &s, &c) == 0);
    const char *cheapest = NULL;
    json_t *a = planner_fleet_costs(&s, &f, &cheapest);
    CHECK(json_array_size(a) == 3);
    CHECK(cheapest && strcmp(cheapest, "H200") == 0); /* the only one it fits */
    json_t *rtx = json_array_get(a, 0), *h200 = json_array_get(a, 1), *a100 = json_array_get(a, 2);
    CHECK(!json_is_true(json_object_get(rtx, "fits")) &&
          json_is_true(json_object_get(h200, "fits")));
    double gh = json_number_value(json_object_get(h200, "gpu_hours"));
    CHECK(gh > 0 && fabs(json_number_value(json_object_get(h200, "cost")) - 3.5 * gh) < 1e-9 * gh);
    CHECK(!strcmp(json_string_value(json_object_get(h200, "currency")), "USD"));
    CHECK(json_is_null(json_object_get(a100, "cost"))); /* no price for A100 here */
    json_decref(a);
    /* a small job fits all three: the cheapest is the lowest gpu_hours x price */
    CHECK(load("{'model':{'family':'gpt2','preset':'124m'},'parallel':{'dp':1},"
               "'train':{'micro_batch':8,'global_batch_tokens':8192,'steps':1000}}",
               NULL, &s, &c) == 0);
    f.pool[2].price_per_gpu_hour = 1.2;
    a = planner_fleet_costs(&s, &f, &cheapest);
    double best = -1;
    const char *want = NULL;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *o = json_array_get(a, i);
        CHECK(json_is_true(json_object_get(o, "fits")));
        double cost = json_number_value(json_object_get(o, "cost"));
        double expect =
            json_number_value(json_object_get(o, "gpu_hours")) * f.pool[i].price_per_gpu_hour;
        CHECK(fabs(cost - expect) <= 1e-9 * expect);
        if (best < 0 || cost < best) {
            best = cost;
            want = f.pool[i].gpu;
        }
    }
    CHECK(cheapest && want && strcmp(cheapest, want) == 0);
    printf("gpt2-124m cheapest type: %s (%.4f)\n", cheapest ? cheapest : "-", best);
    json_decref(a);
}

int main(void) {
    test_lora_8b();
    test_qlora_70b_layouts();
    test_fleet_fit();
    test_fleet_cpu_memory();
    test_fleet_costs();
    test_pp_balance();
    test_pair_area();
    test_cudnn_workspace();
    test_classifier_workspace_cpu();
    test_recompute_budget();
    test_70b_arithmetic();
    test_bands();
    test_comm_bound();
    test_consistency();
    test_estimate_job();
    test_check_fit();
    test_plan_json();
    test_bad_inputs();
    test_offload_model();
    return check_summary("test_planner");
}
