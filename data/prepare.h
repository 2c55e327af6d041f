/* Tokenizing a dataset into the token shards the worker reads: the library behind
 * `loom-data prepare --tokenizer` and the agent's staging step (loom-stage), which
 * tokenizes a job's raw data before its worker starts.
 *
 * Formats (docs/data.md "Datasets with a tokenizer"):
 *   text        every input file is one document
 *   jsonl       one record per line, the text in o->text_key ("text")
 *   chat        one {"messages": [{"role", "content"}...]} per line, rendered by a chat template
 *   completion  one {"prompt", "completion"} per line
 *   webdataset  tar shards (libarchive): every NAME.txt member is a text document, every
 *               NAME.json member one record, read as chat when it has "messages", as
 *               completion when it has "prompt", else as jsonl (o->text_key)
 * Output in OUT: train_NNN.bin / val_NNN.bin (version 1, or 2 above 65536 ids), X.mask beside
 * every X.bin when the loss is masked, and meta.json (counts, content hash, sources).
 *
 * Records are rendered on o->threads threads (one tok_enc per thread, records of a batch
 * split in contiguous runs) and stored in input order, so the output does not depend on the
 * thread count. */
#ifndef LOOM_DATA_PREPARE_H
#define LOOM_DATA_PREPARE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

enum prep_status {
    PREP_OK = 0,
    PREP_EIO = 1,   /* reading inputs or writing shards failed; out of memory */
    PREP_EDATA = 2, /* bad options, a bad record, or nothing left to train on */
};

struct prep_opts {
    const char *tokenizer;     /* tokenizer.json, tokenizer.model or an HF directory */
    const char *format;        /* text | jsonl | chat | completion | webdataset (NULL: text) */
    const char *text_key;      /* jsonl field (NULL: "text") */
    const char *chat_template; /* llama3 | chatml | mistral (chat records) */
    const char *loss_on;       /* all | assistant | completion (NULL: the format's default) */
    long seq_len;              /* longest example, EOS included; 0: no limit */
    const char *overlong;      /* truncate | drop (NULL: truncate) */
    double val_fraction;       /* examples held out for val_NNN.bin */
    long shard_tokens;         /* tokens per shard file (<= 0: 100M) */
    int threads;               /* encoding threads (<= 1: one) */
    /* Called from the calling thread after each batch with the input bytes done so far and
     * their total (NULL: none). */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *progress_user;
};

/* A list of input files, expanded from files, directories (their regular files in name
 * order, not recursive) and globs; every file once, by real path, in order. */
struct prep_files {
    char **v;
    size_t n, cap;
};

/* Adds one comma-separated list of paths, directories or globs. 0, or -1 with a message
 * naming the entry that matches nothing or cannot be read. */
int prep_files_add(struct prep_files *f, const char *list, char *err, size_t errlen);
void prep_files_free(struct prep_files *f);

/* Checks the options (format, loss_on against the format, overlong, chat template) without
 * reading anything. PREP_OK, or PREP_EDATA with a message naming the value. */
int prep_check_opts(const struct prep_opts *o, char *err, size_t errlen);

/* The cache identity of a tokenization: hex SHA-256 (65 bytes with NUL) over the tokenizer's
 * files' contents, every option that changes the output, and each input's path, size and
 * modification time (a changed file gets a new key without its content being read).
 * PREP_OK, or PREP_EIO with a message naming the unreadable file. */
int prep_cache_key(const struct prep_opts *o, const struct prep_files *in, char key[65], char *err,
                   size_t errlen);

/* Tokenizes `in` into the existing directory `out`. On PREP_OK *meta (may be NULL) receives
 * what meta.json holds; otherwise err names the file, the line or tar member, and the field
 * (`chat.jsonl line 3: field "messages[1].content" is missing or not a string`). */
int prep_run(const struct prep_opts *o, const struct prep_files *in, const char *out, json_t **meta,
             char *err, size_t errlen);

#endif
