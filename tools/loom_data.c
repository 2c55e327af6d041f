/* loom-data: prepare and check token shards for loom-worker; run a tokenizer.
 *
 *   loom-data prepare --in FILES|DIR[,...] --out DIR [--val-fraction F]
 *   loom-data check PATTERN [--vocab-size N]
 *   loom-data encode --tokenizer PATH --in FILE [--allow-special]
 *   loom-data decode --tokenizer PATH --in FILE
 *   loom-data chat --tokenizer PATH --template llama3|chatml|mistral --in FILE.jsonl
 *
 * prepare tokenizes text with the byte-level tokenizer (vocab 256: a token is
 * a byte; token 0, NUL, starts every document) into .bin shards (version 1,
 * uint16) DIR/train_NNN.bin and DIR/val_NNN.bin, plus DIR/meta.json. The
 * token stream (all documents in input order, directories expanded to their
 * regular files in name order, duplicates such as symlinks read once) is cut
 * into blocks of --block-size tokens; blocks are assigned to val evenly (block
 * i goes to val when floor((i+1)*F) > floor(i*F)), so the split is
 * deterministic and spread over the whole corpus. Files holding NUL bytes are
 * skipped (not text). The summary is one JSON line on stdout.
 *
 * prepare --tokenizer PATH --format text|jsonl|chat|completion tokenizes examples (a text
 * file, a jsonl line's --text-key field, a chat's messages through --chat-template, a
 * prompt/completion pair) with that tokenizer, EOS after each, into version 1 or 2 shards
 * split by example, plus DIR/X.mask loss-mask shards (worker/data.h) for chat and completion
 * data; empty, all-masked and overlong (--seq-len, --overlong) examples are counted in
 * meta.json with a SHA-256 of tokenizer, options and inputs (docs/data.md).
 *
 * check validates every shard matching PATTERN (header, size and, with
 * --vocab-size, every token) and prints one JSON line; exit 2 on bad data.
 *
 * encode prints one JSON array of token ids per line of FILE ("-": stdin; the
 * newline itself is not encoded, no BOS/EOS is added; special tokens' text is
 * plain text unless --allow-special). decode reads such lines and writes each
 * decoded text followed by a newline, so decode(encode(F)) == F for a file
 * ending in a newline. PATH is a tokenizer.json, a tokenizer.model or an HF
 * directory (data/tok.h).
 *
 * chat renders each line's {"messages": [{"role", "content"}, ...]} with a chat
 * template (data/chat.h) and prints {"ids": [...], "mask": [...]} (mask 1: a
 * token the assistant wrote); --add-generation-prompt ends with an assistant
 * header. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "data/chat.h"
#include "data/tok.h"
#include "worker/data.h"

struct opts {
    char *in;
    char *out;
    double val_fraction;
    long block_size;
    long shard_tokens;
    long vocab_size;
    char *tokenizer;
    int allow_special;
    char *template;
    int add_generation_prompt;
    char *format;
    char *text_key;
    char *chat_template;
    long seq_len;
    char *overlong;
    char *loss_on;
};

static const struct config_entry table[] = {
    {"in", CONFIG_STR, offsetof(struct opts, in), NULL, 1, 0,
     "prepare: input text files or directories, comma-separated (also as arguments)"},
    {"out", CONFIG_STR, offsetof(struct opts, out), NULL, 1, 0, "prepare: output directory"},
    {"val-fraction", CONFIG_DOUBLE, offsetof(struct opts, val_fraction), "0.1", 0, 0.5,
     "prepare: fraction of the tokens held out for validation"},
    {"block-size", CONFIG_INT, offsetof(struct opts, block_size), "4096", 2, 1 << 30,
     "prepare: tokens per split block (the unit assigned to train or val)"},
    {"shard-tokens", CONFIG_INT, offsetof(struct opts, shard_tokens), "100000000", 1024, INT32_MAX,
     "prepare: maximum tokens per shard file"},
    {"vocab-size", CONFIG_INT, offsetof(struct opts, vocab_size), "0", 0, UINT32_MAX,
     "check: reject tokens >= this (0: header and size checks only)"},
    {"tokenizer", CONFIG_STR, offsetof(struct opts, tokenizer), NULL, 1, 0,
     "encode/decode: tokenizer.json, tokenizer.model or an HF directory holding one"},
    {"allow-special", CONFIG_BOOL, offsetof(struct opts, allow_special), "false", 1, 0,
     "encode: special tokens written in the text become their ids"},
    {"template", CONFIG_STR, offsetof(struct opts, template), NULL, 1, 0,
     "chat: chat template: llama3, chatml or mistral"},
    {"add-generation-prompt", CONFIG_BOOL, offsetof(struct opts, add_generation_prompt), "false", 1,
     0, "chat: end with the header of an assistant turn"},
    {"format", CONFIG_STR, offsetof(struct opts, format), NULL, 1, 0,
     "prepare with --tokenizer: text (a file is a document), jsonl, chat or completion"},
    {"text-key", CONFIG_STR, offsetof(struct opts, text_key), NULL, 1, 0,
     "prepare --format jsonl: the field holding the text (default text)"},
    {"chat-template", CONFIG_STR, offsetof(struct opts, chat_template), NULL, 1, 0,
     "prepare --format chat: llama3, chatml or mistral"},
    {"seq-len", CONFIG_INT, offsetof(struct opts, seq_len), "0", 0, INT32_MAX,
     "prepare with --tokenizer: longest example in tokens, EOS included (0: no limit)"},
    {"overlong", CONFIG_STR, offsetof(struct opts, overlong), "truncate", 1, 0,
     "prepare: an example longer than --seq-len is cut (truncate) or left out (drop)"},
    {"loss-on", CONFIG_STR, offsetof(struct opts, loss_on), NULL, 1, 0,
     "prepare: all, or assistant (chat) / completion (completion): writes .mask shards"},
};
#define NTABLE (sizeof table / sizeof *table)
static const char usage[] = "prepare --in FILES|DIR --out DIR [--val-fraction F]\n"
                            "       loom-data prepare --tokenizer PATH --format text|jsonl|chat|"
                            "completion [--text-key K] [--chat-template T] [--seq-len N "
                            "--overlong truncate|drop] [--loss-on all] --in FILES --out DIR\n"
                            "       loom-data check PATTERN [--vocab-size N]\n"
                            "       loom-data encode --tokenizer PATH --in FILE [--allow-special]\n"
                            "       loom-data decode --tokenizer PATH --in FILE\n"
                            "       loom-data chat --tokenizer PATH --template NAME --in FILE";

/* ---- inputs ---------------------------------------------------------------- */

