/* libFuzzer target for the tokenizer.json loader (data/tok_bpe.c), which reads the
 * tokenizer a job names (HF model directories, data prepare). The input becomes a memory file
 * loaded with tok_bpe_load. A refusal must come with a message; an accepted tokenizer must
 * have a vocabulary, encode fixed texts (ASCII, multi-byte UTF-8, an added-token look-alike,
 * with and without TOK_ALLOW_SPECIAL) to ids below its vocabulary size or refuse with a
 * message, and decode those ids again; single ids decode or are refused with a message, the
 * id equal to the vocabulary size always. Every crash found is kept in corpus/tok (e.g.
 * crash_fallback_missing_byte.json: byte_fallback with a <0xAB> token missing once encoded
 * to id 0). Coverage-guided (LOOM_FUZZ=ON with clang, tests/fuzz.cmake). */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data/tok_impl.h"

static void fail(const char *what, const char *text) {
    fprintf(stderr, "fuzz_tok: %s (text \"%s\")\n", what, text ? text : "-");
    abort();
}

static const char *const texts[] = {
    "Hello world",
    "  two  spaces\tand a tab\n",
    "h\xc3\xa9llo \xe2\x82\xac 123 \xf0\x9f\x98\x80",
    "<|endoftext|> after",
    "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("tokenizer.json", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64], err[1024] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *impl = NULL;
    if (tok_bpe_load(path, &impl, err, sizeof err) != 0) {
        if (!err[0]) fail("refused without a message", NULL);
        close(fd);
        return 0;
    }
    close(fd);
    uint32_t vocab = tok_bpe_ops.vocab_size(impl);
    if (vocab == 0) fail("accepted with an empty vocabulary", NULL);
    void *enc = tok_bpe_ops.enc_new(impl);
    if (!enc) fail("no encoder", NULL);
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (unsigned flags = 0; flags <= TOK_ALLOW_SPECIAL; flags++) {
            struct tok_ids ids = {0};
            err[0] = 0;
            size_t len = strlen(texts[i]);
            if (tok_bpe_ops.encode(enc, texts[i], len, flags, &ids, err, sizeof err) != 0) {
                if (!err[0]) fail("encode refused without a message", texts[i]);
                tok_ids_free(&ids);
                continue;
            }
            for (size_t k = 0; k < ids.n; k++)
                if (ids.v[k] >= vocab) fail("an id at or above the vocabulary size", texts[i]);
            char *back = NULL;
            size_t blen = 0;
            if (tok_bpe_ops.decode(impl, ids.v, ids.n, &back, &blen, err, sizeof err) != 0) {
                fprintf(stderr, "fuzz_tok: %s\n", err);
                fail("encoded ids do not decode", texts[i]);
            }
            free(back);
            tok_ids_free(&ids);
        }
    }
    /* Every id decodes on its own, or (a gap in the ids) is refused with a message; an id
     * past the vocabulary is always refused. */
    for (uint32_t id = 0; id <= vocab && id < 4096; id++) {
        char *back = NULL;
        size_t blen = 0;
        err[0] = 0;
        int rc = tok_bpe_ops.decode(impl, &id, 1, &back, &blen, err, sizeof err);
        if (rc != 0 && !err[0]) fail("decode refused an id without a message", NULL);
        if (id == vocab && rc == 0) fail("the id equal to the vocabulary size decodes", NULL);
        free(back);
    }
    tok_bpe_ops.enc_free(enc);
    tok_bpe_ops.free(impl);
    return 0;
}
