/* Device-side ordering of the NCCL comm streams after the engine's compute
 * stream, so that starting a collective on data the GPU is still producing
 * needs no host wait.
 *
 * The comm layer's contract (worker/comm/comm.h) is that the input of an
 * operation is complete when the operation is issued; on the CUDA backend
 * that meant a full stream synchronisation before every per-layer gradient
 * reduction and every ZeRO-3 prefetch, which drains the GPU's queue each
 * time. With ordering attached, the engine thread instead calls
 * nccl_order_mark(range) after issuing the work that produces (or last
 * touches) a device range: it records that range's fence event on the compute
 * stream, and every NCCL operation (issued later, on any comm's thread) whose
 * send or receive buffer overlaps a marked range first makes its stream wait
 * for that range's latest fence. Keyed by range, so a reduction of layer l
 * waits for layer l's gradients only, however far ahead the engine thread
 * has issued the rest of the backward. Unmarked buffers keep the plain
 * contract (the caller synchronises). A range's mark must be issued before
 * the operation that reads it is requested, and not re-marked for newer work
 * before that operation has completed (zero.c waits for each request first).
 * One compute stream per process (the worker's), hence process-wide state.
 * Engine thread: attach/mark/detach; the comm threads only wait on the
 * events (a mutex orders both).
 * Output ordering (compute must not overwrite what a collective reads or
 * writes before it completes) is unchanged: callers still wait for the
 * request on the host before touching its buffers. */
#ifndef LOOM_NCCL_ORDER_H
#define LOOM_NCCL_ORDER_H

#include <stddef.h>

/* Order NCCL operations after fences on compute_stream (a cudaStream_t of the
 * current device). Returns 0. */
int nccl_order_attach(void *compute_stream);
/* Record the fence of [p, p + bytes) after all work issued so far on the
 * compute stream (device memory; at most 256 ranges are tracked, the oldest
 * is reused after waiting for it). */
void nccl_order_mark(const void *p, size_t bytes);
/* Stop ordering and release the event s (call once no operation is in flight). */
void nccl_order_detach(void);

#endif
