/* Tokenizers: text to token ids and back, for the formats models ship with.
 *
 *   - Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen2,
 *     Mistral-Nemo): data/tok_bpe.c.
 *   - SentencePiece tokenizer.model (Llama 2, Mistral v0.1) through libsentencepiece:
 *     data/tok_spm.cc.
 *
 * Encode never adds BOS/EOS. Special tokens (added tokens marked "special", SentencePiece
 * control symbols) are produced from text only with TOK_ALLOW_SPECIAL; otherwise their text
 * is tokenized like any other text. Decode inverts encode exactly (byte for byte) for
 * byte-level BPE; for SentencePiece it is the library's decode.
 *
 * A struct tok is read-only after tok_open: several threads may encode with it at once, each
 * through its own struct tok_enc (tok_enc_new). tok_encode uses the tokenizer's own encoder
 * and must not be called from two threads at once. */
#ifndef LOOM_DATA_TOK_H
#define LOOM_DATA_TOK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tok;
struct tok_enc;

/* A growable array of ids; the caller owns v (free with tok_ids_free). */
struct tok_ids {
    uint32_t *v;
    size_t n, cap;
};
void tok_ids_free(struct tok_ids *ids);
/* Make room for `more` ids past n; -1 when out of memory. */
int tok_ids_reserve(struct tok_ids *ids, size_t more);

enum tok_flags {
    TOK_ALLOW_SPECIAL = 1, /* special tokens' text in the input becomes their ids */
};

/* Open PATH: a tokenizer.json, a tokenizer.model, or a directory holding one of them
 * (tokenizer.json preferred). On error returns -1 and writes a message naming the file and
 * the value to err. The caller frees *out with tok_free. */
int tok_open(const char *path, struct tok **out, char *err, size_t errlen);
void tok_free(struct tok *t);

/* Which format was loaded: "bpe" (tokenizer.json) or "sentencepiece". */
const char *tok_kind(const struct tok *t);
/* Largest id + 1 (base vocabulary plus added tokens). */
uint32_t tok_vocab_size(const struct tok *t);

/* Id of a special token by role ("bos", "eos", "pad", "unk": from tokenizer_config.json
 * beside the file, else the format's own notion) or by its exact text ("<|eot_id|>",
 * "<|im_start|>"). -1 when the tokenizer has none. */
int64_t tok_token_id(const struct tok *t, const char *name);

/* Append the ids of text[0..len) to out. Input must be valid UTF-8 (an error names the byte
 * offset otherwise). Returns 0, or -1 with a message in err. Not thread-safe (see above). */
int tok_encode(struct tok *t, const char *text, size_t len, unsigned flags, struct tok_ids *out,
               char *err, size_t errlen);

/* A per-thread encoder (merge cache and scratch space) for t; t must outlive it. */
struct tok_enc *tok_enc_new(const struct tok *t);
void tok_enc_free(struct tok_enc *e);
int tok_encode_with(struct tok_enc *e, const char *text, size_t len, unsigned flags,
                    struct tok_ids *out, char *err, size_t errlen);

/* Decode ids to bytes: *text is malloc'ed (NUL-terminated, *len without the NUL) and owned by
 * the caller. An id >= tok_vocab_size is an error naming it. Thread-safe. */
int tok_decode(const struct tok *t, const uint32_t *ids, size_t n, char **text, size_t *len,
               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