struct strv {
    char **v;
    size_t n, cap;
};

static int strv_push(struct strv *s, const char *p) {
    if (buf_grow_array(&s->v, &s->cap, s->n + 1, sizeof *s->v, 32) != 0) return -1;
    if (!(s->v[s->n] = strdup(p))) return -1;
    s->n++;
    return 0;
}

static void strv_free(struct strv *s) {
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Add `path` (a file, or a directory's regular files in name order) to files,
 * by real path, once. */
static int add_input(struct strv *files, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        log_error("%s: %s", path, strerror(errno));
        return -1;
    }
    struct strv here = {0};
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) {
            log_error("%s: %s", path, strerror(errno));
            return -1;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char *p = NULL;
            struct stat fst;
            if (asprintf(&p, "%s/%s", path, e->d_name) < 0) break;
            if (stat(p, &fst) == 0 && S_ISREG(fst.st_mode)) strv_push(&here, p);
            free(p);
        }
        closedir(d);
        qsort(here.v, here.n, sizeof *here.v, cmp_str);
    } else {
        strv_push(&here, path);
    }
    for (size_t i = 0; i < here.n; i++) {
        char real[PATH_MAX];
        if (!realpath(here.v[i], real)) continue;
        int dup = 0;
        for (size_t j = 0; j < files->n && !dup; j++)
            dup = strcmp(files->v[j], real) == 0;
        if (!dup) strv_push(files, real);
    }
    strv_free(&here);
    return 0;
}

/* ---- split writer ---------------------------------------------------------- */

struct split {
    const char *name; /* "train" / "val" */
    uint32_t *buf;
    size_t n, cap; /* cap = shard_tokens */
    int shards;
    uint64_t total;
};

static int split_flush(struct split *s, const char *out) {
    if (s->n == 0) return 0;
    char path[PATH_MAX], err[512];
    snprintf(path, sizeof path, "%s/%s_%03d.bin", out, s->name, s->shards);
    if (data_shard_write(path, 1, s->buf, s->n, err, sizeof err) != 0) {
        log_error("%s", err);
        return -1;
    }
    s->shards++;
    s->total += s->n;
    s->n = 0;
    return 0;
}

static int split_add(struct split *s, const uint32_t *t, size_t n, const char *out) {
    while (n) {
        size_t m = s->cap - s->n < n ? s->cap - s->n : n;
        memcpy(s->buf + s->n, t, m * sizeof *t);
        s->n += m;
        t += m;
        n -= m;
        if (s->n == s->cap && split_flush(s, out) != 0) return -1;
    }
    return 0;
}

struct prep {
    const struct opts *o;
    struct split train, val;
    uint32_t *block;
    size_t nblock;
    uint64_t iblock, val_blocks;
};

static int block_done(struct prep *p, int last) {
    if (p->nblock == 0) return 0;
    double f = p->o->val_fraction;
    int to_val = (uint64_t)((double)(p->iblock + 1) * f) > (uint64_t)((double)p->iblock * f);
    /* A small corpus still gets a validation set: its last block. */
    if (last && f > 0 && p->val_blocks == 0 && p->iblock > 0) to_val = 1;
    p->val_blocks += (uint64_t)to_val;
    int rc = split_add(to_val ? &p->val : &p->train, p->block, p->nblock, p->o->out);
    p->iblock++;
    p->nblock = 0;
    return rc;
}

static int push_token(struct prep *p, uint32_t t) {
    p->block[p->nblock++] = t;
    return p->nblock == (size_t)p->o->block_size ? block_done(p, 0) : 0;
}

