/* loom-worker: trains one rank of a job.
 *
 *   loom-worker --spec FILE [--device cpu|cuda] [--out DIR] [--threads N]
 *               [--rank R --world N --rdzv file:DIR] [--export FILE]
 *               [--offload spec|on|off|sync|delayed] [--no-save]
 *
 * Reads and validates the job spec (api/jobspec.h), opens the token shards
 * (worker/data.h), builds the engine and model, resumes from the newest
 * complete checkpoint under OUT/checkpoints (worker/checkpoint.h) or
 * initialises from the seed, and runs the train loop (worker/train.h),
 * writing JSON lines on stdout and free text on stderr. Under an agent the
 * LOOM_RANK / LOOM_WORLD / LOOM_LOCAL_RANK / LOOM_RDZV variables fill the
 * flags of the same names (common/config.h maps LOOM_<NAME>); the tuning
 * and debug knobs are rows too (worker/tuning.h, --help-all), parsed here
 * once and handed down.
 *
 * Exit codes: 0 success; 2 bad spec, bad data, or an unsupported request
 * (e.g. --device cuda on a build without CUDA); 143 stopped by SIGTERM or
 * SIGINT after saving a checkpoint; 1 any other failure (api/exit_codes.h).
 *
 * The only global is the signal flag, which a handler must reach. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/exit_codes.h"
#include "api/jobspec.h"
#include "api/planner.h"
#include "common/config.h"
#include "common/fsutil.h"
#include "common/hash.h"
#include "common/log.h"
#include "worker/checkpoint.h"
#include "worker/cpu_peak.h"
#include "worker/data.h"
#include "worker/hf.h"
#include "worker/hf_cli.h"
#include "worker/hf_spec.h"
#include "worker/launch.h"
#include "worker/lora.h"
#include "worker/memcheck.h"
#include "worker/nf4.h"
#include "worker/offload.h"
#include "worker/offload_adamw.h"
#include "worker/par.h"
#include "worker/safetensors.h"
#include "worker/train.h"
#include "worker/tuning.h"
#include "worker/zero.h"
#ifdef LOOM_HAVE_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

struct opts {
    char *spec, *device, *out, *rdzv, *export_path, *log_level, *pp_schedule, *offload;
    long rank, world, local_rank, threads, nproc, steps, offload_chunk_kib;
    int no_save;
    int rank_steps;            /* --rank-steps: every rank writes rank_step lines */
    int bench_gemm;            /* --bench-gemm: print the cpu GEMM peak and exit */
    char *export_lora;         /* --export-lora DIR */
    struct hf_cli_opts hf;     /* model modes and fine-tuning (worker/hf_cli.h) */
    struct worker_tuning tune; /* the tuning and debug rows (worker/tuning.h) */
};

/* The ordinary rows; main adds the tuning and debug rows of worker/tuning.c
 * (--help-all lists them). */
static const struct config_entry table[] = {
    {"spec", CONFIG_STR, offsetof(struct opts, spec), NULL, 1, 0, "job spec JSON file (required)"},
    {"device", CONFIG_STR, offsetof(struct opts, device), "", 1, 0,
     "cpu or cuda (default: the spec's resources.device)"},
    {"out", CONFIG_STR, offsetof(struct opts, out), "./loom-run", 1, 0,
     "output dir: checkpoints under OUT/checkpoints, shared by every attempt"},
    {"rank", CONFIG_INT, offsetof(struct opts, rank), "0", 0, 1e6, "global rank (LOOM_RANK)"},
    {"world", CONFIG_INT, offsetof(struct opts, world), "1", 1, 1e6, "world size (LOOM_WORLD)"},
    {"local-rank", CONFIG_INT, offsetof(struct opts, local_rank), "0", 0, 1e4,
     "rank on this node (LOOM_LOCAL_RANK)"},
    {"rdzv", CONFIG_STR, offsetof(struct opts, rdzv), NULL, 1, 0,
     "rendezvous: file:DIR or the attempt's URL (LOOM_RDZV)"},
    {"nproc", CONFIG_INT, offsetof(struct opts, nproc), "1", 1, 1024,
     "ranks to launch locally (standalone multi-process, worker/launch.h)"},
    {"threads", CONFIG_INT, offsetof(struct opts, threads), "0", 0, 1024,
     "CPU backend threads, and the offloaded optimizer's (0: OpenMP default; offload on cuda: "
     "OMP_NUM_THREADS, else the node's cores / its ranks)"},
    {"steps", CONFIG_INT, offsetof(struct opts, steps), "0", 0, 1e12,
     "stop after this many steps (0: the spec's train.steps; the schedule still uses the spec)"},
    {"export", CONFIG_STR, offsetof(struct opts, export_path), NULL, 1, 0,
     "write the final model as Hugging Face safetensors to this file"},
    {"log-level", CONFIG_STR, offsetof(struct opts, log_level), "info", 1, 0,
     "debug|info|warn|error"},
    {"pp-schedule", CONFIG_STR, offsetof(struct opts, pp_schedule), "1f1b", 1, 0,
     "pipeline schedule with pp > 1: 1f1b or gpipe (LOOM_PP_SCHEDULE)"},
    {"offload", CONFIG_STR, offsetof(struct opts, offload), "spec", 1, 0,
     "optimizer offload: spec (train.offload_optimizer), on, off, sync (on, with "
     "synchronous copies) or delayed (on, each update one step late, overlapping the next "
     "step: different numerics); on/sync/delayed also work on cpu (tests)"},
    {"offload-chunk-kib", CONFIG_INT, offsetof(struct opts, offload_chunk_kib), "65536", 4, 1 << 24,
     "optimizer offload: pipeline chunk of the transfer buffer, KiB"},
    {"no-save", CONFIG_BOOL, offsetof(struct opts, no_save), "0", 0, 0,
     "do not write checkpoints; for benchmarks of models whose checkpoint would not fit the "
     "disk"},
    {"rank-steps", CONFIG_BOOL, offsetof(struct opts, rank_steps), "0", 0, 0,
     "ranks other than 0 write {\"type\":\"rank_step\"} timing lines on stdout (set by "
     "loom-agent: LOOM_RANK_STEPS=1)"},
    {"bench-gemm", CONFIG_BOOL, offsetof(struct opts, bench_gemm), "0", 0, 0,
     "measure the cpu backend's fp32 GEMM peak (about 0.5 s, --threads), print "
     "{\"type\":\"cpu_peak\",\"gflops\":..} and exit (run by loom-agent at start)"},
    /* fine-tuning contract (docs/engine.md "Hugging Face models") */
    {"init-from", CONFIG_STR, offsetof(struct opts, hf.init_from), NULL, 1, 0,
     "Hugging Face model directory to load (no --spec needed) for the modes below"},
    {"score-tokens", CONFIG_STR, offsetof(struct opts, hf.score), NULL, 1, 0,
     "print {\"type\":\"score\",\"logprobs\":[null,..]} for these comma-separated token ids"},
    {"generate-tokens", CONFIG_STR, offsetof(struct opts, hf.generate), NULL, 1, 0,
     "print {\"type\":\"generate\",\"tokens\":[..]}: new tokens after this prompt"},
    {"max-new-tokens", CONFIG_INT, offsetof(struct opts, hf.max_new), "16", 0, 1 << 20,
     "tokens --generate-tokens adds"},
    {"temperature", CONFIG_DOUBLE, offsetof(struct opts, hf.temperature), "0", 0, 100,
     "sampling temperature (0: greedy)"},
    {"top-p", CONFIG_DOUBLE, offsetof(struct opts, hf.top_p), "1", 0, 1, "nucleus sampling mass"},
    {"seed", CONFIG_INT, offsetof(struct opts, hf.seed), "0", 0, 9e15, "sampling seed"},
    {"generate-recompute", CONFIG_BOOL, offsetof(struct opts, hf.recompute), "0", 0, 0,
     "debug: generate by re-running the whole forward per token instead of the KV cache (what "
     "a backend without decode operations does)"},
    {"export-hf", CONFIG_STR, offsetof(struct opts, hf.export_hf), NULL, 1, 0,
     "write the model as a Hugging Face directory (config, safetensors shards + index, "
     "tokenizer files)"},
    {"export-lora", CONFIG_STR, offsetof(struct opts, export_lora), NULL, 1, 0,
     "with train.lora: write the trained adapter as a PEFT directory (adapter_config.json, "
     "adapter_model.safetensors) here at the end"},
    {"export-shard-mb", CONFIG_DOUBLE, offsetof(struct opts, hf.shard_mb), "5000", 0.001, 1e9,
     "--export-hf / export.hf: most MB of tensors per safetensors file"},
};
#define NTABLE (sizeof table / sizeof *table)

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
    char *buf = fs_read_file(path, 0, len);
    if (!buf) snprintf(err, errlen, "cannot open spec %s: %s", path, strerror(errno));
    return buf;
}

