/* Tests of the agent's GPU inventory (agent/gpu.c) over NVML answers given as
 * recordings (the JSON files in tests/unit/nvml: what nvmlDeviceGetName, GetMemoryInfo,
 * GetCudaComputeCapability, GetNumGpuCores, GetNvLinkState, GetP2PStatus
 * (NVLink index), GetTopologyCommonAncestor and the system version calls answer
 * on such machines; a field left out is an NVML "not supported"). Expected SM
 * counts are the data-sheet figures (H100 SXM 132, A100 108, RTX 4090 128,
 * L40S 142, L4 58), not recomputed from the cores. usage: test_gpu_inventory DIR */
#include "agent/gpu.h"

#include <stdio.h>
#include <string.h>

#include "tests/check.h"

struct want {
    const char *file;
    int n;
    const char *type; /* of device 0 */
    const char *type_last;
    long sm0;           /* sm_count of device 0 (-1: null) */
    const char *cc;     /* device 0 */
    long nvlinks;       /* device 0 (-1: null) */
    const char *t01;    /* topology[0][1] */
    const char *t_far;  /* topology[0][n-1] */
    const char *driver; /* NULL: null */
    const char *cuda;
    long sm_last;
};

static const struct want cases[] = {
    {"h100_sxm_8.json", 8, "H100-SXM", "H100-SXM", 132, "9.0", 18, "NV18", "NV18", "550.54.15",
     "12.4", 132},
    {"rtx4090_2.json", 2, "RTX4090", "RTX4090", 128, "8.9", -1, "PXB", "PXB", "535.104.05", "12.2",
     128},
    {"a100_40gb_4.json", 4, "A100-40GB", "A100-40GB", 108, "8.0", 12, "NV12", "NV12", "525.85.12",
     "12.0", -1},
    {"l40s_l4.json", 2, "L40S", "L4", 142, "8.9", -1, "", "", NULL, NULL, 58},
};

static long int_or_m1(json_t *v) {
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

static int str_is(json_t *v, const char *want) {
    if (!want) return json_is_null(v);
    return json_is_string(v) && strcmp(json_string_value(v), want) == 0;
}

static void test_case(const char *dir, const struct want *w) {
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/%s", dir, w->file);
    struct gpu_inv *g = gpu_inv_from_recording(path, err, sizeof err);
    CHECK(g != NULL);
    if (!g) {
        fprintf(stderr, "%s: %s\n", w->file, err);
        return;
    }
    CHECK(strcmp(gpu_inv_kind(g), "cuda") == 0);
    CHECK(gpu_inv_count(g) == w->n);
    CHECK(strcmp(gpu_inv_type(g, 0), w->type) == 0);
    CHECK(strcmp(gpu_inv_type(g, w->n - 1), w->type_last) == 0);
    CHECK(strcmp(gpu_inv_type(g, w->n), "") == 0); /* out of range */
    json_t *inv = gpu_inv_inventory(g);
    json_t *gpus = json_object_get(inv, "gpus"), *topo = json_object_get(inv, "topology");
    json_t *d0 = json_array_get(gpus, 0), *dl = json_array_get(gpus, (size_t)w->n - 1);
    CHECK(json_array_size(gpus) == (size_t)w->n);
    CHECK(str_is(json_object_get(d0, "gpu_type"), w->type));
    CHECK(int_or_m1(json_object_get(d0, "sm_count")) == w->sm0);
    CHECK(int_or_m1(json_object_get(dl, "sm_count")) == w->sm_last);
    CHECK(str_is(json_object_get(d0, "compute_capability"), w->cc));
    CHECK(int_or_m1(json_object_get(d0, "nvlinks")) == w->nvlinks);
    CHECK(str_is(json_object_get(inv, "driver_version"), w->driver));
    CHECK(str_is(json_object_get(inv, "cuda_version"), w->cuda));
    CHECK(json_array_size(topo) == (size_t)w->n);
    CHECK(str_is(json_array_get(json_array_get(topo, 0), 0), "X"));
    CHECK(str_is(json_array_get(json_array_get(topo, 0), 1), w->t01));
    CHECK(str_is(json_array_get(json_array_get(topo, 0), (size_t)w->n - 1), w->t_far));
    /* the telemetry carries the type too, and the recorded memory */
    json_t *tel = gpu_inv_telemetry(g);
    CHECK(str_is(json_object_get(json_array_get(tel, 0), "gpu_type"), w->type));
    CHECK(int_or_m1(json_object_get(json_array_get(tel, 0), "mem_total_mib")) ==
          int_or_m1(json_object_get(d0, "mem_total_mib")));
    json_decref(tel);
    json_decref(inv);
    gpu_inv_free(g);
}

/* 8 x H100 across two sockets: NVLink between every pair beats the PCIe level */
static void test_h100_sockets(const char *dir) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/h100_sxm_8.json", dir);
    struct gpu_inv *g = gpu_inv_from_recording(path, err, sizeof err);
    CHECK(g != NULL);
    if (!g) return;
    json_t *inv = gpu_inv_inventory(g);
    json_t *topo = json_object_get(inv, "topology");
    int nv = 0;
    for (size_t a = 0; a < 8; a++)
        for (size_t b = 0; b < 8; b++)
            nv += a != b && str_is(json_array_get(json_array_get(topo, a), b), "NV18");
    CHECK(nv == 56);
    CHECK(json_integer_value(json_object_get(json_array_get(json_object_get(inv, "gpus"), 7),
                                             "mem_total_mib")) == 81559);
    json_decref(inv);
    gpu_inv_free(g);
}

static void test_bad(const char *dir) {
    const char *bad[] = {"bad_matrix.json", "missing.json"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char path[1024], err[256] = "";
        snprintf(path, sizeof path, "%s/%s", dir, bad[i]);
        struct gpu_inv *g = gpu_inv_from_recording(path, err, sizeof err);
        CHECK(g == NULL);
        CHECK(err[0] != 0);
        gpu_inv_free(g);
    }
    /* cpu devices: type cpu, no topology */
    struct gpu_inv *c = gpu_inv_new(3);
    CHECK(c && strcmp(gpu_inv_type(c, 2), "cpu") == 0);
    json_t *inv = c ? gpu_inv_inventory(c) : NULL;
    CHECK(json_array_size(json_object_get(inv, "gpus")) == 3);
    CHECK(json_array_size(json_object_get(inv, "topology")) == 0);
    json_decref(inv);
    gpu_inv_free(c);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_gpu_inventory DIR\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        test_case(argv[1], &cases[i]);
    test_h100_sockets(argv[1]);
    test_bad(argv[1]);
    return check_summary("test_gpu_inventory");
}