struct strv;
static int cmd_prepare_tok(struct opts *o, struct strv *files);

/* Writes meta (consumed) to OUT/meta.json, then prints it on stdout as the
 * one-line summary record (without its "sources", with type, out and the
 * bytes read). 0 or -1 (logged). */
static int write_meta(json_t *meta, const char *out, uint64_t bytes) {
    char mpath[PATH_MAX];
    snprintf(mpath, sizeof mpath, "%s/meta.json", out);
    if (json_dump_file(meta, mpath,
                       JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) != 0) {
        log_error("prepare: cannot write %s", mpath);
        json_decref(meta);
        return -1;
    }
    json_object_del(meta, "sources");
    json_object_set_new(meta, "type", json_string("prepare"));
    json_object_set_new(meta, "out", json_string(out));
    json_object_set_new(meta, "bytes", json_integer((json_int_t)bytes));
    char *line = json_dumps(meta, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    printf("%s\n", line);
    free(line);
    json_decref(meta);
    return 0;
}

static int cmd_prepare(struct opts *o, char **pos, int npos) {
    int rc = 1;
    struct strv files = {0};
    struct prep p = {.o = o};
    json_t *sources = json_array();
    if (!o->out) {
        log_error("prepare: --out DIR is required");
        return 2;
    }
    char *save = NULL;
    for (char *tok = o->in ? strtok_r(o->in, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save))
        if (add_input(&files, tok) != 0) goto out;
    for (int i = 1; i < npos; i++)
        if (add_input(&files, pos[i]) != 0) goto out;
    if (files.n == 0) {
        log_error("prepare: no input files (--in FILES|DIR)");
        rc = 2;
        goto out;
    }
    if (mkdir(o->out, 0755) != 0 && errno != EEXIST) {
        log_error("prepare: cannot create %s: %s", o->out, strerror(errno));
        goto out;
    }
    if (o->tokenizer) {
        rc = cmd_prepare_tok(o, &files);
        goto out;
    }
    p.train = (struct split){.name = "train", .cap = (size_t)o->shard_tokens};
    p.val = (struct split){.name = "val", .cap = (size_t)o->shard_tokens};
    p.train.buf = malloc(p.train.cap * sizeof(uint32_t));
    p.val.buf = malloc(p.val.cap * sizeof(uint32_t));
    p.block = malloc((size_t)o->block_size * sizeof(uint32_t));
    if (!p.train.buf || !p.val.buf || !p.block) {
        log_error("prepare: out of memory");
        goto out;
    }
    uint64_t docs = 0, bytes = 0;
    for (size_t i = 0; i < files.n; i++) {
        size_t len = 0;
        unsigned char *text = (unsigned char *)fs_read_file(files.v[i], 0, &len);
        if (!text) {
            log_error("%s: cannot read: %s", files.v[i], strerror(errno));
            goto out;
        }
        if (len == 0 || memchr(text, 0, len)) {
            log_warn("%s: skipped (%s)", files.v[i], len ? "holds NUL bytes, not text" : "empty");
            free(text);
            continue;
        }
        int err = push_token(&p, 0); /* document start */
        for (size_t k = 0; k < len && !err; k++)
            err = push_token(&p, text[k]);
        free(text);
        if (err) goto out;
        docs++;
        bytes += len;
        json_array_append_new(sources, json_string(files.v[i]));
    }
    if (block_done(&p, 1) != 0 || split_flush(&p.train, o->out) != 0 ||
        split_flush(&p.val, o->out) != 0)
        goto out;
    if (p.train.total == 0) {
        log_error("prepare: no training tokens produced");
        rc = 2;
        goto out;
    }
    json_t *meta =
        json_pack("{s:s,s:i,s:i,s:f,s:I,s:I,s:I,s:I,s:i,s:i,s:O}", "tokenizer", "byte",
                  "vocab_size", 256, "bos_token", 0, "val_fraction", o->val_fraction, "block_size",
                  (json_int_t)o->block_size, "documents", (json_int_t)docs, "train_tokens",
                  (json_int_t)p.train.total, "val_tokens", (json_int_t)p.val.total, "train_shards",
                  p.train.shards, "val_shards", p.val.shards, "sources", sources);
    if (write_meta(meta, o->out, bytes) != 0) goto out;
    rc = 0;
out:
    json_decref(sources);
    free(p.train.buf);
    free(p.val.buf);
    free(p.block);
    strv_free(&files);
    return rc;
}

static int cmd_check(const struct opts *o, char **pos, int npos) {
    if (npos != 2) {
        log_error("check: expected one PATTERN");
        return 2;
    }
    char err[1024] = "";
    char **paths = NULL;
    size_t n = 0;
    if (data_glob(pos[1], &paths, &n, err, sizeof err) != 0) {
        log_error("%s", err);
        return 2;
    }
    uint64_t tokens = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int version = 0;
        uint64_t t = 0;
        if (data_shard_check(paths[i], &version, &t, err, sizeof err) != 0) {
            log_error("%s", err);
            rc = 2;
        }
        tokens += t;
    }
    if (rc == 0 && o->vocab_size > 0) {
        struct data_loader_opts lo = {.pattern = pos[1],
                                      .vocab_size = (uint32_t)o->vocab_size,
                                      .B = 1,
                                      .T = 1,
                                      .dp_size = 1,
                                      .grad_accum = 1,
                                      .token_check = DATA_CHECK_OPEN};
        struct data_loader *dl = NULL;
        if (data_loader_open(&lo, &dl, err, sizeof err) != 0 && !strstr(err, "hold no sequence")) {
            log_error("%s", err);
            rc = 2;
        }
        data_loader_free(dl);
    }
    if (rc == 0)
        printf("{\"type\":\"check\",\"files\":%zu,\"tokens\":%" PRIu64 ",\"ok\":true}\n", n,
               tokens);
    data_paths_free(paths);
    return rc;
}