/* ---- data and checkpoint adapters ---- */

struct data_src {
    struct data_loader *dl;
    int dp_rank;
    /* train.packing "document": documents end at eos; starts[B*T] (owned by the train
     * source, shared with val) tells the backend where each row's document starts */
    struct backend *be;
    int32_t *starts;
    int64_t eos;
    int B, T;
};

static int data_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                      size_t errlen) {
    struct data_src *d = user;
    int rc = data_loader_batch(d->dl, step, micro, d->dp_rank, in, tg, err, errlen);
    if (rc != 0 || !d->starts) return rc;
    /* a document starts at a row's first position and after every EOS */
    for (int b = 0; b < d->B; b++)
        for (int t = 0; t < d->T; t++) {
            size_t r = (size_t)b * d->T + t;
            d->starts[r] = t == 0 ? 0 : in[r - 1] == d->eos ? t : d->starts[r - 1];
        }
    d->be->set_doc_starts(d->be->ctx, d->starts, d->B * d->T);
    return 0;
}

static int64_t data_step_loss_tokens(void *user, int64_t step) {
    return data_loader_step_loss_tokens(((struct data_src *)user)->dl, step);
}

struct worker {
    struct opts o;
    struct loom_spec spec;
    struct jobspec_derived der;
    struct engine *e;
    struct model *m;
    struct data_loader *train_dl, *val_dl;
    struct zero *z;       /* DP/ZeRO and the comm layer when world > 1 (worker/zero.h) */
    struct hf_spec hfs;   /* model.init_from / export.hf (worker/hf_spec.h) */
    struct par *par;      /* tp / pp > 1 (worker/par.h) */
    struct lora *lora;    /* train.lora (worker/lora.h) */
    char lora_init[1024]; /* model.init_from named a PEFT adapter: its directory */
    char ckpt_path[1024];
    char err[1024];
};

static int barrier_none(void *ctx) {
    (void)ctx;
    return 0;
}

/* train.lora: the frozen base is rebuilt from model.init_from / the seed on
 * every attempt, so a checkpoint holds the adapter state only. */
static int save_lora_checkpoint(struct worker *w, int64_t done) {
    struct engine *e = w->e;
    struct ckpt_writer *cw = NULL;
    json_t *man = NULL;
    struct ckpt_opts co = {.out_dir = w->o.out,
                           .rank = e->rank,
                           .world = e->world,
                           .barrier = w->z ? zero_barrier : barrier_none,
                           .barrier_ctx = w->z,
                           .keep = w->spec.checkpoint.keep};
    if (ckpt_begin(&co, done, &cw, w->err, sizeof w->err) != 0) return -1;
    if (lora_ckpt_add(w->lora, cw) != 0) {
        ckpt_abort(cw);
        return -1;
    }
    ckpt_set_rank_meta(cw, json_pack("{s:i, s:i, s:i, s:o}", "dp", e->dp_idx, "tp", e->tp_idx, "pp",
                                     e->pp_idx, "lora", lora_ckpt_meta(w->lora)));
    struct data_position pos;
    data_loader_position(w->train_dl, done, &pos);
    man = json_pack("{s:o, s:o, s:{s:s}, s:{s:i, s:i, s:i, s:i}, s:{s:I}, s:s}", "spec",
                    jobspec_to_json(&w->spec), "data", data_position_to_json(&pos), "rng", "seed",
                    "derived from train.seed; LoRA dropout masks from (seed, adapter, step, "
                    "micro-step)",
                    "layout", "dp", e->dp, "tp", e->tp, "pp", e->pp, "zero_stage",
                    w->spec.parallel.zero_stage, "train", "step", (json_int_t)done, "contents",
                    "lora");
    int rc = ckpt_commit(cw, man, w->ckpt_path, sizeof w->ckpt_path, w->err, sizeof w->err);
    if (rc == 0)
        hf_cli_emit(json_pack("{s:s, s:I, s:s}", "type", "checkpoint", "step", (json_int_t)done,
                              "path", w->ckpt_path));
    else
        log_error("checkpoint at step %lld: %s", (long long)done, w->err);
    json_decref(man);
    return rc;
}

static int save_checkpoint(void *user, int64_t done) {
    struct worker *w = user;
    struct engine *e = w->e;
    struct ckpt_writer *cw = NULL;
    int rc = -1;
    if (w->lora) return save_lora_checkpoint(w, done);
    size_t n = e->shard_n;
    float *master = malloc((n ? n : 1) * sizeof(float));
    float *mom_m = malloc((n ? n : 1) * sizeof(float));
    float *mom_v = malloc((n ? n : 1) * sizeof(float));
    json_t *man = NULL;
    if (!master || !mom_m || !mom_v) goto out;
    engine_opt_read(e, ENGINE_OPT_MASTER, master, 0, n);
    engine_opt_read(e, ENGINE_OPT_M, mom_m, 0, n);
    engine_opt_read(e, ENGINE_OPT_V, mom_v, 0, n);
    struct ckpt_opts co = {.out_dir = w->o.out,
                           .rank = e->rank,
                           .world = e->world,
                           .barrier = w->z ? zero_barrier : barrier_none,
                           .barrier_ctx = w->z,
                           .keep = w->spec.checkpoint.keep};
    if (ckpt_begin(&co, done, &cw, w->err, sizeof w->err) != 0) goto out;
    if (ckpt_add_f32(cw, "params", master, n) != 0 || ckpt_add_f32(cw, "adam_m", mom_m, n) != 0 ||
        ckpt_add_f32(cw, "adam_v", mom_v, n) != 0) {
        ckpt_abort(cw);
        goto out;
    }
    ckpt_set_rank_meta(cw, json_pack("{s:i, s:i, s:i, s:I, s:I}", "dp", e->dp_idx, "tp", e->tp_idx,
                                     "pp", e->pp_idx, "offset", (json_int_t)e->shard_off, "count",
                                     (json_int_t)e->shard_n));
    struct data_position pos;
    data_loader_position(w->train_dl, done, &pos);
    man = json_pack("{s:o, s:o, s:{s:s}, s:{s:i, s:i, s:i, s:i}, s:{s:I}}", "spec",
                    jobspec_to_json(&w->spec), "data", data_position_to_json(&pos), "rng", "seed",
                    "derived from train.seed; no stochastic layers", "layout", "dp", e->dp, "tp",
                    e->tp, "pp", e->pp, "zero_stage", w->spec.parallel.zero_stage, "train", "step",
                    (json_int_t)done);
    rc = ckpt_commit(cw, man, w->ckpt_path, sizeof w->ckpt_path, w->err, sizeof w->err);
    if (rc == 0)
        hf_cli_emit(json_pack("{s:s, s:I, s:s}", "type", "checkpoint", "step", (json_int_t)done,
                              "path", w->ckpt_path));
    else
        log_error("checkpoint at step %lld: %s", (long long)done, w->err);
out:
    json_decref(man);
    free(master);
    free(mom_m);
    free(mom_v);
    return rc;
}

/* Load the newest complete checkpoint; returns the step to start at (0 when
 * none), or -1 on failure (message in w->err). Any world size and ZeRO stage
 * may have written it: zero_load_checkpoint reshards (worker/zero.h). */
