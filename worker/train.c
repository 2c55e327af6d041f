/* Train loop: micro-steps, hooks, clipping, AdamW, evaluation, checkpoint
 * callbacks and JSON-lines reporting (format in train.h). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/lora.h"
#include "worker/offload.h"
#include "worker/train.h"

/* Diagnosis sampling off for this 0-based step (train.h no_timing_sync,
 * diag_ab). */
static int sampling_off(const struct train_opts *o, int64_t step) {
    return o->no_timing_sync || (o->diag_ab > 0 && (step / o->diag_ab) % 2 == 1);
}

static int hook(struct engine *e, int (*fn)(struct engine *, void *), double *ms) {
    if (!fn) return 0;
    double t0 = clock_mono_msf();
    int rc = fn(e, e->hooks.user);
    *ms += clock_mono_msf() - t0;
    return rc;
}

struct layer_cb {
    struct engine *e;
    int last; /* last micro-step of the step */
};

static void on_layer(int layer, void *user) {
    struct layer_cb *cb = user;
    struct engine *e = cb->e;
    if (e->hooks.layer_grads_done) e->hooks.layer_grads_done(e, e->hooks.user, layer);
    if (cb->last && e->hooks.layer_grads_ready) e->hooks.layer_grads_ready(e, e->hooks.user, layer);
}

int train_step(struct model *m, const struct train_opts *o, int64_t step,
               struct train_step_info *info, int32_t *inputs, int32_t *targets, char *err,
               size_t errlen) {
    struct engine *e = m->e;
    struct backend *b = e->be;
    double t0 = clock_mono_msf(), comm = 0;
    float gs = (float)(1.0 / (double)o->global_batch_tokens);
    double sums[4] = {0, 0, 0, 0}; /* loss sum, tokens, comm ms, data ms (train_opts) */
    if (m->lora)                   /* the base is frozen: only the adapters have gradients */
        lora_zero_grads(m->lora);
    else
        engine_zero_grads(e);
    /* Test knob (a straggler): before the forward, as a slow device is slow
     * all through its compute, so its gradients reach the reductions late
     * and its peers wait in grad_sync. (A sleep after the backward would be
     * hidden: the per-layer reductions already run in the background.) */
    if (o->slow_ms > 0) clock_sleep_ms(o->slow_ms);
    if (o->micro_steps) {
        int rc = o->micro_steps(o->micro_user, m, o, step, inputs, targets, sums, err, errlen);
        if (rc != 0) return rc;
    }
    for (int micro = 0; !o->micro_steps && micro < o->grad_accum; micro++) {
        double d0 = clock_mono_msf();
        if (o->train.batch(o->train.user, step, micro, inputs, targets, err, errlen) != 0)
            return -2;
        sums[3] += clock_mono_msf() - d0;
        int64_t cnt = 0;
        int last = micro == o->grad_accum - 1;
        e->micro_last = last; /* gradients added into the shard in it are final */
        /* the adapters' dropout masks follow the micro-batch's place in the global batch
         * (the data loader's order: micro-step, then dp rank), so dp2 draws dp1's masks */
        if (m->lora) lora_begin_micro(m->lora, step, (int64_t)micro * e->dp + e->dp_idx);
        sums[0] += model_forward(m, inputs, targets, gs, &cnt);
        sums[1] += (double)cnt;
        struct layer_cb cb = {e, last};
        int any = e->hooks.layer_grads_done || (last && e->hooks.layer_grads_ready);
        model_backward(m, any ? on_layer : NULL, &cb);
    }
    e->micro_last = 0;
    /* The backward may be issued ahead of the device (cuda + nccl ordering):
     * wait for it here, so that the grad_sync time counts only the
     * communication left exposed after the compute. This sync is there for
     * the timing alone (the collectives wait on device fences, worker/zero.c
     * comm_ready): no_timing_sync (tuning diag 0) leaves it out. The pair
     * transport's compute_sync is a bounded wait (hang detection) and stays. */
    int csync = 0;
    if (e->hooks.grad_sync && e->hooks.compute_sync)
        csync = e->hooks.compute_sync(e, e->hooks.user);
    else if (e->hooks.grad_sync && !sampling_off(o, step))
        b->sync(b->ctx);
    if (csync != 0 || hook(e, e->hooks.grad_sync, &comm) != 0 ||
        (m->lora && lora_grad_sync(m->lora) != 0)) {
        snprintf(err, errlen, "gradient synchronisation failed at step %lld", (long long)step);
        return -1;
    }
    /* offload: the shard's gradients start down now (those not already on
     * their way), overlapping the norm */
    if (!m->lora) offload_fetch_grads(e);
    /* Masked data: the mean over the step's counted targets (all micro-steps and ranks),
     * not over its token count; the gradients are linear in their scale, so the factor is
     * applied to the norm and the optimizer's grad_scale instead of re-running anything. */
    double gfac = 1.0;
    if (o->step_loss_tokens) {
        int64_t counted = o->step_loss_tokens(o->step_loss_tokens_user, step);
        if (counted > 0) gfac = (double)o->global_batch_tokens / (double)counted;
    }
    double norm = gfac * sqrt(m->lora ? lora_grad_norm_sq(m->lora) : optim_grad_norm_sq(e));
    double lr = optim_lr(&o->optim, step);
    double clip = optim_clip_scale(norm, o->optim.grad_clip);
    double t_opt = clock_mono_msf();
    if (m->lora) {
        if (lora_adamw(m->lora, &o->optim, lr, clip * gfac, step + 1) != 0) {
            snprintf(err, errlen, "adapter parameter synchronisation failed at step %lld",
                     (long long)step);
            return -1;
        }
    } else {
        optim_step(e, &o->optim, lr, clip * gfac, step + 1);
    }
    /* the loss sums and the stop request travel in one host all-reduce (one
     * round trip per step instead of two), made while the device runs the
     * AdamW just issued: its latency (a staged NCCL call, ~0.1 ms) is hidden
     * there instead of following the step (counted in ms_optimizer) */
    double stop = o->stop && *o->stop;
    double red[3] = {sums[0], sums[1], stop};
    if (e->hooks.allreduce_sum) {
        e->hooks.allreduce_sum(e, e->hooks.user, red, 3);
        sums[0] = red[0], sums[1] = red[1];
    }
    b->sync(b->ctx); /* the device AdamW is queued behind the norm's download only */
    double ms_opt = clock_mono_msf() - t_opt;
    if (hook(e, e->hooks.param_sync, &comm) != 0) {
        snprintf(err, errlen, "parameter synchronisation failed at step %lld", (long long)step);
        return -1;
    }
    info->stop_any = red[2] > 0;
    b->sync(b->ctx);
    double t_end = clock_mono_msf();
    info->loss = sums[1] > 0 ? sums[0] / sums[1] : 0;
    info->lr = lr;
    info->grad_norm = norm;
    info->tokens = o->global_batch_tokens;
    info->loss_tokens = (int64_t)sums[1];
    info->ms_step = t_end - t0;
    info->ms_comm = comm + sums[2];
    info->ms_data = sums[3];
    info->ms_compute = info->ms_step - info->ms_comm - info->ms_data;
    info->ms_optimizer = ms_opt;
    return 0;
}

