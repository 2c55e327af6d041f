/* CPU backend: NF4 base weights dequantized to fp32 (struct backend
 * nf4_dequant): the host reference itself (worker/nf4.c). */
#include "worker/cpu/cpu.h"
#include "worker/nf4.h"

void cpu_nf4_dequant(void *ctx, void *out, const void *q, size_t n) {
    (void)ctx;
    nf4_dequantize(q, n, out);
}

void cpu_nf4_dequant_absmax(void *ctx, void *out, const void *q, size_t n) {
    (void)ctx;
    nf4_dequantize_absmax(q, n, out);
}