static int64_t resume(struct worker *w) {
    struct engine *e = w->e;
    char path[1024];
    int64_t step = 0;
    int found = ckpt_find_latest(w->o.out, 0, path, sizeof path, &step);
    if (found <= 0) return found < 0 ? -1 : 0;
    struct ckpt_reader *r = NULL;
    if (ckpt_open(path, 0, &r, w->err, sizeof w->err) != 0) return -1;
    const json_t *data = json_object_get(ckpt_manifest(r), "data");
    struct data_position pos;
    if (data && data_position_from_json(data, &pos, w->err, sizeof w->err) == 0 &&
        data_loader_check_position(w->train_dl, &pos, w->err, sizeof w->err) != 0)
        log_warn("resuming from %s although the data changed: %s", path, w->err);
    int is_lora = json_object_get(ckpt_manifest(r), "contents") != NULL;
    ckpt_close(r);
    if (!!is_lora != !!w->lora) {
        snprintf(w->err, sizeof w->err,
                 "%.700s is a %s checkpoint but this spec %s train.lora: use a new --out", path,
                 is_lora ? "LoRA adapter" : "full-model", w->lora ? "has" : "has no");
        return -1;
    }
    if (w->lora ? lora_ckpt_load(w->lora, path, e->rank, w->err, sizeof w->err) != 0
                : zero_load_checkpoint(e, path, w->err, sizeof w->err) != 0)
        return -1;
    log_info("resumed from %s (step %lld)", path, (long long)step);
    return step;
}

/* ---- main ---- */

/* One {"type":"memory"} line at start: the planner's per-GPU estimate beside
 * what this rank allocated, by category, so the gap shows in every run
 * (issue 9). The engine allocates its arenas at start-up and nothing inside a
 * step, so the allocation is the peak of these categories. */
static void emit_memory_plan(struct worker *w, const struct loom_spec *s) {
    struct planner_estimate est;
    struct loom_error perr;
    memset(&perr, 0, sizeof perr);
    /* the layout this worker runs (--offload may override the spec; the
     * jobspec allows offload only with device cuda) */
    struct loom_spec *ps = malloc(sizeof *ps);
    if (!ps) return;
    *ps = *s;
    ps->train.offload_optimizer = w->e->offload && s->resources.device == JOBSPEC_DEV_CUDA;
    int prc = planner_estimate_job(ps, NULL, 0, &est, &perr);
    /* host side: the planner's offload share of one rank for this engine's
     * element size (also when --offload forces it on a cpu run) */
    double host_plan = 0;
    if (prc == 0 && w->e->offload) {
        struct planner_estimate eh;
        ps->resources.device = JOBSPEC_DEV_CUDA;
        ps->train.precision =
            w->e->be->dtype == BACKEND_F32 ? JOBSPEC_PREC_FP32 : JOBSPEC_PREC_BF16;
        ps->train.offload_optimizer = 1;
        if (planner_estimate_job(ps, NULL, 0, &eh, &perr) == 0) host_plan = eh.mem.host_per_rank;
    }
    free(ps);
    if (prc != 0) {
        log_warn("planner estimate unavailable: %s", perr.message);
        return;
    }
    const double g = 1024.0 * 1024.0 * 1024.0;
    const struct engine_mem *m = &w->e->mem;
    double have[5] = {(double)m->params, (double)m->grads, (double)m->optimizer,
                      (double)m->activations, (double)m->comm};
    double plan[5] = {est.mem.params, est.mem.grads, est.mem.optimizer, est.mem.activations,
                      est.mem.comm};
    static const char *const names[5] = {"params", "grads", "optimizer", "activations", "comm"};
    json_t *pj = json_object(), *aj = json_object();
    double ptot = 0, atot = 0;
    for (int i = 0; i < 5; i++) {
        json_object_set_new(pj, names[i], json_real(plan[i] / g));
        json_object_set_new(aj, names[i], json_real(have[i] / g));
        ptot += plan[i];
        atot += have[i];
    }
    /* host memory: the planner's offload share of one rank beside what this
     * rank's offload allocated (master, moments, transfer buffer) */
    hf_cli_emit(json_pack("{s:s, s:i, s:o, s:o, s:f, s:f, s:{s:f, s:f}}", "type", "memory", "rank",
                          w->e->rank, "planned_gib", pj, "allocated_gib", aj, "planned_total_gib",
                          ptot / g, "allocated_total_gib", atot / g, "host_gib", "planned",
                          host_plan / g, "allocated", (double)m->host / g));
    if (m->host)
        log_info("memory: host (optimizer offload) planner %.3f GiB, allocated %.3f GiB",
                 host_plan / g, (double)m->host / g);
    log_info("memory: planner %.3f GiB, allocated %.3f GiB (params %.3f/%.3f, grads %.3f/%.3f, "
             "optimizer %.3f/%.3f, activations %.3f/%.3f GiB planned/allocated)",
             ptot / g, atot / g, plan[0] / g, have[0] / g, plan[1] / g, have[1] / g, plan[2] / g,
             have[2] / g, plan[3] / g, have[3] / g);
}

/* ---- the run, in stages ---- */

/* What the stages hand each other. Each stage returns 0 to go on, or the
 * process exit code (api/exit_codes.h) after reporting the error; the last
 * one returns LOOM_EXIT_OK or LOOM_EXIT_STOPPED. */
struct run {
    struct worker *w;
    const char *device; /* "cpu" or "cuda" */
    struct backend *be; /* until build_engine hands it to the engine */
    struct data_src train_src, val_src;
    struct model_opts mo;
    struct train_opts to;
    int64_t start, end; /* first step, one past the last of this process */
    int train_rc;       /* train_run: 0 finished, 1 stopped */
    struct train_step_info last;
    double secs;
};

static int fail(struct worker *w, int code, const char *ecode, const char *msg) {
    hf_cli_error(ecode, msg ? msg : w->err);
    return code;
}

/* model.init_from naming a PEFT adapter directory (adapter_config.json):
 * the base is its base_model_name_or_path (an HF directory) and the adapters
 * continue from it (resume_stage). Rewrites the spec text's init_from to
 * the base and keeps the adapter directory in w->lora_init. 0, or -1 with a
 * message in w->err. */
static int peft_init_redirect(struct worker *w, char **text, size_t *len) {
    json_error_t je;
    json_t *j = json_loadb(*text, *len, 0, &je);
    const char *init = json_string_value(json_object_get(json_object_get(j, "model"), "init_from"));
    char cfgp[1100];
    struct stat st;
    int rc = 0;
    if (!init || snprintf(cfgp, sizeof cfgp, "%s/adapter_config.json", init) >= (int)sizeof cfgp ||
        stat(cfgp, &st) != 0)
        goto out; /* not a PEFT directory (or no spec JSON: the parser reports it) */
    json_t *cfg = json_load_file(cfgp, 0, &je);
    const char *base = json_string_value(json_object_get(cfg, "base_model_name_or_path"));
    if (!base || !*base) {
        snprintf(w->err, sizeof w->err,
                 "model.init_from %.300s is a PEFT adapter but %.400s has no "
                 "base_model_name_or_path (the base model's HF directory)",
                 init, cfgp);
        json_decref(cfg);
        rc = -1;
        goto out;
    }
    snprintf(w->lora_init, sizeof w->lora_init, "%s", init);
    json_object_set_new(json_object_get(j, "model"), "init_from", json_string(base));
    json_decref(cfg);
    char *nt = json_dumps(j, JSON_COMPACT);
    if (!nt) {
        snprintf(w->err, sizeof w->err, "out of memory");
        rc = -1;
        goto out;
    }
    free(*text);
    *text = nt;
    *len = strlen(nt);
out:
    json_decref(j);
    return rc;
}