/* ---- encode / decode -------------------------------------------------------- */

/* The input of encode/decode: a whole file or stdin. */
static unsigned char *read_input(const char *cmd, const char *in, size_t *len) {
    if (!in) {
        log_error("%s: --in FILE is required (\"-\" for stdin)", cmd);
        return NULL;
    }
    unsigned char *b =
        (unsigned char *)fs_read_file(strcmp(in, "-") == 0 ? "/dev/stdin" : in, 0, len);
    if (!b) log_error("%s: cannot read %s: %s", cmd, in, strerror(errno));
    return b;
}

static struct tok *open_tokenizer(const char *cmd, const char *path) {
    char err[1024];
    struct tok *t = NULL;
    if (!path) {
        log_error("%s: --tokenizer PATH is required", cmd);
        return NULL;
    }
    if (tok_open(path, &t, err, sizeof err) != 0) log_error("%s: %s", cmd, err);
    return t;
}

/* Lines of b[0..len): the last one needs no newline; a final newline ends no extra line. */
#define FOR_EACH_LINE(b, len, line, n, lineno)                                                     \
    for (size_t at_ = 0, n = 0, lineno = 1; at_ < (len); at_ += n + 1, lineno++)                   \
        for (const char *line = (const char *)(b) + at_, *nl_ = memchr(line, '\n', (len)-at_);     \
             line && ((n = nl_ ? (size_t)(nl_ - line) : (len)-at_), 1); line = NULL)

