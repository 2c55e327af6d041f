/* Pipeline parallelism: schedules, stage ranges and the micro-step runner
 * (see pp.h). */
#include "worker/pp.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/comm/comm.h"
#include "worker/lora.h"

int pp_schedule_parse(const char *s) {
    if (!s || !*s || !strcmp(s, "1f1b")) return PP_1F1B;
    if (!strcmp(s, "gpipe")) return PP_GPIPE;
    return -1;
}

const char *pp_schedule_name(enum pp_schedule s) {
    return s == PP_GPIPE ? "gpipe" : "1f1b";
}

int pp_schedule_actions(enum pp_schedule s, int pp, int stage, int M, struct pp_action *out) {
    int n = 0;
    if (s == PP_GPIPE) {
        for (int i = 0; i < M; i++)
            out[n++] = (struct pp_action){1, i};
        for (int i = 0; i < M; i++)
            out[n++] = (struct pp_action){0, i};
        return n;
    }
    int warm = pp - stage - 1;
    if (warm > M) warm = M;
    int f = 0, b = 0;
    for (; f < warm; f++)
        out[n++] = (struct pp_action){1, f};
    for (; f < M; f++, b++) {
        out[n++] = (struct pp_action){1, f};
        out[n++] = (struct pp_action){0, b};
    }
    for (; b < M; b++)
        out[n++] = (struct pp_action){0, b};
    return n;
}

int pp_schedule_slots(enum pp_schedule s, int pp, int stage, int M) {
    if (s == PP_GPIPE) return M;
    return pp - stage < M ? pp - stage : M;
}

double pp_bubble_ideal(int pp, int M) {
    return (double)(pp - 1) / (double)(M + pp - 1);
}

/* The tied embedding's copy on the last stage is used, not owned. */
static int owned(const struct engine *e, const struct model_tensor *t) {
    if (!model_tensor_on_stage(&e->cfg, t, e->pp, e->pp_idx)) return 0;
    return !(t->kind == MODEL_T_EMBED && e->pp_idx != 0);
}

void pp_stage_range(const struct engine *e, size_t *lo, size_t *hi) {
    if (e->pp <= 1) {
        *lo = 0;
        *hi = e->n_params;
        return;
    }
    size_t a = e->n_params, z = 0, sum = 0;
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        if (!owned(e, t)) continue;
        size_t o = (size_t)t->rank_offset, n = (size_t)t->rank_numel;
        if (o < a) a = o;
        if (o + n > z) z = o + n;
        sum += n;
    }
    if (sum != z - a) die("pp: stage %d's tensors are not contiguous in the layout", e->pp_idx);
    *lo = a;
    *hi = z;
}

/* ---- runner ---- */

/* ZeRO-2/3 reduce each layer's gradients of every micro-step (engine.h). */
static void grads_done(int layer, void *user) {
    struct engine *e = user;
    e->hooks.layer_grads_done(e, e->hooks.user, layer);
}

static enum comm_dtype cdt(const struct engine *e) {
    return e->be->dtype == BACKEND_BF16 ? COMM_BF16 : COMM_F32;
}

struct pp {
    struct engine *e;
    struct comm *c; /* e->pp_group */
    enum pp_schedule sched;
    struct model **slot; /* [nslots]; slot[0] is the caller's model */
    int nslots, M;
    struct comm_req **fwd_req, **bwd_req; /* pending sends per slot */
    struct pp_action *act;
    size_t act_bytes;
    double *stats;       /* [3*pp]: bubble ms, busy ms, in-flight max per stage */
    double last_step_ms; /* of the last step, this stage */
};

struct pp *pp_new(struct model *m, const struct model_opts *mo, enum pp_schedule s, char *err,
                  size_t errlen) {
    struct engine *e = m->e;
    struct pp *p = calloc(1, sizeof *p);
    if (!p) goto nomem;
    p->e = e;
    p->c = e->pp_group;
    p->sched = s;
    if (!p->c) {
        snprintf(err, errlen, "pp=%d but no pipeline communicator", e->pp);
        pp_free(p);
        return NULL;
    }
    /* Blocks split evenly (pp divides n_layer), but the embeddings sit on the
     * first stage and the head on the last: report the imbalance. */
    int64_t lo = -1, hi = 0;
    for (int st = 0; st < e->pp; st++) {
        int64_t n = model_layout_stage_numel(&e->layout, &e->cfg, e->pp, st);
        lo = lo < 0 || n < lo ? n : lo;
        hi = n > hi ? n : hi;
    }
    if (e->rank == 0 && lo > 0 && (double)hi / (double)lo > 1.25)
        log_warn("pp=%d: stages hold %lld to %lld parameters (embeddings on the first, head on "
                 "the last); the heaviest stage sets the pace",
                 e->pp, (long long)lo, (long long)hi);
    p->stats = calloc(3 * (size_t)e->pp, sizeof *p->stats);
    if (!p->stats) goto nomem;
    p->slot = calloc(1, sizeof *p->slot);
    if (!p->slot) goto nomem;
    p->slot[0] = m;
    p->nslots = 1;
    size_t before = e->mem.activations;
    p->act_bytes = before; /* slot 0 was counted when the caller made it */
    (void)mo;
    return p;
nomem:
    snprintf(err, errlen, "pp: out of memory");
    pp_free(p);
    return NULL;
}

