/* Optimizer offload: the fp32 master weights and AdamW moments of this rank's
 * optimizer shard live in HOST memory and AdamW runs on the CPU cores
 * (a pool of threads, SIMD kernels), so that a model whose optimizer state does not fit the GPU can
 * train (spec train.offload_optimizer; docs/engine.md "Optimizer offload").
 *
 * What lives where (shard of n elements, compute element size es):
 *   device: params and grads windows as without offload, the norm scalar
 *   host:   master, m, v   fp32 [n] each, anonymous pages (mmap, huge
 *                          pages asked for), first touched by the pool
 *                          threads that update them (NUMA locality); they
 *                          never cross PCIe, so they are not pinned
 *           transfer       compute dtype [n], page-locked: mapped, touched
 *                          and registered in pieces by the pool threads in
 *                          parallel (backend host_register; host_alloc or
 *                          pageable memory as fallbacks):
 *                          the shard's gradients come down into it and the
 *                          updated parameters go back up from it, in place
 * Host bytes: n * (12 + es) (offload_host_bytes; the planner's formula).
 *
 * Per step (worker/train.c, worker/optim.c):
 *   backward, last micro-step: ZeRO-2/3 add the owned part of each block's
 *     reduced gradient into the shard; right after, offload_grads_final
 *     queues that range's download (copy stream, after the add)
 *   grad_sync; offload_fetch_grads queues the download of every range not
 *     yet queued (stages 0/1: the whole shard, after grad_sync)
 *   grad norm on the device (unchanged), clip factor
 *   offload_step: per chunk k of the shard: wait for chunk k's gradients,
 *     AdamW on the CPU threads (SIMD, offload_adamw.h: exactly backend.h's
 *     formula, the decay runs of
 *     optim_step, bf16 params rounded to nearest even), queue chunk k's
 *     upload into the params window; downloads of later chunks and uploads of
 *     earlier ones run meanwhile (two copy streams); a copy fence orders the
 *     next device work after the uploads
 * On a backend without async copies (the CPU backend) every copy is a
 * synchronous download / upload: same results, no overlap.
 *
 * Delayed update (opts.delayed, `--offload delayed`; ZeRO-Offload's "DPU"):
 * offload_step of step s waits for the CPU update of step s-1, uploads its
 * parameters, downloads step s's gradients into the same buffer chunk by
 * chunk and starts their update on the CPU threads in the background, so the
 * update of step s runs during step s+1's forward and backward; step s+1
 * therefore computes its gradients at the parameters of update s-1 (one step
 * stale). Bit-identical master / moments arithmetic, different trajectory.
 * offload_flush ends the lag before anything reads the weights.
 *
 * Threads: only the engine thread calls these; the update runs on the
 * offload's own pool of threads (offload_adamw.h), created once. */
#ifndef LOOM_WORKER_OFFLOAD_H
#define LOOM_WORKER_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "worker/engine.h"
#include "worker/optim.h"

#define OFFLOAD_MAX_THREADS 256

/* How the transfer buffer is page-locked (tuning row offload-pin). */
enum offload_pin {
    OFFLOAD_PIN_REGISTER = 0, /* mapped, touched and registered in pieces by the pool (default) */
    OFFLOAD_PIN_ALLOC,        /* the backend's host_alloc, one call (cudaHostAlloc) */
    OFFLOAD_PIN_OFF,          /* pageable (copies do not overlap; comparisons) */
};

struct offload_opts {
    size_t chunk_bytes; /* pipeline chunk of the transfer buffer; 0: 64 MiB */
    int sync;           /* 1: synchronous copies even where the backend has async ones */
    int threads;        /* threads of the CPU update; 0: OMP_NUM_THREADS / the cores */
    int isa;            /* enum oadam_isa (offload_adamw.h); 0: the best this CPU has */
    int pin;            /* enum offload_pin */
    int delayed;        /* 1: the one-step delayed update (below; changes the numerics) */
};

/* Timings of the last offload_step (ms; bench and step records). */
struct offload_stats {
    double ms_step;      /* wall time of offload_step on the engine thread */
    double ms_cpu;       /* the CPU AdamW's wall time (delayed: the update the last step
                          * finished, which ran behind the device's compute) */
    double ms_cpu_wait;  /* engine thread waiting for the CPU update */
    double ms_copy_wait; /* engine thread waiting for copies (exposed PCIe time) */
    double ms_alloc;     /* offload_alloc: host state ready (start-up) */
    double ms_pin;       /* of which the transfer buffer (map, touch, page-lock) */
};

/* State for engine e (not allocated yet: offload_alloc). NULL on failure.
 * Made by engine_offload_enable; freed by engine_free. */
struct offload *offload_new(struct engine *e, const struct offload_opts *o);
void offload_free(struct offload *o); /* NULL ok; releases the host state */

/* (Re)allocate the host state for a shard of n elements and point
 * e->master / e->opt_m / e->opt_v at it (e->opt_host = 1); m and v are
 * zeroed and master is zeroed too (offload_master_from_params fills it).
 * Adds the bytes to e->mem.host. 0 or -1 (message logged). */
int offload_alloc(struct offload *o, size_t n);
/* Free the host state (waits for copies in flight); e's pointers NULL. */
void offload_release(struct offload *o);
/* master = fp32 of the params window over the shard (after a new shard). */
void offload_master_from_params(struct offload *o);

/* Host bytes offload_alloc takes for n elements of element size es. Pure. */
size_t offload_host_bytes(size_t n, size_t es);

/* Flat gradient range [off, off+n) of the shard is final for this step
 * (issued work on the compute stream has written it): queue its download.
 * Parts outside the shard are ignored. No-op without offload. */
void offload_grads_final(struct engine *e, size_t off, size_t n);
/* Queue the download of every part of the shard's gradients not queued yet
 * this step (after grad_sync). No-op without offload. */
void offload_fetch_grads(struct engine *e);
/* The optimizer step on the CPU (optim_step calls it when offload is on):
 * arguments as optim_step. */
void offload_step(struct engine *e, const struct optim_cfg *c, double lr, double grad_scale,
                  int64_t step);

/* Delayed update: wait for the update in flight and upload its parameters
 * (then param_sync), so that the device and the host state agree: before an
 * evaluation, a checkpoint, an export and at the end. No-op otherwise. */
void offload_flush(struct engine *e);
int offload_delayed(const struct engine *e); /* 1 when the delayed update is on */
void offload_get_stats(const struct engine *e, struct offload_stats *st);

#endif
