/* The dp pair transport (dp_transport.h) over the copy-engine pair
 * all-reduce (pair.h), with the token embedding exchange: the embedding
 * backward of the last micro-step sends this rank's per-token rows and ids
 * through the pair's side area instead of summing the dense gradient. */
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "worker/comm/comm.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/engine.h"
#include "worker/nccl/dp_transport.h"
#include "worker/nccl/pair.h"

struct dp_transport {
    struct engine *e;
    struct pair_ar *pair;
    int rank;                     /* in the pair */
    size_t lo;                    /* flat offset of the pair's buffer */
    size_t pair_bytes;            /* its receive area, counted in e->mem.comm */
    void *emb_rows;               /* this rank's rows [emb_n][C]; NULL: no exchange */
    size_t emb_rows_bytes, emb_n; /* rows area (256-aligned: the ids follow), tokens */
};

static size_t side_bytes(const struct dp_transport *t) {
    return t->emb_rows_bytes + t->emb_n * sizeof(int32_t);
}

static void dpp_close(struct dp_transport *t) {
    if (!t) return;
    struct engine *e = t->e;
    if (t->pair) e->mem.comm -= t->pair_bytes;
    if (t->emb_rows) {
        e->mem.comm -= side_bytes(t);
        engine_release(e, t->emb_rows, t->emb_n * e->cfg.d_model * e->be->elt_size, &e->mem.comm);
    }
    pair_ar_free(t->pair);
    free(t);
}

static struct dp_transport *dpp_open(struct engine *e, struct comm *dp,
                                     const struct dp_transport_opts *o, int *emb_exchange,
                                     char *err, size_t errlen) {
    struct dp_transport *t = calloc(1, sizeof *t);
    *emb_exchange = 0;
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    size_t es = e->be->elt_size, n = o->hi - o->lo, side = 0;
    t->e = e;
    t->lo = o->lo;
    t->rank = comm_rank(dp);
    if (o->emb_tokens > 0) {
        t->emb_n = o->emb_tokens;
        t->emb_rows_bytes = (t->emb_n * (size_t)e->cfg.d_model * es + 255) & ~(size_t)255;
        side = side_bytes(t);
    }
    struct pair_ar_tuning pt = {
        .chunk_kib = o->chunk_kib, .trace = o->trace, .priority = o->priority};
    t->pair = pair_ar_new(dp, engine_grads_at(e, o->lo), n, es, backend_cuda_stream(e->be), side,
                          o->timeout_ms, &pt, err, errlen);
    if (!t->pair) {
        free(t);
        return NULL;
    }
    if (side) {
        t->emb_rows = engine_alloc(e, t->emb_n * (size_t)e->cfg.d_model * es, &e->mem.comm);
        if (t->emb_rows) e->mem.comm += side;
    }
    t->pair_bytes = n * es;
    e->mem.comm += t->pair_bytes;
    *emb_exchange = t->emb_rows != NULL;
    return t;
}

static int dpp_start(struct dp_transport *t, size_t lo, size_t hi) {
    return pair_ar_start(t->pair, lo - t->lo, hi - t->lo);
}

static int dpp_mark(struct dp_transport *t) {
    return pair_ar_mark(t->pair);
}

static int dpp_finish(struct dp_transport *t) {
    return pair_ar_finish(t->pair);
}

/* The token embedding's gradient is the head's part (already summed over
 * both ranks, started before mark) plus each rank's per-token rows; instead
 * of the dense gradient (79 MB at GPT-2 124M) the rows go to the peer (at
 * most N x C, 25 MB at micro-batch 16) with their token ids, and both ranks
 * add rank 0's rows, then rank 1's, into the summed gradient: the same sums,
 * in the same order, so both hold the same bits. The position embedding's
 * gradient stays local here and is summed at the tail (layer -1). */
static int dpp_embedding_bwd(struct dp_transport *t, void *dwte, void *dwpe, const void *dout,
                             const int32_t *tokens, int B, int T, int C) {
    struct backend *b = t->e->be;
    size_t N = (size_t)B * T;
    if (N > t->emb_n) { /* the rows would not fit the peer's side area */
        log_error("zero: embedding exchange: %zu tokens over the %zu it was sized for", N,
                  t->emb_n);
        return -1;
    }
    if (dwpe) b->embedding_bwd(b->ctx, NULL, dwpe, dout, tokens, B, T, C);
    int nu = 0;
    const int32_t *ids = backend_cuda_embed_rows(b, t->emb_rows, &nu, dout, tokens, B, T, C);
    backend_cuda_flush(b);
    void *cs = backend_cuda_stream(b);
    size_t ids_off = t->emb_rows_bytes;
    int s_rows = pair_ar_side_send(t->pair, 0, t->emb_rows, (size_t)nu * C * b->elt_size);
    int s_ids = pair_ar_side_send(t->pair, ids_off, ids, N * sizeof(int32_t));
    if (s_rows < 0 || s_ids < 0 || pair_ar_wait_mark(t->pair, cs) != 0 ||
        pair_ar_side_wait(t->pair, s_rows, cs) != 0 || pair_ar_side_wait(t->pair, s_ids, cs) != 0) {
        log_error("zero: embedding exchange: %s", pair_ar_error(t->pair));
        return -1;
    }
    const void *prow = pair_ar_side_ptr(t->pair, 0);
    const int32_t *pids = pair_ar_side_ptr(t->pair, ids_off);
    for (int k = 0; k < 2; k++) {
        if ((k == 0) == (t->rank == 0))
            backend_cuda_embed_scatter(b, dwte, t->emb_rows, ids, nu, C);
        else
            backend_cuda_embed_scatter(b, dwte, prow, pids, (int)N, C);
    }
    if (pair_ar_side_release(t->pair, cs, 2) != 0) {
        log_error("zero: embedding exchange: %s", pair_ar_error(t->pair));
        return -1;
    }
    return 0;
}

static int dpp_compute_sync(struct dp_transport *t) {
    return pair_ar_sync_compute(t->pair);
}

static const char *dpp_error(const struct dp_transport *t) {
    return pair_ar_error(t->pair);
}

const struct dp_transport_ops *dp_pair_transport(void) {
    static const struct dp_transport_ops ops = {
        .open = dpp_open,
        .start = dpp_start,
        .mark = dpp_mark,
        .finish = dpp_finish,
        .embedding_bwd = dpp_embedding_bwd,
        .compute_sync = dpp_compute_sync,
        .error = dpp_error,
        .close = dpp_close,
    };
    return &ops;
}