/* Read and validate the spec; check the device and the world size. */
static int load_spec(struct run *r) {
    struct worker *w = r->w;
    struct opts *o = &w->o;
    struct loom_error le;
    size_t len = 0;
    char *text = read_file(o->spec, &len, w->err, sizeof w->err);
    if (!text) return fail(w, LOOM_EXIT_BAD_SPEC, "SPEC_UNREADABLE", NULL);
    if (peft_init_redirect(w, &text, &len) != 0) {
        free(text);
        return fail(w, LOOM_EXIT_BAD_SPEC, "LORA_INIT_INVALID", NULL);
    }
    int prc = hf_spec_prepare(&text, &len, &w->hfs, &le) != 0 ||
              jobspec_parse_text(&w->spec, text, len, 0, &le) != 0;
    free(text);
    if (prc != 0) return fail(w, LOOM_EXIT_BAD_SPEC, le.code, le.message);
    /* the settings an HF init_from gives that the spec cannot express */
    if (hf_spec_apply(&w->hfs, &w->spec, &le) != 0)
        return fail(w, LOOM_EXIT_BAD_SPEC, le.code, le.message);
    jobspec_derive(&w->spec, &w->der);
    const struct loom_spec *s = &w->spec;
    r->device = o->device && *o->device ? o->device : jobspec_device_name(s->resources.device);
    if (strcmp(r->device, "cpu") != 0 && strcmp(r->device, "cuda") != 0) {
        snprintf(w->err, sizeof w->err, "--device %s: expected cpu or cuda", r->device);
        return fail(w, LOOM_EXIT_BAD_SPEC, "INVALID_DEVICE", NULL);
    }
    if (lora_precision_check(s, r->device, w->err, sizeof w->err) != 0)
        return fail(w, LOOM_EXIT_BAD_SPEC, "PRECISION_UNSUPPORTED", NULL);
    if (w->der.world != o->world) {
        snprintf(w->err, sizeof w->err,
                 "the spec's layout dp=%d x tp=%d x pp=%d needs world=%d but this worker has "
                 "world=%ld (pass --world/--rank or LOOM_WORLD/LOOM_RANK)",
                 s->parallel.dp, s->parallel.tp, s->parallel.pp, w->der.world, o->world);
        return fail(w, LOOM_EXIT_BAD_SPEC, "WORLD_MISMATCH", NULL);
    }
    if (s->parallel.zero_stage > 0 && s->parallel.dp == 1)
        log_info("zero_stage %d with dp=1: nothing to shard", s->parallel.zero_stage);
    return 0;
}

static int open_backend(struct run *r) {
    struct opts *o = &r->w->o;
    if (strcmp(r->device, "cuda") == 0) {
#ifdef LOOM_HAVE_CUDA
        /* the agent sets CUDA_VISIBLE_DEVICES to this rank's GPU: ordinal 0 */
        r->be = backend_cuda_new_tuned(0, &o->tune.cuda);
        if (!r->be)
            return fail(r->w, LOOM_EXIT_FAILED, "DEVICE_UNAVAILABLE",
                        "the CUDA backend could not start (see stderr)");
#else
        return fail(r->w, LOOM_EXIT_BAD_SPEC, "CUDA_NOT_BUILT",
                    "--device cuda requested but this loom-worker was built without CUDA; use "
                    "--device cpu or rebuild with CUDA");
#endif
    } else {
        r->be = backend_cpu_new_tuned((int)o->threads, &o->tune.cpu);
        if (!r->be) return LOOM_EXIT_FAILED;
        cpu_peak_from_env(r->be); /* the agent's calibration: a real mfu on cpu */
    }
    return 0;
}

/* The train shards and, when the spec names them, the validation shards. */
static int open_data(struct run *r) {
    struct worker *w = r->w;
    const struct loom_spec *s = &w->spec;
    struct data_loader_opts dlo = {.pattern = s->data.train,
                                   .vocab_size = (uint32_t)s->model.vocab_size,
                                   .B = s->train.micro_batch,
                                   .T = s->model.seq_len,
                                   .dp_size = s->parallel.dp,
                                   .grad_accum = (int)w->der.grad_accum,
                                   .seed = s->train.seed,
                                   .shuffle = 1};
    int64_t eos = -1;
    if (s->train.packing == JOBSPEC_PACK_DOCUMENT) {
        /* attention kept within documents: the backend's segment support, and where
         * documents end (the EOS id prepare recorded in meta.json beside the shards) */
        if (!r->be->set_doc_starts || s->parallel.tp > 1 || s->parallel.pp > 1) {
            snprintf(w->err, sizeof w->err,
                     "train.packing \"document\" (attention kept within documents) is built on "
                     "the cpu and cuda backends without tp/pp only (device %s%s, tp %d, pp %d); "
                     "use \"concat\" (the default)",
                     r->device, r->be->set_doc_starts ? "" : " has no document attention",
                     s->parallel.tp, s->parallel.pp);
            return fail(w, LOOM_EXIT_BAD_SPEC, "PACKING_UNSUPPORTED", NULL);
        }
        if (data_meta_eos(s->data.train, &eos, w->err, sizeof w->err) != 0)
            return fail(w, LOOM_EXIT_BAD_SPEC, "DATA_INVALID", NULL);
    }
    if (data_loader_open(&dlo, &w->train_dl, w->err, sizeof w->err) != 0) {
        /* Text, jsonl, chat and completion data are tokenized offline (docs/data.md). */
        size_t l = strlen(w->err);
        if (s->data.format != JOBSPEC_FMT_BIN && l < sizeof w->err)
            snprintf(w->err + l, sizeof w->err - l,
                     " (data.format %s: the worker reads shards; tokenize with `loom-data "
                     "prepare --tokenizer PATH --format %s` and point data.train at its "
                     "train_*.bin)",
                     jobspec_data_format_name(s->data.format),
                     jobspec_data_format_name(s->data.format));
        return fail(w, LOOM_EXIT_BAD_SPEC, "DATA_INVALID", NULL);
    }
    /* A loss on part of the tokens needs the .mask shards prepare writes: without them the
     * run would silently train on every token. */
    if (s->train.loss_on != JOBSPEC_LOSS_ALL && data_loader_num_masked(w->train_dl) == 0) {
        snprintf(w->err, sizeof w->err,
                 "train.loss_on \"%s\" needs loss-mask shards (train_NNN.mask beside "
                 "train_NNN.bin, written by loom-data prepare) but %.200s has none",
                 s->train.loss_on == JOBSPEC_LOSS_ASSISTANT ? "assistant" : "completion",
                 s->data.train);
        return fail(w, LOOM_EXIT_BAD_SPEC, "DATA_INVALID", NULL);
    }
    r->train_src = (struct data_src){.dl = w->train_dl};
    if (eos >= 0) {
        size_t n = (size_t)s->train.micro_batch * (size_t)s->model.seq_len;
        r->train_src = (struct data_src){
            w->train_dl,     0, r->be, calloc(n, sizeof(int32_t)), eos, s->train.micro_batch,
            s->model.seq_len};
        if (!r->train_src.starts) return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY", NULL);
    }
    if (s->data.val[0]) {
        struct data_loader_opts vo = dlo;
        vo.pattern = s->data.val;
        vo.grad_accum = 1;
        vo.shuffle = 0;
        if (data_loader_open(&vo, &w->val_dl, w->err, sizeof w->err) != 0)
            return fail(w, LOOM_EXIT_BAD_SPEC, "DATA_INVALID", NULL);
        r->val_src = r->train_src;
        r->val_src.dl = w->val_dl;
    }
    return 0;
}

