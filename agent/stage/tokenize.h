/* Tokenizing a job's raw data on the node before its worker starts (loom-stage).
 *
 * A spec whose data.format is text, jsonl, chat, completion or webdataset names raw files in
 * data.train (and data.val); the worker reads token shards only. stage_tokenize_spec turns
 * them into shards with the data library (data/prepare.h) under the staging cache:
 *
 *   DIR/tokens/KEY/     train_NNN.bin, val_NNN.bin, their .mask files, meta.json
 *
 * KEY = prep_cache_key: SHA-256 of the tokenizer files' contents, every option that changes
 * the tokens (format, loss_on, text_key, chat template, seq_len, overlong, val_fraction, shard
 * size) and each input's path, size and modification time. A directory is written as
 * DIR/tokens/.tmp.KEY.PID and renamed when complete, under DIR/lock (the ranks of a node
 * serialise: the first tokenizes, the others find the result), so a later attempt or another
 * job on the same data and tokenizer reuses it.
 *
 * Eviction: the entries' total size is kept under max_bytes. Each entry this call uses (found or
 * written) gets a shared flock on KEY/.use through a descriptor left open across exec, so the
 * lock lasts as long as the worker loom-stage becomes (released when it exits); the mtime of
 * KEY is its last use. After the splits are ready, still under DIR/lock, the least recently
 * used entries whose .use no process holds are removed (a trial exclusive flock) until the
 * total fits; entries in use stay even when that leaves the cache over the cap.
 *
 * The spec is rewritten to read the shards: data.train = DIR/tokens/KEY/train_*.bin;
 * data.val = the val shards of the split (data.val_fraction, then set to 0) or the shards of
 * data.val tokenized on its own. data.format stays, so the worker still knows what it reads.
 *
 * Options from the spec: the tokenizer is data.tokenizer, else model.init_from; loss_on is
 * train.loss_on (absent: the format's default); seq_len is model.seq_len for the record
 * formats (jsonl, chat, completion: longer examples are cut or dropped by data.overlong), no
 * limit for text and webdataset documents. */
#ifndef LOOM_AGENT_STAGE_TOKENIZE_H
#define LOOM_AGENT_STAGE_TOKENIZE_H

#include <jansson.h>
#include <stdint.h>

struct stage_tok_report {
    int tokenized; /* 1 when the spec's data needed tokenizing */
    int hits;      /* splits found in the cache (0..2) */
    int splits;    /* splits tokenized or found (train, and val when separate) */
    char key[65];  /* the train split's cache key */
    long long examples, train_tokens, val_tokens, loss_tokens;
    double seconds;
    int evicted;           /* entries evicted for space */
    long long cache_bytes; /* the token cache's size after eviction */
};

/* Progress of the split being tokenized: input bytes done of total. */
typedef void (*stage_tok_progress_fn)(void *user, uint64_t done, uint64_t total);

/* Tokenizes spec's raw data into DIR's token cache (or finds it there) and rewrites
 * data.train / data.val to the shards. threads: encoding threads; max_bytes: the cache cap
 * (<= 0: none). Returns 0 (also when the
 * data is already shards: r->tokenized = 0, spec unchanged), or PREP_EDATA (bad record or
 * option: err names the file, the line and the field) / PREP_EIO with a message in err. */
int stage_tokenize_spec(const char *dir, json_t *spec, int threads, long long max_bytes,
                        stage_tok_progress_fn fn, void *user, struct stage_tok_report *r, char *err,
                        size_t errlen);

#endif
