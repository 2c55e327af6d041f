/* Hugging Face tokenizer.json with a BPE model.
 *
 * The pipeline of the `tokenizers` library, for the parts the model families Loom trains use
 * (GPT-2, Llama 3, Qwen2, Mistral-Nemo; Llama 2 / Mistral style files converted from
 * SentencePiece):
 *   1. added tokens are cut out of the raw text first (special ones only with
 *      TOK_ALLOW_SPECIAL; non-special added tokens always, as the library does);
 *   2. normalizer: none, NFC/NFD/NFKC/NFKD (utf8proc), Prepend, Replace, Sequence;
 *   3. pre-tokenizer: Split (regex from the file, behaviours Isolated and Removed), ByteLevel
 *      (the GPT-2 regex when use_regex), Sequence; regexes run in PCRE2 (UTF + UCP, JIT);
 *   4. model BPE: byte-level (every vocabulary string is mapped back through GPT-2's
 *      byte-to-unicode table, so the model works on raw bytes) or character-level with
 *      byte_fallback (<0xAB> tokens) for SentencePiece-converted files; merges by rank,
 *      leftmost first on ties; ignore_merges; a per-encoder cache of pre-token results.
 *   5. decoder: ByteLevel (exact inverse), or Replace/ByteFallback/Fuse/Strip.
 * Anything else in a file (WordPiece, Unigram, other pre-tokenizers, dropout, subword
 * prefixes) is refused at load with a message naming the file and the value.
 *
 * Hash tables are written here (open addressing over FNV-1a) because none of the libraries
 * Loom may use (jansson, PCRE2, utf8proc) offers one. */
/* Ids at most this - 1: 16M, 4x the largest vocab_size a job spec takes (api/jobspec.c). */
#define TOK_BPE_MAX_ID (1 << 24)
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <utf8proc.h>

#include "common/buf.h"
#include "common/hash.h"
#include "data/tok_impl.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)

/* GPT-2's pre-tokenizer regex: what ByteLevel with use_regex applies. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- byte strings -> u32 ---------------------------------------------------------------- */

struct strmap {
    uint32_t *slot; /* entry index + 1; 0 = empty */
    size_t mask;
    struct sm_ent {
        uint64_t h;
        uint32_t off, len, val;
    } * ent;
    size_t n, cap;
    char *pool;
    size_t pool_n, pool_cap;
};

static void strmap_free(struct strmap *m) {
    free(m->slot);
    free(m->ent);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

static int strmap_rehash(struct strmap *m, size_t nslots) {
    uint32_t *s = calloc(nslots, sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = m->ent[i].h & (nslots - 1);
        while (s[j])
            j = (j + 1) & (nslots - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(m->slot);
    m->slot = s;
    m->mask = nslots - 1;
    return 0;
}

static inline const struct sm_ent *strmap_find_h(const struct strmap *m, const char *p, size_t n,
                                                 uint64_t h) {
    if (!m->slot) return NULL;
    for (size_t j = h & m->mask;; j = (j + 1) & m->mask) {
        uint32_t e = m->slot[j];
        if (!e) return NULL;
        const struct sm_ent *x = &m->ent[e - 1];
        if (x->h == h && x->len == n && memcmp(m->pool + x->off, p, n) == 0) return x;
    }
}

static inline const struct sm_ent *strmap_find(const struct strmap *m, const char *p, size_t n) {
    return strmap_find_h(m, p, n, loom_fnv1a(LOOM_FNV1A_INIT, p, n));
}

/* Insert (or overwrite) p -> val. */
static int strmap_put(struct strmap *m, const char *p, size_t n, uint32_t val) {
    uint64_t h = loom_fnv1a(LOOM_FNV1A_INIT, p, n);
    const struct sm_ent *old = strmap_find_h(m, p, n, h);
    if (old) {
        m->ent[old - m->ent].val = val;
        return 0;
    }
    if ((m->n + 1) * 2 > (m->slot ? m->mask + 1 : 0) &&
        strmap_rehash(m, m->slot ? (m->mask + 1) * 2 : 1024) != 0)
        return -1;
    if (m->n == m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 1024;
        struct sm_ent *ne = realloc(m->ent, nc * sizeof *ne);
        if (!ne) return -1;
        m->ent = ne;
        m->cap = nc;
    }
    if (m->pool_n + n > m->pool_cap) {
        size_t nc = m->pool_cap ? m->pool_cap : 1 << 16;
        while (nc < m->pool_n + n)
            nc *= 2;
        char *np = realloc(m->pool, nc);
        if (!np) return -1;
        m->pool = np;
        m->pool_cap = nc;
    }
    if (n) memcpy(m->pool + m->pool_n, p, n); /* an empty key: the pool may still be NULL */
    m->ent[m->n] = (struct sm_ent){h, (uint32_t)m->pool_n, (uint32_t)n, val};
    m->pool_n += n;
    size_t j = h & m->mask;
    while (m->slot[j])
        j = (j + 1) & m->mask;
    m->slot[j] = (uint32_t)++m->n;
    return 0;
}

/* ---- merge pairs (a, b) -> (rank, merged id) ------------------------------------------ */

struct pairmap {
    struct pm_ent {
        uint64_t key; /* a << 32 | b */
        uint32_t rank, id;
    } * slot; /* rank UINT32_MAX = empty */
    size_t mask, n;
};

static inline size_t pair_hash(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
}

static int pairmap_init(struct pairmap *m, size_t expect) {
    size_t ns = 1024;
    while (ns < expect * 2)
        ns *= 2;
    m->slot = malloc(ns * sizeof *m->slot);
    if (!m->slot) return -1;
    memset(m->slot, 0xff, ns * sizeof *m->slot);
    m->mask = ns - 1;
    m->n = 0;
    return 0;
}

static inline const struct pm_ent *pairmap_find(const struct pairmap *m, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t j = pair_hash(key, m->mask);; j = (j + 1) & m->mask) {
        const struct pm_ent *e = &m->slot[j];
        if (e->rank == UINT32_MAX) return NULL;
        if (e->key == key) return e;
    }
}

/* Insert unless present (a pair listed twice keeps its first, lowest rank). */
static void pairmap_put(struct pairmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    uint64_t key = (uint64_t)a << 32 | b;
    size_t j = pair_hash(key, m->mask);
    for (; m->slot[j].rank != UINT32_MAX; j = (j + 1) & m->mask)
        if (m->slot[j].key == key) return;
    m->slot[j] = (struct pm_ent){key, rank, id};
    m->n++;
}

/* ---- the loaded tokenizer -------------------------------------------------------------- */

enum norm_kind { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE };
struct norm {
    enum norm_kind kind;
    char *a, *b; /* Prepend: a = text; Replace: a = pattern (literal), b = content */
    size_t alen, blen;
};

enum pre_kind { PRE_SPLIT, PRE_BYTELEVEL };
enum split_behavior { SPLIT_ISOLATED, SPLIT_REMOVED };
struct pre {
    enum pre_kind kind;
    pcre2_code *re; /* NULL: ByteLevel without use_regex */
    int jit;
    enum split_behavior behavior;
    int add_prefix_space;
};

enum dec_kind { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP };
struct dec {
    enum dec_kind kind;
    char *a, *b;
    size_t alen, blen;
    int start, stop; /* Strip */
};

struct added {
    char *s;
    size_t len;
    uint32_t id;
    unsigned char special, lstrip, rstrip, single_word;
};

#define MAX_STEPS 16

struct bpe {
    char *path;
    struct strmap vocab; /* token bytes (raw bytes when byte-level) -> id */
    struct pairmap merges;
    int byte_level, ignore_merges, byte_fallback;
    int64_t unk_id;
    uint32_t byte_id[256]; /* byte-level: the token of each byte; fallback: <0xAB> */
    unsigned char byte_ok[256];
    struct norm norm[MAX_STEPS];
    int nnorm;
    struct pre pre[MAX_STEPS];
    int npre;
    struct dec dec[MAX_STEPS];
    int ndec;
    struct added *added; /* sorted by first byte, then longest first */
    size_t nadded;
    uint16_t added_start[257]; /* added[added_start[c] .. added_start[c+1]) start with byte c */
    unsigned char first_any[256], first_plain[256]; /* a candidate starts with this byte */
    uint32_t vocab_size;
    uint32_t *dec_off, *dec_len; /* id -> bytes in dec_pool (len UINT32_MAX: no such id) */
    char *dec_pool;
};

/* ---- GPT-2 byte <-> unicode ------------------------------------------------------------ */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes get the code points from
 * U+0100 on, in byte order (the table GPT-2 introduced). */
static void byte_unicode_tables(uint32_t b2u[256], int u2b[324]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        b2u[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int i = 0; i < 324; i++)
        u2b[i] = -1;
    for (int b = 0; b < 256; b++)
        u2b[b2u[b]] = b;
}

/* Byte-level string (UTF-8 of mapped code points) -> raw bytes in out (cap >= len). Returns the
 * raw length, or -1 when a code point is not in the table. */
static long unmap_bytes(const int u2b[324], const char *s, size_t len, char *out) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0 || cp < 0 || cp >= 324 || u2b[cp] < 0) return -1;
        out[n++] = (char)u2b[cp];
        i += (size_t)k;
    }
    return (long)n;
}