/* Optimizer offload when --offload or the spec asks for it. */
static int setup_offload(struct run *r) {
    struct worker *w = r->w;
    struct opts *o = &w->o;
    const struct loom_spec *s = &w->spec;
    int delayed = strcmp(o->offload, "delayed") == 0;
    int offload = strcmp(o->offload, "on") == 0 || strcmp(o->offload, "sync") == 0 || delayed ||
                  (strcmp(o->offload, "spec") == 0 && s->train.offload_optimizer);
    if (!offload) return 0;
    static const char *const pins[] = {"register", "alloc", "off"};
    int pin = -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(o->tune.offload.pin, pins[i]) == 0) pin = i;
    int isa = oadam_isa_parse(o->tune.offload.isa);
    if (pin < 0 || isa < 0) {
        snprintf(w->err, sizeof w->err,
                 "offload-pin must be register, alloc or off (got %s); offload-isa auto, avx512, "
                 "avx2 or baseline (got %s)",
                 o->tune.offload.pin, o->tune.offload.isa);
        return fail(w, LOOM_EXIT_BAD_SPEC, "BAD_OPTION", NULL);
    }
    struct offload_opts oo = {.chunk_bytes = (size_t)o->offload_chunk_kib << 10,
                              .sync = strcmp(o->offload, "sync") == 0,
                              .threads = (int)o->threads,
                              .isa = isa,
                              .pin = pin,
                              .delayed = delayed};
    /* the agent sets OMP_NUM_THREADS for cpu ranks only: without it (or
     * --threads) the node's cores are split among its ranks, so that two
     * ranks' CPU updates do not oversubscribe the node */
    const char *omp = getenv("OMP_NUM_THREADS");
    if (!oo.threads && !(omp && *omp)) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int local = s->resources.gpus_per_node > 0 ? s->resources.gpus_per_node : 1;
        if (local > w->der.world) local = w->der.world;
        oo.threads = cores > local ? (int)(cores / local) : 1;
    }
    if (engine_offload_enable(w->e, &oo) != 0)
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY",
                    "cannot set up the optimizer offload (see stderr)");
    log_info("optimizer offload on: fp32 master and moments in host memory, AdamW on the CPU (%d "
             "threads; 0: OpenMP default)",
             oo.threads);
    return 0;
}

/* train.lora: what is refused before anything is allocated. */
static int lora_check(struct run *r) {
    struct worker *w = r->w;
    const struct loom_spec *s = &w->spec;
    if (!s->train.lora.enabled) {
        if (w->o.export_lora)
            return fail(w, LOOM_EXIT_BAD_SPEC, "LORA_UNSUPPORTED",
                        "--export-lora needs train.lora in the spec");
        if (w->lora_init[0])
            return fail(w, LOOM_EXIT_BAD_SPEC, "LORA_UNSUPPORTED",
                        "model.init_from names a PEFT adapter but the spec has no train.lora");
        return 0;
    }
    /* tp: every rank quantizes whole tensors and keeps its shard's part
     * (worker/nf4.c nf4_attach); a shard boundary inside a 64-weight block
     * is refused (docs/engine.md "QLoRA") */
    if (s->train.quantize_base == JOBSPEC_QUANT_NF4 &&
        nf4_tp_check(&s->model, s->parallel.tp, w->err, sizeof w->err) != 0)
        return fail(w, LOOM_EXIT_BAD_SPEC, "LORA_UNSUPPORTED", NULL);
    /* before the world is joined, so that a refused rank does not leave the
     * others waiting at the rendezvous */
    if (s->parallel.zero_stage > 2) {
        snprintf(w->err, sizeof w->err,
                 "train.lora shards the adapter state with zero_stage 0-2 (the frozen base has "
                 "no optimizer state for stage 3 to shard); this spec has zero_stage=%d "
                 "(tp=%d pp=%d)",
                 s->parallel.zero_stage, s->parallel.tp, s->parallel.pp);
        return fail(w, LOOM_EXIT_BAD_SPEC, "LORA_UNSUPPORTED", NULL);
    }
    return 0;
}

/* train.lora: the adapters over the model, after the world is joined (the
 * dp communicator carries their gradients); refused where unsupported. */
static int lora_stage(struct run *r) {
    struct worker *w = r->w;
    const struct loom_spec *s = &w->spec;
    if (!s->train.lora.enabled) return 0;
    const char *tg[JOBSPEC_LORA_TARGETS_MAX];
    for (int i = 0; i < s->train.lora.n_targets; i++)
        tg[i] = s->train.lora.targets[i];
    struct lora_opts lo = {.rank = s->train.lora.rank,
                           .alpha = s->train.lora.alpha,
                           .dropout = s->train.lora.dropout,
                           .targets = tg,
                           .n_targets = s->train.lora.n_targets,
                           .seed = (uint64_t)s->train.seed,
                           .dp = w->z ? zero_dp_comm(w->z) : NULL,
                           .zero_stage = s->parallel.zero_stage,
                           .world = w->z ? zero_world_comm(w->z) : NULL};
    const char *code = "LORA_UNSUPPORTED";
    w->lora = lora_new(w->m, &lo, &code, w->err, sizeof w->err);
    if (!w->lora)
        return fail(w, strcmp(code, "OUT_OF_MEMORY") == 0 ? LOOM_EXIT_FAILED : LOOM_EXIT_BAD_SPEC,
                    code, NULL);
    w->m->lora = w->lora;
    log_info("lora: %d adapters of rank %d (scale %g, %zu parameters); base weights frozen",
             lora_count(w->lora), lora_rank(w->lora), lora_scale(w->lora), lora_numel(w->lora));
    return 0;
}

/* Start-up memory check (worker/memcheck.h): the planner's estimate for this
 * rank's layout against the memory free now, before the engine allocates.
 * cuda: the device (cudaMemGetInfo; the CUDA context exists by now, so the
 * planner's 1 GiB context reserve is left out of the need) and, with the
 * optimizer offloaded, host memory for its share; cpu: the node's
 * MemAvailable. Returns 0 or the exit code after reporting OUT_OF_MEMORY. */
static int memory_check(struct run *r) {
    struct worker *w = r->w;
    const struct opts *o = &w->o;
    const struct loom_spec *s = &w->spec;
    int cuda = strcmp(r->device, "cuda") == 0;
    int offload = strcmp(o->offload, "on") == 0 || strcmp(o->offload, "sync") == 0 ||
                  (strcmp(o->offload, "spec") == 0 && s->train.offload_optimizer);
    struct loom_spec *ps = malloc(sizeof *ps);
    if (!ps) return 0;
    *ps = *s;
    ps->train.offload_optimizer = offload && cuda;
    struct planner_estimate est;
    struct loom_error perr;
    memset(&perr, 0, sizeof perr);
    int prc = planner_estimate_job(ps, NULL, 0, &est, &perr);
    free(ps);
    if (prc != 0) {
        log_warn("memory check skipped: planner estimate unavailable: %s", perr.message);
        return 0;
    }
    const double g = 1024.0 * 1024.0 * 1024.0;
    char detail[200];
    snprintf(detail, sizeof detail,
             "params %.2f, grads %.2f, optimizer %.2f, activations %.2f, comm %.2f, workspace "
             "%.2f GiB",
             est.mem.params / g, est.mem.grads / g, est.mem.optimizer / g, est.mem.activations / g,
             est.mem.comm / g, est.mem.workspace / g);
    struct memcheck_in in = {.need = est.mem.total - est.mem.reserved, .detail = detail};
    double hfree = 0, htotal = 0;
    int have_host = memcheck_host(NULL, &hfree, &htotal) == 0;
    if (cuda) {
#ifdef LOOM_HAVE_CUDA
        struct cuda_mem_report cm;
        if (r->be && backend_cuda_mem(r->be, &cm) == 0) {
            in.what = "device (cuda)";
            in.source = "cudaMemGetInfo";
            in.free = (double)cm.device_free;
            in.total = (double)cm.device_total;
        }
#endif
    } else if (have_host) {
        in.what = "host (cpu device)";
        in.source = "MemAvailable of /proc/meminfo";
        in.free = hfree;
        in.total = htotal;
    }
    log_info("memory check: planner %.3f GiB for this rank, %.3f GiB free (%s)", in.need / g,
             in.free / g, in.source ? in.source : "unknown");
    if (in.what && memcheck_judge(&in, w->err, sizeof w->err) != 0)
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY", NULL);
    if (cuda && offload && have_host && est.mem.host_per_rank > 0) {
        struct memcheck_in h = {.what = "host (optimizer offload)",
                                .source = "MemAvailable of /proc/meminfo",
                                .need = est.mem.host_per_rank,
                                .free = hfree,
                                .total = htotal};
        if (memcheck_judge(&h, w->err, sizeof w->err) != 0)
            return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY", NULL);
    }
    return 0;
}

