/* Device inventory and telemetry for loom-agent.
 *
 * GPUs are read through NVML, loaded at run time with dlopen
 * ("libnvidia-ml.so.1"), so the agent has no build-time dependency on the
 * driver and runs on machines without one. With cpu_devices > 0 the agent
 * offers that many CPU "devices" instead (cpu backend, tests, laptops) and
 * NVML is not touched. Called from the agent's main thread only. */
#ifndef LOOM_AGENT_GPU_H
#define LOOM_AGENT_GPU_H

#include <jansson.h>

struct gpu_inv;

/* cpu_devices > 0: offer that many cpu devices. Otherwise probe NVML; with no
 * driver the inventory is empty (kind "cuda", 0 devices) and a warning is
 * logged once. Never NULL except when out of memory. */
struct gpu_inv *gpu_inv_new(int cpu_devices);
void gpu_inv_free(struct gpu_inv *g); /* accepts NULL */

/* "cuda" or "cpu". */
const char *gpu_inv_kind(const struct gpu_inv *g);
int gpu_inv_count(const struct gpu_inv *g);
/* The UUID of device i (GPU) or "cpu-i"; borrowed. */
const char *gpu_inv_uuid(const struct gpu_inv *g, int i);

/* JSON array, one object per device: index, name, uuid, mem_total_mib,
 * mem_used_mib, util_pct, power_w, temp_c (live values re-read from NVML;
 * cpu devices report memory from /proc/meminfo split evenly and utilization
 * from the load average). Caller owns the reply. */
json_t *gpu_inv_telemetry(struct gpu_inv *g);

#endif