/* ---- loading --------------------------------------------------------------------------- */

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int compile_re(const char *path, const char *what, const char *pat, size_t len, int literal,
                      pcre2_code **re, int *jit, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    *re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &ec, &eo, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        ERR("%s: %s regex \"%s\" does not compile at offset %zu: %s", path, what, pat, (size_t)eo,
            (char *)msg);
        return -1;
    }
    *jit = pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

/* The pattern of a Split or Replace: {"Regex": "..."} or {"String": "..."}. */
static int get_pattern(json_t *o, const char **pat, int *literal) {
    json_t *p = json_object_get(o, "pattern");
    if (json_is_string(p)) { /* some writers store a bare string */
        *pat = json_string_value(p);
        *literal = 1;
        return 0;
    }
    if ((*pat = jstr(p, "Regex"))) {
        *literal = 0;
        return 0;
    }
    if ((*pat = jstr(p, "String"))) {
        *literal = 1;
        return 0;
    }
    return -1;
}

static int load_normalizer(struct bpe *b, json_t *n, char *err, size_t errlen) {
    if (!n || json_is_null(n)) return 0;
    const char *type = jstr(n, "type");
    if (!type) {
        ERR("%s: normalizer without a \"type\"", b->path);
        return -1;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers"), *x;
        size_t i;
        json_array_foreach(list, i, x) if (load_normalizer(b, x, err, errlen) != 0) return -1;
        return 0;
    }
    if (b->nnorm == MAX_STEPS) {
        ERR("%s: more than %d normalizers", b->path, MAX_STEPS);
        return -1;
    }
    struct norm *s = &b->norm[b->nnorm];
    static const struct {
        const char *name;
        enum norm_kind kind;
    } simple[] = {{"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC}, {"NFKD", NORM_NFKD}};
    for (size_t i = 0; i < sizeof simple / sizeof *simple; i++)
        if (strcmp(type, simple[i].name) == 0) {
            s->kind = simple[i].kind;
            b->nnorm++;
            return 0;
        }
    if (strcmp(type, "Prepend") == 0) {
        const char *p = jstr(n, "prepend");
        if (!p) {
            ERR("%s: Prepend normalizer without \"prepend\"", b->path);
            return -1;
        }
        s->kind = NORM_PREPEND;
        s->a = strdup(p);
        s->alen = strlen(p);
        b->nnorm++;
        return 0;
    }
    if (strcmp(type, "Replace") == 0) {
        const char *pat = NULL, *content = jstr(n, "content");
        int literal = 0;
        if (get_pattern(n, &pat, &literal) != 0 || !content) {
            ERR("%s: Replace normalizer needs \"pattern\" and \"content\"", b->path);
            return -1;
        }
        if (!literal) {
            ERR("%s: Replace normalizer with a regex pattern (\"%s\") is not supported", b->path,
                pat);
            return -1;
        }
        if (!*pat) { /* checked before anything is owned by the step */
            ERR("%s: Replace normalizer with an empty pattern", b->path);
            return -1;
        }
        s->kind = NORM_REPLACE;
        s->a = strdup(pat);
        s->alen = strlen(pat);
        s->b = strdup(content);
        s->blen = strlen(content);
        b->nnorm++;
        return 0;
    }
    ERR("%s: normalizer type \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, "
        "Replace, Sequence)",
        b->path, type);
    return -1;
}

static int load_pretokenizer(struct bpe *b, json_t *p, char *err, size_t errlen) {
    if (!p || json_is_null(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) {
        ERR("%s: pre_tokenizer without a \"type\"", b->path);
        return -1;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers"), *x;
        size_t i;
        json_array_foreach(list, i, x) if (load_pretokenizer(b, x, err, errlen) != 0) return -1;
        return 0;
    }
    if (b->npre == MAX_STEPS) {
        ERR("%s: more than %d pre-tokenizers", b->path, MAX_STEPS);
        return -1;
    }
    struct pre *s = &b->pre[b->npre];
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = PRE_BYTELEVEL;
        /* The library's defaults when a field is missing. */
        s->add_prefix_space = jbool(p, "add_prefix_space", 1);
        if (jbool(p, "use_regex", 1) &&
            compile_re(b->path, "ByteLevel", gpt2_pattern, sizeof gpt2_pattern - 1, 0, &s->re,
                       &s->jit, err, errlen) != 0)
            return -1;
        b->byte_level = 1;
        b->npre++;
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        const char *pat = NULL, *beh = jstr(p, "behavior");
        int literal = 0;
        if (get_pattern(p, &pat, &literal) != 0) {
            ERR("%s: Split pre-tokenizer without a \"pattern\"", b->path);
            return -1;
        }
        if (jbool(p, "invert", 0)) {
            ERR("%s: Split pre-tokenizer with \"invert\": true is not supported", b->path);
            return -1;
        }
        if (beh && strcmp(beh, "Isolated") == 0) {
            s->behavior = SPLIT_ISOLATED;
        } else if (beh && strcmp(beh, "Removed") == 0) {
            s->behavior = SPLIT_REMOVED;
        } else {
            ERR("%s: Split behavior \"%s\" is not supported (supported: Isolated, Removed)",
                b->path, beh ? beh : "(none)");
            return -1;
        }
        s->kind = PRE_SPLIT;
        if (compile_re(b->path, "Split", pat, strlen(pat), literal, &s->re, &s->jit, err, errlen) !=
            0)
            return -1;
        b->npre++;
        return 0;
    }
    ERR("%s: pre_tokenizer type \"%s\" is not supported (supported: ByteLevel, Split, Sequence)",
        b->path, type);
    return -1;
}

static int load_decoder(struct bpe *b, json_t *d, char *err, size_t errlen) {
    if (!d || json_is_null(d)) return 0;
    const char *type = jstr(d, "type");
    if (!type) {
        ERR("%s: decoder without a \"type\"", b->path);
        return -1;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(d, "decoders"), *x;
        size_t i;
        json_array_foreach(list, i, x) if (load_decoder(b, x, err, errlen) != 0) return -1;
        return 0;
    }
    if (b->ndec == MAX_STEPS) {
        ERR("%s: more than %d decoders", b->path, MAX_STEPS);
        return -1;
    }
    struct dec *s = &b->dec[b->ndec];
    static const struct {
        const char *name;
        enum dec_kind kind;
    } simple[] = {
        {"ByteLevel", DEC_BYTELEVEL}, {"ByteFallback", DEC_BYTEFALLBACK}, {"Fuse", DEC_FUSE}};
    for (size_t i = 0; i < sizeof simple / sizeof *simple; i++)
        if (strcmp(type, simple[i].name) == 0) {
            s->kind = simple[i].kind;
            b->ndec++;
            return 0;
        }
    if (strcmp(type, "Replace") == 0) {
        const char *pat = NULL, *content = jstr(d, "content");
        int literal = 0;
        if (get_pattern(d, &pat, &literal) != 0 || !literal || !content || !*pat) {
            ERR("%s: Replace decoder needs a \"String\" pattern and \"content\"", b->path);
            return -1;
        }
        s->kind = DEC_REPLACE;
        s->a = strdup(pat);
        s->alen = strlen(pat);
        s->b = strdup(content);
        s->blen = strlen(content);
        b->ndec++;
        return 0;
    }
    if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(d, "content");
        if (!c || strcmp(c, " ") != 0) {
            ERR("%s: Strip decoder with content \"%s\" is not supported (only \" \")", b->path,
                c ? c : "(none)");
            return -1;
        }
        s->kind = DEC_STRIP;
        s->start = (int)json_integer_value(json_object_get(d, "start"));
        s->stop = (int)json_integer_value(json_object_get(d, "stop"));
        b->ndec++;
        return 0;
    }
    ERR("%s: decoder type \"%s\" is not supported (supported: ByteLevel, Replace, ByteFallback, "
        "Fuse, Strip, Sequence)",
        b->path, type);
    return -1;
}

/* Vocabulary key -> the bytes the model works on. */
static long key_bytes(const struct bpe *b, const int u2b[324], const char *s, char *out) {
    size_t len = strlen(s);
    if (!b->byte_level) {
        memcpy(out, s, len);
        return (long)len;
    }
    return unmap_bytes(u2b, s, len, out);
}

static int cmp_added(const void *x, const void *y) {
    const struct added *a = x, *b = y;
    unsigned char ca = (unsigned char)a->s[0], cb = (unsigned char)b->s[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return memcmp(a->s, b->s, a->len);
}

static int set_dec(struct bpe *b, uint32_t id, const char *s, size_t n, size_t *pool_n,
                   size_t *pool_cap) {
    if (*pool_n + n > *pool_cap) {
        size_t nc = *pool_cap ? *pool_cap * 2 : 1 << 20;
        while (nc < *pool_n + n)
            nc *= 2;
        char *np = realloc(b->dec_pool, nc);
        if (!np) return -1;
        b->dec_pool = np;
        *pool_cap = nc;
    }
    memcpy(b->dec_pool + *pool_n, s, n);
    b->dec_off[id] = (uint32_t)*pool_n;
    b->dec_len[id] = (uint32_t)n;
    *pool_n += n;
    return 0;
}

static void bpe_free(void *impl);

static int load_model(struct bpe *b, json_t *root, char *err, size_t errlen) {
    json_t *model = json_object_get(root, "model");
    const char *type = jstr(model, "type");
    if (!json_is_object(model)) {
        ERR("%s: no \"model\" object", b->path);
        return -1;
    }
    if (!type && json_object_get(model, "merges")) type = "BPE"; /* old files omit it */
    if (!type || strcmp(type, "BPE") != 0) {
        ERR("%s: model type \"%s\" is not supported (supported: BPE)", b->path,
            type ? type : "(none)");
        return -1;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) != 0.0) {
        ERR("%s: BPE dropout %g is not supported (encoding must be deterministic)", b->path,
            json_number_value(dropout));
        return -1;
    }
    const char *csp = jstr(model, "continuing_subword_prefix"),
               *eow = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow)) {
        ERR("%s: BPE with continuing_subword_prefix \"%s\" / end_of_word_suffix \"%s\" is not "
            "supported",
            b->path, csp ? csp : "", eow ? eow : "");
        return -1;
    }
    b->ignore_merges = jbool(model, "ignore_merges", 0);
    b->byte_fallback = jbool(model, "byte_fallback", 0);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        ERR("%s: BPE model needs a \"vocab\" object and a \"merges\" array", b->path);
        return -1;
    }
    uint32_t b2u[256];
    int u2b[324];
    byte_unicode_tables(b2u, u2b);
    char buf[4096];
    const char *key;
    json_t *v;
    uint64_t max_id = 0;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= (json_int_t)UINT32_MAX - 1) {
            ERR("%s: vocab entry \"%s\" has id %s, not an integer in [0, 2^32-2)", b->path, key,
                json_is_integer(v) ? "out of range" : "of another type");
            return -1;
        }
        if (strlen(key) >= sizeof buf) {
            ERR("%s: vocab entry of %zu bytes is too long", b->path, strlen(key));
            return -1;
        }
        long n = key_bytes(b, u2b, key, buf);
        if (n < 0) {
            ERR("%s: vocab entry \"%s\" (id %lld) is not a byte-level string (a ByteLevel "
                "pre-tokenizer is set)",
                b->path, key, (long long)id);
            return -1;
        }
        if (strmap_put(&b->vocab, buf, (size_t)n, (uint32_t)id) != 0) goto oom;
        if ((uint64_t)id + 1 > max_id) max_id = (uint64_t)id + 1;
    }
    /* Byte tokens: the byte's own string (byte-level) or <0xAB> (byte_fallback). */
    for (int c = 0; c < 256; c++) {
        const struct sm_ent *e;
        if (b->byte_level) {
            char ch = (char)c;
            e = strmap_find(&b->vocab, &ch, 1);
        } else {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", c);
            e = strmap_find(&b->vocab, name, strlen(name));
        }
        if (e) {
            b->byte_id[c] = e->val;
            b->byte_ok[c] = 1;
        }
    }
    b->unk_id = -1;
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        const struct sm_ent *e = strmap_find(&b->vocab, unk, strlen(unk));
        if (!e) {
            ERR("%s: unk_token \"%s\" is not in the vocabulary", b->path, unk);
            return -1;
        }
        b->unk_id = e->val;
    }
    for (int c = 0; c < 256 && b->byte_fallback && !b->byte_level && b->unk_id < 0; c++)
        if (!b->byte_ok[c]) {
            ERR("%s: byte_fallback without an unk_token needs all 256 <0xAB> tokens; <0x%02X> "
                "is missing",
                b->path, c);
            return -1;
        }
    if (pairmap_init(&b->merges, json_array_size(merges)) != 0) goto oom;
    size_t r;
    json_array_foreach(merges, r, v) {
        const char *l = NULL, *rt = NULL;
        char pair[4096];
        if (json_is_string(v)) {
            const char *s = json_string_value(v), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ') || strlen(s) >= sizeof pair) {
                ERR("%s: merge %zu \"%s\" is not \"left right\"", b->path, r, s);
                return -1;
            }
            memcpy(pair, s, strlen(s) + 1);
            pair[sp - s] = 0;
            l = pair;
            rt = pair + (sp - s) + 1;
        } else if (json_is_array(v) && json_array_size(v) == 2) {
            l = json_string_value(json_array_get(v, 0));
            rt = json_string_value(json_array_get(v, 1));
        }
        if (!l || !rt) {
            ERR("%s: merge %zu is neither \"left right\" nor [\"left\", \"right\"]", b->path, r);
            return -1;
        }
        if (strlen(l) + strlen(rt) >= sizeof buf) {
            ERR("%s: merge %zu is too long", b->path, r);
            return -1;
        }
        long nl = key_bytes(b, u2b, l, buf), nr = nl < 0 ? -1 : key_bytes(b, u2b, rt, buf + nl);
        const struct sm_ent *el = nl < 0 ? NULL : strmap_find(&b->vocab, buf, (size_t)nl);
        const struct sm_ent *er = nr < 0 ? NULL : strmap_find(&b->vocab, buf + nl, (size_t)nr);
        const struct sm_ent *em = el && er ? strmap_find(&b->vocab, buf, (size_t)(nl + nr)) : NULL;
        if (!em) {
            ERR("%s: merge %zu (\"%s\" \"%s\"): %s is not in the vocabulary", b->path, r, l, rt,
                !el   ? "the left part"
                : !er ? "the right part"
                      : "the merged token");
            return -1;
        }
        pairmap_put(&b->merges, el->val, er->val, (uint32_t)r, em->val);
    }
    /* Added tokens. */
    json_t *added = json_object_get(root, "added_tokens");
    size_t na = json_array_size(added), i;
    b->added = calloc(na ? na : 1, sizeof *b->added);
    if (!b->added) goto oom;
    json_array_foreach(added, i, v) {
        const char *content = jstr(v, "content");
        json_t *jid = json_object_get(v, "id");
        if (!content || !*content || !json_is_integer(jid) || json_integer_value(jid) < 0 ||
            json_integer_value(jid) >= (json_int_t)UINT32_MAX - 1) {
            ERR("%s: added_tokens[%zu] needs a non-empty \"content\" and an \"id\" in range",
                b->path, i);
            return -1;
        }
        struct added *a = &b->added[b->nadded++];
        a->s = strdup(content);
        a->len = strlen(content);
        a->id = (uint32_t)json_integer_value(jid);
        a->special = (unsigned char)jbool(v, "special", 0);
        a->lstrip = (unsigned char)jbool(v, "lstrip", 0);
        a->rstrip = (unsigned char)jbool(v, "rstrip", 0);
        a->single_word = (unsigned char)jbool(v, "single_word", 0);
        if (!a->s) goto oom;
        if ((uint64_t)a->id + 1 > max_id) max_id = (uint64_t)a->id + 1;
    }
    if (b->nadded > UINT16_MAX) {
        ERR("%s: %zu added tokens (at most %d)", b->path, b->nadded, UINT16_MAX);
        return -1;
    }
    qsort(b->added, b->nadded, sizeof *b->added, cmp_added);
    for (int c = 0, k = 0; c <= 256; c++) {
        while (k < (int)b->nadded && (unsigned char)b->added[k].s[0] < c)
            k++;
        b->added_start[c] = (uint16_t)k;
    }
    for (size_t k = 0; k < b->nadded; k++) {
        unsigned char c = (unsigned char)b->added[k].s[0];
        b->first_any[c] = 1;
        if (!b->added[k].special) b->first_plain[c] = 1;
    }
    /* Decode table: vocabulary bytes, then added tokens' text over them. Its size is the
     * largest id + 1: refuse ids past any real vocabulary rather than allocate for them. */
    if (max_id > TOK_BPE_MAX_ID) {
        ERR("%s: token id %llu is past the largest supported id %d", b->path,
            (unsigned long long)(max_id - 1), TOK_BPE_MAX_ID - 1);
        return -1;
    }
    b->vocab_size = (uint32_t)max_id;
    b->dec_off = calloc(max_id ? max_id : 1, sizeof *b->dec_off);
    b->dec_len = malloc((max_id ? max_id : 1) * sizeof *b->dec_len);
    if (!b->dec_off || !b->dec_len) goto oom;
    memset(b->dec_len, 0xff, max_id * sizeof *b->dec_len);
    size_t pool_n = 0, pool_cap = 0;
    for (size_t k = 0; k < b->vocab.n; k++) {
        const struct sm_ent *e = &b->vocab.ent[k];
        if (set_dec(b, e->val, b->vocab.pool + e->off, e->len, &pool_n, &pool_cap) != 0) goto oom;
    }
    for (size_t k = 0; k < b->nadded; k++)
        if (set_dec(b, b->added[k].id, b->added[k].s, b->added[k].len, &pool_n, &pool_cap) != 0)
            goto oom;
    return 0;
