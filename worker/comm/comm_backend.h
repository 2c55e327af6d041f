/* The contract between the comm layer (worker/comm/comm.c) and a backend
 * (local in comm.c, gloo in worker/gloo/, nccl in worker/nccl/). Engine code
 * uses comm.h, never this file.
 *
 * A backend supplies synchronous operations; comm.c adds ordering, the
 * background thread for asynchronous calls, error latching and logging.
 * Every function returns 0 or -1 with a message in err. Calls on one comm
 * come from one thread at a time, except the p2p functions, which may run on
 * the caller's thread while a collective of the same comm runs on the comm's
 * thread (backends keep p2p on their own tags / streams). */
#ifndef LOOM_WORKER_COMM_BACKEND_H
#define LOOM_WORKER_COMM_BACKEND_H

#include <stddef.h>

#include "worker/comm/comm.h"
#include "worker/comm/rdzv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a backend sees of a world and of a comm. */
struct comm_backend_world {
    int rank, size;
    int timeout_ms;
    int cuda_device;
    int rdzv_is_file; /* 1 when all ranks share a directory (likely one host) */
    struct rdzv *rdzv;
    /* tuning rows (worker/tuning.h), copied from comm_world_opts; "" unset */
    char iface[64], host[256];                          /* gloo: where to listen */
    char nccl_stream_priority[16], nccl_cta_policy[16]; /* nccl */
};

struct comm_backend_comm {
    const struct comm_backend_world *world;
    void *world_impl;      /* from world_init */
    const char *name;      /* unique in the attempt; prefixes rendezvous keys */
    int rank, size;        /* within the comm */
    const int *world_rank; /* world rank of each comm rank */
};

struct comm_backend_ops {
    const char *name;
    /* Per-process state shared by all comms (e.g. Gloo's TCP device). */
    void *(*world_init)(const struct comm_backend_world *w, char *err, size_t errlen);
    void (*world_fini)(void *world_impl);
    /* Connect the members of one comm (collective over them). */
    void *(*comm_init)(const struct comm_backend_comm *c, char *err, size_t errlen);
    void (*comm_fini)(void *impl);

    int (*allreduce)(void *impl, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                     char *err, size_t errlen);
    /* counts[i]: elements of member i's slice (rank order, sum = total; never
     * NULL). recv gets this rank's slice of the reduction; recv may be send +
     * this rank's offset (in place). */
    int (*reduce_scatter)(void *impl, const void *send, void *recv, size_t total,
                          const size_t *counts, enum comm_dtype dt, enum comm_op op, char *err,
                          size_t errlen);
    /* send holds this rank's slice; may alias its place in recv. */
    int (*all_gather)(void *impl, const void *send, void *recv, size_t total, const size_t *counts,
                      enum comm_dtype dt, char *err, size_t errlen);
    int (*broadcast)(void *impl, void *buf, size_t n, enum comm_dtype dt, int root, char *err,
                     size_t errlen);
    int (*barrier)(void *impl, char *err, size_t errlen);

    /* Point-to-point: post returns a handle that p2p_wait completes (and
     * frees). bytes > 0. */
    int (*isend)(void *impl, const void *buf, size_t bytes, int peer, void **h, char *err,
                 size_t errlen);
    int (*irecv)(void *impl, void *buf, size_t bytes, int peer, void **h, char *err, size_t errlen);
    int (*p2p_wait)(void *impl, void *h, char *err, size_t errlen);
    /* Optional: a paired exchange as one operation (NCCL needs send and recv
     * in one group to avoid a cross-wait). NULL: comm.c posts both. */
    int (*sendrecv)(void *impl, const void *sendbuf, size_t sbytes, int dst, void *recvbuf,
                    size_t rbytes, int src, char *err, size_t errlen);
    /* Optional (comm_allreduce_stream): enqueue an in-place all-reduce of
     * device memory on the caller's stream (a cudaStream_t) from the caller's
     * thread and return without waiting for it; the previous such operation
     * must complete first (bounded run-ahead; its failure or timeout is
     * reported here). NULL: unsupported. */
    int (*allreduce_stream)(void *impl, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                            void *stream, char *err, size_t errlen);
};

/* Backends compiled into this build (NULL when absent). */
const struct comm_backend_ops *comm_backend_local(void);
#ifdef LOOM_HAVE_GLOO
const struct comm_backend_ops *comm_backend_gloo(void);
#endif
#ifdef LOOM_HAVE_NCCL
const struct comm_backend_ops *comm_backend_nccl(void);
#endif

#ifdef __cplusplus
}
#endif

#endif
