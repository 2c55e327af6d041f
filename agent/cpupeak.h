/* The node's cpu peak for MFU: loom-agent runs `loom-worker --bench-gemm
 * --threads N` once at start (the worker's own fp32 GEMM, about 0.5 s) and
 * reports the result at registration (cpu_peak_gflops) and to its cpu
 * workers (LOOM_CPU_PEAK_GFLOPS). docs/operations.md "CPU peak and MFU". */
#ifndef LOOM_AGENT_CPUPEAK_H
#define LOOM_AGENT_CPUPEAK_H

/* GFLOP/s of one cpu device of `threads` threads, measured by `worker`
 * within timeout_ms (the child is killed past it); 0 with a warning logged
 * when the run failed, timed out or printed no number. */
double cpupeak_measure(const char *worker, int threads, int timeout_ms);

/* The "gflops" number of the worker's {"type":"cpu_peak",...} line in out,
 * or 0 when there is none or it is not in (0, 1e7]. */
double cpupeak_parse(const char *out);

#endif