oom:
    ERR("%s: out of memory", b->path);
    return -1;
}

int tok_bpe_load(const char *path, void **impl, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    struct bpe *b = NULL;
    int rc = -1;
    if (!root) {
        if (je.line < 1)
            ERR("%s: cannot read: %s", path, je.text);
        else
            ERR("%s: invalid JSON at line %d column %d: %s", path, je.line, je.column, je.text);
        goto out;
    }
    if (!json_is_object(root)) {
        ERR("%s: not a tokenizer.json (the top level is not an object)", path);
        goto out;
    }
    b = calloc(1, sizeof *b);
    if (!b || !(b->path = strdup(path))) {
        ERR("%s: out of memory", path);
        goto out;
    }
    if (load_normalizer(b, json_object_get(root, "normalizer"), err, errlen) != 0 ||
        load_pretokenizer(b, json_object_get(root, "pre_tokenizer"), err, errlen) != 0 ||
        load_decoder(b, json_object_get(root, "decoder"), err, errlen) != 0)
        goto out;
    int dec_bl = 0;
    for (int i = 0; i < b->ndec; i++)
        dec_bl |= b->dec[i].kind == DEC_BYTELEVEL;
    if (dec_bl != b->byte_level) {
        ERR("%s: a ByteLevel %s without a ByteLevel %s is not supported", path,
            b->byte_level ? "pre_tokenizer" : "decoder",
            b->byte_level ? "decoder" : "pre_tokenizer");
        goto out;
    }
    if (load_model(b, root, err, errlen) != 0) goto out;
    if (!b->byte_level && !b->byte_fallback && b->unk_id < 0) {
        ERR("%s: a character-level BPE needs byte_fallback or an unk_token", path);
        goto out;
    }
    if (b->byte_level)
        for (int c = 0; c < 256; c++)
            if (!b->byte_ok[c]) {
                ERR("%s: byte-level vocabulary has no token for byte 0x%02x", path, c);
                goto out;
            }
    *impl = b;
    b = NULL;
    rc = 0;
out:
    bpe_free(b);
    json_decref(root);
    return rc;
}

