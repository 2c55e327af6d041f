/* The cpu backend's peak FLOP/s for MFU: a short fp32 GEMM benchmark of the
 * backend's own matmul (loom-worker --bench-gemm, run once by loom-agent at
 * start), and the value the agent passes back to its cpu workers in
 * LOOM_CPU_PEAK_GFLOPS (docs/operations.md "CPU peak and MFU"). */
#ifndef LOOM_WORKER_CPU_PEAK_H
#define LOOM_WORKER_CPU_PEAK_H

#include "worker/backend.h"

/* Best GFLOP/s of the backend's matmul_fwd over repeated [256 x 512] @
 * [512 x 512]^T products within about budget_s seconds (at least 3 runs
 * after a warm-up). 0 when out of memory. */
double cpu_peak_measure(struct backend *be, double budget_s);

/* Sets be->peak_flops from LOOM_CPU_PEAK_GFLOPS when it holds a number in
 * (0, 1e7]; a malformed value is logged and ignored (mfu stays null).
 * Returns the GFLOP/s applied, 0 when none. */
double cpu_peak_from_env(struct backend *be);

#endif
