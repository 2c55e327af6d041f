/* nf4_tool IN OUT_Q OUT_W [THREADS]: the host NF4 quantizer (worker/nf4.c)
 * over the fp32 values of file IN (raw little-endian): OUT_Q gets the
 * quantized buffer (worker/nf4_format.h), OUT_W the dequantized fp32 values.
 * THREADS: the fast quantizer on that many threads (nf4_quantize_mt), 0 the
 * serial reference; default nf4_quantize. For tests/qlora/test_qlora.py,
 * which checks both against numpy. */
#include <stdio.h>
#include <stdlib.h>

#include "worker/nf4.h"

static long file_size(FILE *f) {
    if (fseek(f, 0, SEEK_END) != 0) return -1;
    long n = ftell(f);
    return fseek(f, 0, SEEK_SET) == 0 ? n : -1;
}

int main(int argc, char **argv) {
    int threads = argc == 5 ? atoi(argv[4]) : -1;
    if ((argc != 4 && argc != 5) || (argc == 5 && (threads < 0 || threads > NF4_MAX_THREADS))) {
        fprintf(stderr, "usage: nf4_tool IN OUT_Q OUT_W [THREADS 0..%d]\n", NF4_MAX_THREADS);
        return 2;
    }
    int rc = 1;
    FILE *in = fopen(argv[1], "rb"), *oq = NULL, *ow = NULL;
    float *w = NULL, *d = NULL;
    uint8_t *q = NULL;
    long bytes = in ? file_size(in) : -1;
    if (bytes < 0 || bytes % 4) {
        fprintf(stderr, "nf4_tool: cannot read %s as fp32 values\n", argv[1]);
        goto out;
    }
    size_t n = (size_t)bytes / 4;
    w = malloc(n * 4 + 4), d = malloc(n * 4 + 4), q = malloc(nf4_bytes(n));
    if (!w || !d || !q || fread(w, 4, n, in) != n) {
        fprintf(stderr, "nf4_tool: out of memory or short read\n");
        goto out;
    }
    if (threads < 0)
        nf4_quantize(w, n, q);
    else if (threads == 0)
        nf4_quantize_serial(w, n, q);
    else
        nf4_quantize_mt(w, n, q, threads);
    nf4_dequantize(q, n, d);
    oq = fopen(argv[2], "wb"), ow = fopen(argv[3], "wb");
    if (!oq || !ow || fwrite(q, 1, nf4_bytes(n), oq) != nf4_bytes(n) || fwrite(d, 4, n, ow) != n) {
        fprintf(stderr, "nf4_tool: cannot write the outputs\n");
        goto out;
    }
    rc = 0;
out:
    if (in) fclose(in);
    if (oq && fclose(oq) != 0) rc = 1;
    if (ow && fclose(ow) != 0) rc = 1;
    free(w), free(d), free(q);
    return rc;
}