double train_eval(struct model *m, const struct train_opts *o, int32_t *inputs, int32_t *targets,
                  int64_t *tokens, char *err, size_t errlen, int *rc) {
    struct engine *e = m->e;
    double sums[2] = {0, 0};
    *rc = 0;
    for (int64_t i = 0; i < o->eval_batches; i++) {
        if (o->val.batch(o->val.user, i, 0, inputs, targets, err, errlen) != 0) {
            *rc = -2;
            return 0;
        }
        int64_t cnt = 0;
        sums[0] += o->forward_only ? o->forward_only(o->micro_user, m, inputs, targets, &cnt)
                                   : model_forward(m, inputs, targets, 0.0f, &cnt);
        sums[1] += (double)cnt;
    }
    if (e->hooks.allreduce_sum) e->hooks.allreduce_sum(e, e->hooks.user, sums, 2);
    if (tokens) *tokens = (int64_t)sums[1];
    return sums[1] > 0 ? sums[0] / sums[1] : 0;
}

static double gib(size_t bytes) {
    return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

static void emit(FILE *out, json_t *j) {
    if (out) {
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
        if (s) {
            fprintf(out, "%s\n", s);
            fflush(out);
            free(s);
        }
    }
    json_decref(j);
}

/* A rank other than 0: its timing only (the loss and norms are rank 0's). */
void train_emit_rank_step(FILE *out, int rank, int64_t done, const struct train_step_info *in) {
    emit(out, json_pack("{s:s, s:I, s:i, s:{s:f, s:f, s:f, s:f, s:f}}", "type", "rank_step", "step",
                        (json_int_t)done, "rank", rank, "ms", "step", in->ms_step, "compute",
                        in->ms_compute, "comm_exposed", in->ms_comm, "data_wait", in->ms_data,
                        "optimizer", in->ms_optimizer));
}

static void emit_step(const struct model *m, const struct train_opts *o, int64_t done,
                      const struct train_step_info *in) {
    if (!o->out) {
        if (o->rank_out && !sampling_off(o, done - 1))
            train_emit_rank_step(o->rank_out, o->rank, done, in);
        return;
    }
    const struct engine *e = m->e;
    const struct engine_mem *mm = &e->mem;
    double tps = in->ms_step > 0 ? (double)in->tokens / (in->ms_step / 1e3) : 0;
    /* MFU per device: this rank's share of the step's FLOPs over its peak. */
    json_t *mfu = json_null();
    if (e->be->peak_flops > 0 && o->flops_per_token > 0)
        mfu = json_real(tps * o->flops_per_token / e->world / e->be->peak_flops);
    size_t total = mm->params + mm->grads + mm->optimizer + mm->activations + mm->comm;
    json_t *j = json_pack(
        "{s:s, s:I, s:f, s:f, s:f, s:I, s:f, s:o, s:{s:f, s:f, s:f, s:f, s:f}, s:f, s:{s:f, s:f, "
        "s:f, s:f, s:f}}",
        "type", "step", "step", (json_int_t)done, "loss", in->loss, "lr", in->lr, "grad_norm",
        in->grad_norm, "tokens", (json_int_t)in->tokens, "tokens_per_s", tps, "mfu", mfu, "ms",
        "compute", in->ms_compute, "comm_exposed", in->ms_comm, "data_wait", in->ms_data, "step",
        in->ms_step, "optimizer", in->ms_optimizer, "mem_gib", gib(total), "mem", "params",
        gib(mm->params), "grads", gib(mm->grads), "optimizer", gib(mm->optimizer), "activations",
        gib(mm->activations), "comm", gib(mm->comm));
    json_t *extra = o->step_extra ? o->step_extra(o->step_extra_user) : NULL;
    if (extra) json_object_update(j, extra);
    json_decref(extra);
    json_object_set_new(j, "loss_tokens", json_integer((json_int_t)in->loss_tokens));
    emit(o->out, j);
}

int train_run(struct model *m, const struct train_opts *o, int64_t start,
              struct train_step_info *last, char *err, size_t errlen) {
    size_t n = (size_t)m->B * m->T;
    int32_t *inputs = malloc(n * sizeof *inputs), *targets = malloc(n * sizeof *targets);
    int rc = 0;
    struct train_step_info info;
    memset(&info, 0, sizeof info);
    if (!inputs || !targets) {
        snprintf(err, errlen, "out of memory for batch buffers");
        rc = -1;
        goto out;
    }
    for (int64_t step = start; step < o->steps; step++) {
        rc = train_step(m, o, step, &info, inputs, targets, err, errlen);
        if (rc != 0) goto out;
        int64_t done = step + 1;
        info.step = done;
        emit_step(m, o, done, &info);
        int eval_due =
            o->val.batch && o->eval_every > 0 && (done % o->eval_every == 0 || done == o->steps);
        int save_due = o->save && (done == o->steps || info.stop_any ||
                                   (o->save_every > 0 && done % o->save_every == 0));
        /* delayed offload: the last update lands before anything reads the weights */
        if (eval_due || save_due || done == o->steps || info.stop_any) offload_flush(m->e);
        if (eval_due) {
            int64_t vt = 0;
            int erc = 0;
            double vl = train_eval(m, o, inputs, targets, &vt, err, errlen, &erc);
            if (erc != 0) {
                rc = erc;
                goto out;
            }
            emit(o->out, json_pack("{s:s, s:I, s:f, s:I}", "type", "eval", "step", (json_int_t)done,
                                   "val_loss", vl, "tokens", (json_int_t)vt));
        }
        /* The save below is collective: with dp ranks, any rank's stop request
         * stops all of them at this same step (train_step reduced the flag
         * with the loss sums). */
        int stopping = info.stop_any;
        if (save_due) {
            if (o->save(o->save_user, done) != 0) {
                snprintf(err, errlen, "checkpoint at step %lld failed", (long long)done);
                rc = -1;
                goto out;
            }
        }
        if (stopping && done < o->steps) {
            rc = 1;
            goto out;
        }
    }
out:
    if (last) *last = info;
    free(inputs);
    free(targets);
    return rc;
}
