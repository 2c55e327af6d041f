/* Optimizer: schedule, clipping and AdamW over the optimizer shard. See
 * optim.h for the formulas. */
#include <math.h>

#include "worker/optim.h"
#include "worker/offload.h"

double optim_lr(const struct optim_cfg *c, int64_t step) {
    if (c->warmup > 0 && step < c->warmup) return c->lr * (double)(step + 1) / (double)c->warmup;
    if (c->schedule == OPTIM_CONSTANT) return c->lr;
    int64_t span = c->steps - c->warmup;
    double p = (double)(step - c->warmup) / (double)(span > 1 ? span : 1);
    if (p < 0) p = 0;
    if (p > 1) p = 1;
    if (c->schedule == OPTIM_LINEAR) return c->lr - p * (c->lr - c->min_lr);
    return c->min_lr + 0.5 * (1.0 + cos(M_PI * p)) * (c->lr - c->min_lr);
}

double optim_clip_scale(double norm, double clip) {
    if (clip <= 0) return 1.0;
    double s = clip / (norm + 1e-6);
    return s < 1.0 ? s : 1.0;
}

double optim_grad_norm_sq(struct engine *e) {
    if (e->hooks.grad_norm_sq) return e->hooks.grad_norm_sq(e, e->hooks.user);
    struct backend *b = e->be;
    float *acc = e->scalar, h = 0;
    b->zero(b->ctx, acc, sizeof(float));
    b->sumsq(b->ctx, acc, engine_grads_at(e, e->shard_off), e->shard_n);
    b->download(b->ctx, &h, acc, sizeof(float));
    double v = h;
    if (e->hooks.allreduce_sum && !e->shard_replicated)
        e->hooks.allreduce_sum(e, e->hooks.user, &v, 1);
    return v;
}

static void run(struct engine *e, const struct optim_cfg *c, size_t lo, size_t hi, int decay,
                double lr, double grad_scale, int64_t step) {
    struct backend *b = e->be;
    if (hi <= lo) return;
    size_t k = lo - e->shard_off;
    struct backend_adamw a = {
        .param = engine_params_at(e, lo),
        .master = e->master + k,
        .grad = engine_grads_at(e, lo),
        .m = e->opt_m + k,
        .v = e->opt_v + k,
        .n = hi - lo,
        .lr = (float)lr,
        .beta1 = (float)c->beta1,
        .beta2 = (float)c->beta2,
        .eps = (float)c->eps,
        .weight_decay = decay ? (float)c->weight_decay : 0.0f,
        .grad_scale = (float)grad_scale,
        .step = (int)step,
    };
    b->adamw(b->ctx, &a);
}

void optim_runs(const struct engine *e, const struct optim_cfg *c,
                void (*fn)(size_t lo, size_t hi, int decay, void *user), void *user) {
    size_t s0 = e->shard_off, s1 = e->shard_off + e->shard_n;
    size_t run_lo = s0;
    int run_decay = -1;
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        size_t lo = (size_t)t->rank_offset, hi = lo + (size_t)t->rank_numel;
        if (hi <= s0 || lo >= s1) continue;
        int d = c->decay_all || t->decay;
        if (lo < s0) lo = s0;
        if (d != run_decay) {
            if (run_decay >= 0 && lo > run_lo) fn(run_lo, lo, run_decay, user);
            run_lo = lo;
            run_decay = d;
        }
    }
    if (run_decay >= 0 && s1 > run_lo) fn(run_lo, s1, run_decay, user);
}

struct run_args {
    struct engine *e;
    const struct optim_cfg *c;
    double lr, grad_scale;
    int64_t step;
};

static void run_cb(size_t lo, size_t hi, int decay, void *user) {
    struct run_args *a = user;
    run(a->e, a->c, lo, hi, decay, a->lr, a->grad_scale, a->step);
}

void optim_step(struct engine *e, const struct optim_cfg *c, double lr, double grad_scale,
                int64_t step) {
    if (e->offload) {
        offload_step(e, c, lr, grad_scale, step);
        return;
    }
    struct run_args a = {e, c, lr, grad_scale, step};
    optim_runs(e, c, run_cb, &a);
}
