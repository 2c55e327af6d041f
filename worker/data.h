/* Training data: token shards in the common `.bin` format and the loader that
 * turns them into batches.
 *
 * Shard format (llm.c compatible): a header of 256 little-endian int32 values
 * (header[0] = 20240520 magic, header[1] = version, header[2] = token count,
 * the rest zero), then the tokens: version 1 stores uint16 tokens, version 2
 * uint32 tokens (vocabularies above 65536). A shard's size must be exactly
 * 1024 + count * token_bytes; anything else is reported as truncated or
 * foreign, naming the file and what is wrong.
 *
 * Samples: every shard is cut into non-overlapping windows of T+1 tokens at
 * stride T (window i covers tokens [i*T, i*T + T]; inputs are its first T
 * tokens, targets its last T), windows never cross shard boundaries. The
 * windows of all shards (in sorted path order) form one epoch of N samples.
 *
 * Order: one optimizer step consumes G = grad_accum * dp_size * B samples.
 * Global sample position p = step * G + k with k = (micro_step * dp_size +
 * dp_rank) * B + b, epoch = p / N and the sample read is
 * perm(seed, epoch)(p % N), where perm is a keyed bijection of [0, N) (a
 * Feistel network with cycle walking; no table, O(1) memory). So:
 *   - the batch of a step is a pure function of (seed, epoch, step): a run
 *     resumed at step s reads exactly what an uninterrupted run reads;
 *   - the dp ranks read disjoint samples of every global batch, and the set of
 *     samples in a global batch depends only on G (dp=2 x accum=1 sees the
 *     same samples as dp=1 x accum=2), which keeps layouts loss-equivalent;
 *   - an epoch is a permutation: no sample repeats before all were seen
 *     (a global batch that straddles an epoch boundary continues in the next
 *     epoch's permutation).
 * With shuffle off (validation) perm is the identity.
 *
 * Shards are mmap'ed read-only; the loader holds no mutable state after open,
 * so data_loader_batch may be called from any thread, concurrently.
 *
 * Errors: functions that can fail return 0 or a negative value and write one
 * human-readable message into the caller's `err` buffer (when err != NULL);
 * they do not log. The worker prints that message and exits with code 2. */
#ifndef LOOM_WORKER_DATA_H
#define LOOM_WORKER_DATA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define DATA_MAGIC        20240520
#define DATA_HEADER_INTS  256
#define DATA_HEADER_BYTES (DATA_HEADER_INTS * 4)

/* Error codes (negative). DATA_EINVAL: bad argument; DATA_EIO: open/read/
 * write/mmap failed; DATA_EFORMAT: truncated or foreign shard; DATA_EVOCAB: a
 * token >= vocab_size; DATA_EEMPTY: no file matched or fewer than T+1 tokens;
 * DATA_EMISMATCH: a checkpoint's data position does not fit this loader. */
enum {
    DATA_EINVAL = -1,
    DATA_EIO = -2,
    DATA_EFORMAT = -3,
    DATA_EVOCAB = -4,
    DATA_EEMPTY = -5,
    DATA_EMISMATCH = -6,
};

/* ---- shards ---------------------------------------------------------------- */

/* Write a shard file `path` holding tokens[0..n) in the given version (1:
 * uint16, 2: uint32). Every token must fit the version (v1: < 65536). The
 * file is written to "path.tmp", fsynced and renamed. Returns 0 or < 0. */
int data_shard_write(const char *path, int version, const uint32_t *tokens, size_t n, char *err,
                     size_t errlen);

/* Loss-mask shards (`train_000.mask` beside `train_000.bin`): the same 1024-byte
 * header with magic DATA_MASK_MAGIC, version 1 and the token count, then one
 * byte per token of the token shard: 1 when the loss counts the prediction of
 * that token (it is a target), 0 when it is skipped. Written by
 * `loom-data prepare` for chat and completion data. */
#define DATA_MASK_MAGIC 20240521
int data_mask_write(const char *path, const uint8_t *mask, size_t n, char *err, size_t errlen);

/* Check one shard's header and size (does not read the tokens). On success
 * stores the version and token count (either pointer may be NULL). */
int data_shard_check(const char *path, int *version, uint64_t *ntokens, char *err, size_t errlen);

/* Expand `pattern` into the sorted list of matching files. The pattern is a
 * glob(3) pattern; several patterns may be given separated by commas; a
 * directory stands for DIR/ *.bin. On success *paths is a NULL-terminated
 * array owned by the caller (free with data_paths_free) and *count its length;
 * no match is DATA_EEMPTY naming the pattern. */
int data_glob(const char *pattern, char ***paths, size_t *count, char *err, size_t errlen);
void data_paths_free(char **paths);

/* The EOS id that ends every document of a tokenized data set: "eos_token" of the meta.json
 * that `loom-data prepare --tokenizer` (and the staging step) write beside the shards, read
 * from the directory of the first file `pattern` matches. 0, or DATA_EINVAL / DATA_EIO with a
 * message naming the file (train.packing "document" needs it). */
int data_meta_eos(const char *pattern, int64_t *eos, char *err, size_t errlen);

/* ---- loader ---------------------------------------------------------------- */

enum { DATA_CHECK_AUTO = 0, DATA_CHECK_OPEN = 1, DATA_CHECK_READ = 2 };
/* Above this many tokens AUTO defers the vocab check to read time (a full scan
 * runs at about 1 G tokens/s; see docs/perf.md). */