/* Grow to n slots (micro-batches in flight) with the options of slot 0. */
static int ensure_slots(struct pp *p, int n) {
    if (n <= p->nslots && p->fwd_req) return 0;
    struct model *m0 = p->slot[0];
    struct model **ns = realloc(p->slot, (size_t)n * sizeof *ns);
    if (!ns) return -1;
    p->slot = ns;
    for (int i = p->nslots; i < n; i++) {
        struct model_opts mo = {
            .B = m0->B, .T = m0->T, .threads = 0, .recompute = m0->recompute, .keep = m0->keep};
        p->slot[i] = model_new_ex(p->e, &mo);
        if (!p->slot[i]) return -1;
        p->slot[i]->lora = m0->lora; /* shared adapters, a set of saved products per slot */
        p->nslots = i + 1;
    }
    if (m0->lora && lora_reserve_slots(m0->lora, p->nslots) != 0) return -1;
    free(p->fwd_req);
    free(p->bwd_req);
    p->fwd_req = calloc((size_t)p->nslots, sizeof *p->fwd_req);
    p->bwd_req = calloc((size_t)p->nslots, sizeof *p->bwd_req);
    return p->fwd_req && p->bwd_req ? 0 : -1;
}

void pp_free(struct pp *p) {
    if (!p) return;
    for (int i = 0; p->fwd_req && i < p->nslots; i++) {
        comm_wait(p->fwd_req[i]);
        comm_wait(p->bwd_req[i]);
    }
    for (int i = 1; p->slot && i < p->nslots; i++)
        model_free(p->slot[i]);
    free(p->slot);
    free(p->fwd_req);
    free(p->bwd_req);
    free(p->act);
    free(p->stats);
    free(p);
}

double pp_forward_only(void *user, struct model *m, const int32_t *inputs, const int32_t *targets,
                       int64_t *count) {
    struct pp *p = user;
    struct engine *e = p->e;
    int s = e->pp_idx, first = s == 0, last = s == e->pp - 1;
    size_t n = (size_t)m->B * m->T * m->C;
    if (!first && comm_recv(p->c, model_stage_input(m), n, cdt(e), s - 1, NULL) != 0)
        die("pipeline evaluation: receive failed: %s", comm_error(p->c));
    double sum = model_forward(m, first ? inputs : NULL, last ? targets : NULL, 0.0f, count);
    if (!last) {
        e->be->sync(e->be->ctx);
        if (comm_send(p->c, model_stage_output(m), n, cdt(e), s + 1, NULL) != 0)
            die("pipeline evaluation: send failed: %s", comm_error(p->c));
    }
    return sum;
}

int pp_reserve(struct pp *p, int M) {
    if (M == p->M && p->act) return 0;
    free(p->act);
    p->act = malloc(2 * (size_t)M * sizeof *p->act);
    if (!p->act || ensure_slots(p, pp_schedule_slots(p->sched, p->e->pp, p->e->pp_idx, M)) != 0)
        return -1;
    p->M = M;
    return 0;
}

/* train.lora: micro-batch i of the step (its place in the global batch, as
 * train.c names it) in slot si. */
static void lora_at(struct model *x, int64_t step, int i, int si, const struct engine *e) {
    if (!x->lora) return;
    lora_begin_micro(x->lora, step, (int64_t)i * e->dp + e->dp_idx);
    lora_use_slot(x->lora, si);
}

