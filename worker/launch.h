/* Local launcher: `loom-worker --nproc N ...` starts N ranks of the same
 * command on this machine, like torchrun.
 *
 * Each child is this executable (/proc/self/exe) with the caller's arguments
 * minus --nproc/--rank/--world/--rdzv/--local-rank, plus --rank R --world N
 * --local-rank R --rdzv file:DIR, where DIR is a fresh temporary directory
 * (removed afterwards). Environment: LOOM_NPROC=1 (no recursion) and
 * CUDA_VISIBLE_DEVICES = the R-th entry of the caller's list, or R when the
 * caller set none (one GPU per rank; the worker then uses its device 0).
 * Rank 0's stdout is the launcher's stdout (the job's JSON lines); the other
 * ranks' stdout goes to the launcher's stderr, so consumers see one stream.
 * If any rank exits non-zero or dies, the others get SIGTERM, then SIGKILL
 * after a grace period: no rank is left waiting in a collective. SIGTERM and
 * SIGINT to the launcher are forwarded to every rank.
 *
 * Returns the exit code for the launcher: 0 when every rank exited 0, else
 * the first failing rank's code (128 + signal when killed). Call from main
 * before any thread starts. */
#ifndef LOOM_WORKER_LAUNCH_H
#define LOOM_WORKER_LAUNCH_H

int launch_local(int argc, char **argv, int nproc);

#endif
