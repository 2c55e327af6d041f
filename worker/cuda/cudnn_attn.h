/* Causal attention through cuDNN's fused flash-attention engines (the
 * backend graph API), an alternative to k_attn.cu's kernels for multi-head
 * (H == Hkv) and grouped-query attention (H a multiple of Hkv) on the
 * engine's fused qkv layout.
 *
 * cuDNN is optional at build and at run time: the module is compiled against
 * cudnn_graph.h when the toolkit has it, and libcudnn.so.9 is opened with
 * dlopen on first use, so a worker without cuDNN still starts and uses
 * k_attn.cu. Every failure (no library, no engine for the graph, a status
 * from cuDNN) is returned as -1 / NULL with a message in `why`; the caller
 * falls back to k_attn.cu.
 *
 * Two backward graphs, both the ones cudnn-frontend builds for its SDPA
 * backward node (read there, written here against the backend API):
 *   deterministic (default): dQ written directly, the engine keeps dP in its
 *     workspace (B*H*T*T bf16), no float atomics; bit-identical repeats;
 *   nondeterministic ("nd"): dQ summed in an fp32 accumulator with atomics
 *     and converted, smaller workspace.
 * Statistics: lse[B][H][T] fp32, natural-log log-sum-exp of the scaled
 * scores, the same convention as lk_attn_fwd, so either forward can feed
 * either backward. */
#ifndef LOOM_WORKER_CUDA_CUDNN_ATTN_H
#define LOOM_WORKER_CUDA_CUDNN_ATTN_H

#include <stddef.h>

struct lcudnn_attn;

/* Plans for one shape: q/k/v rows of ld_qkv elements (q of head h at h*D,
 * k of kv head j at (H+j)*D, v at (H+Hkv+j)*D; query head h uses kv head
 * h / (H / Hkv)), out and dout rows of ld_o. stream is a cudaStream_t.
 * deterministic selects the backward graph. NULL with `why` filled when
 * cuDNN or an engine for this shape is not available, or H is not a
 * multiple of Hkv. The backward writes dK / dV with Hkv heads (each the sum
 * over its group of query heads). */
struct lcudnn_attn *lcudnn_attn_new(void *stream, int B, int T, int H, int Hkv, int D, int ld_qkv,
                                    int ld_o, int deterministic, char *why, size_t whylen);
int lcudnn_attn_fwd(struct lcudnn_attn *a, void *out, float *lse, const void *qkv);
int lcudnn_attn_bwd(struct lcudnn_attn *a, void *dqkv, const void *dout, const void *out,
                    const float *lse, const void *qkv);
/* device bytes held (cuDNN workspaces and the module's own buffers) */
size_t lcudnn_attn_bytes(const struct lcudnn_attn *a);
/* engine global indexes chosen for the forward and backward plans */
void lcudnn_attn_engines(const struct lcudnn_attn *a, int *fwd, int *bwd);
void lcudnn_attn_free(struct lcudnn_attn *a);
/* the loaded library's version (e.g. 91900), 0 when it cannot be loaded */
long lcudnn_version(void);

#endif