/* The engine (it takes the backend), the offload and the model. */
static int build_engine(struct run *r) {
    struct worker *w = r->w;
    struct opts *o = &w->o;
    const struct loom_spec *s = &w->spec;
    /* train.quantize_base nf4: no resident params window; nf4_attach gives
     * every tensor a view (worker/nf4.h) */
    int nf4 = s->train.lora.enabled && s->train.quantize_base == JOBSPEC_QUANT_NF4;
    struct engine_place p = {.rank = (int)o->rank,
                             .world = (int)o->world,
                             .local_rank = (int)o->local_rank,
                             .tp = s->parallel.tp,
                             .dp = s->parallel.dp,
                             .pp = s->parallel.pp,
                             /* optimizer state once the shard is known (ZeRO) */
                             .opt_later = 1,
                             /* with other ranks, the parameter and gradient windows
                              * are sized by ZeRO before the weights exist, so a
                              * sharded rank never holds the whole model */
                             .windows_later = o->world > 1 || nf4,
                             .tp_host_sync = !o->tune.comm.tp_stream,
                             /* train.lora: the base is frozen (no grads, master, moments) */
                             .frozen = s->train.lora.enabled};
    int lc = lora_check(r);
    if (lc) return lc;
    int mc = memory_check(r);
    if (mc) return mc;
    w->e = engine_new(&s->model, &p, r->be);
    r->be = NULL; /* the engine's now, freed by engine_new on failure too */
    if (!w->e) return LOOM_EXIT_FAILED;
    if (nf4) { /* the quantizer's knobs (tuning rows nf4-*): its threads nf4-threads, else
                * --threads, else the node's cores split among its ranks (dp / pp ranks each
                * quantize their base at the same time) */
        const struct nf4_tuning *nt = &o->tune.nf4;
        long th = nt->threads ? nt->threads : o->threads;
        if (!th) {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            long local = s->resources.gpus_per_node > 0 ? s->resources.gpus_per_node : 1;
            if (local > o->world) local = o->world > 0 ? o->world : 1;
            th = cores > local ? cores / local : 1;
        }
        nf4_configure(&(struct nf4_opts){.fast = nt->fast, .threads = th, .overlap = nt->overlap});
    }
    if (nf4 && nf4_attach(w->e, w->err, sizeof w->err) != 0)
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY", NULL);
    if (nf4) {
        int nq;
        size_t nw, nb;
        nf4_stats(w->e->nf4, &nq, &nw, &nb);
        log_info("qlora: %d block linear weights (%zu values) in NF4, %.1f MiB", nq, nw,
                 (double)nb / 1048576.0);
    }
    int code = setup_offload(r);
    if (code) return code;
    /* world 1: the whole buffer is the shard; allocated before the weights are
     * initialised so that a bf16 backend keeps their unrounded fp32 master */
    if (o->world == 1 && engine_opt_init(w->e) != 0)
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY",
                    "cannot allocate the optimizer state (see stderr)");
    r->train_src.dp_rank = r->val_src.dp_rank = w->e->dp_idx;
    enum jobspec_recompute rc = s->train.recompute;
    r->mo = (struct model_opts){.B = s->train.micro_batch,
                                .T = s->model.seq_len,
                                .threads = (int)o->threads,
                                .recompute = rc == JOBSPEC_RECOMPUTE_FULL ? MODEL_RECOMPUTE_FULL
                                             : rc == JOBSPEC_RECOMPUTE_SELECTIVE
                                                 ? MODEL_RECOMPUTE_SELECTIVE
                                                 : MODEL_RECOMPUTE_NONE};
    if (s->train.recompute_budget_gib > 0) {
        /* {"budget_gib": N}: as many blocks of this stage as fit keep every
         * activation, the others recompute in full (the planner's memory
         * model, checked against the allocations by unit.api.planner_engine) */
        int keep = 0;
        double floor_gib = 0;
        struct loom_error perr;
        if (planner_recompute_keep(s, w->e->pp_idx, &keep, &floor_gib, &perr) != 0)
            return fail(w, LOOM_EXIT_BAD_SPEC, perr.code, perr.message);
        r->mo.recompute = MODEL_RECOMPUTE_FULL;
        r->mo.keep = keep;
        int l0, l1;
        model_stage_layers(&s->model, s->parallel.pp, w->e->pp_idx, &l0, &l1);
        log_info("recompute budget %.2f GiB: %d of %d blocks of this stage kept, the rest "
                 "recomputed (every block recomputed: %.2f GiB)",
                 s->train.recompute_budget_gib, keep, l1 - l0, floor_gib);
    }
    /* fp8 LoRA on one GPU: the activations once fp8_stage has freed the bf16
     * base (worker/fp8base.h), so that base and activations are never both
     * on the device */
    r->mo.acts_later = s->train.precision == JOBSPEC_PREC_FP8 && s->train.lora.enabled &&
                       o->world == 1 && !o->tune.cuda.fp8_base_bf16;
    w->m = model_new_ex(w->e, &r->mo);
    if (!w->m)
        return fail(w, LOOM_EXIT_BAD_SPEC, "UNSUPPORTED",
                    "the model could not be built for this layout (see stderr)");
    return 0;
}

/* world > 1: join the attempt (DP/ZeRO, then tp/pp); then the optimizer
 * state of this rank's shard and the initial weights. */
static int join_world(struct run *r) {
    struct worker *w = r->w;
    struct opts *o = &w->o;
    const struct loom_spec *s = &w->spec;
    if (o->world > 1) {
        struct zero_setup_opts zo = {.rank = (int)o->rank,
                                     .world = (int)o->world,
                                     .tp = s->parallel.tp,
                                     .dp = s->parallel.dp,
                                     .pp = s->parallel.pp,
                                     .zero_stage = s->parallel.zero_stage,
                                     .device = r->device,
                                     .rdzv = o->rdzv,
                                     .token = getenv("LOOM_RDZV_TOKEN"), /* agent contract */
                                     .micro_tokens = r->mo.B * r->mo.T,
                                     .tune = &o->tune.comm};
        w->z = zero_setup(w->e, &zo, w->err, sizeof w->err);
        if (!w->z) return fail(w, LOOM_EXIT_FAILED, "COMM_FAILED", NULL);
        if (s->parallel.tp > 1 || s->parallel.pp > 1) {
            w->par = par_setup(w->e, w->z, w->m, &r->mo, o->pp_schedule, w->err, sizeof w->err);
            if (!w->par) return fail(w, LOOM_EXIT_BAD_SPEC, "UNSUPPORTED", NULL);
        }
    }
    if (engine_opt_init(w->e) != 0) /* zero_new set a shard, or stage 0: everything */
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY",
                    "cannot allocate the optimizer state (see stderr)");
    /* into the windows, views and master that now exist (world > 1: this
     * rank's share only; the master gets the unrounded fp32 values) */
    if (model_init_params(w->m, s->train.seed) != 0) return LOOM_EXIT_FAILED;
    return lora_stage(r);
}

/* A first attempt starts from model.init_from's weights (an HF directory);
 * a checkpoint in the run directory wins over them (a retried attempt). */
static int resume_stage(struct run *r) {
    struct loom_error le;
    /* a LoRA checkpoint holds the adapters only: the frozen base always
     * comes from init_from (out_dir NULL: loaded whatever the run dir holds) */
    if (r->w->hfs.hf) hf_set_threads(r->w->hfs.hf, (int)r->w->o.threads);
    if (hf_spec_init(&r->w->hfs, r->w->e, r->w->lora ? NULL : r->w->o.out, &le) != 0)
        return fail(r->w, LOOM_EXIT_BAD_SPEC, le.code, le.message);
    r->start = resume(r->w);
    if (r->start < 0) return fail(r->w, LOOM_EXIT_FAILED, "CHECKPOINT_INVALID", NULL);
    /* a PEFT adapter named by model.init_from: the adapters continue from it
     * (a checkpoint of this run, when there is one, wins) */
    if (r->start == 0 && r->w->lora && r->w->lora_init[0]) {
        if (lora_load_peft(r->w->lora, r->w->lora_init, r->w->err, sizeof r->w->err) != 0)
            return fail(r->w, LOOM_EXIT_BAD_SPEC, "LORA_INIT_INVALID", NULL);
        log_info("lora: adapters from the PEFT directory %s", r->w->lora_init);
    }
    return 0;
}