static void bpe_free(void *impl) {
    struct bpe *b = impl;
    if (!b) return;
    strmap_free(&b->vocab);
    free(b->merges.slot);
    for (int i = 0; i < b->nnorm; i++) {
        free(b->norm[i].a);
        free(b->norm[i].b);
    }
    for (int i = 0; i < b->npre; i++)
        pcre2_code_free(b->pre[i].re);
    for (int i = 0; i < b->ndec; i++) {
        free(b->dec[i].a);
        free(b->dec[i].b);
    }
    for (size_t i = 0; i < b->nadded; i++)
        free(b->added[i].s);
    free(b->added);
    free(b->dec_off);
    free(b->dec_len);
    free(b->dec_pool);
    free(b->path);
    free(b);
}

static uint32_t bpe_vocab_size(const void *impl) {
    return ((const struct bpe *)impl)->vocab_size;
}

static int64_t bpe_piece_id(const void *impl, const char *text) {
    const struct bpe *b = impl;
    size_t n = strlen(text);
    for (size_t i = 0; i < b->nadded; i++)
        if (b->added[i].len == n && memcmp(b->added[i].s, text, n) == 0) return b->added[i].id;
    const struct sm_ent *e = strmap_find(&b->vocab, text, n);
    return e ? (int64_t)e->val : -1;
}

