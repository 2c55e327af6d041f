/* Table-driven tests of api/gpu_types.c: the NVML model-name normalizer
 * (names and memory sizes as NVML reports them on real machines: the memory
 * column is nvmlDeviceGetMemoryInfo's total in MiB), aliases, and the facts
 * of the table checked against the data-sheet figures listed in
 * docs/planner.md. */
#include "api/gpu_types.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/check.h"

#define MIB (1024.0 * 1024.0)

static const struct {
    const char *model;
    double mib;       /* 0: memory unknown */
    const char *want; /* NULL: not a known type */
} names[] = {
    {"NVIDIA H200", 143771, "H200"},
    {"NVIDIA H200 NVL", 143771, "H200-NVL"},
    {"NVIDIA H100 80GB HBM3", 81559, "H100-SXM"},
    {"NVIDIA H100 PCIe", 81559, "H100-PCIE"},
    {"NVIDIA H100 NVL", 95830, "H100-NVL"},
    {"NVIDIA H20", 97871, "H20"},
    {"NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"},
    {"NVIDIA A100 80GB PCIe", 81920, "A100-80GB"},
    {"NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"},
    {"NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"},
    {"NVIDIA A10", 23028, "A10"},
    {"NVIDIA L40S", 46068, "L40S"},
    {"NVIDIA L40", 46068, "L40"},
    {"NVIDIA L4", 23034, "L4"},
    {"NVIDIA GeForce RTX 4090", 24564, "RTX4090"},
    {"NVIDIA GeForce RTX 3090", 24576, "RTX3090"},
    {"nvidia geforce rtx 4090", 0, "RTX4090"}, /* case does not matter */
    {"NVIDIA B200", 183359, "B200"},
    {"Tesla V100-SXM2-16GB", 16160, NULL}, /* below sm_80: not a Loom type */
    {"Tesla T4", 15360, NULL},
    {"NVIDIA A800 80GB PCIe", 81920, NULL}, /* not "A10", not "A100" */
    {"NVIDIA H800", 81559, NULL},           /* not "H20" nor "H200" */
    {"", 0, NULL},
};

static void test_normalize(void) {
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const struct gpu_type *t = gpu_type_normalize(names[i].model, names[i].mib * MIB);
        const char *got = t ? t->name : NULL;
        int ok = names[i].want ? got && strcmp(got, names[i].want) == 0 : got == NULL;
        if (!ok)
            fprintf(stderr, "normalize(\"%s\", %.0f MiB) = %s, want %s\n", names[i].model,
                    names[i].mib, got ? got : "NULL", names[i].want ? names[i].want : "NULL");
        CHECK(ok);
    }
    CHECK(gpu_type_normalize(NULL, 0) == NULL);
    /* memory tells the A100 variants apart; unknown memory takes the first row */
    CHECK(strcmp(gpu_type_normalize("NVIDIA A100-PCIE", 40960 * MIB)->name, "A100-40GB") == 0);
    CHECK(strcmp(gpu_type_normalize("NVIDIA A100-PCIE", 0)->name, "A100-80GB") == 0);
}

static const struct {
    const char *name, *want;
} finds[] = {
    {"H100-SXM", "H100-SXM"},
    {"h100-sxm", "H100-SXM"},
    {"H100-80GB", "H100-SXM"},
    {"H100", "H100-SXM"},
    {"H100-PCIe", "H100-PCIE"},
    {"RTX-4090", "RTX4090"},
    {"cpu", "cpu"},
    {"H300", NULL},
    {"", NULL},
};

static void test_find(void) {
    for (size_t i = 0; i < sizeof finds / sizeof *finds; i++) {
        const struct gpu_type *t = gpu_type_find(finds[i].name);
        CHECK(finds[i].want ? t && strcmp(t->name, finds[i].want) == 0 : t == NULL);
    }
    CHECK(gpu_type_find(NULL) == NULL);
}