#define DATA_SCAN_MAX (1ULL << 30)

struct data_loader_opts {
    const char *pattern; /* shard glob (see data_glob) */
    uint32_t vocab_size; /* tokens must be < vocab_size (the model's unpadded
                            vocabulary); 0 disables the check */
    int B;               /* micro-batch (sequences per rank per micro-step) */
    int T;               /* sequence length */
    int dp_size;         /* data-parallel ranks (1 when standalone) */
    int grad_accum;      /* micro-steps per optimizer step */
    uint64_t seed;       /* train.seed */
    int shuffle;         /* 1: permuted per epoch (train), 0: sequential (val) */
    int token_check;     /* when tokens are checked against vocab_size:
                            DATA_CHECK_AUTO (0, default): all at open when the
                            data has at most DATA_SCAN_MAX tokens, else as
                            windows are read; DATA_CHECK_OPEN: all at open;
                            DATA_CHECK_READ: only windows as they are read */
};

struct data_loader;

/* Open the shards, validate them and build the sample index. On success
 * *out is owned by the caller (data_loader_free). Fails with one message for
 * the first bad file (e.g. "train_003.bin: truncated: header says 1000000
 * tokens (2001024 bytes) but the file has 1500000 bytes"). */
int data_loader_open(const struct data_loader_opts *opts, struct data_loader **out, char *err,
                     size_t errlen);
void data_loader_free(struct data_loader *dl); /* accepts NULL */

/* The B x (T+1) token windows of (step, micro_step, dp_rank): window b goes to
 * window[b * (T+1) ... b * (T+1) + T]. Returns 0, or DATA_EVOCAB naming the
 * file and token offset when a token is out of range (only possible with
 * tokens not scanned at open), or DATA_EINVAL for out-of-range arguments. Thread-safe. */
int data_loader_window(const struct data_loader *dl, int64_t step, int micro_step, int dp_rank,
                       int32_t *window, char *err, size_t errlen);

/* The same batch split into inputs[B*T] and targets[B*T] (row-major, b*T+t);
 * targets[b*T+t] is the token after inputs[b*T+t]. Thread-safe. */
int data_loader_batch(const struct data_loader *dl, int64_t step, int micro_step, int dp_rank,
                      int32_t *inputs, int32_t *targets, char *err, size_t errlen);

/* Global sample index (in [0, N)) that (step, micro_step, dp_rank, b) reads,
 * and the (shard, first token) it maps to. For tests and debugging. */
int64_t data_loader_sample(const struct data_loader *dl, int64_t step, int micro_step, int dp_rank,
                           int b);

/* Sizes: samples per epoch N, samples per optimizer step G, optimizer steps
 * per epoch (N / G, rounded down; at least one step always exists because a
 * step may wrap into the next epoch), total tokens, shard count. */
int64_t data_loader_samples(const struct data_loader *dl);
int64_t data_loader_samples_per_step(const struct data_loader *dl);
int64_t data_loader_steps_per_epoch(const struct data_loader *dl);
uint64_t data_loader_tokens(const struct data_loader *dl);
size_t data_loader_num_shards(const struct data_loader *dl);
/* How many of the shards have a loss-mask shard beside them. */
size_t data_loader_num_masked(const struct data_loader *dl);
/* Targets that count in the loss in optimizer step `step`: over all its G windows (every
 * micro-step and dp rank), the targets whose mask byte is 1 (all T of a window whose shard
 * has no mask). A pure function of the step, so every rank knows the step's total before its
 * backward pass without communicating. -1 on a bad step. */
int64_t data_loader_step_loss_tokens(const struct data_loader *dl, int64_t step);

/* ---- position (checkpoint manifest) ---------------------------------------- */

/* Where the loader stands before optimizer step `step` (i.e. after `step`
 * completed steps). Everything here follows from `step` and the loader; the
 * other fields let a resumed run detect that the data or batch shape changed.
 * "fingerprint" is a hash of the shard paths' base names and token counts. */
struct data_position {
    int64_t step;             /* next optimizer step to read */
    int64_t epoch;            /* epoch of that step's first sample */
    int64_t sample_in_epoch;  /* its index within the epoch's permutation */
    int64_t samples_consumed; /* step * samples_per_step */
    int64_t samples_per_epoch;
    int64_t samples_per_step;
    uint64_t seed;
    uint64_t tokens;
    uint64_t fingerprint;
    int64_t shards;
};

void data_loader_position(const struct data_loader *dl, int64_t step, struct data_position *pos);
/* JSON object with the fields above (uint64 values as decimal strings, since
 * JSON numbers lose precision past 2^53). Returns a new reference. */
json_t *data_position_to_json(const struct data_position *pos);
/* Parse data_position_to_json's output. Returns 0 or DATA_EINVAL. */
int data_position_from_json(const json_t *obj, struct data_position *pos, char *err, size_t errlen);
/* Check that a saved position fits this loader (same samples per epoch and per
 * step, seed and fingerprint). Returns 0 or DATA_EMISMATCH naming the field
 * and both values; the caller decides whether that is fatal. */
int data_loader_check_position(const struct data_loader *dl, const struct data_position *pos,
                               char *err, size_t errlen);

/* ---- permutation ----------------------------------------------------------- */

/* The keyed bijection of [0, n) used for shuffling: returns perm(i) for
 * i < n. Exposed for tests (bijectivity) and for tools. */
uint64_t data_permute(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch);

#endif
