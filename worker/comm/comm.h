/* The communication layer of loom-worker: one interface for the engine over
 * every backend (gloo for cpu, nccl for cuda, local for a world of one).
 *
 * Objects:
 * - struct comm_world: this process's membership in an attempt (rank, world
 *   size, backend, rendezvous). One per process, made once at start-up.
 * - struct comm: a communicator over a group of ranks (the whole world, or
 *   the tp / dp / pp group of this rank). Ranks inside a comm are numbered
 *   0..size-1 in the order of the `ranks` list it was made from.
 * - struct comm_req: a handle on an operation started asynchronously.
 *
 * Every operation takes `struct comm_req **req`: NULL runs it to completion
 * (blocking); otherwise the call returns at once with *req set and the
 * operation runs in the background; comm_wait(*req) completes it and frees
 * the handle. Buffers must stay valid and untouched until then. Collectives
 * of one comm run in the order they were issued, on every rank in the same
 * order (as with NCCL and torch.distributed); issue them in the same order on
 * all members or the job deadlocks until the timeout fires.
 *
 * Errors: 0 on success, a negative value on failure with a message naming
 * the rank, operation and cause in comm_error(); the message is logged once.
 * After a failure (a peer died, a timeout fired) the comm is broken and
 * every later call fails at once. A peer that dies or never arrives makes
 * every other rank fail within the timeout (comm_world_opts.timeout_ms);
 * nothing waits forever.
 *
 * Buffers are host memory for gloo and local, device memory for nccl.
 * Threads: a comm may be used by one thread at a time (the engine's); the
 * background work runs on the comm's own thread. */
#ifndef LOOM_WORKER_COMM_H
#define LOOM_WORKER_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum comm_dtype { COMM_F32 = 0, COMM_F64, COMM_BF16, COMM_F16, COMM_I32, COMM_I64, COMM_U8 };
enum comm_op { COMM_SUM = 0, COMM_MAX, COMM_MIN };

/* Bytes per element; 0 for an unknown type. */
size_t comm_dtype_size(enum comm_dtype dt);
const char *comm_dtype_name(enum comm_dtype dt);

struct comm_world;
struct comm;
struct comm_req;

/* 5 min: a dead peer fails the others at once (its sockets close); the
 * timeout bounds hangs and absent peers (LOOM_COMM_TIMEOUT_MS overrides). */
#define COMM_DEFAULT_TIMEOUT_MS 300000

struct comm_world_opts {
    /* "auto" (NULL too): "local" when world == 1, else "gloo" for device cpu
     * and "nccl" for device cuda. Or name one: "local", "gloo", "nccl". */
    const char *backend;
    const char *device; /* "cpu" (default) or "cuda": picks the auto backend */
    int rank, world;
    /* "file:DIR" (a directory shared by all ranks, fresh per attempt) or the
     * base URL of loomd's rendezvous for the attempt
     * ("http://host:port/v1/rdzv/JOB/ATTEMPT"). Unused when world == 1. */
    const char *rdzv;
    const char *token; /* bearer token for an http rendezvous; may be NULL */
    int timeout_ms;    /* rendezvous and per-operation timeout; 0: default */
    int cuda_device;   /* nccl: the device this rank uses */
    /* Tuning rows (worker/tuning.h; NULL: the default). gloo: the network
     * interface or the address to listen on (default: loopback for a file
     * rendezvous, else the host name). nccl: "high" puts the comm stream at
     * the device's highest priority; "efficiency" or "zero" the CTA policy. */
    const char *iface, *host;
    const char *nccl_stream_priority, *nccl_cta_policy;
};

/* Fill the rank fields of `o` from the environment contract: LOOM_RANK,
 * LOOM_WORLD, LOOM_RDZV, LOOM_RDZV_TOKEN, LOOM_COMM_TIMEOUT_MS (optional),
 * and the comm tuning variables LOOM_COMM_IFACE, LOOM_COMM_HOST,
 * LOOM_NCCL_STREAM_PRIORITY, LOOM_NCCL_CTA_POLICY. For programs other than
 * loom-worker, which parses these as config rows (worker/tuning.h).
 * Fields already set (rank >= 0 / non-NULL strings) are kept only when the
 * variable is absent. Returns 1 when LOOM_WORLD was found, 0 when not. The
 * strings point into the environment (not copied). */
int comm_world_opts_from_env(struct comm_world_opts *o);

/* Join the world: rendezvous with every other rank of the attempt and set up
 * the backend. Blocks until all ranks arrived or the timeout passed. Returns
 * NULL on failure with a message in err. Caller owns the result. */
struct comm_world *comm_world_new(const struct comm_world_opts *o, char *err, size_t errlen);
void comm_world_free(struct comm_world *w); /* accepts NULL; frees nothing else */
int comm_world_rank(const struct comm_world *w);
int comm_world_size(const struct comm_world *w);
const char *comm_world_backend(const struct comm_world *w); /* "local", "gloo", "nccl" */

/* A communicator over `ranks` (world ranks, n of them, this rank among them),
 * made collectively by every member with the same name and list (the name
 * keys the rendezvous, so it must be unique per group in the attempt, e.g.
 * "dp.pp0.tp1"). A group of one needs no peers. NULL on failure (err). The
 * caller frees the comm before its world. */