static int64_t bpe_role_id(const void *impl, const char *role) {
    const struct bpe *b = impl;
    return strcmp(role, "unk") == 0 ? b->unk_id : -1;
}

/* ---- encoding -------------------------------------------------------------------------- */

#define CACHE_MAX_LEN 64     /* pre-tokens longer than this are not cached */
#define CACHE_MAX_ENT 400000 /* the cache is emptied when it holds this many */

struct cache {
    uint32_t *slot; /* entry index + 1 */
    size_t mask;
    struct c_ent {
        uint64_t h;
        uint32_t off, len, ioff, ilen;
    } * ent;
    size_t n, cap;
    char *bytes;
    size_t nb, capb;
    uint32_t *ids;
    size_t ni, capi;
};

struct bpe_enc {
    const struct bpe *b;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    struct cache cache;
    struct buf norm[2];
    uint32_t *sym, *rank;
    int32_t *prev, *next;
    struct heap_ent {
        uint32_t rank, pos;
    } * heap;
    size_t sym_cap, heap_cap;
    char *err;
    size_t errlen;
    int failed;
};

static void cache_free(struct cache *c) {
    free(c->slot);
    free(c->ent);
    free(c->bytes);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

static void *bpe_enc_new(const void *impl) {
    struct bpe_enc *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->b = impl;
    e->md = pcre2_match_data_create(4, NULL);
    e->mctx = pcre2_match_context_create(NULL);
    /* Long whitespace runs backtrack through \s+(?!\S): give JIT more than its 32 KiB. */
    e->jstack = pcre2_jit_stack_create(64 << 10, 8 << 20, NULL);
    if (!e->md || !e->mctx || !e->jstack) {
        pcre2_match_data_free(e->md);
        pcre2_match_context_free(e->mctx);
        pcre2_jit_stack_free(e->jstack);
        free(e);
        return NULL;
    }
    pcre2_jit_stack_assign(e->mctx, NULL, e->jstack);
    e->cache.slot = calloc(1 << 20, sizeof *e->cache.slot);
    e->cache.mask = (1 << 20) - 1;
    if (!e->cache.slot) {
        e->cache.mask = 0;
    }
    return e;
}

static void bpe_enc_free(void *enc) {
    struct bpe_enc *e = enc;
    if (!e) return;
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jstack);
    cache_free(&e->cache);
    free(e->norm[0].p);
    free(e->norm[1].p);
    free(e->sym);
    free(e->rank);
    free(e->prev);
    free(e->next);
    free(e->heap);
    free(e);
}

