/* Internal interface between data/tok.c (opening, roles, dispatch) and the two tokenizer
 * back-ends: data/tok_bpe.c (tokenizer.json) and data/tok_spm.cc (SentencePiece). Not for use
 * outside data/. */
#ifndef LOOM_DATA_TOK_IMPL_H
#define LOOM_DATA_TOK_IMPL_H

#include "data/tok.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A back-end. impl is the loaded tokenizer (read-only after load); enc is a per-thread encoder
 * made by enc_new. Every function reports errors by returning -1 and writing err. */
struct tok_ops {
    const char *kind;
    void (*free)(void *impl);
    uint32_t (*vocab_size)(const void *impl);
    /* Exact token text to id (added/control tokens first, then the vocabulary); -1 if none. */
    int64_t (*piece_id)(const void *impl, const char *text);
    /* The format's own bos/eos/pad/unk id, or -1 (used when no tokenizer_config.json). */
    int64_t (*role_id)(const void *impl, const char *role);
    void *(*enc_new)(const void *impl);
    void (*enc_free)(void *enc);
    int (*encode)(void *enc, const char *text, size_t len, unsigned flags, struct tok_ids *out,
                  char *err, size_t errlen);
    int (*decode)(const void *impl, const uint32_t *ids, size_t n, char **text, size_t *len,
                  char *err, size_t errlen);
};

/* Loaders: 0 and *impl on success. */
int tok_bpe_load(const char *path, void **impl, char *err, size_t errlen);
int tok_spm_load(const char *path, void **impl, char *err, size_t errlen);
extern const struct tok_ops tok_bpe_ops;
extern const struct tok_ops tok_spm_ops;

/* Append one id; -1 when out of memory. */
static inline int tok_ids_push(struct tok_ids *ids, uint32_t id) {
    if (ids->n == ids->cap && tok_ids_reserve(ids, 1) != 0) return -1;
    ids->v[ids->n++] = id;
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif
