/* Device inventory and telemetry for loom-agent.
 *
 * GPUs are read through NVML, loaded at run time with dlopen
 * ("libnvidia-ml.so.1"), so the agent has no build-time dependency on the
 * driver and runs on machines without one. With cpu_devices > 0 the agent
 * offers that many CPU "devices" instead (cpu backend, tests, laptops) and
 * NVML is not touched. Called from the agent's main thread only.
 *
 * The inventory (read once at start-up, sent at registration) names each
 * GPU's model, memory, SM count, compute capability and normalized gpu_type
 * (api/gpu_types.h), the driver and CUDA versions, and the link between each
 * pair of the node's GPUs (NVLink or the PCIe level, as `nvidia-smi topo -m`
 * prints it) where NVML gives it. Tests feed recorded NVML answers instead of
 * the library (gpu_inv_from_recording). */
#ifndef LOOM_AGENT_GPU_H
#define LOOM_AGENT_GPU_H

#include <jansson.h>

struct gpu_inv;

/* cpu_devices > 0: offer that many cpu devices. Otherwise probe NVML; with no
 * driver the inventory is empty (kind "cuda", 0 devices) and a warning is
 * logged once. Never NULL except when out of memory. */
struct gpu_inv *gpu_inv_new(int cpu_devices);

/* For tests: the inventory NVML would have given, from a JSON recording of
 * its answers (see tests/unit/test_gpu_inventory.c for the format: one object
 * per device with name, uuid, memory_total, cc, cores, nvlink_active; the
 * node's p2p_nvlink and common_ancestor matrices; driver_version and
 * cuda_driver_version). A field left out reads as NVML_ERROR_NOT_SUPPORTED.
 * NULL with `err` filled when the file is not such a recording. */
struct gpu_inv *gpu_inv_from_recording(const char *path, char *err, size_t errlen);
void gpu_inv_free(struct gpu_inv *g); /* accepts NULL */

/* "cuda" or "cpu". */
const char *gpu_inv_kind(const struct gpu_inv *g);
int gpu_inv_count(const struct gpu_inv *g);
/* The UUID of device i (GPU) or "cpu-i"; borrowed. */
const char *gpu_inv_uuid(const struct gpu_inv *g, int i);
/* The gpu_type of device i ("H100-SXM", "cpu", or "unknown" for a model not
 * in api/gpu_types.c); borrowed. */
const char *gpu_inv_type(const struct gpu_inv *g, int i);

/* The registration inventory (caller owns):
 * {"driver_version","cuda_version","gpus":[{"index","name","uuid","gpu_type",
 *  "mem_total_mib","sm_count","compute_capability","nvlinks"}],
 *  "topology":[["X","NV18",..],..]} where a pair's entry is "NV<links>" when
 * NVML reports NVLink peer access between them, else the PCIe level: "PIX"
 * (one switch), "PXB" (several switches), "PHB" (host bridge), "NODE" (same
 * NUMA node), "SYS" (across sockets); "" where NVML does not say. Values NVML
 * does not give are null. cpu devices give {"gpus":[...cpu...],"topology":[]}. */
json_t *gpu_inv_inventory(const struct gpu_inv *g);

/* JSON array, one object per device: index, name, uuid, gpu_type,
 * mem_total_mib, mem_used_mib, util_pct, power_w, temp_c (live values re-read
 * from NVML; cpu devices report memory from /proc/meminfo split evenly and
 * utilization from the load average). Caller owns the reply. */
json_t *gpu_inv_telemetry(struct gpu_inv *g);

#endif
