/* Submit-time checks of a job against what loomd can see: its data files
 * (shared storage assumed), the data's vocabulary (meta.json beside the
 * shards) and the tenant's GPU quota. Each fills a struct loom_error with a
 * stable code and returns -1, or returns 0. Called by api_jobs_submit on its
 * request thread. */
#ifndef LOOM_DAEMON_SUBMITCHECK_H
#define LOOM_DAEMON_SUBMITCHECK_H

#include <stddef.h>

#include "api/jobspec.h"

struct store;

/* 1 when every one of the n roots is a directory loomd can see (and n > 0):
 * loomd then has the nodes' view of the data (shared storage). */
int submitcheck_roots_visible(const char *const *roots, size_t n);

/* data.train and data.val must match at least one file when loomd has data
 * roots (the tenant's or --data-roots) and every one of them is a directory
 * it can see: loomd then has the same view of the data as the nodes (shared
 * storage). Otherwise nothing is checked here and the agent's staging step
 * reports a missing file as the attempt's failure event.
 * Code: DATA_PATH_NOT_FOUND naming the field and the pattern. */
int submitcheck_data(const struct loom_spec *s, const char *const *roots, size_t nroots,
                     int roots_configured, struct loom_error *e);

/* For token shards (data.format bin): the vocab_size recorded in meta.json
 * of the train data's directory (written by loom-data prepare) must not be
 * above model.vocab_size. No meta.json: not checked (the worker checks the
 * tokens at open). Code: VOCAB_TOO_SMALL naming both numbers. */
int submitcheck_vocab(const struct loom_spec *s, struct loom_error *e);

/* A tenant with a gpu_quota (> 0) smaller than the job's world size could
 * never run it. Code: QUOTA_TOO_SMALL naming both numbers. Returns 0 when
 * the tenant has no quota or cannot be read (the scheduler still applies it). */
int submitcheck_quota(struct store *st, const char *tenant_id, int world, struct loom_error *e);

#endif