int pp_micro_steps(void *user, struct model *m, const struct train_opts *o, int64_t step,
                   int32_t *inputs, int32_t *targets, double *sums, char *err, size_t errlen) {
    struct pp *p = user;
    struct engine *e = p->e;
    struct backend *b = e->be;
    int M = o->grad_accum, P = e->pp, s = e->pp_idx;
    int first = s == 0, last = s == P - 1;
    (void)m;
    if (pp_reserve(p, M) != 0) {
        snprintf(err, errlen, "pp: out of memory for %d micro-batch slots",
                 pp_schedule_slots(p->sched, P, s, M));
        return -1;
    }
    size_t n = (size_t)m->B * m->T * m->C;
    float gs = (float)(1.0 / (double)o->global_batch_tokens);
    int na = pp_schedule_actions(p->sched, P, s, M, p->act);
    double t0 = clock_mono_msf(), idle = 0;
    int inflight = 0, most = 0, rc = 0;
    for (int k = 0; k < na && rc == 0; k++) {
        int i = p->act[k].micro, si = i % p->nslots;
        struct model *x = p->slot[si];
        if (p->act[k].fwd) {
            if (first || last) {
                double d0 = clock_mono_msf();
                if (o->train.batch(o->train.user, step, i, inputs, targets, err, errlen) != 0)
                    return -2;
                sums[3] += clock_mono_msf() - d0;
            }
            double w0 = clock_mono_msf();
            if (comm_wait(p->fwd_req[si]) != 0) rc = -1; /* the slot's output was sent */
            p->fwd_req[si] = NULL;
            if (!first && rc == 0 &&
                comm_recv(p->c, model_stage_input(x), n, cdt(e), s - 1, NULL) != 0)
                rc = -1;
            idle += clock_mono_msf() - w0;
            if (rc) break;
            int64_t cnt = 0;
            lora_at(x, step, i, si, e);
            sums[0] += model_forward(x, first ? inputs : NULL, last ? targets : NULL, gs, &cnt);
            sums[1] += (double)cnt;
            if (!last) {
                b->sync(b->ctx);
                if (comm_send(p->c, model_stage_output(x), n, cdt(e), s + 1, &p->fwd_req[si]) != 0)
                    rc = -1;
            }
            if (++inflight > most) most = inflight;
        } else {
            double w0 = clock_mono_msf();
            if (comm_wait(p->bwd_req[si]) != 0) rc = -1; /* dres of the slot was sent */
            p->bwd_req[si] = NULL;
            if (!last && rc == 0 &&
                comm_recv(p->c, model_stage_dout(x), n, cdt(e), s + 1, NULL) != 0)
                rc = -1;
            idle += clock_mono_msf() - w0;
            if (rc) break;
            lora_at(x, step, i, si, e); /* the forward's dropout masks and saved products */
            model_backward(x, e->hooks.layer_grads_done ? grads_done : NULL, e);
            if (!first) {
                b->sync(b->ctx);
                if (comm_send(p->c, model_stage_dinput(x), n, cdt(e), s - 1, &p->bwd_req[si]) != 0)
                    rc = -1;
            }
            inflight--;
        }
    }
    double w0 = clock_mono_msf();
    for (int i = 0; i < p->nslots; i++) {
        if (comm_wait(p->fwd_req[i]) != 0 || comm_wait(p->bwd_req[i]) != 0) rc = -1;
        p->fwd_req[i] = p->bwd_req[i] = NULL;
    }
    idle += clock_mono_msf() - w0;
    if (rc != 0) {
        snprintf(err, errlen, "pipeline send/recv failed at step %lld: %s", (long long)step,
                 comm_error(p->c));
        return -1;
    }
    double total = clock_mono_msf() - t0;
    double r0 = clock_mono_msf();
    /* every stage's figures to every stage (all p2p of the step is done) */
    memset(p->stats, 0, 3 * (size_t)P * sizeof *p->stats);
    p->stats[s] = idle;
    p->stats[P + s] = total;
    p->stats[2 * P + s] = most;
    if (comm_allreduce(p->c, p->stats, 3 * (size_t)P, COMM_F64, COMM_SUM, NULL) != 0) {
        snprintf(err, errlen, "pipeline statistics all-reduce failed: %s", comm_error(p->c));
        return -1;
    }
    /* Waiting on the neighbour stages is communication, not compute, in the
     * step's timing (train.h): the bubble plus this all-reduce, which also
     * waits for the slowest stage. */
    sums[2] += idle + (clock_mono_msf() - r0);
    return 0;
}

json_t *pp_step_extra(void *user) {
    struct pp *p = user;
    int P = p->e->pp;
    json_t *ms = json_array(), *frac = json_array(), *inf = json_array(), *np = json_array();
    for (int s = 0; s < P; s++) {
        json_array_append_new(np, json_integer((json_int_t)model_layout_stage_numel(
                                      &p->e->layout, &p->e->cfg, P, s)));
        json_array_append_new(ms, json_real(p->stats[s]));
        double tot = p->stats[P + s];
        json_array_append_new(frac, json_real(tot > 0 ? p->stats[s] / tot : 0));
        json_array_append_new(inf, json_integer((json_int_t)p->stats[2 * P + s]));
    }
    return json_pack("{s:{s:s, s:i, s:o, s:o, s:f, s:o, s:o}}", "pp", "schedule",
                     pp_schedule_name(p->sched), "micro", p->M, "bubble_ms", ms, "bubble_frac",
                     frac, "bubble_ideal", pp_bubble_ideal(P, p->M), "inflight", inf,
                     "stage_params", np);
}
