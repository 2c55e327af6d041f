/* Dataset tokenization into token and loss-mask shards (see data/prepare.h). */
#define _GNU_SOURCE
#include "data/prepare.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/buf.h"
#include "common/fsutil.h"
#include "data/chat.h"
#include "data/tok.h"
#include "worker/data.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)

/* A batch is rendered in parallel, then stored in order: at most this many records or bytes. */
#define BATCH_ITEMS 16384
#define BATCH_BYTES (16u << 20)
#define MAX_THREADS 64
/* A tar member larger than this is refused rather than read into memory. */
#define MAX_MEMBER (1u << 30)

/* ---- inputs ------------------------------------------------------------------ */

static int files_push(struct prep_files *f, const char *p) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->v[i], p) == 0) return 0; /* reached twice (symlinks, overlapping globs) */
    if (buf_grow_array(&f->v, &f->cap, f->n + 1, sizeof *f->v, 16) != 0) return -1;
    if (!(f->v[f->n] = strdup(p))) return -1;
    f->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file, or a directory's regular files (no dot files) in name order, by real path. */
static int add_path(struct prep_files *f, const char *path, char *err, size_t errlen) {
    struct stat st;
    char real[PATH_MAX];
    if (stat(path, &st) != 0) {
        ERR("%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (!realpath(path, real) || files_push(f, real) != 0) {
            ERR("%s: %s", path, strerror(errno));
            return -1;
        }
        return 0;
    }
    DIR *d = opendir(path);
    if (!d) {
        ERR("%s: %s", path, strerror(errno));
        return -1;
    }
    struct prep_files here = {0};
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) && rc == 0) {
        if (e->d_name[0] == '.') continue;
        char *p = NULL;
        struct stat fst;
        if (asprintf(&p, "%s/%s", path, e->d_name) < 0) {
            rc = -1;
            break;
        }
        if (stat(p, &fst) == 0 && S_ISREG(fst.st_mode)) rc = files_push(&here, p);
        free(p);
    }
    closedir(d);
    qsort(here.v, here.n, sizeof *here.v, cmp_str);
    for (size_t i = 0; i < here.n && rc == 0; i++)
        if (realpath(here.v[i], real)) rc = files_push(f, real);
    prep_files_free(&here);
    if (rc != 0) ERR("%s: out of memory", path);
    return rc;
}