/* Data-sheet figures (dense bf16 TFLOP/s, GiB, TB/s, NVLink, sm): the table
 * must carry them; the normalizer's answer for each fleet GPU must be the row. */
static const struct {
    const char *name;
    double mem, bf16, tbps;
    int nvlink, cc;
} sheet[] = {
    {"H200", 141, 989, 4.8, 1, 90},       {"H100-SXM", 80, 989, 3.35, 1, 90},
    {"H100-PCIE", 80, 756, 2.0, 0, 90},   {"H20", 96, 148, 4.0, 1, 90},
    {"A100-80GB", 80, 312, 2.039, 1, 80}, {"A100-40GB", 40, 312, 1.555, 1, 80},
    {"A10", 24, 125, 0.6, 0, 86},         {"L40S", 48, 362, 0.864, 0, 89},
    {"L4", 24, 121, 0.3, 0, 89},          {"RTX4090", 24, 165, 1.008, 0, 89},
    {"RTX3090", 24, 71, 0.936, 0, 86},
};

static void test_facts(void) {
    for (size_t i = 0; i < sizeof sheet / sizeof *sheet; i++) {
        const struct gpu_type *t = gpu_type_find(sheet[i].name);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK(fabs(t->mem_gib - sheet[i].mem) < 1e-9);
        CHECK(fabs(t->bf16_tflops - sheet[i].bf16) < 1e-9);
        CHECK(fabs(t->mem_tbps - sheet[i].tbps) < 1e-9);
        CHECK(t->nvlink == sheet[i].nvlink);
        CHECK(t->cc == sheet[i].cc);
        CHECK(t->cc >= 80); /* every listed GPU runs the sm_80+ kernels */
    }
    /* names are unique and every GPU row is reachable through the normalizer */
    size_t n = 0;
    const struct gpu_type *all = gpu_types(&n);
    CHECK(n >= sizeof sheet / sizeof *sheet);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            CHECK(strcmp(all[i].name, all[j].name) != 0);
    char buf[256];
    gpu_type_names(buf, sizeof buf);
    CHECK(strstr(buf, "H200") && strstr(buf, "RTX4090") && !strstr(buf, "cpu"));
    gpu_type_names(buf, 8); /* truncates, stays terminated */
    CHECK(strlen(buf) < 8);
}

/* Which devices a build can run on (the worker's start-up gate). */
static const struct {
    const char *archs;
    int cc, want;
} runs[] = {
    {"80-real;86-real;89-real;90-real;90-virtual", 80, 1},
    {"80-real;86-real;89-real;90-real;90-virtual", 86, 1},
    {"80-real,86-real,89-real,90-real,90-virtual", 89, 1},
    {"80-real,86-real,89-real,90-real,90-virtual", 90, 1},
    {"80-real,86-real,89-real,90-real,90-virtual", 100, 1}, /* B200 through the PTX */
    {"80-real,86-real,89-real,90-real,90-virtual", 75, 0},  /* T4 */
    {"90-real", 80, 0},                                     /* H100-only build on an A100 */
    {"90-real", 100, 0},                                    /* sm_90 code does not run on 10.0 */
    {"80-real", 86, 1},                                     /* same major, higher minor */
    {"86-real", 80, 0},
    {"80-virtual", 89, 1},
    {"86", 89, 1},
    {"86", 80, 0},
    {"native", 75, 1},
    {"", 80, 1},
};

static void test_build_runs_on(void) {
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        int got = gpu_build_runs_on(runs[i].archs, runs[i].cc);
        if (got != runs[i].want)
            fprintf(stderr, "runs_on(\"%s\", %d) = %d, want %d\n", runs[i].archs, runs[i].cc, got,
                    runs[i].want);
        CHECK(got == runs[i].want);
    }
}

int main(void) {
    test_build_runs_on();
    test_normalize();
    test_find();
    test_facts();
    return check_summary("test_gpu_types");
}
