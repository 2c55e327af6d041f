/* GPU types: the one table of accelerator facts Loom uses, and the mapping
 * from what NVML (or cudaGetDeviceProperties) calls a device to a normalized
 * `gpu_type` name ("NVIDIA H100 80GB HBM3" -> "H100-SXM").
 *
 * The agent tags every GPU it reports with its type, the scheduler matches a
 * job's resources.gpu_type against it, the planner takes memory and peak
 * FLOP/s from it, prices are set per type, and the worker takes its MFU
 * denominator from it. Figures are the vendors' data-sheet numbers (dense,
 * no sparsity); docs/planner.md lists the sources. A pure table: no I/O, any
 * thread. */
#ifndef LOOM_API_GPU_TYPES_H
#define LOOM_API_GPU_TYPES_H

#include <jansson.h>
#include <stddef.h>

#define GPU_TYPE_NAME_MAX 24
/* The least compute capability (x10) with FP8 tensor cores (Ada sm_89,
 * Hopper sm_90, Blackwell): what train.precision fp8 needs. */
#define GPU_FP8_MIN_CC 89
/* Those types of the table, for messages. */
#define GPU_FP8_EXAMPLES "L4, L40, L40S, RTX4090, H100, H200, B200"

struct gpu_type {
    const char *name;       /* normalized gpu_type, e.g. "H100-SXM"; "cpu" for cpu devices */
    double mem_gib;         /* device memory as sold (80 GB parts are 80 GiB of HBM) */
    double bf16_tflops;     /* dense peak, tensor cores, fp32 accumulate */
    double fp32_tflops;     /* dense peak, no tensor cores */
    double mem_tbps;        /* memory bandwidth, TB/s */
    int nvlink;             /* 1: the part is built for NVLink (SXM / HGX boards) */
    const char *intra_link; /* usual GPU-to-GPU link inside a node (planner link names) */
    int cc;                 /* compute capability x10 (90 = sm_90); 0 for cpu */
    /* Normalizer: the words NVML's model name must contain (case-insensitive,
     * on word boundaries, NULL-terminated, at most 3), and the least memory in
     * GiB the device reports, to tell memory variants of one chip apart. */
    const char *nvml[3];
    double nvml_min_gib;
};

/* The whole table, in normalizer order (specific before general). */
const struct gpu_type *gpu_types(size_t *n);

/* By normalized name or an accepted alias ("H100-80GB" and "H100" -> H100-SXM,
 * "H100-PCIe" -> H100-PCIE), case-insensitive. NULL when unknown. */
const struct gpu_type *gpu_type_find(const char *name);

/* From an NVML / CUDA model name and the memory the device reports (bytes;
 * 0: unknown, then the first row of that chip is taken). NULL when the model
 * is not in the table. Examples: ("NVIDIA H100 80GB HBM3", 85.0e9) -> H100-SXM,
 * ("NVIDIA A100-SXM4-40GB", 42.4e9) -> A100-40GB, ("NVIDIA GeForce RTX 4090",
 * 25.3e9) -> RTX4090. */
const struct gpu_type *gpu_type_normalize(const char *model, double mem_bytes);

/* resources.gpu_type of a job spec: NULL / null (any type), one name, or an
 * array of names (preference order). Writes the normalized names (aliases
 * resolved, duplicates dropped) into out[0..max-1] and returns how many, or -1
 * with `err` naming the bad value (unknown type, not a string, more than max).
 * err may be NULL. */
int gpu_type_list_parse(const json_t *v, char (*out)[GPU_TYPE_NAME_MAX], int max, char *err,
                        size_t errlen);

/* 1 when a build for CUDA architectures `archs` (CMAKE_CUDA_ARCHITECTURES with
 * ';' or ',' between entries: "80-real,90-virtual"; a plain "86" is both kinds)
 * carries code a device of compute capability cc (x10) can run: machine code of
 * its major architecture at or below its minor (sm_80 code runs on sm_86 and
 * sm_89, not on sm_90), or PTX at or below it (JIT-compiled by the driver). An
 * empty, "native" or "all..." list is taken on trust. */
int gpu_build_runs_on(const char *archs, int cc);

/* Space-separated list of the GPU names (cpu excluded) into buf, for messages. */
void gpu_type_names(char *buf, size_t len);

#endif