static inline const struct c_ent *cache_find(const struct cache *c, const char *p, size_t n,
                                             uint64_t h) {
    for (size_t j = h & c->mask;; j = (j + 1) & c->mask) {
        uint32_t k = c->slot[j];
        if (!k) return NULL;
        const struct c_ent *x = &c->ent[k - 1];
        if (x->h == h && x->len == n && memcmp(c->bytes + x->off, p, n) == 0) return x;
    }
}

static void cache_put(struct cache *c, const char *p, size_t n, uint64_t h, const uint32_t *ids,
                      size_t ni) {
    if (c->n >= CACHE_MAX_ENT) { /* full: start over (cheap, and bounds memory) */
        memset(c->slot, 0, (c->mask + 1) * sizeof *c->slot);
        c->n = c->nb = c->ni = 0;
    }
    if (buf_grow_array(&c->ent, &c->cap, c->n + 1, sizeof *c->ent, 1024) != 0 ||
        buf_grow_array(&c->bytes, &c->capb, c->nb + n, 1, 1 << 16) != 0 ||
        buf_grow_array(&c->ids, &c->capi, c->ni + ni, sizeof *c->ids, 1 << 14) != 0)
        return; /* out of memory: just not cached */
    memcpy(c->bytes + c->nb, p, n);
    memcpy(c->ids + c->ni, ids, ni * sizeof *ids);
    c->ent[c->n] = (struct c_ent){h, (uint32_t)c->nb, (uint32_t)n, (uint32_t)c->ni, (uint32_t)ni};
    c->nb += n;
    c->ni += ni;
    size_t j = h & c->mask;
    while (c->slot[j])
        j = (j + 1) & c->mask;
    c->slot[j] = (uint32_t)++c->n;
}

static int enc_fail(struct bpe_enc *e, const char *msg) {
    if (!e->failed) snprintf(e->err, e->errlen, "%s: %s", e->b->path, msg);
    e->failed = 1;
    return -1;
}

/* Min-heap of (rank, pos): lowest rank first, then leftmost. */
static inline int heap_less(struct heap_ent a, struct heap_ent b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n) {
    struct heap_ent top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < *n && heap_less(h[l], x)) m = l;
        if (l + 1 < *n && heap_less(h[l + 1], m == i ? x : h[l])) m = l + 1;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = x;
    return top;
}

/* Merge the n symbols in e->sym in place; returns the new count. Short words scan an array of
 * pair ranks (no allocation, a few cache lines); long ones use a heap over a linked list. */
#define SCAN_MAX 48
static size_t merge_symbols(struct bpe_enc *e, size_t n) {
    const struct pairmap *pm = &e->b->merges;
    uint32_t *s = e->sym;
    if (n < 2) return n;
    if (n <= SCAN_MAX) {
        uint32_t r[SCAN_MAX], to[SCAN_MAX];
        for (size_t i = 0; i + 1 < n; i++) {
            const struct pm_ent *m = pairmap_find(pm, s[i], s[i + 1]);
            r[i] = m ? m->rank : UINT32_MAX;
            to[i] = m ? m->id : 0;
        }
        for (;;) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < n; i++)
                if (r[i] < r[best]) best = i;
            if (r[best] == UINT32_MAX) break;
            size_t tail = n - best - 2; /* symbols after the merged pair */
            s[best] = to[best];
            memmove(s + best + 1, s + best + 2, tail * sizeof *s);
            if (tail > 1) {
                memmove(r + best + 1, r + best + 2, (tail - 1) * sizeof *r);
                memmove(to + best + 1, to + best + 2, (tail - 1) * sizeof *to);
            }
            n--;
            for (size_t i = best ? best - 1 : 0; i <= best && i + 1 < n; i++) {
                const struct pm_ent *m = pairmap_find(pm, s[i], s[i + 1]);
                r[i] = m ? m->rank : UINT32_MAX;
                to[i] = m ? m->id : 0;
            }
            if (n < 2) break;
        }
        return n;
    }
    int32_t *prev = e->prev, *next = e->next;
    struct heap_ent *h = e->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        e->rank[i] = 1; /* alive */
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const struct pm_ent *m = pairmap_find(pm, s[i], s[i + 1]);
        if (m) heap_push(h, &nh, (struct heap_ent){m->rank, (uint32_t)i});
    }
    while (nh) {
        struct heap_ent top = heap_pop(h, &nh);
        int32_t p = (int32_t)top.pos, q = e->rank[p] ? next[p] : -1;
        if (q < 0) continue;
        const struct pm_ent *m = pairmap_find(pm, s[p], s[q]);
        if (!m || m->rank != top.rank) continue; /* stale: the pair changed since */
        s[p] = m->id;
        e->rank[q] = 0;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            const struct pm_ent *l = pairmap_find(pm, s[prev[p]], s[p]);
            if (l) heap_push(h, &nh, (struct heap_ent){l->rank, (uint32_t)prev[p]});
        }
        if (next[p] >= 0) {
            const struct pm_ent *rr = pairmap_find(pm, s[p], s[next[p]]);
            if (rr) heap_push(h, &nh, (struct heap_ent){rr->rank, (uint32_t)p});
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i])
        s[k++] = s[i];
    return k;
}

/* Symbols of a character-level word: each UTF-8 character's token, else its bytes' <0xAB>
 * tokens (byte_fallback), else unk (consecutive unknowns fused into one, as the library's
 * fuse_unk does for the files that set it). */
static size_t char_symbols(struct bpe_enc *e, const char *p, size_t n) {
    const struct bpe *b = e->b;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = 1;
        unsigned char c = (unsigned char)p[i];
        if (c >= 0xf0)
            cl = 4;
        else if (c >= 0xe0)
            cl = 3;
        else if (c >= 0xc0)
            cl = 2;
        if (i + cl > n) cl = n - i;
        const struct sm_ent *t = strmap_find(&b->vocab, p + i, cl);
        /* As the library: byte fallback only when every byte of the character has its
         * <0xAB> token, else unk (a vocabulary may lack some). */
        int bytes_ok = b->byte_fallback;
        for (size_t j = 0; j < cl && bytes_ok; j++)
            bytes_ok = b->byte_ok[(unsigned char)p[i + j]];
        if (t) {
            e->sym[k++] = t->val;
        } else if (bytes_ok) {
            for (size_t j = 0; j < cl; j++)
                e->sym[k++] = b->byte_id[(unsigned char)p[i + j]];
        } else if (!(k > 0 && e->sym[k - 1] == (uint32_t)b->unk_id)) {
            e->sym[k++] = (uint32_t)b->unk_id;
        }
        i += cl;
    }
    return k;
}

