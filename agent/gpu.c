/* Device inventory and telemetry: NVML through dlopen, or cpu devices.
 *
 * Only the handful of NVML entry points we need are declared here, with the
 * types NVML documents (nvmlDevice_t is an opaque pointer; nvmlMemory_t is
 * three unsigned long long: total, free, used; nvmlUtilization_t is two
 * unsigned int: gpu, memory; power is in milliwatts; enums are int).
 *
 * The inventory is built in two steps so that tests can drive the second one:
 * a probe collects NVML's raw answers per device and per device pair (struct
 * gpu_dev's raw fields and gpu_inv.p2p / .level; -1 where NVML said "not
 * supported"), either from the library or from a JSON recording; then
 * inv_finish derives what loomd is told (SM count from cores and compute
 * capability, gpu_type, the topology labels). */
#include "agent/gpu.h"

#include "api/gpu_types.h"
#include "common/log.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_MAX      64
#define NVLINK_MAX   18 /* NVML_NVLINK_MAX_LINKS */
#define P2P_NVLINK   2  /* NVML_P2P_CAPS_INDEX_NVLINK */
#define NVML_ENABLED 1  /* NVML_FEATURE_ENABLED */

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
    int (*cc)(nvml_device, int *, int *);
    int (*cores)(nvml_device, unsigned int *);
    int (*link_state)(nvml_device, unsigned int, int *);
    int (*p2p)(nvml_device, nvml_device, int, int *);
    int (*ancestor)(nvml_device, nvml_device, int *);
    int (*driver)(char *, unsigned int);
    int (*cuda)(int *);
};

struct gpu_dev {
    nvml_device h;
    char name[96];
    char uuid[96];
    unsigned long long mem_total;
    /* raw NVML answers (-1: not supported) */
    int cc_major, cc_minor;
    long cores;
    int nvlinks; /* links in state enabled */
    /* derived by inv_finish */
    int sm_count; /* -1: unknown */
    char type[GPU_TYPE_NAME_MAX];
};

