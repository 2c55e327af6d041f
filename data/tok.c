/* Tokenizer front: finds the file behind a path, picks the back-end by file name, reads the
 * special-token roles (bos/eos/pad/unk) from tokenizer_config.json beside it, and forwards
 * encode/decode. See data/tok.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/buf.h"
#include "data/tok_impl.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)

enum { ROLE_BOS, ROLE_EOS, ROLE_PAD, ROLE_UNK, NROLES };
static const char *const role_names[NROLES] = {"bos", "eos", "pad", "unk"};

struct tok {
    const struct tok_ops *ops;
    void *impl;
    void *own_enc;
    int64_t role[NROLES]; /* from tokenizer_config.json; -2: not given there */
};

struct tok_enc {
    const struct tok *t;
    void *impl;
};

void tok_ids_free(struct tok_ids *ids) {
    if (!ids) return;
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

int tok_ids_reserve(struct tok_ids *ids, size_t more) {
    return buf_grow_array(&ids->v, &ids->cap, ids->n + more, sizeof *ids->v, 256);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* tokenizer_config.json's bos_token etc.: a string or {"content": "..."}. */
static void read_roles(struct tok *t, const char *file) {
    char cfg[PATH_MAX];
    const char *slash = strrchr(file, '/');
    int dlen = slash ? (int)(slash - file) : 1;
    snprintf(cfg, sizeof cfg, "%.*s/tokenizer_config.json", dlen, slash ? file : ".");
    for (int r = 0; r < NROLES; r++)
        t->role[r] = -2;
    json_t *root = is_file(cfg) ? json_load_file(cfg, 0, NULL) : NULL;
    if (!root) return;
    for (int r = 0; r < NROLES; r++) {
        char key[32];
        snprintf(key, sizeof key, "%s_token", role_names[r]);
        json_t *v = json_object_get(root, key);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (json_is_null(v)) t->role[r] = -1; /* said explicitly: none */
        if (!json_is_string(v)) continue;
        t->role[r] = t->ops->piece_id(t->impl, json_string_value(v));
    }
    json_decref(root);
}

/* Load one file; its kind follows from the name. */
static int open_file(const char *file, struct tok **out, char *err, size_t errlen) {
    const struct tok_ops *ops = NULL;
    if (ends_with(file, ".json")) {
        ops = &tok_bpe_ops;
    } else if (ends_with(file, ".model")) {
        ops = &tok_spm_ops;
    } else {
        ERR("%s: unknown tokenizer file (expected tokenizer.json or a SentencePiece .model)", file);
        return -1;
    }
    struct tok *t = calloc(1, sizeof *t);
    if (!t) {
        ERR("%s: out of memory", file);
        return -1;
    }
    t->ops = ops;
    int rc = ops == &tok_bpe_ops ? tok_bpe_load(file, &t->impl, err, errlen)
                                 : tok_spm_load(file, &t->impl, err, errlen);
    if (rc != 0) {
        free(t);
        return -1;
    }
    if (!(t->own_enc = ops->enc_new(t->impl))) {
        ERR("%s: out of memory", file);
        tok_free(t);
        return -1;
    }
    read_roles(t, file);
    *out = t;
    return 0;
}

int tok_open(const char *path, struct tok **out, char *err, size_t errlen) {
    *out = NULL;
    if (!path || !*path) {
        ERR("tokenizer path is empty");
        return -1;
    }
    errno = 0;
    if (!is_dir(path)) {
        if (is_file(path)) return open_file(path, out, err, errlen);
        ERR("%s: %s", path, errno ? strerror(errno) : "not a file or directory");
        return -1;
    }
    /* A directory: tokenizer.json first (as transformers does); when that file uses a part
     * Loom does not read (Metaspace, WordPiece, ...) and a tokenizer.model is beside it (Llama 2
     * and Mistral directories ship both), the SentencePiece model gives the same ids. */
    char json[PATH_MAX], model[PATH_MAX];
    snprintf(json, sizeof json, "%s/tokenizer.json", path);
    snprintf(model, sizeof model, "%s/tokenizer.model", path);
    int has_json = is_file(json), has_model = is_file(model);
    if (!has_json && !has_model) {
        ERR("%s: directory holds neither tokenizer.json nor tokenizer.model", path);
        return -1;
    }
    if (!has_json) return open_file(model, out, err, errlen);
    if (open_file(json, out, err, errlen) == 0) return 0;
    if (!has_model || !strstr(err, "not supported")) return -1;
    char why[1024];
    snprintf(why, sizeof why, "%s", err);
    if (open_file(model, out, err, errlen) == 0) return 0;
    char second[1024];
    snprintf(second, sizeof second, "%s", err);
    snprintf(err, errlen, "%s (and %s)", why, second);
    return -1;
}

void tok_free(struct tok *t) {
    if (!t) return;
    if (t->own_enc) t->ops->enc_free(t->own_enc);
    if (t->impl) t->ops->free(t->impl);
    free(t);
}

const char *tok_kind(const struct tok *t) {
    return t->ops->kind;
}

uint32_t tok_vocab_size(const struct tok *t) {
    return t->ops->vocab_size(t->impl);
}

/* When no tokenizer_config.json names a role, the usual texts of the families Loom supports,
 * first match wins. */
static const char *const role_fallback[NROLES][4] = {
    [ROLE_BOS] = {"<|begin_of_text|>", "<s>", NULL},
    [ROLE_EOS] = {"<|end_of_text|>", "<|endoftext|>", "</s>", NULL},
    [ROLE_PAD] = {"<pad>", "<|finetune_right_pad_id|>", NULL},
    [ROLE_UNK] = {"<unk>", NULL},
};

int64_t tok_token_id(const struct tok *t, const char *name) {
    for (int r = 0; r < NROLES; r++) {
        if (strcmp(name, role_names[r]) != 0) continue;
        if (t->role[r] != -2) return t->role[r];
        int64_t id = t->ops->role_id(t->impl, name);
        for (int k = 0; id < 0 && role_fallback[r][k]; k++)
            id = t->ops->piece_id(t->impl, role_fallback[r][k]);
        return id;
    }
    return t->ops->piece_id(t->impl, name);
}

int tok_encode(struct tok *t, const char *text, size_t len, unsigned flags, struct tok_ids *out,
               char *err, size_t errlen) {
    return t->ops->encode(t->own_enc, text, len, flags, out, err, errlen);
}

struct tok_enc *tok_enc_new(const struct tok *t) {
    struct tok_enc *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->t = t;
    if (!(e->impl = t->ops->enc_new(t->impl))) {
        free(e);
        return NULL;
    }
    return e;
}

void tok_enc_free(struct tok_enc *e) {
    if (!e) return;
    e->t->ops->enc_free(e->impl);
    free(e);
}

int tok_encode_with(struct tok_enc *e, const char *text, size_t len, unsigned flags,
                    struct tok_ids *out, char *err, size_t errlen) {
    return e->t->ops->encode(e->impl, text, len, flags, out, err, errlen);
}

int tok_decode(const struct tok *t, const uint32_t *ids, size_t n, char **text, size_t *len,
               char *err, size_t errlen) {
    return t->ops->decode(t->impl, ids, n, text, len, err, errlen);
}
