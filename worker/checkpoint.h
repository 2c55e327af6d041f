/* Checkpoints: one directory per step, a shard file per rank, a manifest.
 *
 * On disk (OUT is the worker's --out directory, shared by all ranks and by
 * every attempt of a job):
 *   OUT/checkpoints/step_00000200/manifest.json
 *   OUT/checkpoints/step_00000200/rank_00000.safetensors   (one per rank)
 *   OUT/checkpoints/step_00000200/rank_00001.safetensors
 * A save is written into OUT/checkpoints/.tmp.step_00000200/ and renamed to
 * its final name only when every shard and the manifest are written and
 * fsynced (then the parent directory is fsynced). A directory named
 * step_NNNNNNNN therefore always holds a complete save; a crash leaves at most
 * a .tmp.* directory, which the next save of that step or the next prune
 * removes.
 *
 * Shards are safetensors files (safetensors.h): each rank adds its named flat
 * buffers (params, AdamW m and v, ... or its ZeRO slice of them), with an
 * optional per-rank JSON "meta" (its dp/tp/pp coordinates, shard ranges, RNG).
 * manifest.json (written by rank 0 after all shards exist):
 *   {"format": "loom-checkpoint", "version": 1, "step": 200, "world": 2,
 *    "created_at": "2026-11-30T08:00:00Z", "save_id": "<unique per save>",
 *    ...every key of the caller's manifest object, by convention
 *    "spec" (job spec), "data" (data_position_to_json), "rng", "layout"
 *    ({"dp","tp","pp","zero_stage"}), "train" (e.g. optimizer step count)...,
 *    "shards": [{"rank": 0, "file": "rank_00000.safetensors", "bytes": N,
 *                "sha256": "hex", "meta": {...},
 *                "tensors": [{"name", "dtype", "shape"}]}, ...]}
 *
 * Verification (before anything is loaded): the manifest parses, has one shard
 * per rank of its world, every shard file exists with the recorded size and
 * SHA-256 and parses as safetensors. A checkpoint failing any check is skipped
 * with a warning by ckpt_find_latest and refused by ckpt_open.
 *
 * Collectives: ckpt_begin and ckpt_commit must be called by every rank of the
 * world in the same order; they synchronise through the caller's barrier
 * (required when world > 1). All ranks return 0 only when the final manifest
 * is this save's (same save_id) and lists their shard's checksum; a rank that
 * fails still enters every barrier, so the others get an error, not a hang. The directory must be
 * on storage every rank sees. Errors: 0 or a negative CKPT_E* code with a message in `err` (may be
 * NULL). Not thread-safe per object; one save at a time per process. */
#ifndef LOOM_WORKER_CHECKPOINT_H
#define LOOM_WORKER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "worker/safetensors.h"

enum {
    CKPT_EINVAL = -1,
    CKPT_EIO = -2,
    CKPT_ECORRUPT = -3,  /* checksum, size or format mismatch */
    CKPT_EBARRIER = -4,  /* the barrier callback failed */
    CKPT_EPEER = -5,     /* another rank's shard is missing after the barrier */
    CKPT_ENOTFOUND = -6, /* no such tensor / rank */
};

/* Returns 0 when all ranks of the world have reached it, non-zero on failure. */
typedef int (*ckpt_barrier_fn)(void *ctx);

struct ckpt_opts {
    const char *out_dir; /* OUT; checkpoints live in OUT/checkpoints/ */
    int rank;            /* this process's global rank */
    int world;           /* number of ranks writing shards (>= 1) */
    ckpt_barrier_fn barrier;
    void *barrier_ctx;
    int keep; /* after a save rank 0 removes all but the `keep` newest
                 complete checkpoints; <= 0 keeps all */
};

/* ---- saving ---------------------------------------------------------------- */

struct ckpt_writer;

/* Start the save of `step` (collective). Rank 0 creates OUT/checkpoints and a
 * fresh temporary directory for the step, then all ranks meet at the barrier.
 * *out is owned by the caller until ckpt_commit / ckpt_abort. */
int ckpt_begin(const struct ckpt_opts *opts, int64_t step, struct ckpt_writer **out, char *err,
               size_t errlen);

/* Register a named buffer of this rank's shard. The pointer must stay valid
 * and unchanged until ckpt_commit returns (nothing is copied). shape has ndim
 * entries. Names are unique per rank. Returns 0 or CKPT_EINVAL. */
int ckpt_add(struct ckpt_writer *w, const char *name, enum st_dtype dtype, const void *data,
             int ndim, const int64_t *shape);
/* Convenience: a flat fp32 buffer of n elements. */
int ckpt_add_f32(struct ckpt_writer *w, const char *name, const float *data, size_t n);

/* Per-rank metadata stored in the manifest under shards[rank].meta (e.g.
 * {"dp":0,"tp":1,"pp":0,"offset":..,"count":..}). Steals the reference. */
