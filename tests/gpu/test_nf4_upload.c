/* QLoRA's NF4 storage on cuda (worker/nf4.c nf4_put / quantize_one): a one-block
 * llama whose MLP weights (16.8M weights each) take two steps of the quantizer's
 * pipeline, loaded through engine_params_from_host (fp32, whole tensors) and
 * engine_params_from_host_raw (bf16, in two pieces), with the codes uploaded while
 * the next step is quantized (nf4-overlap 1) and after the whole tensor (0), and
 * with the serial quantizer (nf4-fast 0). After nf4_layer(0) each block linear
 * weight's bf16 view on the device must equal the host reference: the serial
 * quantizer's buffer dequantized on the host (nf4_dequantize) and rounded to bf16,
 * which tests/gpu/test_lora_cuda.c checks the dequantization kernels against.
 * One PASS / FAIL line per case (with the seconds spent in nf4_put); exits 77 without a
 * CUDA device. `test_nf4_upload cpu` runs the same on the cpu backend (fp32 views, equal
 * to nf4_dequantize exactly; also in builds without CUDA: unit.nf4.upload_cpu). Then the
 * tp shards' dequantization (run_shards). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/backend.h"
#ifdef LOOM_HAVE_CUDA
#include "worker/cuda/cuda_util.h"
#endif
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/nf4.h"
#include "worker/safetensors.h"
#include "worker/tuning.h"

static int fails, on_cpu;

static struct model_config config(void) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, MODEL_LLAMA);
    c.n_layer = 1;
    c.n_head = 8;
    c.n_kv_head = 4;
    c.d_model = 1024;
    c.d_ff = 16448; /* d_ff x d_model = 2^24 + 65536: two pipeline steps */
    c.vocab_size = 64;
    c.seq_len = 64;
    model_config_finalize(&c);
    return c;
}

/* Tensor i's host values: a smooth pattern with a few large and zero ones. */
static void values(float *v, size_t n, int i) {
    for (size_t j = 0; j < n; j++) {
        double x = sin((double)j * 0.0137 + i) * 0.03 * (1.0 + (double)(j % 89) / 40);
        v[j] = j % 4099 == 0 ? 0.4f : j % 1021 == 0 ? 0.0f : (float)x;
    }
}

static const struct {
    const char *name;
    struct nf4_opts o;
    int bf16; /* 1: engine_params_from_host_raw with bf16 values (cpu: fp32), in two pieces */
} cases[] = {
    {"fast, overlapped upload, fp32", {.fast = 1, .threads = 0, .overlap = 1}, 0},
    {"fast, upload after quantization, fp32", {.fast = 1, .threads = 3, .overlap = 0}, 0},
    {"serial quantizer, fp32", {.fast = 0, .threads = 0, .overlap = 0}, 0},
    {"fast, overlapped upload, bf16 in two pieces", {.fast = 1, .threads = 0, .overlap = 1}, 1},
};

