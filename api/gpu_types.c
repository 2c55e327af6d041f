/* The GPU type table and the NVML model-name normalizer (see gpu_types.h).
 *
 * Rows are tried in order by gpu_type_normalize, so a row whose words are a
 * subset of another's comes after it (H200-NVL before H200, H100-PCIE before
 * H100-SXM). Words match on word boundaries only: "A10" does not match
 * "A100-SXM4-40GB", "H20" does not match "H200", "L4" does not match "L40S". */
#include "api/gpu_types.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

/* name, GiB, bf16 TFLOP/s, fp32 TFLOP/s, TB/s, nvlink, intra link, cc, NVML words, min GiB.
 * Sources per row: docs/planner.md "GPU types". */
static const struct gpu_type table[] = {
    {"H200-NVL", 141, 835, 60, 4.8, 0, "pcie5", 90, {"H200", "NVL"}, 0},
    {"H200", 141, 989, 67, 4.8, 1, "nvlink4", 90, {"H200"}, 0},
    {"H100-NVL", 94, 835, 60, 3.9, 0, "pcie5", 90, {"H100", "NVL"}, 0},
    {"H100-PCIE", 80, 756, 51, 2.0, 0, "pcie5", 90, {"H100", "PCIE"}, 0},
    {"H100-SXM", 80, 989, 67, 3.35, 1, "nvlink4", 90, {"H100"}, 0},
    {"H20", 96, 148, 44, 4.0, 1, "nvlink4", 90, {"H20"}, 0},
    {"A100-80GB", 80, 312, 19.5, 2.039, 1, "nvlink3", 80, {"A100"}, 60},
    {"A100-40GB", 40, 312, 19.5, 1.555, 1, "nvlink3", 80, {"A100"}, 0},
    {"A10", 24, 125, 31.2, 0.6, 0, "pcie4", 86, {"A10"}, 0},
    {"L40S", 48, 362, 91.6, 0.864, 0, "pcie4", 89, {"L40S"}, 0},
    {"L40", 48, 181, 90.5, 0.864, 0, "pcie4", 89, {"L40"}, 0},
    {"L4", 24, 121, 30.3, 0.3, 0, "pcie4", 89, {"L4"}, 0},
    {"RTX4090", 24, 165, 82.6, 1.008, 0, "pcie4", 89, {"RTX", "4090"}, 0},
    {"RTX3090", 24, 71, 35.6, 0.936, 0, "pcie4", 86, {"RTX", "3090"}, 0},
    {"B200", 180, 2250, 80, 8.0, 1, "nvlink5", 100, {"B200"}, 0},
    {"cpu", 64, 0.2, 0.2, 0.05, 0, "shm", 0, {NULL}, 0},
};

/* Names accepted besides the normalized ones (older planner names, short forms). */
static const struct {
    const char *alias, *name;
} aliases[] = {
    {"H100-80GB", "H100-SXM"}, {"H100", "H100-SXM"},    {"H100-SXM5", "H100-SXM"},
    {"H200-SXM", "H200"},      {"RTX-4090", "RTX4090"}, {"RTX-3090", "RTX3090"},
};

#define NTABLE (sizeof table / sizeof *table)

const struct gpu_type *gpu_types(size_t *n) {
    *n = NTABLE;
    return table;
}

const struct gpu_type *gpu_type_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < NTABLE; i++)
        if (strcasecmp(table[i].name, name) == 0) return &table[i];
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (strcasecmp(aliases[i].alias, name) == 0) return gpu_type_find(aliases[i].name);
    return NULL;
}

/* 1 when `word` occurs in `s` (case-insensitive) with no letter or digit
 * right before or after it. */
static int has_word(const char *s, const char *word) {
    size_t wl = strlen(word), sl = strlen(s);
    for (size_t i = 0; i + wl <= sl; i++) {
        if (strncasecmp(s + i, word, wl) != 0) continue;
        int left_ok = i == 0 || !isalnum((unsigned char)s[i - 1]);
        int right_ok = i + wl == sl || !isalnum((unsigned char)s[i + wl]);
        if (left_ok && right_ok) return 1;
    }
    return 0;
}

const struct gpu_type *gpu_type_normalize(const char *model, double mem_bytes) {
    if (!model || !*model) return NULL;
    double gib = mem_bytes / GIB;
    for (size_t i = 0; i < NTABLE; i++) {
        const struct gpu_type *t = &table[i];
        if (!t->nvml[0]) continue;
        int all = 1;
        for (int w = 0; w < 3 && t->nvml[w] && all; w++)
            all = has_word(model, t->nvml[w]);
        if (!all) continue;
        if (mem_bytes > 0 && gib < t->nvml_min_gib) continue;
        return t;
    }
    return NULL;
}

int gpu_type_list_parse(const json_t *v, char (*out)[GPU_TYPE_NAME_MAX], int max, char *err,
                        size_t errlen) {
    char tmp[8];
    if (!err) {
        err = tmp;
        errlen = sizeof tmp;
    }
    if (!v || json_is_null(v)) return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    int cnt = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        const char *name = json_string_value(e);
        const struct gpu_type *t = gpu_type_find(name);
        if (!name) {
            snprintf(err, errlen, "resources.gpu_type must be a GPU type name or a list of them");
            return -1;
        }
        if (!t || !t->cc) {
            char names[256];
            gpu_type_names(names, sizeof names);
            snprintf(err, errlen, "unknown resources.gpu_type \"%.40s\" (known: %s)", name, names);
            return -1;
        }
        int dup = 0;
        for (int k = 0; k < cnt && !dup; k++)
            dup = strcmp(out[k], t->name) == 0;
        if (dup) continue;
        if (cnt == max) {
            snprintf(err, errlen, "resources.gpu_type lists more than %d types", max);
            return -1;
        }
        snprintf(out[cnt++], GPU_TYPE_NAME_MAX, "%s", t->name);
    }
    return cnt;
}

int gpu_build_runs_on(const char *archs, int cc) {
    if (!archs || !*archs || !strncmp(archs, "native", 6) || !strncmp(archs, "all", 3)) return 1;
    for (const char *p = archs; *p;) {
        char *end = NULL;
        long a = strtol(p, &end, 10);
        if (end == p) break;
        int is_real = strncmp(end, "-virtual", 8) != 0, is_ptx = strncmp(end, "-real", 5) != 0;
        if (is_real && a / 10 == cc / 10 && a <= cc) return 1;
        if (is_ptx && a <= cc) return 1;
        p = end + strcspn(end, ";,");
        if (*p) p++;
    }
    return 0;
}

void gpu_type_names(char *buf, size_t len) {
    if (!len) return;
    buf[0] = 0;
    for (size_t i = 0; i < NTABLE; i++) {
        if (!table[i].cc) continue;
        size_t l = strlen(buf);
        if (l + 1 >= len) break;
        snprintf(buf + l, len - l, "%s%s", l ? " " : "", table[i].name);
    }
}
