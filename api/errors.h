/* The stable error codes of the API: one row per code (the code, its HTTP
 * status, what it means). loomd's routes answer {"error":{"code","message"}}
 * with these codes and statuses, and the job-spec validator and planner
 * fill struct loom_error with them; api/openapi.yaml lists the same rows
 * under components.x-error-codes (test_daemon_openapi checks both ways) and
 * unit.error_codes checks that every code the sources use is a row here
 * with its status. A code is a promise to clients: rename one only with a
 * line in docs/internals/api.md "Renamed error codes".
 *
 * Families: INVALID_<what> for a value that is malformed or out of its
 * rules, <THING>_NOT_FOUND for a missing object, UNKNOWN_<what> for a name
 * outside a known list, <RULE> tokens for the job spec's cross-field rules. */
#ifndef LOOM_API_ERRORS_H
#define LOOM_API_ERRORS_H

#include <stddef.h>

/* X(code, status, meaning) */
#define LOOM_ERRORS(X)                                                                             \
    /* requests */                                                                                 \
    X(INVALID_JSON, 400, "the body is not JSON, has duplicate keys, or is not an object")          \
    X(INVALID_QUERY, 400, "a query parameter is malformed (the message names it)")                 \
    X(INVALID_CURSOR, 400, "a list cursor that loomd did not issue")                               \
    X(INVALID_IDEMPOTENCY_KEY, 400, "Idempotency-Key is empty or longer than 255 characters")      \
    X(INVALID_STREAM, 400, "logs: stream is not stderr or stdout")                                 \
    X(INVALID_RANK, 400, "logs, metrics: rank is not in 0..world_size-1")                          \
    X(INVALID_TIME, 400, "usage: from/to is not RFC 3339, YYYY-MM-DD or milliseconds")             \
    X(INVALID_GROUP_BY, 400, "usage: group_by is not one of the listed keys")                      \
    X(INVALID_FORMAT, 400, "usage: format is not json or csv")                                     \
    X(INVALID_RDZV_VALUE, 400, "rendezvous: the body is not {\"value\": \"<base64>\"}")            \
    X(INVALID_NODE_NAME, 400, "agent: the node name is missing or malformed")                      \
    X(INVALID_DEVICE_KIND, 400, "agent: kind is not cuda or cpu")                                  \
    X(INVALID_DEVICES, 400, "agent: devices is not an array of at most 64")                        \
    X(INVALID_COMM_ADDR, 400, "agent: comm_addr/comm_iface is too long or has odd characters")     \
    X(INVALID_CPU_PEAK, 400, "agent: cpu_peak_gflops is not a number in (0, 1e7]")                 \
    X(INVALID_METRICS, 400, "agent: metrics items is not an array")                                \
    X(INVALID_LOG_CHUNK, 400, "agent: a log chunk is malformed")                                   \
    X(INVALID_ARTIFACT_SERVER, 400, "agent: artifacts is not {url: http://..., token}")            \
    X(UNAUTHORIZED, 401, "missing, unknown, expired or revoked token")                             \
    X(TOKEN_EXPIRED, 401, "the tenant token is past its expires_at")                               \
    X(FORBIDDEN, 403, "a token of the wrong kind for this route")                                  \
    X(INSUFFICIENT_SCOPE, 403, "the token lacks the scope the route needs (read, submit)")         \
    X(RDZV_FORBIDDEN, 403, "the token is not this attempt's rendezvous token")                     \
    X(STAGING_FORBIDDEN, 403, "the token is not this job's attempt token")                         \
    X(NOT_FOUND, 404, "no such route")                                                             \
    X(JOB_NOT_FOUND, 404, "no such job (or another tenant's)")                                     \
    X(TENANT_NOT_FOUND, 404, "no such tenant")                                                     \
    X(TOKEN_NOT_FOUND, 404, "the tenant has no such token")                                        \
    X(NODE_NOT_FOUND, 404, "no such node (or an agent that is not registered)")                    \
    X(CHECK_NOT_FOUND, 404, "no such node check")                                                  \
    X(RDZV_KEY_NOT_FOUND, 404, "the rendezvous key is not (yet) published")                        \
    X(UI_FILE_NOT_FOUND, 404, "no such file of the web view")                                      \
    X(METHOD_NOT_ALLOWED, 405, "the route exists with other methods (see Allow)")                  \
    X(IDEMPOTENCY_CONFLICT, 409, "the Idempotency-Key was used with a different body")             \
    X(TENANT_EXISTS, 409, "a tenant with this name exists")                                        \
    X(NODE_BUSY, 409, "the node runs job ranks (force to check anyway)")                           \
    X(NODE_NOT_READY, 409, "the node is lost, unknown or has no devices")                          \
    X(KIND_MISMATCH, 409, "the two nodes have different device kinds")                             \
    X(CHECK_NOT_RUNNING, 409, "the node check has no open part for the node")                      \
    X(RDZV_KEY_EXISTS, 409, "the rendezvous key is write-once and already set")                    \
    X(RDZV_FULL, 409, "the rendezvous holds too many keys")                                        \
    X(PAYLOAD_TOO_LARGE, 413, "the body is over --max-body")                                       \
    X(UNSUPPORTED_MEDIA_TYPE, 415, "a body that is not application/json")                          \
    X(RATE_LIMITED, 429, "too many requests for the tenant (see Retry-After)")                     \
    X(TENANT_STREAM_LIMIT, 429, "the tenant has --tenant-streams streams open (logs, SSE)")        \
    X(TOO_MANY_STREAMS, 429, "loomd holds --stream-limit open streams (room kept for others)")     \
    X(INTERNAL, 500, "an internal failure (out of memory, no randomness)")                         \
    X(LOG_READ_FAILED, 500, "a stored log could not be read")                                      \
    X(LOG_WRITE_FAILED, 500, "a log chunk could not be stored")                                    \
    X(STORE_UNAVAILABLE, 503, "the store is unavailable; retry")                                   \
    X(SHUTTING_DOWN, 503, "loomd is stopping")                                                     \
    X(TOO_MANY_NODES, 503, "the cluster holds its most nodes")                                     \
    /* event stream, webhooks, artifacts (daemon/events.h, webhooks.h, artifacts.h) */             \
    X(INVALID_LAST_EVENT_ID, 400, "events: Last-Event-ID is not a non-negative event seq")         \
    X(UNKNOWN_EVENT_TYPE, 400, "an event type outside job.queued ... export.ready")                \
    X(INVALID_WEBHOOK_URL, 400, "webhooks: url is missing, malformed or not http/https")           \
    X(WEBHOOK_HOST_UNRESOLVED, 400, "webhooks: the url's host does not resolve")                   \
    X(WEBHOOK_PRIVATE_ADDRESS, 400,                                                                \
      "webhooks: the host is loopback/private (see --webhook-allow-private)")                      \
    X(INVALID_WEBHOOK_EVENTS, 400, "webhooks: events is not a list of event types or *")           \
    X(INVALID_WEBHOOK_SECRET, 400, "webhooks: secret is not a string of 16-256 characters")        \
    X(WEBHOOK_NOT_FOUND, 404, "no such webhook (or another tenant's, or deleted)")                 \
    X(ARTIFACT_NOT_FOUND, 404, "no such artifact of the job (or a path leaving its directory)")    \
    X(TOO_MANY_WEBHOOKS, 409, "the tenant has 100 webhooks")                                       \
    X(ARTIFACT_IN_CHECKPOINT, 409, "one file of a checkpoint: delete the whole checkpoint")        \
    X(CHECKPOINT_IN_USE, 409, "the newest checkpoint of a job that has not finished")              \
    X(RANGE_NOT_SATISFIABLE, 416, "Range is malformed, several ranges, or past the end")           \
    X(ARTIFACT_DELETE_FAILED, 500, "an artifact could not be deleted")                             \
    /* body fields (non-spec routes) */                                                            \
    X(INVALID_FIELD, 422, "a body field of a non-spec route has the wrong type or value")          \
    X(INVALID_SPEC, 422, "the job spec is invalid (fallback when no finer code applies)")          \
    /* job spec: shape, types, ranges */                                                           \
    X(UNKNOWN_FIELD, 422, "a key that is not in the table, e.g. train.lrr")                        \
    X(WRONG_TYPE, 422, "a value of the wrong JSON type")                                           \
    X(OUT_OF_RANGE, 422, "a number outside its range, a string too long, too many entries")        \
    X(INVALID_VALUE, 422, "a name outside the field's list, NUL/control characters")               \
    X(MISSING_FIELD, 422, "a required field is absent")                                            \
    X(UNKNOWN_PRESET, 422, "model.preset is not one of the family's presets")                      \
    X(INVALID_MODEL, 422, "the model's sizes do not fit together")                                 \
    X(INVALID_NAME, 422, "a job or tenant name outside [A-Za-z0-9._-]")                            \
    X(INVALID_LABEL, 422, "a label key outside [A-Za-z0-9._/-]")                                   \
    X(INVALID_INIT_FROM, 422, "model.init_from is not a plain absolute path or job:<id>[@<step>]") \
    X(INVALID_LORA_TARGET, 422, "a LoRA target outside the family's list, twice, or none")         \
    X(INVALID_GPU_TYPE, 422, "a resources.gpu_type name outside [A-Za-z0-9._-]")                   \
    X(INVALID_JOB_ID, 422, "an after entry that is not a job id")                                  \
    X(INVALID_ARRAY_KEY, 422, "an array key that is not a one-value spec field")                   \
    X(ARRAY_TOO_LARGE, 422, "the array expands to more than 256 jobs")                             \
    X(UNKNOWN_JOB, 422, "after names a job the tenant does not have")                              \
    /* job spec: cross-field rules */                                                              \
    X(WORLD_TOO_LARGE, 422, "dp*tp*pp above 16384")                                                \
    X(TP_HEADS, 422, "tp does not divide n_head")                                                  \
    X(TP_KV_HEADS, 422, "tp does not divide n_kv_head")                                            \
    X(TP_FFN, 422, "tp does not divide d_ff")                                                      \
    X(TP_CROSSES_NODE, 422, "tp above gpus_per_node (the job's or the cluster's)")                 \
    X(PP_LAYERS, 422, "pp does not divide n_layer, or exceeds it")                                 \
    X(ZERO_WITH_PP, 422, "zero_stage >= 2 with pp > 1")                                            \
    X(BATCH_NOT_DIVISIBLE, 422, "global_batch_tokens is not a multiple of micro_batch*seq_len*dp") \
    X(PP_TOO_FEW_MICROBATCHES, 422, "pp > 1 with fewer micro-batches than stages")                 \
    X(LR_ORDER, 422, "min_lr above lr")                                                            \
    X(WARMUP_TOO_LONG, 422, "warmup_steps above steps")                                            \
    X(PRECISION_DEVICE, 422, "bf16 or fp8 on the cpu device")                                      \
    X(OFFLOAD_DEVICE, 422, "offload_optimizer on the cpu device")                                  \
    X(PRECISION_GPU, 422, "fp8 where no GPU the job may use has FP8 tensor cores (cc < 8.9)")      \
    X(EVAL_WITHOUT_VAL, 422, "eval_every without data.val or data.val_fraction")                   \
    X(QUANTIZE_WITHOUT_LORA, 422, "quantize_base=nf4 without train.lora")                          \
    X(EXPORT_WITHOUT_LORA, 422, "export.lora without train.lora")                                  \
    X(LOSS_ON_FORMAT, 422, "loss_on assistant/completion without the matching data.format")        \
    X(VAL_SOURCE_CONFLICT, 422, "data.val_fraction together with data.val")                        \
    X(DATA_PATH_INVALID, 422, "a data path that is relative, has ./.., or globs a directory")      \
    X(DATA_PATH_FORBIDDEN, 422, "a data path that resolves outside the tenant's data roots")       \
    X(DATA_PATH_NOT_FOUND, 422, "a data path that matches nothing where loomd looks")              \
    X(VOCAB_TOO_SMALL, 422, "the data's vocab_size (meta.json) is above model.vocab_size")         \
    X(QUOTA_TOO_SMALL, 422, "the job's world size is above the tenant's gpu_quota")                \
    /* planner */                                                                                  \
    X(DOES_NOT_FIT, 422, "the per-GPU memory estimate is above the GPUs' memory")                  \
    X(LAYOUT_EXCEEDS_CLUSTER, 422, "dp*tp*pp above the cluster's GPUs")                            \
    X(RECOMPUTE_BUDGET_TOO_SMALL, 422,                                                             \
      "train.recompute.budget_gib under the memory with every block recomputed")                   \
    X(UNKNOWN_GPU, 422, "cluster.gpu is not in the GPU table (and no memory/TFLOPS given)")        \
    X(UNKNOWN_LINK, 422, "cluster link is not in the link table")                                  \
    /* GPU fleet: types, capacity, prices */                                                       \
    X(UNKNOWN_GPU_TYPE, 422, "resources.gpu_type names a type not in api/gpu_types.c")             \
    X(UNSCHEDULABLE, 422, "the cluster could never hold the job (ranks, tp, GPU type)")            \
    X(INVALID_PRICES, 422, "prices: items is not an array of at most 64")                          \
    X(INVALID_PRICE, 422, "prices: an item's gpu_type, price or currency is invalid")              \
    X(DUPLICATE_PRICE, 422, "prices: a gpu_type is listed twice")                                  \
    /* tenant QoS */                                                                               \
    X(PRIORITY_TOO_HIGH, 422, "the job's priority is above the tenant's max_priority")             \
    X(BUDGET_EXHAUSTED, 409, "the tenant used its gpu_hours_per_month this month")                 \
    /* model.init_from: HF directories and forks (api/hf_config.h, daemon/initfrom.h) */           \
    X(HF_CONFIG_MISSING, 422, "model.init_from: the directory has no config.json")                 \
    X(HF_CONFIG_INVALID, 422, "model.init_from: config.json is not JSON or lacks a size")          \
    X(HF_CONFIG_UNSUPPORTED, 422, "model.init_from: a feature or seq_len Loom does not implement") \
    X(UNSUPPORTED_ARCHITECTURE, 422, "config.json names an architecture outside the four")         \
    X(INIT_FROM_MISMATCH, 422, "a size the spec states differs from model.init_from's model")      \
    X(INIT_FROM_NOT_FOUND, 422, "model.init_from names a directory that does not exist")           \
    X(INIT_FROM_UNSUPPORTED, 422, "a fork of a job whose checkpoints cannot start one (LoRA)")     \
    X(CHECKPOINT_NOT_FOUND, 409, "model.init_from job:<id>[@<step>]: no such saved checkpoint")    \
    X(LORA_INIT_INVALID, 422, "model.init_from: a PEFT adapter train.lora cannot continue")        \
    X(PEFT_BASE_NOT_FOUND, 422, "model.init_from: a PEFT adapter whose base model is not found")   \
    /* node admission (daemon/nodes.h) */                                                          \
    X(NODE_NOT_APPROVED, 403, "agent: the node is pending or rejected, not approved")              \
    X(NODE_MISMATCH, 403, "agent: the node credential belongs to another node")                    \
    X(NODE_REJECTED, 403, "agent: an admin rejected this node (DELETE it to let it apply again)")  \
    X(NODE_CREDENTIAL_REQUIRED, 409,                                                               \
      "agent: the node is approved; it registers with its credential")                             \
    X(NODE_NOT_PENDING, 409, "approve/reject: the node is not pending (revoked nodes re-apply)")   \
    X(INVALID_GRACE, 422, "token rotation: grace_s is not an integer in 0..604800")                \
    X(TASK_NOT_ON_NODE, 403, "agent: the job's attempt and rank are not placed on this node")

enum loom_errcode {
#define LOOM_ERRORS_ENUM(code, status, meaning) LOOM_E_##code,
    LOOM_ERRORS(LOOM_ERRORS_ENUM)
#undef LOOM_ERRORS_ENUM
        LOOM_E_COUNT
};

struct loom_errdef {
    const char *code;
    int status;
    const char *meaning;
};

/* The rows, in LOOM_ERRORS order (index = enum loom_errcode). Static. */
const struct loom_errdef *loom_errors(size_t *n);
/* The row of `c`. */
const struct loom_errdef *loom_errdef_of(enum loom_errcode c);
/* The row of a code's text, or NULL. */
const struct loom_errdef *loom_errdef_find(const char *code);

#endif