struct gpu_inv {
    int cpu;
    int n;
    struct gpu_dev dev[GPU_MAX];
    struct nvml_api nv;
    char driver[48];                     /* "" when unknown */
    int cuda_version;                    /* 12040 = 12.4; -1 when unknown */
    signed char p2p[GPU_MAX][GPU_MAX];   /* NVLink P2P status (0 = OK), -1 unknown */
    signed char level[GPU_MAX][GPU_MAX]; /* nvmlGpuTopologyLevel_t, -1 unknown */
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
    nv->cc = (int (*)(nvml_device, int *, int *))sym(nv->lib, "nvmlDeviceGetCudaComputeCapability",
                                                     NULL);
    nv->cores =
        (int (*)(nvml_device, unsigned int *))sym(nv->lib, "nvmlDeviceGetNumGpuCores", NULL);
    nv->link_state =
        (int (*)(nvml_device, unsigned int, int *))sym(nv->lib, "nvmlDeviceGetNvLinkState", NULL);
    nv->p2p =
        (int (*)(nvml_device, nvml_device, int, int *))sym(nv->lib, "nvmlDeviceGetP2PStatus", NULL);
    nv->ancestor = (int (*)(nvml_device, nvml_device, int *))sym(
        nv->lib, "nvmlDeviceGetTopologyCommonAncestor", NULL);
    nv->driver = (int (*)(char *, unsigned int))sym(nv->lib, "nvmlSystemGetDriverVersion", NULL);
    nv->cuda = (int (*)(int *))sym(nv->lib, "nvmlSystemGetCudaDriverVersion_v2",
                                   "nvmlSystemGetCudaDriverVersion");
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

/* FP32 cores per SM by compute capability (NVIDIA's CUDA C Programming Guide,
 * "Arithmetic Instructions" throughput table): NVML gives cores, not SMs. */
static int cores_per_sm(int major, int minor) {
    static const struct {
        int cc, cores;
    } t[] = {{80, 64}, {86, 128}, {87, 128}, {89, 128}, {90, 128}, {100, 128}, {120, 128}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (t[i].cc == major * 10 + minor) return t[i].cores;
    return 0;
}

static void init_unknown(struct gpu_inv *g) {
    g->cuda_version = -1;
    memset(g->p2p, -1, sizeof g->p2p);
    memset(g->level, -1, sizeof g->level);
}

/* Raw answers -> derived fields. */
static void inv_finish(struct gpu_inv *g) {
    for (int i = 0; i < g->n; i++) {
        struct gpu_dev *d = &g->dev[i];
        int per = d->cc_major >= 0 ? cores_per_sm(d->cc_major, d->cc_minor) : 0;
        d->sm_count = per && d->cores > 0 ? (int)(d->cores / per) : -1;
        const struct gpu_type *t =
            g->cpu ? gpu_type_find("cpu") : gpu_type_normalize(d->name, (double)d->mem_total);
        snprintf(d->type, sizeof d->type, "%s", t ? t->name : "unknown");
    }
}

static void nvml_probe(struct gpu_inv *g) {
    struct nvml_api *nv = &g->nv;
    unsigned int cnt = 0;
    if (nv->count(&cnt) != 0) cnt = 0;
    for (unsigned int i = 0; i < cnt && g->n < GPU_MAX; i++) {
        struct gpu_dev *d = &g->dev[g->n];
        if (nv->handle(i, &d->h) != 0) continue;
        if (!nv->name || nv->name(d->h, d->name, sizeof d->name) != 0)
            snprintf(d->name, sizeof d->name, "gpu");
        if (!nv->uuid || nv->uuid(d->h, d->uuid, sizeof d->uuid) != 0)
            snprintf(d->uuid, sizeof d->uuid, "gpu-%u", i);
        struct nvml_memory m = {0};
        if (nv->memory && nv->memory(d->h, &m) == 0) d->mem_total = m.total;
        if (!nv->cc || nv->cc(d->h, &d->cc_major, &d->cc_minor) != 0)
            d->cc_major = d->cc_minor = -1;
        unsigned int cores = 0;
        d->cores = nv->cores && nv->cores(d->h, &cores) == 0 ? (long)cores : -1;
        d->nvlinks = nv->link_state ? 0 : -1;
        for (unsigned int l = 0; nv->link_state && l < NVLINK_MAX; l++) {
            int on = 0;
            if (nv->link_state(d->h, l, &on) != 0) break; /* past the last link */
            if (on == NVML_ENABLED) d->nvlinks++;
        }
        g->n++;
    }
    for (int a = 0; a < g->n; a++)
        for (int b = 0; b < g->n; b++) {
            if (a == b) continue;
            int st = 0, lv = 0;
            if (nv->p2p && nv->p2p(g->dev[a].h, g->dev[b].h, P2P_NVLINK, &st) == 0)
                g->p2p[a][b] = (signed char)(st < 0 || st > 100 ? 100 : st);
            if (nv->ancestor && nv->ancestor(g->dev[a].h, g->dev[b].h, &lv) == 0)
                g->level[a][b] = (signed char)(lv < 0 || lv > 100 ? 100 : lv);
        }
    if (nv->driver && nv->driver(g->driver, sizeof g->driver) != 0) g->driver[0] = 0;
    int cv = 0;
    if (nv->cuda && nv->cuda(&cv) == 0) g->cuda_version = cv;
}

struct gpu_inv *gpu_inv_new(int cpu_devices) {
    struct gpu_inv *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    init_unknown(g);
    if (cpu_devices > 0) {
        g->cpu = 1;
        g->n = cpu_devices > GPU_MAX ? GPU_MAX : cpu_devices;
        for (int i = 0; i < g->n; i++) {
            snprintf(g->dev[i].name, sizeof g->dev[i].name, "cpu");
            snprintf(g->dev[i].uuid, sizeof g->dev[i].uuid, "cpu-%d", i);
            g->dev[i].cc_major = g->dev[i].cc_minor = -1;
            g->dev[i].cores = g->dev[i].nvlinks = -1;
        }
        inv_finish(g);
        return g;
    }
#ifdef LOOM_TEST_HOOKS
    /* Test builds only (-DLOOM_TEST_HOOKS=ON): a node with recorded GPUs, so cluster
     * tests can run a fleet of H100 / RTX 4090 nodes on a machine without GPUs. */
    const char *rec = getenv("LOOM_TEST_NVML_RECORDING");
    if (rec && *rec) {
        char err[256];
        struct gpu_inv *f = gpu_inv_from_recording(rec, err, sizeof err);
        if (!f) log_error("LOOM_TEST_NVML_RECORDING: %s", err);
        free(g);
        return f;
    }
#endif
    if (nvml_load(&g->nv) != 0) {
        log_warn("NVML not available (no NVIDIA driver?): offering no GPUs; use --cpu-devices N "
                 "for cpu workers");
        return g;
    }
    nvml_probe(g);
    inv_finish(g);
    log_info("NVML: %d GPU(s)%s%s", g->n, g->n ? ", first " : "", g->n ? g->dev[0].type : "");
    return g;
}

/* Integer field of a recording, or -1 when absent (NVML_ERROR_NOT_SUPPORTED). */
static long rec_int(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

static int rec_matrix(const json_t *m, int n, signed char out[GPU_MAX][GPU_MAX], char *err,
                      size_t errlen, const char *what) {
    if (!m) return 0;
    if (!json_is_array(m) || (int)json_array_size(m) != n) {
        snprintf(err, errlen, "%s must be a %d x %d array", what, n, n);
        return -1;
    }
    for (int a = 0; a < n; a++) {
        json_t *row = json_array_get(m, (size_t)a);
        if (!json_is_array(row) || (int)json_array_size(row) != n) {
            snprintf(err, errlen, "%s row %d must have %d entries", what, a, n);
            return -1;
        }
        for (int b = 0; b < n; b++) {
            json_t *v = json_array_get(row, (size_t)b);
            if (a != b && json_is_integer(v))
                out[a][b] = (signed char)(json_integer_value(v) < 0     ? -1
                                          : json_integer_value(v) > 100 ? 100
                                                                        : json_integer_value(v));
        }
    }
    return 0;
}

struct gpu_inv *gpu_inv_from_recording(const char *path, char *err, size_t errlen) {
    json_error_t je;
    json_t *r = json_load_file(path, 0, &je);
    struct gpu_inv *g = NULL;
    if (!r) {
        snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
        return NULL;
    }
    json_t *devs = json_object_get(r, "devices");
    if (!json_is_object(r) || !json_is_array(devs) || json_array_size(devs) > GPU_MAX) {
        snprintf(err, errlen, "%s: needs an object with \"devices\": [...] (at most %d)", path,
                 GPU_MAX);
        goto fail;
    }
    g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    init_unknown(g);
    size_t i;
    json_t *d;
    json_array_foreach(devs, i, d) {
        struct gpu_dev *x = &g->dev[g->n];
        const char *name = json_string_value(json_object_get(d, "name"));
        const char *uuid = json_string_value(json_object_get(d, "uuid"));
        json_t *cc = json_object_get(d, "cc");
        if (!json_is_object(d) || !name) {
            snprintf(err, errlen, "%s: devices[%zu] needs a \"name\"", path, i);
            goto fail;
        }
        snprintf(x->name, sizeof x->name, "%s", name);
        if (uuid)
            snprintf(x->uuid, sizeof x->uuid, "%s", uuid);
        else
            snprintf(x->uuid, sizeof x->uuid, "gpu-%zu", i);
        long mem = rec_int(d, "memory_total");
        x->mem_total = mem > 0 ? (unsigned long long)mem : 0;
        x->cc_major = x->cc_minor = -1;
        if (json_is_array(cc) && json_array_size(cc) == 2) {
            x->cc_major = (int)json_integer_value(json_array_get(cc, 0));
            x->cc_minor = (int)json_integer_value(json_array_get(cc, 1));
        }
        x->cores = rec_int(d, "cores");
        x->nvlinks = (int)rec_int(d, "nvlink_active");
        g->n++;
    }
    if (rec_matrix(json_object_get(r, "p2p_nvlink"), g->n, g->p2p, err, errlen, "p2p_nvlink") ||
        rec_matrix(json_object_get(r, "common_ancestor"), g->n, g->level, err, errlen,
                   "common_ancestor"))
        goto fail;
    const char *drv = json_string_value(json_object_get(r, "driver_version"));
    snprintf(g->driver, sizeof g->driver, "%s", drv ? drv : "");
    g->cuda_version = (int)rec_int(r, "cuda_driver_version");
    inv_finish(g);
    json_decref(r);
    return g;
fail:
    free(g);
    json_decref(r);
    return NULL;
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

const char *gpu_inv_type(const struct gpu_inv *g, int i) {
    return i >= 0 && i < g->n ? g->dev[i].type : "";
}

/* nvmlGpuTopologyLevel_t -> the label `nvidia-smi topo -m` prints. */
static const char *level_label(int level) {
    static const struct {
        int level;
        const char *label;
    } t[] = {{0, "PIX"}, {10, "PIX"}, {20, "PXB"}, {30, "PHB"}, {40, "NODE"}, {50, "SYS"}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (t[i].level == level) return t[i].label;
    return "";
}

static json_t *int_or_null(long v) {
    return v >= 0 ? json_integer(v) : json_null();
}

json_t *gpu_inv_inventory(const struct gpu_inv *g) {
    json_t *gpus = json_array(), *topo = json_array();
    for (int i = 0; i < g->n; i++) {
        const struct gpu_dev *d = &g->dev[i];
        char cc[16] = "";
        if (d->cc_major >= 0) snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
        json_t *o =
            json_pack("{s:i, s:s, s:s, s:s, s:I}", "index", i, "name", d->name, "uuid", d->uuid,
                      "gpu_type", d->type, "mem_total_mib", (json_int_t)(d->mem_total >> 20));
        json_object_set_new(o, "sm_count", int_or_null(d->sm_count));
        json_object_set_new(o, "compute_capability", cc[0] ? json_string(cc) : json_null());
        json_object_set_new(o, "nvlinks", int_or_null(d->nvlinks));
        json_array_append_new(gpus, o);
    }
    for (int a = 0; !g->cpu && a < g->n; a++) {
        json_t *row = json_array();
        for (int b = 0; b < g->n; b++) {
            char lab[16] = "X";
            if (a != b && g->p2p[a][b] == 0) {
                int links = g->dev[a].nvlinks;
                snprintf(lab, sizeof lab, links > 0 ? "NV%d" : "NV", links);
            } else if (a != b) {
                snprintf(lab, sizeof lab, "%s", level_label(g->level[a][b]));
            }
            json_array_append_new(row, json_string(lab));
        }
        json_array_append_new(topo, row);
    }
    char cuda[16] = "";
    if (g->cuda_version > 0)
        snprintf(cuda, sizeof cuda, "%d.%d", g->cuda_version / 1000, g->cuda_version % 1000 / 10);
    json_t *o = json_pack("{s:o, s:o}", "gpus", gpus, "topology", topo);
    json_object_set_new(o, "driver_version", g->driver[0] ? json_string(g->driver) : json_null());
    json_object_set_new(o, "cuda_version", cuda[0] ? json_string(cuda) : json_null());
    return o;
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
        } else if (!g->nv.lib) { /* a recording: no live values */
            total_mib = (json_int_t)(d->mem_total >> 20);
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
        json_array_append_new(arr,
                              json_pack("{s:i, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "index", i,
                                        "name", d->name, "uuid", d->uuid, "gpu_type", d->type,
                                        "mem_total_mib", total_mib, "mem_used_mib", used_mib,
                                        "util_pct", util, "power_w", power, "temp_c", temp));
    }
    return arr;
}
