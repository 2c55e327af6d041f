/* A data-parallel gradient transport beside the comm layer, for ZeRO stage 0
 * over exactly two ranks (worker/zero.c). zero.c knows which ranges to sum
 * and when; a transport knows how. The one implementation, dp_pair.c, sums
 * through the copy engines (worker/nccl/pair.h) and also carries the token
 * embedding exchange: instead of the dense embedding gradient, each rank
 * sends its per-token rows. It exists in CUDA + NCCL builds only; elsewhere
 * (and on a backend without caps.pair_transport) zero.c uses the comm
 * layer's all-reduces. This header has no CUDA types so that zero.c includes
 * it in every build. */
#ifndef LOOM_NCCL_DP_TRANSPORT_H
#define LOOM_NCCL_DP_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

struct comm;
struct engine;
struct dp_transport;

struct dp_transport_opts {
    size_t lo, hi;     /* the flat range of gradients it sums (this pipeline stage's) */
    size_t emb_tokens; /* tokens of a micro-step for the embedding exchange (0: none) */
    int timeout_ms;    /* 0: the comm default */
    long chunk_kib, trace;
    const char *priority; /* the pair-* tuning rows (worker/tuning.h) */
};

struct dp_transport_ops {
    /* Set up over `dp` (two ranks; collective). NULL with the reason in err
     * when not possible on this machine: both ranks agree, and the caller
     * falls back to the comm layer. Counts its memory in e->mem.comm.
     * *emb_exchange: 1 when the embedding exchange is on. */
    struct dp_transport *(*open)(struct engine *e, struct comm *dp,
                                 const struct dp_transport_opts *o, int *emb_exchange, char *err,
                                 size_t errlen);
    /* Start summing gradients [lo, hi) (flat offsets) after the work issued
     * so far; no host wait. 0 or -1 (error()). */
    int (*start)(struct dp_transport *t, size_t lo, size_t hi);
    /* The ranges started so far are the ones the embedding exchange waits
     * for (the head's part of the token embedding). */
    int (*mark)(struct dp_transport *t);
    /* End the step: every started range summed, the compute stream ordered
     * after it, the host waited (bounded by the timeout). */
    int (*finish)(struct dp_transport *t);
    /* The token embedding backward of the step's last micro-step, with the
     * exchange on: dwte gets the local and the peer's per-token rows (in
     * rank order on both ranks: the same bits); dwpe (may be NULL) the local
     * backward only. 0 or -1 (logged). */
    int (*embedding_bwd)(struct dp_transport *t, void *dwte, void *dwpe, const void *dout,
                         const int32_t *tokens, int B, int T, int C);
    /* Before the engine's grad_sync with the exchange on: the host waits for
     * the compute stream, which may wait on the peer, with the timeout. */
    int (*compute_sync)(struct dp_transport *t);
    const char *(*error)(const struct dp_transport *t);
    void (*close)(struct dp_transport *t); /* NULL ok; gives back e->mem.comm */
};

/* The copy-engine pair transport (worker/nccl/dp_pair.c); only in builds
 * with CUDA and NCCL. */
const struct dp_transport_ops *dp_pair_transport(void);

#endif
