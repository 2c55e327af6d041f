/* The NF4 storage of one tensor (train.quantize_base "nf4"; docs/engine.md
 * "QLoRA"), as QLoRA / bitsandbytes define it, shared by the host quantizer
 * (worker/nf4.c) and the dequantizing kernels (cpu: worker/cpu/cpu_nf4.c,
 * cuda: worker/cuda/k_nf4.cu). One byte buffer per tensor of n weights:
 *
 *   codes [ceil(n / 2)]  two 4-bit indices into NF4_CODE per byte, weight 2i
 *                        in the high nibble, 2i + 1 in the low one
 *   q8    [nb]           nb = ceil(n / 64): each 64-weight block's absmax,
 *                        double-quantized: an index into the 8-bit map
 *   (zero padding to a 4-byte boundary)
 *   scale [nb2]  fp32    nb2 = ceil(nb / 256): the absmax of (absmax -
 *                        offset) over each 256 blocks
 *   offset       fp32    the mean of the blocks' absmax (over the tensor)
 *   map   [256]  fp32    the 8-bit map (bitsandbytes' signed dynamic map)
 *
 * Weight j: NF4_CODE[code_j] * (map[q8[j / 64]] * scale[j / (64 * 256)] +
 * offset). */
#ifndef LOOM_WORKER_NF4_FORMAT_H
#define LOOM_WORKER_NF4_FORMAT_H

#include <stddef.h>

#define NF4_BLOCK  64  /* weights per absmax */
#define NF4_BLOCK2 256 /* absmax values per fp32 scale */

/* The 16 NF4 values (QLoRA, appendix E / bitsandbytes): normal quantiles
 * q_i = Phi^-1 of evenly spaced probabilities, 8 from the positive half
 * (probabilities from 0.5 to delta = 1/2 (1/32 + 1/30) off 1) and 7 from the
 * negative half, so that 0 is exact, normalized to [-1, 1]. tests/unit/
 * test_nf4.py derives them from that definition and checks these. */
static const float NF4_CODE[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

static inline size_t nf4_nblocks(size_t n) {
    return (n + NF4_BLOCK - 1) / NF4_BLOCK;
}
static inline size_t nf4_nblocks2(size_t n) {
    return (nf4_nblocks(n) + NF4_BLOCK2 - 1) / NF4_BLOCK2;
}
/* Byte offsets of the parts, and the whole buffer's size. */
static inline size_t nf4_off_q8(size_t n) {
    return (n + 1) / 2;
}
static inline size_t nf4_off_scale(size_t n) {
    return (nf4_off_q8(n) + nf4_nblocks(n) + 3) / 4 * 4;
}
static inline size_t nf4_off_offset(size_t n) {
    return nf4_off_scale(n) + 4 * nf4_nblocks2(n);
}
static inline size_t nf4_off_map(size_t n) {
    return nf4_off_offset(n) + 4;
}
static inline size_t nf4_bytes(size_t n) {
    return nf4_off_map(n) + 256 * 4;
}

/* ---- tensor-parallel shards (docs/engine.md "QLoRA", tp) ----
 *
 * tp rank idx's shard of a 2-D tensor [d0][d1] is `count` runs of `len`
 * weights of the flat tensor (numel = d0 * d1), run r starting at base + r *
 * stride: split 1 (column: rows cut, one run a fused part) or 2 (row:
 * columns cut, one run a row); anything else, or tp 1, is the whole tensor.
 * Every rank quantizes the whole tensor as one process does and keeps:
 *
 *   NF4_SHARD_SLICE   the runs start and end on 16384-weight boundaries (256
 *                     blocks of 64; the last run may end at the tensor's
 *                     end): the runs' codes, q8 bytes and scales of the whole
 *                     buffer, concatenated, with its offset and map: a buffer
 *                     of the format above for n = count * len
 *   NF4_SHARD_ABSMAX  the runs start and end on 64-weight boundaries:
 *                     codes [ceil(n / 2)] as above, zero padding to 4 bytes,
 *                     absmax [nb] fp32, each block's absmax dequantized once
 *                     at load, fma(map[q8], scale, offset). Weight j:
 *                     NF4_CODE[code_j] * absmax[j / 64]
 *
 * A run boundary inside a 64-weight block (a block on two ranks) is not
 * supported: NF4_SHARD_NONE. */
enum { NF4_SHARD_NONE = -1, NF4_SHARD_SLICE = 0, NF4_SHARD_ABSMAX = 1 };

struct nf4_shard {
    size_t numel, count, len, base, stride; /* n = count * len */
    int layout;
};

static inline int nf4_runs_aligned(const struct nf4_shard *s, size_t g) {
    int last_at_end = s->count == 1 && s->base + s->len == s->numel;
    return s->base % g == 0 && (s->count == 1 || s->stride % g == 0) &&
           (s->len % g == 0 || last_at_end);
}

/* The shard of tp rank idx (0 <= idx < tp) of tensor [d0][d1] cut by split
 * (1 column, 2 row; `parts` fused blocks along d0 for a column split);
 * returns s->layout. */
static inline int nf4_shard_geom(size_t d0, size_t d1, int split, int parts, int tp, int idx,
                                 struct nf4_shard *s) {
    s->numel = d0 * d1;
    s->count = 1, s->len = s->numel, s->base = 0, s->stride = s->numel;
    if (tp > 1 && split == 1) {
        size_t blk = d0 / (size_t)(parts > 0 ? parts : 1), per = blk / (size_t)tp;
        s->count = (size_t)(parts > 0 ? parts : 1);
        s->len = per * d1;
        s->base = (size_t)idx * per * d1;
        s->stride = blk * d1;
    } else if (tp > 1 && split == 2) {
        size_t r1 = d1 / (size_t)tp;
        s->count = d0;
        s->len = r1;
        s->base = (size_t)idx * r1;
        s->stride = d1;
    }
    s->layout = nf4_runs_aligned(s, (size_t)NF4_BLOCK * NF4_BLOCK2) ? NF4_SHARD_SLICE
                : nf4_runs_aligned(s, NF4_BLOCK)                    ? NF4_SHARD_ABSMAX
                                                                    : NF4_SHARD_NONE;
    return s->layout;
}

/* The ABSMAX layout's absmax offset and size for n weights. */
static inline size_t nf4a_off_absmax(size_t n) {
    return (nf4_off_q8(n) + 3) / 4 * 4;
}
static inline size_t nf4a_bytes(size_t n) {
    return nf4a_off_absmax(n) + 4 * nf4_nblocks(n);
}
/* A shard's bytes (0 for NF4_SHARD_NONE). */
static inline size_t nf4_shard_bytes(const struct nf4_shard *s) {
    size_t n = s->count * s->len;
    return s->layout == NF4_SHARD_SLICE    ? nf4_bytes(n)
           : s->layout == NF4_SHARD_ABSMAX ? nf4a_bytes(n)
                                           : 0;
}

#endif
