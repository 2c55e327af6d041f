/* The backward grid of the LoRA dropout kernels (worker/cuda/k_lora.cu,
 * backend.h lora_drop_bwd) and the workspace it needs: column tiles of
 * LORA_DROP_CT input columns times chunks of rows (a multiple of
 * LORA_DROP_BM), one fp32 [r, in] partial of dA per chunk, summed in chunk
 * order; and the forward's split of K (below). A function of the shape alone, so the summation
 * order (and so every bit of dA) is the same on every run and device. Header only: the planner
 * (api/planner.c) counts the same workspace bytes lora.c allocates. */
#ifndef LOOM_WORKER_LORA_DROP_H
#define LOOM_WORKER_LORA_DROP_H

#include <stddef.h>

#define LORA_DROP_BM     32   /* rows per step of a block */
#define LORA_DROP_CT     64   /* input columns per block */
#define LORA_DROP_BLOCKS 1024 /* the grid it aims for: several waves of 2-3 blocks an SM */

/* chunks of `rows` rows each covering N. */
static inline void lora_drop_grid(int N, int in, int *chunks, int *rows) {
    int ncol = (in + LORA_DROP_CT - 1) / LORA_DROP_CT, nsub = (N + LORA_DROP_BM - 1) / LORA_DROP_BM;
    int ch = (LORA_DROP_BLOCKS + ncol - 1) / ncol;
    if (ch > nsub) ch = nsub;
    if (ch < 1) ch = 1;
    int subs = (nsub + ch - 1) / ch; /* row steps per chunk */
    if (subs < 1) subs = 1;
    *rows = subs * LORA_DROP_BM;
    *chunks = (nsub + subs - 1) / subs;
    if (*chunks < 1) *chunks = 1;
}

/* The forward's split of K (the input columns) over blocks: `splits`
 * ranges of `cols` columns (a multiple of LORA_DROP_CT) each, so that row
 * blocks of LORA_DROP_BM times splits reach about LORA_DROP_BLOCKS; with
 * splits > 1 each range's fp32 [N, r] partial goes to the workspace and a
 * second pass adds them in range order. */
static inline void lora_drop_fsplit(int N, int in, int *splits, int *cols) {
    int rb = (N + LORA_DROP_BM - 1) / LORA_DROP_BM, ks = (in + LORA_DROP_CT - 1) / LORA_DROP_CT;
    int s = (LORA_DROP_BLOCKS + rb - 1) / rb;
    if (s > ks) s = ks;
    if (s < 1) s = 1;
    int steps = (ks + s - 1) / s;
    if (steps < 1) steps = 1;
    *cols = steps * LORA_DROP_CT;
    *splits = (ks + steps - 1) / steps;
    if (*splits < 1) *splits = 1;
}

/* Bytes of the fp32 partials for an [N, in] input and rank r: the
 * backward's dA chunks or the forward's K ranges, whichever is larger. */
static inline size_t lora_drop_ws_bytes(int N, int in, int r) {
    int chunks, rows, splits, cols;
    if (N < 1 || in < 1 || r < 1) return 0;
    lora_drop_grid(N, in, &chunks, &rows);
    lora_drop_fsplit(N, in, &splits, &cols);
    size_t b = (size_t)chunks * (size_t)r * (size_t)in * sizeof(float);
    size_t f = splits > 1 ? (size_t)splits * (size_t)N * (size_t)r * sizeof(float) : 0;
    return b > f ? b : f;
}

#endif