static void run_case(int k) {
    struct model_config c = config();
    struct engine_place pl = {
        .rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1, .frozen = 1, .windows_later = 1};
    nf4_configure(&cases[k].o);
#ifdef LOOM_HAVE_CUDA
    struct backend *be = on_cpu ? backend_cpu_new(0) : backend_cuda_new(0);
#else
    struct backend *be = backend_cpu_new(0);
#endif
    struct engine *e = be ? engine_new(&c, &pl, be) : NULL;
    char err[256] = "";
    int ok = e && nf4_attach(e, err, sizeof err) == 0;
    size_t checked = 0, bad = 0, big = 0;
    for (int i = 0; ok && i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        size_t n = (size_t)t->rank_numel, off = (size_t)t->rank_offset;
        float *v = malloc(n * sizeof *v);
        uint16_t *h = malloc(n * sizeof *h);
        if (!v || !h) {
            ok = 0;
        } else if (cases[k].bf16) {
            values(v, n, i);
            for (size_t j = 0; j < n; j++)
                h[j] = st_f32_to_bf16(v[j]);
            size_t half = n / 2 + 17 < n ? n / 2 + 17 : n, es = e->be->elt_size;
            const char *src = on_cpu ? (const char *)v : (const char *)h; /* the backend's dtype */
            ok = engine_params_from_host_raw(e, off, src, half) == 0 &&
                 (half == n ||
                  engine_params_from_host_raw(e, off + half, src + half * es, n - half) == 0);
        } else {
            values(v, n, i);
            ok = engine_params_from_host(e, off, v, n) == 0;
        }
        free(v), free(h);
    }
    double put_s = ok ? nf4_put_seconds(e->nf4) : 0;
    if (ok) nf4_layer(e->nf4, 0);
    for (int i = 0; ok && i < e->layout.n; i++) {
        if (!nf4_is_quantized(e, i)) continue;
        size_t n = (size_t)e->layout.t[i].rank_numel, nb = nf4_bytes(n);
        float *v = malloc(n * sizeof *v), *d = malloc(n * sizeof *d);
        uint8_t *q = malloc(nb);
        uint16_t *got = malloc(n * sizeof(float)); /* bf16 on cuda, fp32 on cpu */
        if (!v || !d || !q || !got) {
            ok = 0;
        } else {
            values(v, n, i);
            if (cases[k].bf16 && !on_cpu) /* what the engine got: the bf16 values, widened */
                for (size_t j = 0; j < n; j++) {
                    uint32_t u = (uint32_t)st_f32_to_bf16(v[j]) << 16;
                    memcpy(v + j, &u, sizeof u);
                }
            nf4_quantize_serial(v, n, q);
            nf4_dequantize(q, n, d);
            e->be->download(e->be->ctx, got, e->pview[i], n * e->be->elt_size);
            for (size_t j = 0; j < n; j++) {
                float g;
                memcpy(&g, (const float *)(const void *)got + j, sizeof g);
                bad += on_cpu ? memcmp(&g, d + j, sizeof g) != 0 : got[j] != st_f32_to_bf16(d[j]);
            }
            checked += n;
            big += n > ((size_t)1 << 24);
        }
        free(v), free(d), free(q), free(got);
    }
    ok = ok && bad == 0 && big >= 3 && checked > 0;
    int threads = !cases[k].o.fast     ? 1
                  : cases[k].o.threads ? (int)cases[k].o.threads
                                       : nf4_threads();
    printf("%s: NF4 storage on %s, %s: the views after nf4_layer equal the host "
           "reference (%zu of %zu weights differ, %zu tensors over 16M weights; load %.2f s, %d "
           "threads)%s%s\n",
           ok ? "PASS" : "FAIL", on_cpu ? "cpu" : "cuda", cases[k].name, bad, checked, big, put_s,
           threads, err[0] ? "; " : "", err);
    fails += !ok;
    engine_free(e); /* engine_new frees the backend when it fails */
}

/* tp shards (nf4_format.h): the whole tensor quantized, rank idx's shard
 * extracted (nf4_shard_extract), uploaded and dequantized by the backend
 * (nf4_dequant for a SLICE, nf4_dequant_absmax for an ABSMAX shard; on cuda
 * with the 8-a-thread and the one-a-thread kernel) must equal the host's
 * nf4_dequantize_layout of the same buffer (cuda: rounded to bf16), bit for
 * bit. */
static const struct {
    size_t d0, d1;
    int split, parts, tp, layout;
} shards[] = {
    {96, 1024, 2, 1, 2, NF4_SHARD_ABSMAX},   /* row: o / down */
    {96, 1024, 2, 1, 4, NF4_SHARD_ABSMAX},   /* row, tp 4 */
    {512, 96, 1, 1, 2, NF4_SHARD_ABSMAX},    /* column, 24576 weights a rank */
    {768, 64, 1, 3, 2, NF4_SHARD_ABSMAX},    /* fused column (c_attn), 3 runs */
    {512, 128, 1, 1, 2, NF4_SHARD_SLICE},    /* column on 16384 boundaries */
    {3 * 512, 128, 1, 3, 4, NF4_SHARD_SLICE} /* fused column, tp 4 */
};

