/* Device inventory and telemetry: NVML through dlopen, or cpu devices.
 *
 * Only the handful of NVML entry points we need are declared here, with the
 * types NVML documents (nvmlDevice_t is an opaque pointer; nvmlMemory_t is
 * three unsigned long long: total, free, used; nvmlUtilization_t is two
 * unsigned int: gpu, memory; power is in milliwatts). */
#include "agent/gpu.h"

#include "common/log.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_MAX 64

typedef void *nvml_device;
struct nvml_memory {
    unsigned long long total, free, used;
};
struct nvml_util {
    unsigned int gpu, memory;
};

struct nvml_api {
    void *lib;
    int (*init)(void);
    int (*shutdown)(void);
    int (*count)(unsigned int *);
    int (*handle)(unsigned int, nvml_device *);
    int (*name)(nvml_device, char *, unsigned int);
    int (*uuid)(nvml_device, char *, unsigned int);
    int (*memory)(nvml_device, struct nvml_memory *);
    int (*util)(nvml_device, struct nvml_util *);
    int (*power)(nvml_device, unsigned int *);
    int (*temp)(nvml_device, int, unsigned int *);
};

struct gpu_dev {
    nvml_device h;
    char name[96];
    char uuid[96];
    unsigned long long mem_total;
};

struct gpu_inv {
    int cpu;
    int n;
    struct gpu_dev dev[GPU_MAX];
    struct nvml_api nv;
};

static void *sym(void *lib, const char *a, const char *b) {
    void *p = dlsym(lib, a);
    if (!p && b) p = dlsym(lib, b);
    return p;
}

static int nvml_load(struct nvml_api *nv) {
    nv->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nv->lib) return -1;
    nv->init = (int (*)(void))sym(nv->lib, "nvmlInit_v2", "nvmlInit");
    nv->shutdown = (int (*)(void))sym(nv->lib, "nvmlShutdown", NULL);
    nv->count =
        (int (*)(unsigned int *))sym(nv->lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    nv->handle = (int (*)(unsigned int, nvml_device *))sym(nv->lib, "nvmlDeviceGetHandleByIndex_v2",
                                                           "nvmlDeviceGetHandleByIndex");
    nv->name = (int (*)(nvml_device, char *, unsigned int))sym(nv->lib, "nvmlDeviceGetName", NULL);
    nv->uuid = (int (*)(nvml_device, char *, unsigned int))sym(nv->lib, "nvmlDeviceGetUUID", NULL);
    nv->memory =
        (int (*)(nvml_device, struct nvml_memory *))sym(nv->lib, "nvmlDeviceGetMemoryInfo", NULL);
    nv->util = (int (*)(nvml_device, struct nvml_util *))sym(nv->lib,
                                                             "nvmlDeviceGetUtilizationRates", NULL);
    nv->power = (int (*)(nvml_device, unsigned int *))sym(nv->lib, "nvmlDeviceGetPowerUsage", NULL);
    nv->temp =
        (int (*)(nvml_device, int, unsigned int *))sym(nv->lib, "nvmlDeviceGetTemperature", NULL);
    if (!nv->init || !nv->count || !nv->handle || !nv->shutdown) {
        dlclose(nv->lib);
        memset(nv, 0, sizeof *nv);
        return -1;
    }
    if (nv->init() != 0) {
        dlclose(nv->lib);
        memset(nv, 0, sizeof *nv);
        return -1;
    }
    return 0;
}