int ckpt_set_rank_meta(struct ckpt_writer *w, json_t *meta);

/* Write this rank's shard, meet at the barrier, and on rank 0 write the
 * manifest (the keys of `manifest`, borrowed, merged with the ones listed
 * above; ignored on other ranks, may be NULL), fsync, rename the directory,
 * fsync the parent, prune to `keep`; then meet again so that every rank
 * returns only when the checkpoint is complete. Stores the final directory
 * path in path_out (may be NULL). Frees w in every case. */
int ckpt_commit(struct ckpt_writer *w, const json_t *manifest, char *path_out, size_t pathlen,
                char *err, size_t errlen);

/* Give up a save (frees w; removes nothing shared, the next save cleans up). */
void ckpt_abort(struct ckpt_writer *w);

/* Remove all but the `keep` newest complete checkpoints of OUT, and any
 * leftover temporary directories. Rank 0 only. Returns the number removed or
 * < 0. keep <= 0 removes nothing. */
int ckpt_prune(const char *out_dir, int keep);

/* ---- finding and loading --------------------------------------------------- */

/* Steps of the complete (renamed) checkpoints under OUT, ascending, not
 * verified. *steps is malloc'ed (caller frees); *n may be 0. */
int ckpt_list(const char *out_dir, int64_t **steps, size_t *n);

/* Full verification of one checkpoint directory (manifest, shard count equal
 * to `world` when world > 0, sizes, SHA-256 of every shard). Returns 0 or
 * CKPT_ECORRUPT / CKPT_EIO with the reason in err. */
int ckpt_verify(const char *dir, int world, char *err, size_t errlen);

/* Newest checkpoint of OUT that passes ckpt_verify(world); every newer one
 * that fails is skipped with a log_warn naming it and the reason. Returns 1
 * and fills path/step when found, 0 when none, < 0 on error. Every rank may
 * call it (they read the same files and reach the same answer) or rank 0
 * calls it and broadcasts the step. */
int ckpt_find_latest(const char *out_dir, int world, char *path, size_t pathlen, int64_t *step);

/* Cheaper verification for many ranks: the manifest, every shard's size, and
 * the SHA-256 and format of `rank`'s shard only. Returns like ckpt_verify. */
int ckpt_verify_rank(const char *dir, int world, int rank, char *err, size_t errlen);

/* Logical AND across all ranks: on return *ok is 1 on every rank iff it was 1
 * on every rank (e.g. an all-reduce MIN, or a SUM compared with world).
 * Returns 0, non-zero on failure. */
typedef int (*ckpt_agree_fn)(void *ctx, int *ok);

/* Collective ckpt_find_latest: every rank hashes only its own shard
 * (ckpt_verify_rank) and the ranks agree through `agree` once per candidate,
 * newest first, so the checksum work is spread over the ranks and all of them
 * pick the same checkpoint. Call on every rank at start-up (no save running);
 * skipped candidates are logged. Returns 1 (path/step filled), 0 or < 0
 * (CKPT_EBARRIER when agree failed). */
int ckpt_find_latest_shared(const char *out_dir, int world, int rank, ckpt_agree_fn agree,
                            void *ctx, char *path, size_t pathlen, int64_t *step);

struct ckpt_reader;

/* Open a checkpoint directory for `rank`: parse and check the manifest and
 * verify that rank's shard (size, SHA-256, format). Use ckpt_verify or
 * ckpt_find_latest first to check all shards. */
int ckpt_open(const char *dir, int rank, struct ckpt_reader **out, char *err, size_t errlen);
void ckpt_close(struct ckpt_reader *r); /* accepts NULL */

/* The manifest (borrowed, valid until ckpt_close) and shortcuts. */
const json_t *ckpt_manifest(const struct ckpt_reader *r);
int64_t ckpt_step(const struct ckpt_reader *r);
int ckpt_world(const struct ckpt_reader *r);
/* shards[rank].meta of the opened rank (borrowed; NULL when none). */
const json_t *ckpt_rank_meta(const struct ckpt_reader *r);

/* Tensor info of the opened rank's shard; NULL when absent. */
const struct st_info *ckpt_find(const struct ckpt_reader *r, const char *name);
/* Read tensor `name` into dst (dst_bytes must match exactly; BF16 -> F32
 * converts). Returns 0, CKPT_ENOTFOUND or CKPT_EIO/CKPT_ECORRUPT. */
int ckpt_read(const struct ckpt_reader *r, const char *name, enum st_dtype dtype, void *dst,
              size_t dst_bytes, char *err, size_t errlen);
/* Convenience: n fp32 values. */
int ckpt_read_f32(const struct ckpt_reader *r, const char *name, float *dst, size_t n, char *err,
                  size_t errlen);

#endif
