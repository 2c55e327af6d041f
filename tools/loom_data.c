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
 * prepare --tokenizer PATH --format text|jsonl|chat|completion|webdataset tokenizes examples (a
 * text file, a jsonl line's --text-key field, a chat's messages through --chat-template, a
 * prompt/completion pair) with that tokenizer, EOS after each, into version 1 or 2 shards
 * split by example, plus DIR/X.mask loss-mask shards (worker/data.h) for chat and completion
 * data; empty, all-masked and overlong (--seq-len, --overlong) examples are counted in
 * meta.json with a SHA-256 of tokenizer, options and inputs (docs/data.md); the work is
 * data/prepare.c's, on --threads threads.
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

#include "common/buf.h"
#include "common/config.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "data/chat.h"
#include "data/prepare.h"
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
    long threads;
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
     "prepare with --tokenizer: text (a file is a document), jsonl, chat, completion or "
     "webdataset (tar shards of .txt / .json members)"},
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
    {"threads", CONFIG_INT, offsetof(struct opts, threads), "1", 1, 64,
     "prepare with --tokenizer: encoding threads (the shards do not depend on it)"},
};
#define NTABLE (sizeof table / sizeof *table)
static const char usage[] =
    "prepare --in FILES|DIR --out DIR [--val-fraction F]\n"
    "       loom-data prepare --tokenizer PATH --format text|jsonl|chat|"
    "completion|webdataset [--threads N] [--text-key K] [--chat-template T] [--seq-len N "
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

/* The work is data/prepare.c's (shared with the agent's staging step). */
static int cmd_prepare_tok(struct opts *o, struct strv *files) {
    struct prep_opts po = {.tokenizer = o->tokenizer,
                           .format = o->format,
                           .text_key = o->text_key,
                           .chat_template = o->chat_template,
                           .loss_on = o->loss_on,
                           .seq_len = o->seq_len,
                           .overlong = o->overlong,
                           .val_fraction = o->val_fraction,
                           .shard_tokens = o->shard_tokens,
                           .threads = (int)o->threads};
    struct prep_files in = {files->v, files->n, files->cap}; /* borrowed, not freed */
    char err[1024] = "";
    json_t *meta = NULL;
    int rc = prep_run(&po, &in, o->out, &meta, err, sizeof err);
    if (rc != PREP_OK) {
        log_error("prepare: %s", err);
        return rc;
    }
    uint64_t bytes = (uint64_t)json_integer_value(json_object_get(meta, "input_bytes"));
    return write_meta(meta, o->out, bytes) == 0 ? 0 : 1;
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
