/* train.precision "fp8" with a frozen base (LoRA) on one device: the block
 * linear weights held on the device only as the backend's E4M3 W8 (backend.h
 * fp8_freeze with a handle: 1 byte a weight, W8^T made at each input-gradient
 * GEMM), the compute-dtype base in host memory (docs/engine.md "FP8").
 *
 * Without it (the fp8-base-bf16 tuning row, or a layout it does not take),
 * the device holds the bf16 base and the E4M3 W8 and W8^T beside it: 4 bytes
 * a block weight in place of 1. The E4M3 values, and so the training, are the
 * same either way (W8^T is W8 transposed byte for byte).
 *
 * fp8base_attach replaces engine e's params window by a host copy of it, one
 * device buffer for every tensor that is not a held weight (the window less
 * the held spans: adjacent tensors stay adjacent, at their alignment) and the held
 * weights' handles as their views (engine.pview; the other tensors of a fused
 * weight, k and v behind q, up behind gate, get no view). From then on:
 *   - the model passes the handles to the backend (engine_param);
 *   - engine_params_from_host(_raw) writes the host copy (fp8base_put), which
 *     makes a held weight's E4M3 values again from it, and the other tensors'
 *     buffers as before (fp8base_holds: the views not to write);
 *   - the frozen "master" reads (exports, lora_merge) come from the host copy
 *     (fp8base_read): the weights as loaded, not their E4M3 form.
 * Taken when e is frozen, has one rank (tp, dp, pp 1), no NF4 base, no
 * offload, its whole params window resident and no views, on a backend with
 * fp8_freeze (cuda's, bf16; the host copy is in the backend's dtype). Device memory
 * (e->mem.params): the window's bytes less 1 a held weight (its 2 bf16 bytes out, its W8 byte in);
 * the window is freed before W8 is made (through a staging buffer of the widest weight), so the
 * peak is the window's. */
#ifndef LOOM_WORKER_FP8BASE_H
#define LOOM_WORKER_FP8BASE_H
#include <stddef.h>

struct engine;
struct fp8base;

/* One GEMM weight [oc, ic] starting at layout tensor t: the flat range of
 * oc x ic values from t's offset (the tensors it covers adjacent: q|k|v,
 * gate|up, or t alone). */
struct fp8base_weight {
    int t, oc, ic;
};

/* As above over the n weights w. 0 done (*held: the weights on the E4M3 path,
 * *bytes their W8 bytes; a weight the backend does not take stays bf16 in its
 * own buffer), 1 not taken (e keeps its window, or has it again when the
 * backend took no weight), -1 failed (logged; e is unusable). */
int fp8base_attach(struct engine *e, const struct fp8base_weight *w, int n, int *held,
                   size_t *bytes);
void fp8base_free(struct fp8base *f); /* NULL ok */
/* 1 when layout tensor i's view is a held weight's handle. NULL f: 0. */
int fp8base_holds(const struct fp8base *f, int i);
/* engine_params_from_host(_raw)'s hook: flat range [off, off + n) of src
 * (elt bytes a value: 4 fp32, 2 the compute dtype) into the host copy; each
 * held weight it meets gets its E4M3 values again. 0 or -1 (out of memory). */
int fp8base_put(struct fp8base *f, size_t off, const void *src, size_t n, size_t elt);
/* Flat range [off, off + n) of the base as fp32 from the host copy. */
void fp8base_read(const struct fp8base *f, size_t off, size_t n, float *dst);

#endif