/* train.precision fp8: the block weights on the E4M3 path once they are
 * final (initialised, loaded from init_from or a checkpoint above): a frozen
 * base's copies made now, trained weights quantized at each use;
 * docs/engine.md "FP8". */
static int fp8_stage(struct run *r) {
    struct worker *w = r->w;
    if (w->spec.train.precision != JOBSPEC_PREC_FP8) return 0;
    int n = 0;
    size_t bytes = 0;
    if (model_fp8_freeze(w->m, w->o.tune.cuda.fp8_base_bf16, &n, &bytes) != 0)
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY",
                    "cannot make the fp8 copies of the block weights (see stderr)");
    if (n == 0)
        log_warn("fp8: no block linear weight has a shape the FP8 GEMM takes (multiples of 16), "
                 "or the fp8 tuning row is 0: the base runs in bf16");
    else
        log_info("fp8: %d block linear weights on the E4M3 path (%.1f MiB%s)", n,
                 (double)bytes / 1048576.0,
                 !w->lora     ? ": none kept, trained weights quantized at each use, weight "
                                "gradients in E4M3"
                 : w->e->fp8b ? " of W alone on the GPU; the bf16 base in host memory"
                              : " of W and W^T beside the bf16 base");
    if (model_alloc_acts(w->m) != 0)
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY",
                    "cannot allocate the activations (see stderr)");
    return 0;
}

static enum optim_schedule optim_schedule_of(enum jobspec_schedule s) {
    return s == JOBSPEC_SCHED_LINEAR     ? OPTIM_LINEAR
           : s == JOBSPEC_SCHED_CONSTANT ? OPTIM_CONSTANT
                                         : OPTIM_COSINE;
}

/* The train loop's options from the spec and the flags. */
static void make_train_opts(struct run *r) {
    struct worker *w = r->w;
    const struct loom_spec *s = &w->spec;
    struct train_opts *to = &r->to;
    memset(to, 0, sizeof *to);
    to->steps = s->train.steps;
    to->grad_accum = (int)w->der.grad_accum;
    to->global_batch_tokens = s->train.global_batch_tokens;
    to->optim = (struct optim_cfg){.lr = s->train.lr,
                                   .min_lr = s->train.min_lr,
                                   .warmup = s->train.warmup_steps,
                                   .steps = s->train.steps,
                                   .schedule = optim_schedule_of(s->train.schedule),
                                   .beta1 = s->train.beta1,
                                   .beta2 = s->train.beta2,
                                   .eps = s->train.eps,
                                   .weight_decay = s->train.weight_decay,
                                   .grad_clip = s->train.grad_clip};
    to->train = (struct train_source){data_batch, &r->train_src};
    if (data_loader_num_masked(w->train_dl) > 0) { /* mean over the counted targets */
        to->step_loss_tokens = data_step_loss_tokens;
        to->step_loss_tokens_user = &r->train_src;
    }
    if (w->par) par_train_opts(w->par, to);
    if (w->val_dl && s->train.eval_every > 0) {
        to->val = (struct train_source){data_batch, &r->val_src};
        to->eval_every = s->train.eval_every;
        int64_t avail = data_loader_steps_per_epoch(w->val_dl);
        to->eval_batches = s->train.eval_batches < avail ? s->train.eval_batches : avail;
        if (to->eval_batches < 1) to->eval_batches = 1;
    }
    to->save = w->o.no_save ? NULL : save_checkpoint;
    to->save_user = w;
    if (w->o.no_save) log_info("--no-save: no checkpoint will be written");
    to->save_every = s->checkpoint.every_steps;
    to->stop = &g_stop;
    to->out = w->e->rank == 0 ? stdout : NULL;
    to->rank_out = w->e->rank != 0 && w->o.rank_steps && w->o.tune.diag ? stdout : NULL;
    to->no_timing_sync = !w->o.tune.diag;
    to->diag_ab = w->o.tune.diag_ab;
    to->rank = w->e->rank;
    to->slow_ms = w->o.tune.debug_slow_rank == w->e->rank ? w->o.tune.debug_slow_ms : 0;
    to->flops_per_token = w->der.flops_per_token;
    r->end = w->o.steps > 0 && w->o.steps < to->steps ? w->o.steps : to->steps;
}

static int train(struct run *r) {
    struct worker *w = r->w;
    const struct loom_spec *s = &w->spec;
    struct train_opts *to = &r->to;
    make_train_opts(r);
    hf_cli_emit(json_pack("{s:s, s:s, s:s, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s}",
                          "type", "start", "job", s->name, "device", w->e->be->name, "rank",
                          w->e->rank, "world", w->e->world, "params", (json_int_t)w->der.n_params,
                          "steps", (json_int_t)to->steps, "start_step", (json_int_t)r->start,
                          "grad_accum", (json_int_t)to->grad_accum, "tokens_per_step",
                          (json_int_t)to->global_batch_tokens, "micro_batch", (json_int_t)r->mo.B,
                          "family", model_family_name(s->model.family), "out", w->o.out));
    emit_memory_plan(w, s);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int64_t run_steps = to->steps;
    to->steps = r->end; /* stop early for --steps; the schedule keeps the spec's length */
    int rc = r->start < r->end ? train_run(w->m, to, r->start, &r->last, w->err, sizeof w->err) : 0;
    to->steps = run_steps;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (rc == -2) return fail(w, LOOM_EXIT_BAD_SPEC, "DATA_INVALID", NULL);
    if (rc < 0) return fail(w, LOOM_EXIT_FAILED, "TRAIN_FAILED", NULL);
    r->train_rc = rc;
    return 0;
}

/* --export with tp / pp > 1: every rank gathers its shares; rank 0 writes. */
static int export_par(struct run *r) {
    struct worker *w = r->w;
    const struct loom_spec *s = &w->spec;
    struct model_layout full;
    if (model_layout_init(&full, &s->model, 1) != 0) return LOOM_EXIT_FAILED;
    float *h = malloc((size_t)full.numel * sizeof *h);
    int erc = !h || par_gather_full(w->par, h) != 0 ? -1 : 0;
    if (erc != 0)
        snprintf(w->err, sizeof w->err, "gathering the weights failed");
    else if (w->e->rank == 0)
        erc = st_export_model(w->o.export_path, &s->model, &full, h, ST_F32, NULL, w->err,
                              sizeof w->err);
    free(h);
    model_layout_free(&full);
    return erc != 0 ? fail(w, LOOM_EXIT_FAILED, "EXPORT_FAILED", NULL) : 0;
}

/* --export otherwise: the master weights (gathered over ZeRO shards). */
static int export_flat(struct run *r) {
    struct worker *w = r->w;
    size_t n = w->e->n_params;
    float *h = malloc(n * sizeof *h);
    if (!h) return LOOM_EXIT_FAILED;
    if (w->z) { /* every rank takes part in gathering the shards */
        if (zero_gather_master(w->z, h) != 0) {
            free(h);
            return fail(w, LOOM_EXIT_FAILED, "EXPORT_FAILED", "gathering the weights failed");
        }
    } else {
        engine_opt_read(w->e, ENGINE_OPT_MASTER, h, 0, n);
    }
    int erc = w->e->rank != 0 ? 0
                              : st_export_model(w->o.export_path, &w->spec.model, &w->e->layout, h,
                                                ST_F32, NULL, w->err, sizeof w->err);
    free(h);
    return erc != 0 ? fail(w, LOOM_EXIT_FAILED, "EXPORT_FAILED", NULL) : 0;
}