#ifdef LOOM_HAVE_CUDA
static struct backend *shard_backend(int plain) {
    if (on_cpu) return backend_cpu_new(0);
    struct worker_tuning t;
    if (worker_tuning_from_env(&t) != 0) return NULL;
    t.cuda.nf4_vec = plain ? 0 : t.cuda.nf4_vec;
    struct backend *b = backend_cuda_new_tuned(0, &t.cuda);
    worker_tuning_free(&t);
    return b;
}
#else
static struct backend *shard_backend(int plain) {
    (void)plain;
    return backend_cpu_new(0);
}
#endif

static void run_shards(void) {
    for (int plain = 0; plain < (on_cpu ? 1 : 2); plain++)
        for (size_t k = 0; k < sizeof shards / sizeof *shards; k++)
            for (int idx = 0; idx < shards[k].tp; idx++) {
                struct nf4_shard sh;
                int lay = nf4_shard_geom(shards[k].d0, shards[k].d1, shards[k].split,
                                         shards[k].parts, shards[k].tp, idx, &sh);
                size_t N = sh.numel, n = sh.count * sh.len, sb = nf4_shard_bytes(&sh);
                struct backend *be = shard_backend(plain);
                float *v = malloc(N * sizeof *v), *d = malloc(n * sizeof *d);
                uint8_t *whole = malloc(nf4_bytes(N)), *q = malloc(sb ? sb : 1);
                uint32_t *got = malloc(n * sizeof *got);
                void *dq = be ? be->alloc(be->ctx, sb ? sb : 1) : NULL;
                void *dout = be ? be->alloc(be->ctx, n * be->elt_size) : NULL;
                size_t bad = 0;
                int ok = lay == shards[k].layout && be && v && d && whole && q && got && dq &&
                         dout && be->nf4_dequant_absmax;
                if (ok) {
                    values(v, N, (int)k);
                    nf4_quantize(v, N, whole);
                    nf4_shard_extract(&sh, whole, q);
                    nf4_dequantize_layout(lay, q, n, d);
                    be->upload(be->ctx, dq, q, sb);
                    if (lay == NF4_SHARD_ABSMAX)
                        be->nf4_dequant_absmax(be->ctx, dout, dq, n);
                    else
                        be->nf4_dequant(be->ctx, dout, dq, n);
                    be->download(be->ctx, got, dout, n * be->elt_size);
                    for (size_t j = 0; j < n; j++) {
                        if (on_cpu) {
                            bad += memcmp(got + j, d + j, sizeof *d) != 0;
                        } else {
                            uint16_t g;
                            memcpy(&g, (const uint16_t *)(const void *)got + j, sizeof g);
                            bad += g != st_f32_to_bf16(d[j]);
                        }
                    }
                }
                ok = ok && bad == 0;
                printf("%s: NF4 tp shard on %s (%s kernel): [%zu, %zu] %s-parallel, tp %d rank "
                       "%d, %s layout: the backend's dequantization equals the host's (%zu of %zu "
                       "weights differ)\n",
                       ok ? "PASS" : "FAIL", on_cpu ? "cpu" : "cuda",
                       on_cpu  ? "host"
                       : plain ? "one-a-thread"
                               : "8-a-thread",
                       shards[k].d0, shards[k].d1, shards[k].split == 2 ? "row" : "column",
                       shards[k].tp, idx,
                       lay == NF4_SHARD_SLICE    ? "SLICE"
                       : lay == NF4_SHARD_ABSMAX ? "ABSMAX"
                                                 : "NONE",
                       bad, n);
                fails += !ok;
                if (be) {
                    be->free(be->ctx, dq);
                    be->free(be->ctx, dout);
                }
                backend_free(be);
                free(v), free(d), free(whole), free(q), free(got);
            }
}

int main(int argc, char **argv) {
    on_cpu = argc > 1 && strcmp(argv[1], "cpu") == 0;
#ifdef LOOM_HAVE_CUDA
    int rc = on_cpu ? 0 : lcuda_probe();
    if (rc) return rc;
#else
    if (!on_cpu) {
        printf("no GPU: built without CUDA (test_nf4_upload cpu runs the cpu backend)\n");
        return 77;
    }
#endif
    for (int k = 0; k < (int)(sizeof cases / sizeof *cases); k++)
        run_case(k);
    run_shards();
    nf4_configure(&(struct nf4_opts){.fast = 1, .threads = 0, .overlap = 1});
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