struct gpu_inv *gpu_inv_new(int cpu_devices) {
    struct gpu_inv *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    if (cpu_devices > 0) {
        g->cpu = 1;
        g->n = cpu_devices > GPU_MAX ? GPU_MAX : cpu_devices;
        for (int i = 0; i < g->n; i++) {
            snprintf(g->dev[i].name, sizeof g->dev[i].name, "cpu");
            snprintf(g->dev[i].uuid, sizeof g->dev[i].uuid, "cpu-%d", i);
        }
        return g;
    }
    if (nvml_load(&g->nv) != 0) {
        log_warn("NVML not available (no NVIDIA driver?): offering no GPUs; use --cpu-devices N "
                 "for cpu workers");
        return g;
    }
    unsigned int cnt = 0;
    if (g->nv.count(&cnt) != 0) cnt = 0;
    for (unsigned int i = 0; i < cnt && g->n < GPU_MAX; i++) {
        struct gpu_dev *d = &g->dev[g->n];
        if (g->nv.handle(i, &d->h) != 0) continue;
        if (!g->nv.name || g->nv.name(d->h, d->name, sizeof d->name) != 0)
            snprintf(d->name, sizeof d->name, "gpu");
        if (!g->nv.uuid || g->nv.uuid(d->h, d->uuid, sizeof d->uuid) != 0)
            snprintf(d->uuid, sizeof d->uuid, "gpu-%u", i);
        struct nvml_memory m = {0};
        if (g->nv.memory && g->nv.memory(d->h, &m) == 0) d->mem_total = m.total;
        g->n++;
    }
    log_info("NVML: %d GPU(s)", g->n);
    return g;
}

void gpu_inv_free(struct gpu_inv *g) {
    if (!g) return;
    if (g->nv.lib) {
        g->nv.shutdown();
        dlclose(g->nv.lib);
    }
    free(g);
}

const char *gpu_inv_kind(const struct gpu_inv *g) {
    return g->cpu ? "cpu" : "cuda";
}

int gpu_inv_count(const struct gpu_inv *g) {
    return g->n;
}

const char *gpu_inv_uuid(const struct gpu_inv *g, int i) {
    return i >= 0 && i < g->n ? g->dev[i].uuid : "";
}

static void host_memory(unsigned long long *total_kib, unsigned long long *avail_kib) {
    *total_kib = *avail_kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned long long v;
        if (sscanf(line, "MemTotal: %llu", &v) == 1) *total_kib = v;
        if (sscanf(line, "MemAvailable: %llu", &v) == 1) *avail_kib = v;
    }
    fclose(f);
}

json_t *gpu_inv_telemetry(struct gpu_inv *g) {
    json_t *arr = json_array();
    if (!arr) return NULL;
    unsigned long long tk = 0, ak = 0;
    double load = 0;
    if (g->cpu) {
        host_memory(&tk, &ak);
        FILE *f = fopen("/proc/loadavg", "r");
        if (f) {
            if (fscanf(f, "%lf", &load) != 1) load = 0;
            fclose(f);
        }
    }
    for (int i = 0; i < g->n; i++) {
        struct gpu_dev *d = &g->dev[i];
        json_int_t total_mib = 0, used_mib = 0, util = 0, power = 0, temp = 0;
        if (g->cpu) {
            total_mib = (json_int_t)(tk / 1024 / (unsigned long long)g->n);
            used_mib = (json_int_t)((tk - ak) / 1024 / (unsigned long long)g->n);
            util = (json_int_t)(load * 100.0 / g->n);
            if (util > 100) util = 100;
        } else {
            struct nvml_memory m = {0};
            struct nvml_util u = {0};
            unsigned int p = 0, t = 0;
            if (g->nv.memory && g->nv.memory(d->h, &m) == 0) {
                total_mib = (json_int_t)(m.total >> 20);
                used_mib = (json_int_t)(m.used >> 20);
            }
            if (g->nv.util && g->nv.util(d->h, &u) == 0) util = u.gpu;
            if (g->nv.power && g->nv.power(d->h, &p) == 0) power = p / 1000;
            if (g->nv.temp && g->nv.temp(d->h, 0, &t) == 0) temp = t;
        }
        json_array_append_new(arr, json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "index", i,
                                             "name", d->name, "uuid", d->uuid, "mem_total_mib",
                                             total_mib, "mem_used_mib", used_mib, "util_pct", util,
                                             "power_w", power, "temp_c", temp));
    }
    return arr;
}