/* export.hf: RUN/export/hf, collective over every rank's shares. */
static int export_hf(struct run *r) {
    struct worker *w = r->w;
    struct loom_error le;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/export/hf", w->o.out);
    if (hf_export_engine(w->e, w->z, w->par, dir, w->hfs.hf, (uint64_t)(w->o.hf.shard_mb * 1e6),
                         &le) != 0)
        return fail(w, LOOM_EXIT_FAILED, le.code, le.message);
    /* the record loomd turns into export.ready (docs/internals/daemon.md) */
    if (w->e->rank == 0)
        hf_cli_emit(json_pack("{s:s, s:s, s:s}", "type", "export", "kind", "hf", "path", dir));
    return 0;
}

/* The adapter (--export-lora DIR, export.lora: RUN/export/lora), then the
 * adapters merged into the base weights for the full-model exports. */
static int export_lora(struct run *r) {
    struct worker *w = r->w;
    const struct loom_spec *s = &w->spec;
    const char *base = s->init_from[0] ? s->init_from : s->name;
    char dir[1100];
    const char *dirs[2] = {w->o.export_lora, NULL};
    if (s->export.lora) {
        snprintf(dir, sizeof dir, "%s/export", w->o.out);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            snprintf(w->err, sizeof w->err, "cannot create %.900s: %s", dir, strerror(errno));
            return fail(w, LOOM_EXIT_FAILED, "EXPORT_FAILED", NULL);
        }
        snprintf(dir, sizeof dir, "%s/export/lora", w->o.out);
        dirs[1] = dir;
    }
    for (int i = 0; i < 2; i++) /* every rank: a collective gather with tp / pp; rank 0 writes */
        if (dirs[i] && lora_export_peft(w->lora, dirs[i], base, w->err, sizeof w->err) != 0)
            return fail(w, LOOM_EXIT_FAILED, "EXPORT_FAILED", NULL);
    if ((w->hfs.export_hf || w->o.export_path) && lora_merge(w->lora) != 0)
        return fail(w, LOOM_EXIT_FAILED, "OUT_OF_MEMORY", "merging the adapters failed");
    return 0;
}

static int export_model(struct run *r) {
    struct worker *w = r->w;
    if (r->train_rc != 0) return 0;
    if (w->lora) {
        int lc = export_lora(r);
        if (lc != 0) return lc;
    }
    if (w->hfs.export_hf) {
        int hc = export_hf(r);
        if (hc != 0) return hc;
    }
    if (!w->o.export_path) return 0;
    int code = 0;
    if (w->par)
        code = export_par(r);
    else if (w->e->rank == 0 || w->z)
        code = export_flat(r);
    else
        return 0;
    if (code == 0 && w->e->rank == 0) log_info("exported the model to %s", w->o.export_path);
    return code;
}

/* The debug-param-hash row (LOOM_DEBUG_PARAM_HASH=1): every rank holding all
 * fp32 master weights (ZeRO 0 or one rank) logs their FNV-1a hash, for tests
 * that check the data-parallel ranks stayed bit-identical
 * (tests/gpu/device/check_all.sh curves). Then the summary line. */
static int summary(struct run *r) {
    struct worker *w = r->w;
    struct engine *e = w->e;
    if (w->o.tune.debug_param_hash && e->shard_off == 0 && e->shard_n == e->n_params) {
        size_t n = e->n_params;
        float *h = malloc(n * sizeof(float));
        if (h) {
            engine_opt_read(e, ENGINE_OPT_MASTER, h, 0, n);
            log_info("param hash rank %d: %016llx (%zu parameters)", e->rank,
                     (unsigned long long)loom_fnv1a(LOOM_FNV1A_INIT, h, n * sizeof(float)), n);
        }
        free(h);
    }
    int64_t done = r->start < r->end ? r->last.step : r->start;
    double tokens =
        (double)(r->end > r->start ? r->end - r->start : 0) * (double)r->to.global_batch_tokens;
    hf_cli_emit(json_pack("{s:s, s:I, s:f, s:f, s:f, s:f, s:b, s:s}", "type", "summary", "step",
                          (json_int_t)done, "final_loss", r->last.loss, "seconds", r->secs,
                          "tokens", tokens, "tokens_per_s", r->secs > 0 ? tokens / r->secs : 0.0,
                          "stopped", r->train_rc == 1, "checkpoint", w->ckpt_path));
    return r->train_rc == 1 ? LOOM_EXIT_STOPPED : LOOM_EXIT_OK;
}

static int run(struct worker *w) {
    static int (*const stages[])(struct run *) = {
        load_spec,    open_backend, open_data, build_engine, join_world,
        resume_stage, fp8_stage,    train,     export_model, summary,
    };
    struct run r;
    memset(&r, 0, sizeof r);
    r.w = w;
    int code = 0;
    for (size_t i = 0; i < sizeof stages / sizeof *stages && code == 0; i++)
        code = stages[i](&r);
    backend_free(r.be);       /* NULL once the engine took it */
    free(r.train_src.starts); /* val_src shares it; the backend is not used past here */
    return code;
}

/* --bench-gemm: the cpu peak for MFU (worker/cpu_peak.h). */
static int bench_gemm(struct opts *o) {
    struct backend *be = backend_cpu_new_tuned((int)o->threads, &o->tune.cpu);
    if (!be) return LOOM_EXIT_FAILED;
    double g = cpu_peak_measure(be, 0.5);
    if (g > 0)
        hf_cli_emit(json_pack("{s:s, s:f, s:I, s:s}", "type", "cpu_peak", "gflops", g, "threads",
                              (json_int_t)o->threads, "isa", backend_cpu_isa(be)));
    else
        hf_cli_error("OUT_OF_MEMORY", "cannot allocate the GEMM benchmark's buffers");
    backend_free(be);
    return g > 0 ? LOOM_EXIT_OK : LOOM_EXIT_FAILED;
}

int main(int argc, char **argv) {
    struct worker w;
    memset(&w, 0, sizeof w);
    log_init("loom-worker", LOG_INFO);
    size_t nrows = 0;
    struct config_entry *rows =
        worker_config_table(table, NTABLE, offsetof(struct opts, tune), &nrows);
    if (!rows) {
        hf_cli_error("OUT_OF_MEMORY", "cannot build the config table");
        return LOOM_EXIT_FAILED;
    }
    int rc = config_load(rows, nrows, &w.o, "loom-worker", "--spec FILE [options]", argc, argv,
                         NULL, NULL);
    if (rc != 0) {
        config_free(rows, nrows, &w.o);
        free(rows);
        return rc == 1 ? LOOM_EXIT_OK : LOOM_EXIT_BAD_SPEC;
    }
    int lvl = log_level_parse(w.o.log_level);
    if (lvl >= 0) log_init("loom-worker", (enum log_level)lvl);
    if (hf_cli_wanted(&w.o.hf)) { /* model modes instead of training (worker/hf_cli.h) */
        w.o.hf.spec = w.o.spec;
        w.o.hf.out = w.o.spec ? w.o.out : NULL;
        w.o.hf.device = w.o.device;
        w.o.hf.threads = w.o.threads;
        rc = hf_cli_run(&w.o.hf);
        goto out;
    }
    if (w.o.bench_gemm) {
        rc = bench_gemm(&w.o);
        goto out;
    }
    if (!w.o.spec) {
        hf_cli_error("USAGE", "--spec FILE is required");
        rc = LOOM_EXIT_BAD_SPEC;
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    if (w.o.nproc > 1) { /* local launcher: N ranks of this command (worker/launch.h) */
        rc = launch_local(argc, argv, (int)w.o.nproc);
        goto out;
    }
    rc = run(&w);
    hf_spec_free(&w.hfs);
    par_free(w.par);
    zero_free(w.z);
    lora_free(w.lora);
    model_free(w.m);
    engine_free(w.e);
    data_loader_free(w.train_dl);
    data_loader_free(w.val_dl);
out:
    config_free(rows, nrows, &w.o);
    free(rows);
    return rc;
}
