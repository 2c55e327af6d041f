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

#endif