int prep_files_add(struct prep_files *f, const char *list, char *err, size_t errlen) {
    char *copy = strdup(list ? list : ""), *save = NULL;
    int rc = copy ? 0 : -1;
    for (char *p = copy ? strtok_r(copy, ",", &save) : NULL; p && rc == 0;
         p = strtok_r(NULL, ",", &save)) {
        if (!strpbrk(p, "*?[")) {
            rc = add_path(f, p, err, errlen);
            continue;
        }
        glob_t g;
        memset(&g, 0, sizeof g);
        if (glob(p, GLOB_ERR, NULL, &g) != 0 || g.gl_pathc == 0) {
            ERR("%s matches no file", p);
            rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
            rc = add_path(f, g.gl_pathv[i], err, errlen);
        globfree(&g);
    }
    free(copy);
    return rc;
}

void prep_files_free(struct prep_files *f) {
    for (size_t i = 0; i < f->n; i++)
        free(f->v[i]);
    free(f->v);
    memset(f, 0, sizeof *f);
}

/* ---- options ------------------------------------------------------------------- */

enum fmt { F_TEXT, F_JSONL, F_CHAT, F_COMPLETION, F_WEBDATASET };
static const char *const fmt_names[] = {"text", "jsonl", "chat", "completion", "webdataset"};
/* The loss a format trains on unless told otherwise, and the one masked choice it allows. */
static const char *const fmt_loss[] = {"all", "all", "assistant", "completion", "all"};

static int parse_fmt(const char *s) {
    for (int i = 0; i < 5; i++)
        if (strcmp(s ? s : "text", fmt_names[i]) == 0) return i;
    return -1;
}

static const char *loss_of(const struct prep_opts *o, int f) {
    return o->loss_on ? o->loss_on : fmt_loss[f];
}

int prep_check_opts(const struct prep_opts *o, char *err, size_t errlen) {
    int f = parse_fmt(o->format);
    if (f < 0) {
        ERR("format \"%s\" is not one of text, jsonl, chat, completion, webdataset", o->format);
        return PREP_EDATA;
    }
    const char *loss = loss_of(o, f);
    /* webdataset members may be chat or completion records: either masked loss fits. */
    int ok = strcmp(loss, "all") == 0 || strcmp(loss, fmt_loss[f]) == 0 ||
             (f == F_WEBDATASET && (!strcmp(loss, "assistant") || !strcmp(loss, "completion")));
    if (!ok) {
        ERR("loss_on \"%s\" does not fit format %s (use all or %s)", loss, fmt_names[f],
            f == F_WEBDATASET ? "assistant/completion" : fmt_loss[f]);
        return PREP_EDATA;
    }
    const char *ol = o->overlong ? o->overlong : "truncate";
    if (strcmp(ol, "truncate") != 0 && strcmp(ol, "drop") != 0) {
        ERR("overlong \"%s\" is not one of truncate, drop", ol);
        return PREP_EDATA;
    }
    enum chat_template tpl;
    if ((f == F_CHAT || (f == F_WEBDATASET && o->chat_template)) &&
        chat_template_parse(o->chat_template, &tpl) != 0) {
        ERR("chat template (--chat-template, data.chat_template) \"%s\" is not one of llama3, "
            "chatml, mistral",
            o->chat_template ? o->chat_template : "");
        return PREP_EDATA;
    }
    if (!o->tokenizer || !*o->tokenizer) {
        ERR("no tokenizer given");
        return PREP_EDATA;
    }
    return PREP_OK;
}

/* ---- hashing ------------------------------------------------------------------- */

static int sha_file(EVP_MD_CTX *md, const char *path) {
    size_t len = 0;
    char *b = fs_read_file(path, 0, &len);
    if (!b) return -1;
    EVP_DigestUpdate(md, path, strlen(path) + 1);
    EVP_DigestUpdate(md, b, len);
    free(b);
    return 0;
}

/* The tokenizer's files (a directory: the ones tok_open may read in it). */
static int sha_tokenizer(EVP_MD_CTX *md, const char *tok, char *err, size_t errlen) {
    struct stat st;
    if (stat(tok, &st) == 0 && S_ISDIR(st.st_mode)) {
        static const char *const names[] = {"tokenizer.json", "tokenizer.model",
                                            "tokenizer_config.json"};
        for (size_t i = 0; i < 3; i++) {
            char tp[PATH_MAX];
            snprintf(tp, sizeof tp, "%s/%s", tok, names[i]);
            sha_file(md, tp);
        }
        return 0;
    }
    if (sha_file(md, tok) != 0) {
        ERR("cannot read %s: %s", tok, strerror(errno));
        return -1;
    }
    return 0;
}

/* Everything but the inputs that changes the tokens produced. */
static void opt_string(const struct prep_opts *o, char *s, size_t n) {
    int f = parse_fmt(o->format);
    snprintf(s, n, "%s|%s|%s|%s|%ld|%s|%g", fmt_names[f < 0 ? 0 : f], loss_of(o, f < 0 ? 0 : f),
             o->text_key ? o->text_key : "text", o->chat_template ? o->chat_template : "",
             o->seq_len, o->overlong ? o->overlong : "truncate", o->val_fraction);
}

static void hex32(const unsigned char *d, char out[65]) {
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

int prep_cache_key(const struct prep_opts *o, const struct prep_files *in, char key[65], char *err,
                   size_t errlen) {
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = PREP_EIO;
    char s[PATH_MAX + 512];
    unsigned char dig[32];
    if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) goto out;
    EVP_DigestUpdate(md, "loom-prepare-1", 15);
    if (sha_tokenizer(md, o->tokenizer, err, errlen) != 0) goto out;
    opt_string(o, s, sizeof s);
    EVP_DigestUpdate(md, s, strlen(s) + 1);
    snprintf(s, sizeof s, "%ld", o->shard_tokens);
    EVP_DigestUpdate(md, s, strlen(s) + 1);
    for (size_t i = 0; i < in->n; i++) {
        struct stat st;
        if (stat(in->v[i], &st) != 0) {
            ERR("%s: %s", in->v[i], strerror(errno));
            goto out;
        }
        snprintf(s, sizeof s, "%s\n%lld\n%lld.%09ld", in->v[i], (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
        EVP_DigestUpdate(md, s, strlen(s) + 1);
    }
    EVP_DigestFinal_ex(md, dig, NULL);
    hex32(dig, key);
    rc = PREP_OK;
out:
    if (rc != PREP_OK && !*err) ERR("out of memory");
    EVP_MD_CTX_free(md);
    return rc;
}

/* ---- output splits ------------------------------------------------------------- */

/* One output split: token shard and, when masked, the mask shard. */
struct tsplit {
    const char *name;
    uint32_t *tok;
    uint8_t *mask;
    size_t n, cap;
    int shards, version, masked;
    uint64_t total, counted, examples;
};

static int tsplit_flush(struct tsplit *s, const char *out, char *err, size_t errlen) {
    if (s->n == 0) return 0;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s_%03d.bin", out, s->name, s->shards);
    if (data_shard_write(path, s->version, s->tok, s->n, err, errlen) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s_%03d.mask", out, s->name, s->shards);
    if (s->masked && data_mask_write(path, s->mask, s->n, err, errlen) != 0) return -1;
    s->shards++;
    s->total += s->n;
    s->n = 0;
    return 0;
}

static int tsplit_add(struct tsplit *s, const uint32_t *t, const uint8_t *m, size_t n,
                      const char *out, char *err, size_t errlen) {
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
        if (s->n == s->cap && tsplit_flush(s, out, err, errlen) != 0) return -1;
    }
    return 0;
}

/* ---- rendering (one worker per thread) -------------------------------------------- */

struct prep {
    const struct prep_opts *o;
    struct tok *t;
    enum fmt fmt;
    enum chat_template tpl;
    int has_tpl;
    int masked; /* loss on assistant / completion */
    uint32_t eos;
    const char *out;
    struct tsplit train, val;
    uint64_t examples, kept, empty, all_masked, truncated, dropped, skipped_members;
    struct tok_ids ids; /* the example being stored */
    struct chat_mask mask;
};

enum item_kind { IT_TEXT, IT_RECORD };

/* One example to render: a text document or a JSON record, where it came from, and where
 * its tokens went. */
struct item {
    const char *p;
    size_t n;
    enum item_kind kind;
    size_t line;        /* line of a jsonl file (0: none) */
    const char *member; /* tar member name (NULL: none) */
    int worker;         /* which worker rendered it */
    size_t off, len;    /* its tokens in that worker's output */
    int failed;
};

struct worker {
    struct prep *p;
    struct tok_enc *enc;
    struct tok_ids ids, out;
    struct chat_mask mask, outm;
    struct item *items;
    size_t lo, hi;
    char err[1024];
};

static int mask_push(struct chat_mask *m, uint8_t v, size_t upto) {
    if (upto > m->n && buf_grow_array(&m->v, &m->cap, upto, 1, 256) != 0) return -1;
    while (m->n < upto)
        m->v[m->n++] = v;
    return 0;
}

static int enc_field(struct worker *w, const char *s, uint8_t v, char *err, size_t errlen) {
    if (tok_encode_with(w->enc, s, strlen(s), 0, &w->ids, err, errlen) != 0) return -1;
    return mask_push(&w->mask, v, w->ids.n);
}

static int render_chat(struct worker *w, json_t *list, char *err, size_t errlen) {
    struct prep *p = w->p;
    size_t nm = json_array_size(list), i;
    json_t *m;
    if (!json_is_array(list)) {
        ERR("field \"messages\" is %s, expected an array", list ? "not an array" : "missing");
        return -1;
    }
    if (nm == 0) return 0; /* counted as empty */
    if (!p->has_tpl) {
        ERR("a chat record needs a chat template (data.chat_template: llama3, chatml, mistral)");
        return -1;
    }
    struct chat_msg *msgs = calloc(nm, sizeof *msgs);
    int rc = -1;
    if (!msgs) {
        ERR("out of memory");
        return -1;
    }
    json_array_foreach(list, i, m) {
        msgs[i].role = json_string_value(json_object_get(m, "role"));
        msgs[i].content = json_string_value(json_object_get(m, "content"));
        if (!msgs[i].role || !msgs[i].content) {
            ERR("field \"messages[%zu].%s\" is missing or not a string", i,
                msgs[i].role ? "content" : "role");
            goto out;
        }
    }
    struct chat_mask cm = {0};
    size_t before = w->ids.n;
    rc = chat_render_with(p->t, w->enc, p->tpl, msgs, nm, 0, &w->ids, &cm, err, errlen);
    for (size_t k = 0; rc == 0 && k < w->ids.n - before; k++)
        rc = mask_push(&w->mask, p->masked ? cm.v[k] : 1, w->mask.n + 1);
    chat_mask_free(&cm);
out:
    free(msgs);
    return rc;
}

static int render_completion(struct worker *w, json_t *root, char *err, size_t errlen) {
    json_t *pr = json_object_get(root, "prompt"), *co = json_object_get(root, "completion");
    if (!json_is_string(pr) || !json_is_string(co)) {
        ERR("field \"%s\" is %s, expected a string", json_is_string(pr) ? "completion" : "prompt",
            (json_is_string(pr) ? co : pr) ? "not a string" : "missing");
        return -1;
    }
    if (enc_field(w, json_string_value(pr), w->p->masked ? 0 : 1, err, errlen) != 0) return -1;
    return enc_field(w, json_string_value(co), 1, err, errlen);
}

static int render_text_field(struct worker *w, json_t *root, char *err, size_t errlen) {
    const char *key = w->p->o->text_key ? w->p->o->text_key : "text";
    json_t *v = json_object_get(root, key);
    if (!json_is_string(v)) {
        ERR("field \"%s\" is %s, expected a string", key, v ? "not a string" : "missing");
        return -1;
    }
    return enc_field(w, json_string_value(v), 1, err, errlen);
}

/* One example into w->ids / w->mask. 0, or -1 with a message naming the field. */
static int render(struct worker *w, const struct item *it, char *err, size_t errlen) {
    struct prep *p = w->p;
    w->ids.n = w->mask.n = 0;
    if (it->kind == IT_TEXT) {
        if (tok_encode_with(w->enc, it->p, it->n, 0, &w->ids, err, errlen) != 0) return -1;
        return mask_push(&w->mask, 1, w->ids.n);
    }
    json_error_t je;
    json_t *root = json_loadb(it->p, it->n, 0, &je);
    int rc = -1;
    if (!json_is_object(root)) {
        ERR("not a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
    } else if (p->fmt == F_CHAT || (p->fmt == F_WEBDATASET && json_object_get(root, "messages"))) {
        rc = render_chat(w, json_object_get(root, "messages"), err, errlen);
    } else if (p->fmt == F_COMPLETION ||
               (p->fmt == F_WEBDATASET && json_object_get(root, "prompt"))) {
        rc = render_completion(w, root, err, errlen);
    } else {
        rc = render_text_field(w, root, err, errlen);
    }
    json_decref(root);
    return rc;
}

static void *work(void *arg) {
    struct worker *w = arg;
    for (size_t i = w->lo; i < w->hi; i++) {
        struct item *it = &w->items[i];
        if (render(w, it, w->err, sizeof w->err) != 0) {
            it->failed = 1;
            for (size_t k = i + 1; k < w->hi; k++) /* stored in order: nothing past it is used */
                w->items[k].failed = 2;
            break;
        }
        it->off = w->out.n;
        it->len = w->ids.n;
        if (tok_ids_reserve(&w->out, w->ids.n) != 0 ||
            buf_grow_array(&w->outm.v, &w->outm.cap, w->outm.n + w->ids.n + 1, 1, 256) != 0) {
            snprintf(w->err, sizeof w->err, "out of memory");
            it->failed = 1;
            break;
        }
        memcpy(w->out.v + w->out.n, w->ids.v, w->ids.n * sizeof *w->ids.v);
        memcpy(w->outm.v + w->outm.n, w->mask.v, w->ids.n);
        w->out.n += w->ids.n;
        w->outm.n += w->ids.n;
    }
    return NULL;
}

/* ---- storing in order ------------------------------------------------------------- */

/* Count, cut and store p->ids / p->mask; the kept example's index decides train or val. */
static int store_example(struct prep *p, char *err, size_t errlen) {
    const struct prep_opts *o = p->o;
    p->examples++;
    if (p->ids.n == 0) {
        p->empty++;
        return 0;
    }
    /* EOS ends every document. It counts in the loss when the last content token does,
     * except after a chat with loss on the assistant: the template's own end marker is what
     * the assistant learns to write. */
    if (p->ids.v[p->ids.n - 1] != p->eos) {
        uint8_t last = p->fmt == F_CHAT && p->masked ? 0 : p->mask.v[p->mask.n - 1];
        if (tok_ids_reserve(&p->ids, 1) != 0 || mask_push(&p->mask, last, p->mask.n + 1) != 0) {
            ERR("out of memory");
            return -1;
        }
        p->ids.v[p->ids.n++] = p->eos;
    }
    if (o->seq_len > 0 && p->ids.n > (size_t)o->seq_len) {
        if (o->overlong && strcmp(o->overlong, "drop") == 0) {
            p->dropped++;
            return 0;
        }
        p->truncated++;
        p->ids.n = p->mask.n = (size_t)o->seq_len;
    }
    size_t ones = 0;
    for (size_t i = 0; i < p->mask.n; i++)
        ones += p->mask.v[i];
    if (ones == 0) {
        p->all_masked++;
        return 0;
    }
    uint64_t i = p->kept++;
    double f = o->val_fraction;
    int to_val = (uint64_t)((double)(i + 1) * f) > (uint64_t)((double)i * f);
    return tsplit_add(to_val ? &p->val : &p->train, p->ids.v, p->mask.v, p->ids.n, p->out, err,
                      errlen);
}

/* Renders items[0..n) on the workers, then stores them in order. On a bad record err names
 * `file` and the item's line or member. */
static int run_batch(struct prep *p, struct worker *ws, int nw, struct item *items, size_t n,
                     const char *file, char *err, size_t errlen) {
    if (n == 0) return PREP_OK;
    int use = nw < 1 ? 1 : nw;
    if ((size_t)use > n) use = (int)n;
    pthread_t th[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int k = 0; k < use; k++) {
        struct worker *w = &ws[k];
        w->items = items;
        w->lo = n * (size_t)k / (size_t)use;
        w->hi = n * (size_t)(k + 1) / (size_t)use;
        w->out.n = w->outm.n = 0;
        w->err[0] = 0;
        for (size_t i = w->lo; i < w->hi; i++)
            items[i].worker = k;
        if (k > 0 && pthread_create(&th[k], NULL, work, w) == 0) started[k] = 1;
    }
    work(&ws[0]);
    for (int k = 1; k < use; k++) {
        if (started[k])
            pthread_join(th[k], NULL);
        else
            work(&ws[k]); /* no thread: do its share here */
    }
    for (size_t i = 0; i < n; i++) {
        struct item *it = &items[i];
        struct worker *w = &ws[it->worker];
        if (it->failed) {
            if (it->member)
                ERR("%s member %s: %s", file, it->member, w->err);
            else if (it->line)
                ERR("%s line %zu: %s", file, it->line, w->err);
            else
                ERR("%s: %s", file, w->err);
            return strcmp(w->err, "out of memory") == 0 ? PREP_EIO : PREP_EDATA;
        }
        p->ids.n = p->mask.n = 0;
        if (tok_ids_reserve(&p->ids, it->len + 1) != 0 ||
            buf_grow_array(&p->mask.v, &p->mask.cap, it->len + 1, 1, 256) != 0) {
            ERR("out of memory");
            return PREP_EIO;
        }
        memcpy(p->ids.v, w->out.v + it->off, it->len * sizeof *p->ids.v);
        memcpy(p->mask.v, w->outm.v + it->off, it->len);
        p->ids.n = p->mask.n = it->len;
        if (store_example(p, err, errlen) != 0) return PREP_EIO;
    }
    return PREP_OK;
}

/* ---- readers ----------------------------------------------------------------------- */

struct reader {
    struct prep *p;
    struct worker *ws;
    int nw;
    EVP_MD_CTX *md;
    uint64_t done, total;
    struct item *items;
    size_t cap;
};

static int push_item(struct reader *r, size_t *n, struct item it) {
    if (buf_grow_array(&r->items, &r->cap, *n + 1, sizeof *r->items, 256) != 0) return -1;
    r->items[(*n)++] = it;
    return 0;
}

static void progress(struct reader *r, uint64_t done) {
    if (r->p->o->progress) r->p->o->progress(r->p->o->progress_user, done, r->total);
}

/* A text or jsonl file (read whole; records are its non-blank lines). */
static int read_file(struct reader *r, const char *path, char *err, size_t errlen) {
    size_t len = 0;
    char *b = fs_read_file(path, 0, &len);
    if (!b) {
        ERR("%s: cannot read: %s", path, strerror(errno));
        return PREP_EIO;
    }
    EVP_DigestUpdate(r->md, b, len);
    int rc = PREP_OK;
    size_t n = 0, bytes = 0, at = 0, lineno = 0;
    if (r->p->fmt == F_TEXT) {
        rc = push_item(r, &n, (struct item){.p = b, .n = len, .kind = IT_TEXT}) ? PREP_EIO : 0;
        if (rc == PREP_OK) rc = run_batch(r->p, r->ws, r->nw, r->items, n, path, err, errlen);
        goto out;
    }
    while (at < len && rc == PREP_OK) {
        const char *line = b + at, *nl = memchr(line, '\n', len - at);
        size_t ln = nl ? (size_t)(nl - line) : len - at;
        lineno++;
        at += ln + 1;
        size_t k = 0;
        while (k < ln && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r'))
            k++;
        if (k < ln) { /* blank lines separate nothing */
            if (push_item(r, &n,
                          (struct item){.p = line, .n = ln, .kind = IT_RECORD, .line = lineno}) !=
                0) {
                ERR("out of memory");
                rc = PREP_EIO;
                break;
            }
            bytes += ln;
        }
        if (n == BATCH_ITEMS || bytes >= BATCH_BYTES || at >= len) {
            rc = run_batch(r->p, r->ws, r->nw, r->items, n, path, err, errlen);
            n = bytes = 0;
            if (rc == PREP_OK) progress(r, r->done + (at < len ? at : len));
        }
    }
out:
    r->done += len;
    free(b);
    return rc;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* A webdataset tar shard: .txt members are documents, .json members records, others are
 * skipped (counted). Members are read in archive order, batched, rendered in parallel. */
static int read_tar(struct reader *r, const char *path, char *err, size_t errlen) {
    struct archive *a = archive_read_new();
    struct archive_entry *e;
    char **bufs = NULL, **names = NULL;
    size_t n = 0, cap = 0, ncap = 0, bytes = 0;
    int rc = PREP_OK;
    if (!a) {
        ERR("out of memory");
        return PREP_EIO;
    }
    archive_read_support_format_tar(a);
    archive_read_support_format_gnutar(a);
    archive_read_support_filter_all(a); /* .tar.gz and friends too */
    if (archive_read_open_filename(a, path, 1 << 20) != ARCHIVE_OK) {
        ERR("%s: not a readable tar file: %s", path, archive_error_string(a));
        rc = PREP_EDATA;
        goto out;
    }
    for (;;) {
        int hr = archive_read_next_header(a, &e);
        int end = hr == ARCHIVE_EOF;
        if (hr != ARCHIVE_OK && hr != ARCHIVE_WARN && !end) {
            ERR("%s: bad tar file after %zu members: %s", path, n, archive_error_string(a));
            rc = PREP_EDATA;
            break;
        }
        if (!end && archive_entry_filetype(e) == AE_IFREG) {
            const char *name = archive_entry_pathname(e);
            int txt = name && ends_with(name, ".txt"), js = name && ends_with(name, ".json");
            int64_t size = archive_entry_size(e);
            if (!txt && !js) {
                r->p->skipped_members++;
            } else if (size < 0 || size > MAX_MEMBER) {
                ERR("%s member %s: size %lld is over the limit of %u bytes", path, name,
                    (long long)size, MAX_MEMBER);
                rc = PREP_EDATA;
                break;
            } else {
                char *buf = malloc((size_t)size + 1), *nm = strdup(name);
                if (!buf || !nm || buf_grow_array(&bufs, &cap, n + 1, sizeof *bufs, 64) != 0 ||
                    buf_grow_array(&names, &ncap, n + 1, sizeof *names, 64) != 0) {
                    free(buf);
                    free(nm);
                    ERR("out of memory");
                    rc = PREP_EIO;
                    break;
                }
                la_ssize_t got = archive_read_data(a, buf, (size_t)size);
                bufs[n] = buf;
                names[n] = nm;
                if (got != size) {
                    if (got < 0)
                        ERR("%s member %s: cannot read it (%lld bytes): %s", path, name,
                            (long long)size, archive_error_string(a));
                    else
                        ERR("%s member %s: truncated (%lld of %lld bytes)", path, name,
                            (long long)got, (long long)size);
                    n++;
                    rc = PREP_EDATA;
                    break;
                }
                EVP_DigestUpdate(r->md, name, strlen(name) + 1);
                EVP_DigestUpdate(r->md, buf, (size_t)size);
                size_t k = n;
                if (push_item(r, &k,
                              (struct item){.p = buf,
                                            .n = (size_t)size,
                                            .kind = txt ? IT_TEXT : IT_RECORD,
                                            .member = nm}) != 0) {
                    n++;
                    ERR("out of memory");
                    rc = PREP_EIO;
                    break;
                }
                n++;
                bytes += (size_t)size;
            }
        }
        if (n && (end || n == BATCH_ITEMS || bytes >= BATCH_BYTES)) {
            rc = run_batch(r->p, r->ws, r->nw, r->items, n, path, err, errlen);
            for (size_t i = 0; i < n; i++) {
                free(bufs[i]);
                free(names[i]);
            }
            n = bytes = 0;
            if (rc != PREP_OK) break;
            progress(r, r->done + (uint64_t)archive_filter_bytes(a, -1));
        }
        if (end) break;
    }
out:
    for (size_t i = 0; i < n; i++) {
        free(bufs[i]);
        free(names[i]);
    }
    free(bufs);
    free(names);
    archive_read_free(a);
    struct stat st;
    r->done += stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    return rc;
}

/* ---- the whole run -------------------------------------------------------------------- */

int prep_run(const struct prep_opts *o, const struct prep_files *in, const char *out,
             json_t **meta_out, char *err, size_t errlen) {
    struct prep p = {.o = o, .out = out};
    struct reader r = {.p = &p};
    struct worker ws[MAX_THREADS];
    int nw = o->threads < 1 ? 1 : o->threads > MAX_THREADS ? MAX_THREADS : o->threads;
    int rc = prep_check_opts(o, err, errlen);
    memset(ws, 0, sizeof ws);
    if (meta_out) *meta_out = NULL;
    if (rc != PREP_OK) return rc;
    p.fmt = (enum fmt)parse_fmt(o->format);
    const char *loss = loss_of(o, (int)p.fmt);
    p.masked = strcmp(loss, "all") != 0;
    p.has_tpl = o->chat_template && chat_template_parse(o->chat_template, &p.tpl) == 0;
    if (in->n == 0) {
        ERR("no input files");
        return PREP_EDATA;
    }
    rc = PREP_EIO;
    if (tok_open(o->tokenizer, &p.t, err, errlen) != 0) {
        rc = PREP_EDATA;
        goto out;
    }
    int64_t eos = tok_token_id(p.t, "eos");
    if (eos < 0) {
        ERR("%s: the tokenizer has no EOS token", o->tokenizer);
        rc = PREP_EDATA;
        goto out;
    }
    p.eos = (uint32_t)eos;
    uint32_t vocab = tok_vocab_size(p.t);
    int version = vocab > 65536 ? 2 : 1;
    size_t cap = o->shard_tokens > 0 ? (size_t)o->shard_tokens : 100000000;
    p.train = (struct tsplit){.name = "train", .cap = cap, .version = version, .masked = p.masked};
    p.val = p.train;
    p.val.name = "val";
    p.train.tok = malloc(cap * 4);
    p.val.tok = malloc(cap * 4);
    p.train.mask = malloc(cap);
    p.val.mask = malloc(cap);
    r.md = EVP_MD_CTX_new();
    if (!r.md || !p.train.tok || !p.val.tok || !p.train.mask || !p.val.mask) {
        ERR("out of memory");
        goto out;
    }
    for (int k = 0; k < nw; k++) {
        ws[k].p = &p;
        if (!(ws[k].enc = tok_enc_new(p.t))) {
            ERR("out of memory");
            goto out;
        }
    }
    r.ws = ws;
    r.nw = nw;
    EVP_DigestInit_ex(r.md, EVP_sha256(), NULL);
    if (sha_tokenizer(r.md, o->tokenizer, err, errlen) != 0) goto out;
    char optstr[512];
    opt_string(o, optstr, sizeof optstr);
    EVP_DigestUpdate(r.md, optstr, strlen(optstr));
    for (size_t i = 0; i < in->n; i++) {
        struct stat st;
        if (stat(in->v[i], &st) == 0) r.total += (uint64_t)st.st_size;
    }
    progress(&r, 0);
    for (size_t i = 0; i < in->n; i++) {
        rc = p.fmt == F_WEBDATASET ? read_tar(&r, in->v[i], err, errlen)
                                   : read_file(&r, in->v[i], err, errlen);
        if (rc != PREP_OK) goto out;
    }
    rc = PREP_EIO;
    if (tsplit_flush(&p.train, out, err, errlen) != 0 ||
        tsplit_flush(&p.val, out, err, errlen) != 0)
        goto out;
    progress(&r, r.total);
    if (p.train.total == 0) {
        ERR("no training examples remain: %" PRIu64 " read, %" PRIu64 " empty, %" PRIu64
            " with every token masked, %" PRIu64 " dropped as longer than seq_len %ld",
            p.examples, p.empty, p.all_masked, p.dropped, o->seq_len);
        rc = PREP_EDATA;
        goto out;
    }
    unsigned char dig[32];
    char hex[65];
    EVP_DigestFinal_ex(r.md, dig, NULL);
    hex32(dig, hex);
    json_t *sources = json_array();
    for (size_t i = 0; i < in->n; i++)
        json_array_append_new(sources, json_string(in->v[i]));
    const char *ol = o->overlong ? o->overlong : "truncate";
    json_t *meta = json_pack(
        "{s:s,s:s,s:i,s:I,s:s,s:s,s:i,s:f,s:I,s:s,s:{s:I,s:I,s:I,s:I,s:I,s:I},s:I,s:I,s:I,s:I,"
        "s:I,s:I,s:i,s:i,s:b,s:s,s:o}",
        "tokenizer", o->tokenizer, "tokenizer_kind", tok_kind(p.t), "vocab_size", (int)vocab,
        "eos_token", (json_int_t)p.eos, "format", fmt_names[p.fmt], "loss_on", loss,
        "shard_version", version, "val_fraction", o->val_fraction, "seq_len",
        (json_int_t)o->seq_len, "overlong", ol, "examples", "read", (json_int_t)p.examples, "kept",
        (json_int_t)p.kept, "empty", (json_int_t)p.empty, "all_masked", (json_int_t)p.all_masked,
        "truncated", (json_int_t)p.truncated, "dropped", (json_int_t)p.dropped, "train_examples",
        (json_int_t)p.train.examples, "val_examples", (json_int_t)p.val.examples, "train_tokens",
        (json_int_t)p.train.total, "val_tokens", (json_int_t)p.val.total, "train_loss_tokens",
        (json_int_t)p.train.counted, "val_loss_tokens", (json_int_t)p.val.counted, "train_shards",
        p.train.shards, "val_shards", p.val.shards, "mask", p.masked, "content_sha256", hex,
        "sources", sources);
    if (!meta) {
        ERR("out of memory");
        goto out;
    }
    if (p.fmt == F_CHAT || (p.fmt == F_WEBDATASET && o->chat_template))
        json_object_set_new(meta, "chat_template", json_string(o->chat_template));
    if (p.fmt == F_JSONL || p.fmt == F_WEBDATASET)
        json_object_set_new(meta, "text_key", json_string(o->text_key ? o->text_key : "text"));
    if (p.fmt == F_WEBDATASET)
        json_object_set_new(meta, "skipped_members", json_integer((json_int_t)p.skipped_members));
    json_object_set_new(meta, "input_bytes", json_integer((json_int_t)r.total));
    char mpath[PATH_MAX];
    snprintf(mpath, sizeof mpath, "%s/meta.json", out);
    if (json_dump_file(meta, mpath,
                       JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) != 0) {
        ERR("cannot write %s", mpath);
        json_decref(meta);
        goto out;
    }
    if (meta_out)
        *meta_out = meta;
    else
        json_decref(meta);
    rc = PREP_OK;
out:
    for (int k = 0; k < nw; k++) {
        tok_enc_free(ws[k].enc);
        tok_ids_free(&ws[k].ids);
        tok_ids_free(&ws[k].out);
        chat_mask_free(&ws[k].mask);
        chat_mask_free(&ws[k].outm);
    }
    free(r.items);
    EVP_MD_CTX_free(r.md);
    free(p.train.tok);
    free(p.val.tok);
    free(p.train.mask);
    free(p.val.mask);
    tok_ids_free(&p.ids);
    chat_mask_free(&p.mask);
    tok_free(p.t);
    return rc;
}
