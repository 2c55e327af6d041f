/* Artifacts: what a job wrote, listed and served over HTTP.
 *
 * Where the bytes are: loomd reads them from shared storage. A job's out_dir
 * (<jobs-dir>/<job id>, handed to every rank) must be visible to loomd at
 * the same path, as it is on one node and in every loopback test, or with
 * the jobs dir on NFS/Lustre/a CSI volume shared by loomd and the nodes. Log
 * artifacts are loomd's own copies (<data-dir>/logs/<job>, shipped by the
 * agents), so they are always local. The other option (agents serving their
 * work dir to loomd, which proxies) is described in docs/operations.md and
 * not built.
 *
 * Layout (relative artifact paths -> kind, step):
 *   checkpoints/step_NNNNNNNN/<file>  checkpoint, step N (complete saves only:
 *                                     the directory has a manifest.json)
 *   export/hf/<file...>               model
 *   export/lora/<file...>             adapter
 *   logs/<attempt>.<rank>.<stream>.log log
 * Anything else under out_dir is not an artifact (404).
 *
 * Confinement: a path with an empty, "." or ".." segment is refused, and the
 * resolved path (realpath, symlinks followed) must lie under the resolved
 * root; otherwise 404, the same answer as a missing file.
 *
 * Checksums: SHA-256 of each file, computed once per (size, mtime) and kept
 * in table artifact_hashes (migration 072); checkpoint shards take the
 * checksum their manifest records when the size matches (the worker computed
 * it while writing and verifies it on load). ETag is the quoted SHA-256. */
#ifndef LOOM_DAEMON_ARTIFACTS_H
#define LOOM_DAEMON_ARTIFACTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/http.h"

enum artifact_kind {
    ARTIFACT_NONE = -1,
    ARTIFACT_CHECKPOINT,
    ARTIFACT_MODEL,
    ARTIFACT_ADAPTER,
    ARTIFACT_LOG,
};
const char *artifacts_kind_name(enum artifact_kind k);

/* Kind of a relative artifact path (ARTIFACT_NONE: not one, or a path with
 * an empty/"."/".." segment). *step gets the checkpoint step (-1 otherwise);
 * *is_dir_path is set when rel names a whole checkpoint or export directory
 * (checkpoints/step_N, export/hf, export/lora) rather than a file. Pure. */
enum artifact_kind artifacts_classify(const char *rel, long *step, int *is_dir_path);

/* Parses a Range header against a file of `size` bytes. Returns 0 when there
 * is no header (serve everything), 1 with *off and *len set for one satisfiable
 * range ("bytes=A-B", "bytes=A-" and "bytes=-N"), -1 for anything else (416):
 * malformed, several ranges, or not satisfiable. Pure. */
int artifacts_parse_range(const char *header, uint64_t size, uint64_t *off, uint64_t *len);

/* Retention. A finished job's checkpoints/ and export/ are deleted once it
 * has been over for its tenant's TTL (tenants.artifact_ttl_s, set by an
 * admin with PATCH /v1/tenants/{id} {"artifact_ttl_s"}; NULL: the cluster's
 * --artifact-ttl; 0: kept), from shared storage or from every node that
 * holds them (loomd tells the agent, which deletes inside the job directory
 * only), and an `artifacts.expired` event records it; jobs.artifacts_expired_at
 * marks it done (migration 170). logs/ stay (loomd's own small copies). A
 * node that cannot be reached keeps the job for the next sweep (every
 * --artifact-sweep seconds). checkpoint.keep still prunes while a job runs. */
struct store_tx;
struct loomd;
int artifacts_start(struct loomd *ld);
void artifacts_stop(struct loomd *ld);
/* One sweep at `now_ms` (the clock is the caller's, for tests): returns the
 * number of jobs whose artifacts were deleted, or -1. */
int artifacts_sweep(struct loomd *ld, int64_t now_ms);
/* Inside a store callback: sets a tenant's TTL (ttl_s < 0: back to the
 * cluster default), or adds "artifact_ttl_s" (null: default) to the tenant
 * JSON t. STORE_* codes. */
int artifacts_tenant_ttl_set(struct store_tx *tx, const char *tenant_id, long ttl_s);
int artifacts_tenant_ttl_json(struct store_tx *tx, const char *tenant_id, json_t *t);

/* Routes (tenant: own jobs; admin: any). */
int artifacts_api_list(struct http_req *req);
int artifacts_api_get(struct http_req *req);
int artifacts_api_delete(struct http_req *req);

#endif