struct comm *comm_new(struct comm_world *w, const char *name, const int *ranks, int n, char *err,
                      size_t errlen);
void comm_free(struct comm *c); /* accepts NULL; waits for queued work first */
int comm_rank(const struct comm *c);
int comm_size(const struct comm *c);
const char *comm_error(const struct comm *c); /* "" when none */

/* ---- Rank layout: tp fastest, then dp, then pp (Megatron order):
 * rank = pp_idx*dp*tp + dp_idx*tp + tp_idx. */
struct comm_layout {
    int tp, dp, pp;
};
enum comm_axis { COMM_AXIS_TP = 0, COMM_AXIS_DP, COMM_AXIS_PP };

void comm_layout_coords(const struct comm_layout *l, int rank, int *tp_idx, int *dp_idx,
                        int *pp_idx);
int comm_layout_rank(const struct comm_layout *l, int tp_idx, int dp_idx, int pp_idx);
/* The world ranks of `rank`'s group along `axis`, in group-rank order, into
 * ranks[] (room for the axis size); returns the count. */
int comm_layout_group(const struct comm_layout *l, int rank, enum comm_axis axis, int *ranks);

/* The usual set of communicators for a rank. Members that are groups of one
 * are still valid comms (local, no peers). */
struct comm_groups {
    struct comm *world, *tp, *dp, *pp;
};
/* Build all four (collective over the whole world). 0 or -1 (err). */
int comm_groups_init(struct comm_world *w, const struct comm_layout *l, struct comm_groups *g,
                     char *err, size_t errlen);
void comm_groups_free(struct comm_groups *g); /* frees the comms, zeroes g */

/* Balanced shards: element range [*off, *off + *cnt) of shard idx when
 * `total` elements are cut into n shards; the first total % n shards hold one
 * element more, so shards differ by at most one and any total works. */
void comm_shard_range(size_t total, int n, int idx, size_t *off, size_t *cnt);

/* ---- Operations. See the top comment for req, errors and ordering. */

/* In place on the device, ordered by a stream instead of the comm thread:
 * the all-reduce of buf (device memory, n elements) is enqueued on `stream`
 * (a cudaStream_t of this rank's GPU) after the work already there, and
 * later work on the stream sees its result; no host wait. For collectives on
 * the critical path (tensor parallelism). Returns 0, -1 on failure (the comm
 * is broken; the previous stream operation timing out is reported here), or
 * 1 when the backend has no such path or operations are queued on the comm
 * (use comm_allreduce then). */
int comm_allreduce_stream(struct comm *c, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                          void *stream);
/* In place: buf (n elements) holds the reduction over all members. */
int comm_allreduce(struct comm *c, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                   struct comm_req **req);
/* send holds `total` elements on every member; recv (comm_shard_range(total,
 * size, rank) elements) receives this rank's shard of the reduction. recv may
 * be send + this rank's shard offset (in place). */
int comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t total,
                        enum comm_dtype dt, enum comm_op op, struct comm_req **req);
/* send holds this rank's shard (comm_shard_range) of `total` elements; recv
 * (total elements) receives every shard in rank order. send may point at
 * this rank's slice of recv (in place). */
int comm_all_gather(struct comm *c, const void *send, void *recv, size_t total, enum comm_dtype dt,
                    struct comm_req **req);
/* Variable shards: counts[i] (one per member) elements for member i, laid
 * out in rank order, total = sum(counts). reduce_scatterv: send holds total
 * elements, recv (counts[rank]) gets the reduction of this rank's slice;
 * all_gatherv: send holds this rank's counts[rank] elements, recv (total)
 * gets every slice. Zero counts are fine. In place: recv == send + this
 * rank's offset (reduce_scatterv), send == recv + offset (all_gatherv).
 * counts is copied; it need not outlive the call. */
int comm_reduce_scatterv(struct comm *c, const void *send, void *recv, const size_t *counts,
                         enum comm_dtype dt, enum comm_op op, struct comm_req **req);
int comm_all_gatherv(struct comm *c, const void *send, void *recv, const size_t *counts,
                     enum comm_dtype dt, struct comm_req **req);
/* buf (n elements) of `root` (a comm rank) is copied to every member. */
int comm_broadcast(struct comm *c, void *buf, size_t n, enum comm_dtype dt, int root,
                   struct comm_req **req);
/* Point-to-point with comm rank `peer`. Messages between two ranks match in
 * the order they were posted. A send completes once the peer has received, so
 * exchanges in both directions must post both before waiting on either (use
 * req), or use comm_sendrecv. Not ordered with respect to collectives. */
int comm_send(struct comm *c, const void *buf, size_t n, enum comm_dtype dt, int peer,
              struct comm_req **req);
int comm_recv(struct comm *c, void *buf, size_t n, enum comm_dtype dt, int peer,
              struct comm_req **req);
int comm_sendrecv(struct comm *c, const void *sendbuf, size_t sn, int dst, void *recvbuf, size_t rn,
                  int src, enum comm_dtype dt);
int comm_barrier(struct comm *c, struct comm_req **req);

/* Complete an asynchronous operation and free the handle (NULL: returns 0).
 * Returns the operation's status. */
int comm_wait(struct comm_req *req);

#ifdef __cplusplus
}
#endif

#endif
