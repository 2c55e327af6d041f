/* Gradient all-reduce for a data-parallel group of exactly two GPUs of one
 * host, done by the copy engines instead of NCCL kernels.
 *
 * Why: with NCCL, the per-layer gradient all-reduces of the backward run as
 * kernels that hold SMs (one CTA per channel) and compete with the
 * backward's matmuls for the whole transfer; on 2x H200 that made the dp2
 * GPT-2 124M step ~1.5 ms slower than the 1-GPU step beyond the exposed tail
 * (docs/perf.md, "Multi-GPU II"). Here each rank copies its range straight
 * into the peer's receive area (cudaMemcpyAsync between IPC-mapped device
 * buffers: a DMA copy over NVLink, no SMs), and a short add kernel sums the
 * two halves in place. Both ranks compute bf16(float(a) + float(b)), which is
 * commutative, so both hold identical bits (the same value NCCL's two-rank
 * sum gives).
 *
 * A range is cut into chunks (about pair-chunk-kib, LOOM_PAIR_CHUNK_KIB, default 8 MiB; at
 * most 16 a range) copied alternately on two copy streams (two copy engines
 * busy), and each chunk is added as soon as it has arrived, so the adds of a
 * large range overlap its later copies. Synchronisation is on the device,
 * with stream memory operations on 32-bit flags that live in each rank's
 * receive allocation and are written by the peer (cuStreamWriteValue32 to the
 * IPC-mapped address):
 *   copy streams: wait(compute fence of the range); at a step's first range
 *                 wait(freed >= chunks we have sent so far) (the peer has
 *                 consumed them: its receive area is free again);
 *                 copy chunk i -> peer.recv; peer.arrived[i] = step
 *   add stream:   wait(our copy of chunk i: the add overwrites its source);
 *                 wait(arrived[i] >= step); buf[chunk] += recv[chunk];
 *                 peer.freed = chunks of the peer's we have consumed
 * pair_ar_finish orders the compute stream after the last add and waits on the
 * host, bounded by the timeout, so a dead peer fails the step instead of
 * hanging it. Ranges must be started in the same order on both ranks (as
 * with any collective). Used by worker/zero.c for ZeRO stage 0 on CUDA when
 * dp == 2 (LOOM_DP_PAIR=0 falls back to NCCL), through the transport interface of
 * worker/nccl/dp_transport.h. */
#ifndef LOOM_NCCL_PAIR_H
#define LOOM_NCCL_PAIR_H

#include <stddef.h>

struct comm;
struct pair_ar;

/* Collective over the two members of `c` (a nccl comm): allocate this rank's
 * receive area (n elements of elt bytes, the size of buf) and open the
 * peer's. buf: the device buffer whose ranges are reduced (bf16 only: elt
 * 2); compute_stream: the cudaStream_t producing it. Returns NULL with a
 * reason in err when the pair path is not possible (group size, dtype, no
 * peer mapping, no stream memory operations); both ranks then agree to
 * return NULL, so the caller can fall back to NCCL. side_bytes: the size of
 * the side area for pair_ar_side_send (0: none). */
/* The pair-* tuning rows (worker/tuning.h). */
struct pair_ar_tuning {
    long chunk_kib;       /* chunk size (<= 0: 8192) */
    long trace;           /* log chunk timings of this many steps (0: none) */
    const char *priority; /* "high": copy and add streams at the highest priority */
};
/* t: NULL for the defaults. */
struct pair_ar *pair_ar_new(struct comm *c, void *buf, size_t n, size_t elt, void *compute_stream,
                            size_t side_bytes, int timeout_ms, const struct pair_ar_tuning *t,
                            char *err, size_t errlen);
/* Start the sum of elements [lo, hi) of buf with the peer, after the work
 * issued so far on the compute stream. No host wait. At most 1024 chunks a
 * step. 0, or -1 (err in pair_ar_error). */
int pair_ar_start(struct pair_ar *p, size_t lo, size_t hi);
/* End the step: every started range holds the sum on the device, the
 * compute stream is ordered after the adds, and the host has waited for
 * them (bounded by the timeout). 0, or -1 on a timeout or CUDA error (the
 * pair is then broken and every later call fails). */
int pair_ar_finish(struct pair_ar *p);
/* Side messages: bytes from the device buffer src into the peer's side area
 * at off, copied after the work issued so far on the compute stream, in the
 * same slot sequence as the ranges (both ranks make the same calls in the
 * same order). Returns the slot (>= 0) or -1. The receiver makes a stream
 * wait for the peer's message of a slot (pair_ar_side_wait), reads it at
 * pair_ar_side_ptr(off), and when its readers are issued on that stream
 * gives the space back (pair_ar_side_release, count messages); the next
 * step's first copy into the peer waits for that. */
int pair_ar_side_send(struct pair_ar *p, size_t off, const void *src, size_t bytes);
int pair_ar_side_wait(struct pair_ar *p, int slot, void *stream);
void *pair_ar_side_ptr(struct pair_ar *p, size_t off);
int pair_ar_side_release(struct pair_ar *p, void *stream, int count);
/* pair_ar_mark records the add stream's position (the sums of every range
 * started so far); pair_ar_wait_mark makes a stream wait for it. */
int pair_ar_mark(struct pair_ar *p);
int pair_ar_wait_mark(struct pair_ar *p, void *stream);
/* Wait on the host, bounded by the timeout, for the compute stream's work
 * issued so far (which may wait on the peer's side messages). 0 or -1. */
int pair_ar_sync_compute(struct pair_ar *p);
const char *pair_ar_error(const struct pair_ar *p);
/* Collective-free: waits for the streams, unmaps the peer, frees. NULL ok. */
void pair_ar_free(struct pair_ar *p);

#endif