/* One pre-token through the model. */
static int bpe_word(struct bpe_enc *e, const char *p, size_t n, struct tok_ids *out) {
    const struct bpe *b = e->b;
    if (b->ignore_merges) {
        const struct sm_ent *t = strmap_find(&b->vocab, p, n);
        if (t) return tok_ids_push(out, t->val);
    }
    uint64_t h = 0;
    int cached = n <= CACHE_MAX_LEN && e->cache.slot;
    if (cached) {
        h = loom_fnv1a(LOOM_FNV1A_INIT, p, n);
        const struct c_ent *c = cache_find(&e->cache, p, n, h);
        if (c) {
            if (tok_ids_reserve(out, c->ilen) != 0) return enc_fail(e, "out of memory");
            memcpy(out->v + out->n, e->cache.ids + c->ioff, c->ilen * sizeof *out->v);
            out->n += c->ilen;
            return 0;
        }
    }
    size_t need = n * 4 + 1; /* fallback: up to 4 byte tokens a character */
    if (need > e->sym_cap) {
        size_t c1 = e->sym_cap, c2 = c1, c3 = c1, c4 = c1; /* the four grow alike */
        if (buf_grow_array(&e->sym, &c1, need, sizeof *e->sym, 256) ||
            buf_grow_array(&e->rank, &c2, need, sizeof *e->rank, 256) ||
            buf_grow_array(&e->prev, &c3, need, sizeof *e->prev, 256) ||
            buf_grow_array(&e->next, &c4, need, sizeof *e->next, 256) ||
            buf_grow_array(&e->heap, &e->heap_cap, need * 3, sizeof *e->heap, 768))
            return enc_fail(e, "out of memory");
        e->sym_cap = c1 < c2 ? c1 : c2;
    }
    size_t k;
    if (b->byte_level) {
        for (size_t i = 0; i < n; i++)
            e->sym[i] = b->byte_id[(unsigned char)p[i]];
        k = n;
    } else {
        k = char_symbols(e, p, n);
    }
    k = merge_symbols(e, k);
    if (tok_ids_reserve(out, k) != 0) return enc_fail(e, "out of memory");
    memcpy(out->v + out->n, e->sym, k * sizeof *e->sym);
    out->n += k;
    if (cached) cache_put(&e->cache, p, n, h, e->sym, k);
    return 0;
}

static int pre_split(struct bpe_enc *e, int step, const char *p, size_t n, struct tok_ids *out);