static int cmd_encode(const struct opts *o) {
    int rc = 1;
    size_t len = 0;
    struct tok_ids ids = {0};
    struct tok *t = open_tokenizer("encode", o->tokenizer);
    unsigned char *b = t ? read_input("encode", o->in, &len) : NULL;
    char *out = NULL;
    size_t cap = 0;
    if (!b) goto out;
    FOR_EACH_LINE(b, len, line, n, lineno) {
        char err[1024];
        ids.n = 0;
        if (tok_encode(t, line, n, o->allow_special ? TOK_ALLOW_SPECIAL : 0, &ids, err,
                       sizeof err) != 0) {
            log_error("encode: %s line %zu: %s", o->in, lineno, err);
            goto out;
        }
        if (cap < ids.n * 11 + 3) {
            free(out);
            cap = ids.n * 11 + 64;
            if (!(out = malloc(cap))) {
                log_error("encode: out of memory");
                goto out;
            }
        }
        size_t k = 0;
        out[k++] = '[';
        for (size_t i = 0; i < ids.n; i++) {
            char d[12];
            int nd = 0;
            uint32_t v = ids.v[i];
            do
                d[nd++] = (char)('0' + v % 10);
            while ((v /= 10));
            if (i) out[k++] = ',';
            while (nd)
                out[k++] = d[--nd];
        }
        out[k++] = ']';
        out[k++] = '\n';
        fwrite(out, 1, k, stdout);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    free(out);
    free(b);
    tok_ids_free(&ids);
    tok_free(t);
    return rc;
}

static int cmd_decode(const struct opts *o) {
    int rc = 1;
    size_t len = 0;
    struct tok_ids ids = {0};
    struct tok *t = open_tokenizer("decode", o->tokenizer);
    unsigned char *b = t ? read_input("decode", o->in, &len) : NULL;
    if (!b) goto out;
    FOR_EACH_LINE(b, len, line, n, lineno) {
        char err[1024];
        json_error_t je;
        json_t *arr = json_loadb(line, n, 0, &je);
        ids.n = 0;
        int bad = !json_is_array(arr);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            json_int_t x = json_integer_value(v);
            if (bad || !json_is_integer(v) || x < 0 || x > UINT32_MAX) {
                bad = 1;
                break;
            }
            if (tok_ids_reserve(&ids, 1) != 0) break;
            ids.v[ids.n++] = (uint32_t)x;
        }
        json_decref(arr);
        if (bad) {
            log_error("decode: %s line %zu: expected a JSON array of token ids, got \"%.*s\"",
                      o->in, lineno, n > 60 ? 60 : (int)n, line);
            goto out;
        }
        char *text = NULL;
        size_t tn = 0;
        if (tok_decode(t, ids.v, ids.n, &text, &tn, err, sizeof err) != 0) {
            log_error("decode: %s line %zu: %s", o->in, lineno, err);
            goto out;
        }
        fwrite(text, 1, tn, stdout);
        fputc('\n', stdout);
        free(text);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    free(b);
    tok_ids_free(&ids);
    tok_free(t);
    return rc;
}

/* ---- prepare with a tokenizer ----------------------------------------------- */

/* One output split of a tokenized corpus: token shard and, when masked, the mask shard. */
struct tsplit {
    const char *name;
    uint32_t *tok;
    uint8_t *mask;
    size_t n, cap;
    int shards, version, masked;
    uint64_t total, counted, examples;
};

static int tsplit_flush(struct tsplit *s, const char *out) {
    if (s->n == 0) return 0;
    char path[PATH_MAX], err[512];
    snprintf(path, sizeof path, "%s/%s_%03d.bin", out, s->name, s->shards);
    if (data_shard_write(path, s->version, s->tok, s->n, err, sizeof err) != 0) goto fail;
    snprintf(path, sizeof path, "%s/%s_%03d.mask", out, s->name, s->shards);
    if (s->masked && data_mask_write(path, s->mask, s->n, err, sizeof err) != 0) goto fail;
    s->shards++;
    s->total += s->n;
    s->n = 0;
    return 0;
fail:
    log_error("prepare: %s", err);
    return -1;
}

static int tsplit_add(struct tsplit *s, const uint32_t *t, const uint8_t *m, size_t n,
                      const char *out) {
    s->examples++;
    while (n) {
        size_t k = s->cap - s->n < n ? s->cap - s->n : n;
        memcpy(s->tok + s->n, t, k * sizeof *t);
        for (size_t i = 0; i < k; i++)
            s->counted += m[i];
        memcpy(s->mask + s->n, m, k);
        s->n += k;
        t += k;
        m += k;
        n -= k;
        if (s->n == s->cap && tsplit_flush(s, out) != 0) return -1;
    }
    return 0;
}

/* Counts of what prepare kept and skipped (meta.json and the summary line). */
struct tcounts {
    uint64_t examples, kept, empty, all_masked, truncated, dropped;
};

struct tprep {
    const struct opts *o;
    struct tok *t;
    enum { TF_TEXT, TF_JSONL, TF_CHAT, TF_COMPLETION } fmt;
    enum chat_template tpl;
    int masked; /* loss_on assistant / completion */
    uint32_t eos;
    struct tok_ids ids;
    struct chat_mask mask;
    struct tsplit train, val;
    struct tcounts c;
};

static const char *const fmt_names[] = {"text", "jsonl", "chat", "completion"};

static int mask_push(struct chat_mask *m, uint8_t v, size_t upto) {
    while (m->n < upto) {
        if (buf_grow_array(&m->v, &m->cap, m->n + 1, 1, 256) != 0) return -1;
        m->v[m->n++] = v;
    }
    return 0;
}

/* Encode a string field and mark its tokens with `v`. */
static int enc_field(struct tprep *p, const char *s, uint8_t v, char *err, size_t errlen) {
    if (tok_encode(p->t, s, strlen(s), 0, &p->ids, err, errlen) != 0) return -1;
    return mask_push(&p->mask, v, p->ids.n);
}

/* Render one example (a line of jsonl/chat/completion, or a text file) into p->ids/p->mask.
 * Returns 0, or -1 with a message naming the field in err. */
static int render_example(struct tprep *p, const char *line, size_t n, char *err, size_t errlen) {
    int rc = -1;
    json_error_t je;
    json_t *root = NULL;
    struct chat_msg *msgs = NULL;
    p->ids.n = p->mask.n = 0;
    if (p->fmt == TF_TEXT) {
        if (tok_encode(p->t, line, n, 0, &p->ids, err, errlen) != 0) return -1;
        return mask_push(&p->mask, 1, p->ids.n);
    }
    if (!(root = json_loadb(line, n, 0, &je)) || !json_is_object(root)) {
        snprintf(err, errlen, "not a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
        goto out;
    }
    if (p->fmt == TF_JSONL) {
        const char *key = p->o->text_key ? p->o->text_key : "text";
        json_t *v = json_object_get(root, key);
        if (!json_is_string(v)) {
            snprintf(err, errlen, "field \"%s\" is %s, expected a string", key,
                     v ? "not a string" : "missing");
            goto out;
        }
        rc = enc_field(p, json_string_value(v), 1, err, errlen);
    } else if (p->fmt == TF_COMPLETION) {
        json_t *pr = json_object_get(root, "prompt"), *co = json_object_get(root, "completion");
        if (!json_is_string(pr) || !json_is_string(co)) {
            snprintf(err, errlen, "field \"%s\" is %s, expected a string",
                     json_is_string(pr) ? "completion" : "prompt",
                     (json_is_string(pr) ? co : pr) ? "not a string" : "missing");
            goto out;
        }
        if (enc_field(p, json_string_value(pr), p->masked ? 0 : 1, err, errlen) != 0 ||
            enc_field(p, json_string_value(co), 1, err, errlen) != 0)
            goto out;
        rc = 0;
    } else {
        json_t *list = json_object_get(root, "messages"), *m;
        size_t nm = json_array_size(list), i;
        if (!json_is_array(list)) {
            snprintf(err, errlen, "field \"messages\" is %s, expected an array",
                     list ? "not an array" : "missing");
            goto out;
        }
        if (!(msgs = calloc(nm ? nm : 1, sizeof *msgs))) goto out;
        json_array_foreach(list, i, m) {
            msgs[i].role = json_string_value(json_object_get(m, "role"));
            msgs[i].content = json_string_value(json_object_get(m, "content"));
            if (!msgs[i].role || !msgs[i].content) {
                snprintf(err, errlen, "field \"messages[%zu].%s\" is missing or not a string", i,
                         msgs[i].role ? "content" : "role");
                goto out;
            }
        }
        if (nm == 0) {
            rc = 0;
            goto out;
        }
        struct chat_mask cm = {0};
        size_t before = p->ids.n;
        rc = chat_render(p->t, p->tpl, msgs, nm, 0, &p->ids, &cm, err, errlen);
        if (rc == 0)
            for (size_t k = 0; k < p->ids.n - before && rc == 0; k++)
                rc = mask_push(&p->mask, p->masked ? cm.v[k] : 1, p->mask.n + 1);
        chat_mask_free(&cm);
    }
out:
    free(msgs);
    json_decref(root);
    return rc;
}

/* Count, cut and store the rendered example; example index i decides train or val. */
static int store_example(struct tprep *p) {
    const struct opts *o = p->o;
    p->c.examples++;
    if (p->ids.n == 0) {
        p->c.empty++;
        return 0;
    }
    /* EOS ends every document. It counts in the loss when the last content token does,
     * except after a chat with loss on the assistant: the template's own end marker is what
     * the assistant learns to write. */
    if (p->ids.v[p->ids.n - 1] != p->eos) {
        uint8_t last = p->fmt == TF_CHAT && p->masked ? 0 : p->mask.v[p->mask.n - 1];
        if (tok_ids_reserve(&p->ids, 1) != 0 || mask_push(&p->mask, last, p->mask.n + 1) != 0)
            return -1;
        p->ids.v[p->ids.n++] = p->eos;
    }
    if (o->seq_len > 0 && p->ids.n > (size_t)o->seq_len) {
        if (strcmp(o->overlong, "drop") == 0) {
            p->c.dropped++;
            return 0;
        }
        p->c.truncated++;
        p->ids.n = p->mask.n = (size_t)o->seq_len;
    }
    size_t ones = 0;
    for (size_t i = 0; i < p->mask.n; i++)
        ones += p->mask.v[i];
    if (ones == 0) {
        p->c.all_masked++;
        return 0;
    }
    uint64_t i = p->c.kept++;
    double f = o->val_fraction;
    int to_val = (uint64_t)((double)(i + 1) * f) > (uint64_t)((double)i * f);
    return tsplit_add(to_val ? &p->val : &p->train, p->ids.v, p->mask.v, p->ids.n, o->out);
}

static int sha_file(EVP_MD_CTX *md, const char *path) {
    size_t len = 0;
    char *b = fs_read_file(path, 0, &len);
    if (!b) return -1;
    EVP_DigestUpdate(md, path, strlen(path) + 1);
    EVP_DigestUpdate(md, b, len);
    free(b);
    return 0;
}

static int cmd_prepare_tok(struct opts *o, struct strv *files) {
    int rc = 1;
    char err[1024];
    struct tprep p = {.o = o};
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    const char *fmt = o->format ? o->format : "text";
    int f = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(fmt, fmt_names[i]) == 0) f = i;
    if (f < 0) {
        log_error("prepare: --format \"%s\" is not one of text, jsonl, chat, completion", fmt);
        rc = 2;
        goto out;
    }
    p.fmt = f;
    const char *def_loss = p.fmt == TF_CHAT         ? "assistant"
                           : p.fmt == TF_COMPLETION ? "completion"
                                                    : "all";
    const char *loss = o->loss_on ? o->loss_on : def_loss;
    if (strcmp(loss, "all") != 0 && strcmp(loss, def_loss) != 0) {
        log_error("prepare: --loss-on \"%s\" does not fit --format %s (use all or %s)", loss, fmt,
                  def_loss);
        rc = 2;
        goto out;
    }
    p.masked = strcmp(loss, "all") != 0;
    if (strcmp(o->overlong, "truncate") != 0 && strcmp(o->overlong, "drop") != 0) {
        log_error("prepare: --overlong \"%s\" is not one of truncate, drop", o->overlong);
        rc = 2;
        goto out;
    }
    if (p.fmt == TF_CHAT && chat_template_parse(o->chat_template, &p.tpl) != 0) {
        log_error("prepare: --chat-template \"%s\" is not one of llama3, chatml, mistral",
                  o->chat_template ? o->chat_template : "");
        rc = 2;
        goto out;
    }
    if (!(p.t = open_tokenizer("prepare", o->tokenizer))) goto out;
    int64_t eos = tok_token_id(p.t, "eos");
    if (eos < 0) {
        log_error("prepare: %s: the tokenizer has no EOS token", o->tokenizer);
        goto out;
    }
    p.eos = (uint32_t)eos;
    uint32_t vocab = tok_vocab_size(p.t);
    int version = vocab > 65536 ? 2 : 1;
    p.train = (struct tsplit){
        .name = "train", .cap = (size_t)o->shard_tokens, .version = version, .masked = p.masked};
    p.val = p.train;
    p.val.name = "val";
    p.train.tok = malloc(p.train.cap * 4);
    p.val.tok = malloc(p.val.cap * 4);
    p.train.mask = malloc(p.train.cap);
    p.val.mask = malloc(p.val.cap);
    if (!md || !p.train.tok || !p.val.tok || !p.train.mask || !p.val.mask) {
        log_error("prepare: out of memory");
        goto out;
    }
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    /* The tokenizer's files take part in the content hash (a directory: the files tok_open
     * may read in it). */
    struct stat st;
    if (stat(o->tokenizer, &st) == 0 && S_ISDIR(st.st_mode)) {
        static const char *const names[] = {"tokenizer.json", "tokenizer.model",
                                            "tokenizer_config.json"};
        for (size_t i = 0; i < 3; i++) {
            char tp[PATH_MAX];
            snprintf(tp, sizeof tp, "%s/%s", o->tokenizer, names[i]);
            sha_file(md, tp);
        }
    } else if (sha_file(md, o->tokenizer) != 0) {
        log_error("prepare: cannot read %s: %s", o->tokenizer, strerror(errno));
        goto out;
    }
    char optstr[512];
    snprintf(optstr, sizeof optstr, "%s|%s|%s|%s|%ld|%s|%g", fmt, loss,
             o->text_key ? o->text_key : "text", o->chat_template ? o->chat_template : "",
             o->seq_len, o->overlong, o->val_fraction);
    EVP_DigestUpdate(md, optstr, strlen(optstr));
    uint64_t bytes = 0;
    for (size_t i = 0; i < files->n; i++) {
        size_t len = 0;
        char *b = fs_read_file(files->v[i], 0, &len);
        if (!b) {
            log_error("prepare: %s: cannot read: %s", files->v[i], strerror(errno));
            goto out;
        }
        EVP_DigestUpdate(md, b, len);
        bytes += len;
        int bad = 0;
        if (p.fmt == TF_TEXT) {
            if (render_example(&p, b, len, err, sizeof err) != 0) {
                log_error("prepare: %s: %s", files->v[i], err);
                bad = 1;
            } else if (store_example(&p) != 0) {
                bad = 1;
            }
        } else {
            FOR_EACH_LINE(b, len, line, n, lineno) {
                if (bad) break;
                size_t k = 0;
                while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r'))
                    k++;
                if (k == n) continue; /* blank lines separate nothing */
                if (render_example(&p, line, n, err, sizeof err) != 0) {
                    log_error("prepare: %s line %zu: %s", files->v[i], lineno, err);
                    bad = 1;
                } else if (store_example(&p) != 0) {
                    bad = 1;
                }
            }
        }
        free(b);
        if (bad) {
            rc = 2;
            goto out;
        }
    }
    if (tsplit_flush(&p.train, o->out) != 0 || tsplit_flush(&p.val, o->out) != 0) goto out;
    if (p.train.total == 0) {
        log_error("prepare: no training examples remain: %" PRIu64 " read, %" PRIu64
                  " empty, %" PRIu64 " with every token masked, %" PRIu64 " dropped as longer "
                  "than --seq-len %ld",
                  p.c.examples, p.c.empty, p.c.all_masked, p.c.dropped, o->seq_len);
        rc = 2;
        goto out;
    }
    unsigned char dig[32];
    char hex[65];
    EVP_DigestFinal_ex(md, dig, NULL);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", dig[i]);
    json_t *sources = json_array();
    for (size_t i = 0; i < files->n; i++)
        json_array_append_new(sources, json_string(files->v[i]));
    json_t *meta = json_pack(
        "{s:s,s:s,s:i,s:I,s:s,s:s,s:i,s:f,s:I,s:s,s:{s:I,s:I,s:I,s:I,s:I,s:I},s:I,s:I,s:I,s:I,"
        "s:I,s:I,s:i,s:i,s:b,s:s,s:o}",
        "tokenizer", o->tokenizer, "tokenizer_kind", tok_kind(p.t), "vocab_size", (int)vocab,
        "eos_token", (json_int_t)p.eos, "format", fmt, "loss_on", loss, "shard_version", version,
        "val_fraction", o->val_fraction, "seq_len", (json_int_t)o->seq_len, "overlong", o->overlong,
        "examples", "read", (json_int_t)p.c.examples, "kept", (json_int_t)p.c.kept, "empty",
        (json_int_t)p.c.empty, "all_masked", (json_int_t)p.c.all_masked, "truncated",
        (json_int_t)p.c.truncated, "dropped", (json_int_t)p.c.dropped, "train_examples",
        (json_int_t)p.train.examples, "val_examples", (json_int_t)p.val.examples, "train_tokens",
        (json_int_t)p.train.total, "val_tokens", (json_int_t)p.val.total, "train_loss_tokens",
        (json_int_t)p.train.counted, "val_loss_tokens", (json_int_t)p.val.counted, "train_shards",
        p.train.shards, "val_shards", p.val.shards, "mask", p.masked, "content_sha256", hex,
        "sources", sources);
    if (p.fmt == TF_CHAT) json_object_set_new(meta, "chat_template", json_string(o->chat_template));
    if (p.fmt == TF_JSONL)
        json_object_set_new(meta, "text_key", json_string(o->text_key ? o->text_key : "text"));
    if (write_meta(meta, o->out, bytes) != 0) goto out;
    rc = 0;
out:
    EVP_MD_CTX_free(md);
    free(p.train.tok);
    free(p.val.tok);
    free(p.train.mask);
    free(p.val.mask);
    tok_ids_free(&p.ids);
    chat_mask_free(&p.mask);
    tok_free(p.t);
    return rc;
}

/* Append "[a,b,c]" of n values to b. */
static int put_array(struct buf *b, const uint32_t *ids, const uint8_t *mask, size_t n) {
    int rc = buf_append_ch(b, '[');
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = buf_printf(b, i ? ",%u" : "%u", ids ? ids[i] : (unsigned)mask[i]);
    return rc ? rc : buf_append_ch(b, ']');
}

static int cmd_chat(const struct opts *o) {
    int rc = 1;
    size_t len = 0;
    struct tok_ids ids = {0};
    struct chat_mask mask = {0};
    struct chat_msg *msgs = NULL;
    struct buf line_out = BUF_INIT;
    enum chat_template tpl;
    if (chat_template_parse(o->template, &tpl) != 0) {
        log_error("chat: --template \"%s\" is not one of llama3, chatml, mistral",
                  o->template ? o->template : "");
        return 2;
    }
    struct tok *t = open_tokenizer("chat", o->tokenizer);
    unsigned char *b = t ? read_input("chat", o->in, &len) : NULL;
    if (!b) goto out;
    FOR_EACH_LINE(b, len, line, n, lineno) {
        char err[1024];
        json_error_t je;
        json_t *root = json_loadb(line, n, 0, &je), *list = json_object_get(root, "messages");
        size_t nm = json_array_size(list), i;
        json_t *m;
        free(msgs);
        msgs = calloc(nm ? nm : 1, sizeof *msgs);
        int bad = !json_is_array(list) || !msgs;
        json_array_foreach(list, i, m) {
            msgs[i].role = json_string_value(json_object_get(m, "role"));
            msgs[i].content = json_string_value(json_object_get(m, "content"));
        }
        ids.n = mask.n = 0;
        if (bad) {
            log_error(
                "chat: %s line %zu: expected {\"messages\": [{\"role\", \"content\"}...]}%s%s",
                o->in, lineno, root ? "" : ": ", root ? "" : je.text);
        } else if (chat_render(t, tpl, msgs, nm, o->add_generation_prompt, &ids, &mask, err,
                               sizeof err) != 0) {
            log_error("chat: %s line %zu: %s", o->in, lineno, err);
            bad = 1;
        }
        json_decref(root);
        if (bad) goto out;
        buf_reset(&line_out);
        if (buf_append_str(&line_out, "{\"ids\":") || put_array(&line_out, ids.v, NULL, ids.n) ||
            buf_append_str(&line_out, ",\"mask\":") || put_array(&line_out, NULL, mask.v, mask.n) ||
            buf_append_str(&line_out, "}\n")) {
            log_error("chat: out of memory");
            goto out;
        }
        fwrite(line_out.p, 1, line_out.len, stdout);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    free(msgs);
    free(b);
    buf_free(&line_out);
    tok_ids_free(&ids);
    chat_mask_free(&mask);
    tok_free(t);
    return rc;
}

int main(int argc, char **argv) {
    struct opts o;
    memset(&o, 0, sizeof o);
    char *pos[256];
    int npos = 256;
    log_init("loom-data", LOG_INFO);
    int rc = config_load(table, NTABLE, &o, "loom-data", usage, argc, argv, pos, &npos);
    if (rc != 0) {
        config_free(table, NTABLE, &o);
        return rc > 0 ? 0 : 2;
    }
    if (npos >= 1 && strcmp(pos[0], "prepare") == 0) {
        rc = cmd_prepare(&o, pos, npos);
    } else if (npos >= 1 && strcmp(pos[0], "check") == 0) {
        rc = cmd_check(&o, pos, npos);
    } else if (npos == 1 && strcmp(pos[0], "encode") == 0) {
        rc = cmd_encode(&o);
    } else if (npos == 1 && strcmp(pos[0], "decode") == 0) {
        rc = cmd_decode(&o);
    } else if (npos == 1 && strcmp(pos[0], "chat") == 0) {
        rc = cmd_chat(&o);
    } else {
        config_print_help(table, NTABLE, "loom-data", usage, stderr);
        rc = 2;
    }
    config_free(table, NTABLE, &o);
    return rc;
}
