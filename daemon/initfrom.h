/* model.init_from resolved at submit, before the spec is parsed.
 *
 * An HF directory: loomd reads its config.json (the path confined to the
 * tenant's data roots first, like data paths) and writes the family and
 * sizes into the spec's "model" (api/hf_config.h, the same derivation the
 * worker makes), so the stored spec, the planner and the memory check have
 * them; sizes the spec states must agree (INIT_FROM_MISMATCH).
 *
 * "job:<id>" or "job:<id>@<step>" (a fork): the job must be the tenant's
 * (another tenant's is JOB_NOT_FOUND, the same answer as no job), the step
 * one of its saved checkpoints (its newest when no step is given; else
 * CHECKPOINT_NOT_FOUND listing the steps there are). The model becomes the
 * parent's shape (sizes the spec states must agree), init_from names the
 * step explicitly, and model.init_checkpoint / model.init_hf record the
 * checkpoint directory and the HF directory the parent's model came from.
 * loomd must see the parent's out_dir (the shared jobs directory, as for
 * artifacts). A fork starts a fresh optimizer and schedule at step 0.
 *
 * Called on the submit request thread; reads the store and the filesystem. */
#ifndef LOOM_DAEMON_INITFROM_H
#define LOOM_DAEMON_INITFROM_H

#include <stddef.h>

#include <jansson.h>

#include "api/jobspec.h"

struct store;

struct initfrom_ctx {
    struct store *st;
    const char *tenant_id;    /* the submitting tenant (NULL: no fork resolution) */
    const char *const *roots; /* the tenant's data roots */
    size_t nroots;
    /* 1 when loomd's view of the data is authoritative (roots configured and
     * all visible): a missing directory is refused even when the spec states
     * the family and sizes (otherwise the worker checks it) */
    int strict;
};

/* *out = body with "model" rewritten as above (a new object), or body itself
 * (a new reference) when init_from is absent or not a string. 0, or -1 with
 * e filled (status and code of api/errors.h). */
int initfrom_resolve(const struct initfrom_ctx *c, json_t *body, json_t **out,
                     struct loom_error *e);

/* Complete checkpoint steps under out_dir/checkpoints (step_N directories
 * with a manifest.json), ascending, into steps[0..max); returns how many
 * there are (may exceed max), -1 when the directory cannot be read. */
int initfrom_list_steps(const char *out_dir, long long *steps, int max);

#endif