static int regex_split(struct bpe_enc *e, int step, const struct pre *s, const char *p, size_t n,
                       struct tok_ids *out) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    size_t gap = 0, at = 0;
    while (at < n) {
        int rc =
            s->jit
                ? pcre2_jit_match(s->re, (PCRE2_SPTR)p, n, at, PCRE2_NO_UTF_CHECK, e->md, e->mctx)
                : pcre2_match(s->re, (PCRE2_SPTR)p, n, at, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return enc_fail(e, (const char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: not a piece; search on from the next character */
            at = ms + 1;
            while (at < n && ((unsigned char)p[at] & 0xc0) == 0x80)
                at++;
            continue;
        }
        if (ms > gap && pre_split(e, step + 1, p + gap, ms - gap, out) != 0) return -1;
        if (s->behavior == SPLIT_ISOLATED && pre_split(e, step + 1, p + ms, me - ms, out) != 0)
            return -1;
        gap = at = me;
    }
    if (n > gap) return pre_split(e, step + 1, p + gap, n - gap, out);
    return 0;
}

static int pre_split(struct bpe_enc *e, int step, const char *p, size_t n, struct tok_ids *out) {
    const struct bpe *b = e->b;
    if (n == 0) return 0;
    if (step == b->npre) return bpe_word(e, p, n, out);
    const struct pre *s = &b->pre[step];
    if (s->kind == PRE_BYTELEVEL && s->add_prefix_space && p[0] != ' ') {
        char *q = malloc(n + 1);
        if (!q) return enc_fail(e, "out of memory");
        q[0] = ' ';
        memcpy(q + 1, p, n);
        int rc =
            s->re ? regex_split(e, step, s, q, n + 1, out) : pre_split(e, step + 1, q, n + 1, out);
        free(q);
        return rc;
    }
    if (!s->re) return pre_split(e, step + 1, p, n, out);
    return regex_split(e, step, s, p, n, out);
}

/* Run the normalizers over p; *res points at p itself or at one of e's buffers. */
static int normalize(struct bpe_enc *e, const char *p, size_t n, const char **res, size_t *rn) {
    const struct bpe *b = e->b;
    int cur = -1; /* which buffer holds the current text; -1: the input */
    for (int i = 0; i < b->nnorm; i++) {
        const struct norm *s = &b->norm[i];
        const char *src = cur < 0 ? p : e->norm[cur].p;
        size_t sn = cur < 0 ? n : e->norm[cur].len;
        struct buf *dst = &e->norm[cur == 0 ? 1 : 0];
        dst->len = 0;
        if (s->kind == NORM_PREPEND) {
            if (sn == 0) continue; /* the library prepends to non-empty text only */
            if (buf_append(dst, s->a, s->alen) || buf_append(dst, src, sn)) goto oom;
        } else if (s->kind == NORM_REPLACE) {
            for (size_t j = 0; j < sn;) {
                const char *hit = memmem(src + j, sn - j, s->a, s->alen);
                size_t upto = hit ? (size_t)(hit - src) : sn;
                if (buf_append(dst, src + j, upto - j)) goto oom;
                if (!hit) break;
                if (buf_append(dst, s->b, s->blen)) goto oom;
                j = upto + s->alen;
            }
        } else {
            static const int opts[] = {
                [NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
                [NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
                [NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                [NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
            };
            utf8proc_uint8_t *o = NULL;
            utf8proc_ssize_t on = utf8proc_map((const utf8proc_uint8_t *)src, (utf8proc_ssize_t)sn,
                                               &o, opts[s->kind]);
            if (on < 0) {
                free(o);
                return enc_fail(e, utf8proc_errmsg(on));
            }
            int bad = buf_append(dst, (const char *)o, (size_t)on);
            free(o);
            if (bad) goto oom;
        }
        cur = cur == 0 ? 1 : 0;
    }
    *res = cur < 0 ? p : e->norm[cur].p;
    *rn = cur < 0 ? n : e->norm[cur].len;
    return 0;
oom:
    return enc_fail(e, "out of memory");
}

static int encode_plain(struct bpe_enc *e, const char *p, size_t n, struct tok_ids *out) {
    if (n == 0) return 0;
    const char *q = p;
    size_t qn = n;
    if (e->b->nnorm && normalize(e, p, n, &q, &qn) != 0) return -1;
    if (qn == 0) return 0;
    /* The normalized text may live in a scratch buffer reused by a later segment only. */
    return pre_split(e, 0, q, qn, out);
}

static inline int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static inline int is_word(unsigned char c) {
    return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') ||
           ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* The added token matching at text[i], longest first; NULL if none. */
static const struct added *match_added(const struct bpe *b, const char *t, size_t len, size_t i,
                                       int allow_special) {
    unsigned char c = (unsigned char)t[i];
    for (int k = b->added_start[c]; k < b->added_start[c + 1]; k++) {
        const struct added *a = &b->added[k];
        if (a->special && !allow_special) continue;
        if (a->len > len - i || memcmp(t + i, a->s, a->len) != 0) continue;
        if (a->single_word && ((i > 0 && is_word((unsigned char)t[i - 1])) ||
                               (i + a->len < len && is_word((unsigned char)t[i + a->len]))))
            continue;
        return a;
    }
    return NULL;
}

/* Position of the first invalid UTF-8 sequence, or len when all is valid. */
static size_t utf8_check(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return len;
}

static int bpe_encode(void *enc, const char *text, size_t len, unsigned flags, struct tok_ids *out,
                      char *err, size_t errlen) {
    struct bpe_enc *e = enc;
    const struct bpe *b = e->b;
    e->err = err;
    e->errlen = errlen;
    e->failed = 0;
    size_t bad = utf8_check(text, len);
    if (bad < len) {
        ERR("%s: input is not valid UTF-8 at byte %zu (0x%02x)", b->path, bad,
            (unsigned char)text[bad]);
        return -1;
    }
    size_t n0 = out->n;
    int allow = (flags & TOK_ALLOW_SPECIAL) != 0;
    const unsigned char *first = allow ? b->first_any : b->first_plain;
    size_t seg = 0;
    for (size_t i = 0; i < len; i++) {
        if (!first[(unsigned char)text[i]]) continue;
        const struct added *a = match_added(b, text, len, i, allow);
        if (!a) continue;
        size_t end = i, next = i + a->len;
        if (a->lstrip)
            while (end > seg && is_space((unsigned char)text[end - 1]))
                end--;
        if (a->rstrip)
            while (next < len && is_space((unsigned char)text[next]))
                next++;
        if (encode_plain(e, text + seg, end - seg, out) != 0 || tok_ids_push(out, a->id) != 0)
            goto fail;
        seg = next;
        i = next - 1;
    }
    if (encode_plain(e, text + seg, len - seg, out) != 0) goto fail;
    return 0;
fail:
    if (!e->failed) ERR("%s: out of memory", b->path);
    out->n = n0;
    return -1;
}

/* ---- decoding -------------------------------------------------------------------------- */

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int bpe_decode(const void *impl, const uint32_t *ids, size_t n, char **text, size_t *len,
                      char *err, size_t errlen) {
    const struct bpe *b = impl;
    struct buf o = BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= b->vocab_size || b->dec_len[ids[i]] == UINT32_MAX) {
            ERR("%s: token id %u at position %zu is not in the vocabulary (size %u)", b->path,
                ids[i], i, b->vocab_size);
            free(o.p);
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *s = b->dec_pool + b->dec_off[ids[i]];
        size_t sn = b->dec_len[ids[i]];
        /* Character-level decoders: <0xAB> pieces become their byte, Replace maps the
         * SentencePiece space mark back. Byte-level pieces are already raw bytes. */
        int is_added = 0;
        for (size_t k = 0; k < b->nadded && !b->byte_level && !is_added; k++)
            is_added = b->added[k].id == ids[i];
        if (b->byte_level || is_added) {
            if (buf_append(&o, s, sn)) goto oom;
            continue;
        }
        int fell_back = 0;
        for (int d = 0; d < b->ndec && !fell_back; d++)
            if (b->dec[d].kind == DEC_BYTEFALLBACK && sn == 6 && memcmp(s, "<0x", 3) == 0 &&
                s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
                char c = (char)(hexval(s[3]) * 16 + hexval(s[4]));
                if (buf_append(&o, &c, 1)) goto oom;
                fell_back = 1;
            }
        if (fell_back) continue;
        struct buf cur = BUF_INIT, nxt = BUF_INIT;
        if (buf_append(&cur, s, sn)) goto oom;
        for (int d = 0; d < b->ndec; d++) {
            const struct dec *x = &b->dec[d];
            if (x->kind != DEC_REPLACE) continue;
            nxt.len = 0;
            for (size_t j = 0; j < cur.len;) {
                const char *hit = memmem(cur.p + j, cur.len - j, x->a, x->alen);
                size_t upto = hit ? (size_t)(hit - cur.p) : cur.len;
                if (buf_append(&nxt, cur.p + j, upto - j) ||
                    (hit && buf_append(&nxt, x->b, x->blen))) {
                    free(cur.p);
                    free(nxt.p);
                    goto oom;
                }
                if (!hit) break;
                j = upto + x->alen;
            }
            struct buf t = cur;
            cur = nxt;
            nxt = t;
        }
        int bad = buf_append(&o, cur.p, cur.len);
        free(cur.p);
        free(nxt.p);
        if (bad) goto oom;
    }
    /* Strip (after Fuse: on the whole text): drop `start` leading and `stop` trailing spaces. */
    size_t off = 0;
    for (int d = 0; d < b->ndec; d++) {
        const struct dec *x = &b->dec[d];
        if (x->kind != DEC_STRIP) continue;
        for (int k = 0; k < x->start && off < o.len && o.p[off] == ' '; k++)
            off++;
        for (int k = 0; k < x->stop && o.len > off && o.p[o.len - 1] == ' '; k++)
            o.len--;
    }
    if (buf_reserve(&o, 0)) goto oom; /* storage even for an empty text */
    if (off) memmove(o.p, o.p + off, o.len - off);
    o.len -= off;
    o.p[o.len] = 0;
    *text = o.p;
    *len = o.len;
    return 0;
oom:
    free(o.p);
    ERR("%s: out of memory", b->path);
    return -1;
}

const struct tok_ops tok_bpe_ops = {
    .kind = "bpe",
    .free = bpe_free,
    .vocab_size = bpe_vocab_size,
    .piece_id = bpe_piece_id,
    .role_id = bpe_role_id,
    .enc_new = bpe_enc_new,
    .enc_free = bpe_enc_free,
    .encode = bpe_encode,
    .decode = bpe_decode,
};
