/* Unit tests of data/tok: small tokenizer.json files written here, with expected ids worked
 * out by hand from their vocabularies and merges (the comparisons with real third-party
 * tokenizers on large corpora are tests/tok/tok_test.sh).
 *   - byte-level BPE: merge order, the GPT-2 regex split, string and array merges, a long
 *     word (heap path) against a short one (scan path), ignore_merges;
 *   - special tokens are text unless TOK_ALLOW_SPECIAL; non-special added tokens always match;
 *   - a SentencePiece-style file (Prepend/Replace normalizers, byte_fallback, Replace /
 *     ByteFallback / Fuse / Strip decoders);
 *   - roles from tokenizer_config.json, vocab size, decode errors, invalid UTF-8;
 *   - two threads encoding at once with their own encoders;
 *   - every open error names the file and the value. */
#define _GNU_SOURCE
#include "data/tok.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"

static char dir[256];

static void path_in(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", dir, name);
}

static void write_text(const char *name, const char *text) {
    char p[512];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

/* UTF-8 of code point cp into out; returns the length. */
static int utf8(unsigned cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* GPT-2's byte -> code point table, written out independently of data/tok_bpe.c. */
static unsigned gpt2_cp(int b) {
    static unsigned map[256];
    static int done;
    if (!done) {
        int n = 0;
        for (int c = 0; c < 256; c++) {
            int keep = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || (c >= 0xae);
            map[c] = keep ? (unsigned)c : 256u + (unsigned)n++;
        }
        done = 1;
    }
    return map[b];
}

/* Byte-level key of a raw ASCII string. */
static void bl_key(const char *s, char *out) {
    int k = 0;
    for (; *s; s++)
        k += utf8(gpt2_cp((unsigned char)*s), out + k);
    out[k] = 0;
}

/* Byte-level toy: ids 0..255 are the bytes; then ab=256, abc=257, aa=258, " a"=259, xyz=260;
 * merges a+b, ab+c, a+a, " "+a; added <|end|>=261 (special), <x>=262 (plain). */
enum { ID_AB = 256, ID_ABC, ID_AA, ID_SP_A, ID_XYZ, ID_END, ID_X };
static void write_byte_level(const char *name, int array_merges, int ignore_merges) {
    json_t *vocab = json_object(), *merges = json_array();
    for (int b = 0; b < 256; b++) {
        char k[4] = {0};
        utf8(gpt2_cp(b), k);
        json_object_set_new(vocab, k, json_integer(b));
    }
    static const char *const extra[] = {"ab", "abc", "aa", " a", "xyz"};
    for (int i = 0; i < 5; i++) {
        char k[32];
        bl_key(extra[i], k);
        json_object_set_new(vocab, k, json_integer(256 + i));
    }
    static const char *const pairs[][2] = {{"a", "b"}, {"ab", "c"}, {"a", "a"}, {" ", "a"}};
    for (int i = 0; i < 4; i++) {
        char l[32], r[32], both[64];
        bl_key(pairs[i][0], l);
        bl_key(pairs[i][1], r);
        snprintf(both, sizeof both, "%s %s", l, r);
        json_array_append_new(merges, array_merges ? json_pack("[s,s]", l, r) : json_string(both));
    }
    json_t *root = json_pack(
        "{s:[{s:i,s:s,s:b},{s:i,s:s,s:b}],s:n,s:{s:s,s:b,s:b},s:{s:s},s:{s:s,s:o,s:o,s:b}}",
        "added_tokens", "id", ID_END, "content", "<|end|>", "special", 1, "id", ID_X, "content",
        "<x>", "special", 0, "normalizer", "pre_tokenizer", "type", "ByteLevel", "add_prefix_space",
        0, "use_regex", 1, "decoder", "type", "ByteLevel", "model", "type", "BPE", "vocab", vocab,
        "merges", merges, "ignore_merges", ignore_merges);
    char p[512];
    path_in(p, sizeof p, name);
    json_dump_file(root, p, JSON_COMPACT);
    json_decref(root);
}

/* SentencePiece-style (Llama 2 as converted to tokenizer.json): <unk>=0 <s>=1 </s>=2,
 * <0x00>..<0xFF> = 3..258, "▁"=259 a=260 b=261 "▁a"=262 ab=263 "▁ab"=264. */
#define SP "\xe2\x96\x81"
static void write_spm_style(const char *name) {
    json_t *vocab = json_pack("{s:i,s:i,s:i}", "<unk>", 0, "<s>", 1, "</s>", 2);
    for (int b = 0; b < 256; b++) {
        char k[8];
        snprintf(k, sizeof k, "<0x%02X>", b);
        json_object_set_new(vocab, k, json_integer(3 + b));
    }
    static const char *const extra[] = {SP, "a", "b", SP "a", "ab", SP "ab"};
    for (int i = 0; i < 6; i++)
        json_object_set_new(vocab, extra[i], json_integer(259 + i));
    json_t *root = json_pack(
        "{s:[{s:i,s:s,s:b},{s:i,s:s,s:b}],"
        "s:{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]},s:n,"
        "s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]},"
        "s:{s:s,s:o,s:[s,s,s],s:s,s:b}}",
        "added_tokens", "id", 1, "content", "<s>", "special", 1, "id", 2, "content", "</s>",
        "special", 1, "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend",
        SP, "type", "Replace", "pattern", "String", " ", "content", SP, "pre_tokenizer", "decoder",
        "type", "Sequence", "decoders", "type", "Replace", "pattern", "String", SP, "content", " ",
        "type", "ByteFallback", "type", "Fuse", "type", "Strip", "content", " ", "start", 1, "stop",
        0, "model", "type", "BPE", "vocab", vocab, "merges", SP " a", "a b", SP "a b", "unk_token",
        "<unk>", "byte_fallback", 1);
    char p[512];
    path_in(p, sizeof p, name);
    json_dump_file(root, p, JSON_COMPACT);
    json_decref(root);
}

static struct tok *open_in(const char *name) {
    char p[512], err[1024] = "";
    struct tok *t = NULL;
    path_in(p, sizeof p, name);
    if (tok_open(p, &t, err, sizeof err) != 0) fprintf(stderr, "open %s: %s\n", p, err);
    CHECK(t != NULL);
    return t;
}

#define MAXIDS 8
struct enc_case {
    const char *text;
    unsigned flags;
    int n; /* -1: encode fails */
    uint32_t ids[MAXIDS];
};

static int ids_equal(const struct tok_ids *got, const struct enc_case *c) {
    if ((int)got->n != c->n) return 0;
    for (int i = 0; i < c->n; i++)
        if (got->v[i] != c->ids[i]) return 0;
    return 1;
}

static void run_cases(struct tok *t, const char *what, const struct enc_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const struct enc_case *c = &cases[i];
        struct tok_ids ids = {0};
        char err[1024] = "";
        int rc = tok_encode(t, c->text, strlen(c->text), c->flags, &ids, err, sizeof err);
        int ok = c->n < 0 ? rc != 0 && err[0] : rc == 0 && ids_equal(&ids, c);
        if (!ok) {
            fprintf(stderr, "%s case %zu \"%s\": rc %d, %zu ids:", what, i, c->text, rc, ids.n);
            for (size_t k = 0; k < ids.n; k++)
                fprintf(stderr, " %u", ids.v[k]);
            fprintf(stderr, " (%s)\n", err);
        }
        CHECK(ok);
        /* decode inverts encode exactly on this tokenizer (byte-level) */
        if (ok && c->n >= 0 && strcmp(tok_kind(t), "bpe") == 0 && strstr(what, "byte")) {
            char *back = NULL;
            size_t bn = 0;
            CHECK(tok_decode(t, ids.v, ids.n, &back, &bn, err, sizeof err) == 0);
            CHECK(back && bn == strlen(c->text) && memcmp(back, c->text, bn) == 0);
            free(back);
        }
        tok_ids_free(&ids);
    }
}

static const struct enc_case byte_cases[] = {
    {"abc", 0, 1, {ID_ABC}},
    {"abcab", 0, 2, {ID_ABC, ID_AB}},      /* a+b twice (leftmost first), then ab+c */
    {"aaaaa", 0, 3, {ID_AA, ID_AA, 'a'}},  /* a+a from the left */
    {"a abc", 0, 3, {'a', ' ', ID_ABC}},   /* " abc" is one pre-token: " "+a ranks after ab+c */
    {"xyz", 0, 3, {'x', 'y', 'z'}},        /* xyz has no merges */
    {"it's", 0, 4, {'i', 't', '\'', 's'}}, /* the GPT-2 regex cuts "it" | "'s" */
    {"b a", 0, 2, {'b', ID_SP_A}},         /* " a" is a pre-token; " "+a merges */
    {"", 0, 0, {0}},
    {"<|end|>", 0, 7, {'<', '|', 'e', 'n', 'd', '|', '>'}}, /* special: text by default */
    {"<|end|>", TOK_ALLOW_SPECIAL, 1, {ID_END}},
    {"ab<|end|>ab", TOK_ALLOW_SPECIAL, 3, {ID_AB, ID_END, ID_AB}},
    {"<x>", 0, 1, {ID_X}}, /* a non-special added token always matches */
    {"a<x>b", 0, 3, {'a', ID_X, 'b'}},
    {"\xff", 0, -1, {0}}, /* invalid UTF-8 */
    {"a\xc3", 0, -1, {0}},
};

static void test_byte_level(void) {
    const struct enc_case *cases = byte_cases;
    size_t ncases = sizeof byte_cases / sizeof *byte_cases;
    write_byte_level("bl.json", 0, 0);
    write_byte_level("bl_array.json", 1, 0);
    const char *files[] = {"bl.json", "bl_array.json"};
    for (int f = 0; f < 2; f++) {
        struct tok *t = open_in(files[f]);
        if (!t) continue;
        CHECK(strcmp(tok_kind(t), "bpe") == 0);
        CHECK(tok_vocab_size(t) == ID_X + 1);
        run_cases(t, "byte-level", cases, ncases);
        CHECK(tok_token_id(t, "<|end|>") == ID_END);
        CHECK(tok_token_id(t, "ab") == ID_AB);
        CHECK(tok_token_id(t, "<nope>") == -1);
        CHECK(tok_token_id(t, "bos") == -1);
        /* A long word (heap path) merges like a short one (scan path). */
        char word[1001];
        memset(word, 'a', 1000);
        word[1000] = 0;
        struct tok_ids ids = {0};
        char err[1024];
        CHECK(tok_encode(t, word, 1000, 0, &ids, err, sizeof err) == 0);
        int all_aa = ids.n == 500;
        for (size_t i = 0; i < ids.n; i++)
            all_aa &= ids.v[i] == ID_AA;
        CHECK(all_aa);
        ids.n = 0;
        CHECK(tok_encode(t, word, 999, 0, &ids, err, sizeof err) == 0);
        CHECK(ids.n == 500 && ids.v[498] == ID_AA && ids.v[499] == 'a');
        /* decode: an unknown id is an error naming it */
        uint32_t bad[] = {ID_AB, 9999};
        char *text = NULL;
        size_t tn = 0;
        CHECK(tok_decode(t, bad, 2, &text, &tn, err, sizeof err) != 0 && strstr(err, "9999"));
        uint32_t good[] = {ID_ABC, ID_END, ' ', ID_X};
        CHECK(tok_decode(t, good, 4, &text, &tn, err, sizeof err) == 0 &&
              strcmp(text, "abc<|end|> <x>") == 0 && tn == 14);
        free(text);
        tok_ids_free(&ids);
        tok_free(t);
    }
    /* ignore_merges: a pre-token found whole in the vocabulary is one token. */
    write_byte_level("bl_ignore.json", 0, 1);
    struct tok *t = open_in("bl_ignore.json");
    if (t) {
        static const struct enc_case ig[] = {{"xyz", 0, 1, {ID_XYZ}}, {"abc", 0, 1, {ID_ABC}}};
        run_cases(t, "byte-level ignore_merges", ig, 2);
        tok_free(t);
    }
}

static void test_spm_style(void) {
    write_spm_style("sp.json");
    struct tok *t = open_in("sp.json");
    if (!t) return;
    static const struct enc_case cases[] = {
        {"ab ab", 0, 2, {264, 264}},
        {"a", 0, 1, {262}},
        {"b a", 0, 3, {259, 261, 262}},
        {"\xc3\xa7", 0, 3, {259, 3 + 0xc3, 3 + 0xa7}}, /* ç: byte fallback */
        {"<s>a", 0, 5, {259, 3 + '<', 3 + 's', 3 + '>', 260}},
        {"<s>a", TOK_ALLOW_SPECIAL, 2, {1, 262}},
    };
    run_cases(t, "spm-style", cases, sizeof cases / sizeof *cases);
    uint32_t ids[] = {264, 264, 259, 3 + 0xc3, 3 + 0xa7};
    char *text = NULL, err[1024];
    size_t n = 0;
    CHECK(tok_decode(t, ids, 5, &text, &n, err, sizeof err) == 0 &&
          strcmp(text, "ab ab \xc3\xa7") == 0);
    free(text);
    CHECK(tok_token_id(t, "bos") == 1 && tok_token_id(t, "eos") == 2);
    CHECK(tok_token_id(t, "unk") == 0);
    tok_free(t);
}

static void test_roles_and_dir(void) {
    char sub[512], p[600], err[1024];
    snprintf(sub, sizeof sub, "%s/hf", dir);
    mkdir(sub, 0755);
    write_byte_level("hf/tokenizer.json", 0, 0);
    write_text("hf/tokenizer_config.json",
               "{\"bos_token\": {\"content\": \"<x>\"}, \"eos_token\": \"<|end|>\", "
               "\"pad_token\": null}");
    struct tok *t = NULL;
    CHECK(tok_open(sub, &t, err, sizeof err) == 0);
    if (!t) return;
    CHECK(tok_token_id(t, "bos") == ID_X);
    CHECK(tok_token_id(t, "eos") == ID_END);
    CHECK(tok_token_id(t, "pad") == -1);
    tok_free(t);
    snprintf(p, sizeof p, "%s/tokenizer.json", sub);
    CHECK(tok_open(p, &t, err, sizeof err) == 0); /* the config is found beside the file too */
    CHECK(t && tok_token_id(t, "eos") == ID_END);
    tok_free(t);
}

struct thr {
    struct tok *t;
    int ok;
};

static void *thr_main(void *arg) {
    struct thr *a = arg;
    struct tok_enc *e = tok_enc_new(a->t);
    struct tok_ids ids = {0};
    char err[256];
    a->ok = e != NULL;
    /* Pre-tokens "abcab" | " aaaaa" | " ", then the special token; in " aaaaa" a+a ranks
     * before " "+a, so the space stays alone: " " aa aa a. */
    static const uint32_t want[] = {ID_ABC, ID_AB, ' ', ID_AA, ID_AA, 'a', ' ', ID_END};
    for (int i = 0; i < 2000 && a->ok; i++) {
        ids.n = 0;
        a->ok = tok_encode_with(e, "abcab aaaaa <|end|>", 19, TOK_ALLOW_SPECIAL, &ids, err,
                                sizeof err) == 0 &&
                ids.n == 8 && memcmp(ids.v, want, sizeof want) == 0;
    }
    tok_ids_free(&ids);
    tok_enc_free(e);
    return NULL;
}

static void test_threads(void) {
    struct tok *t = open_in("bl.json");
    if (!t) return;
    struct thr a[2] = {{t, 0}, {t, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, thr_main, &a[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK(a[0].ok && a[1].ok);
    tok_free(t);
}

struct err_case {
    const char *name; /* file under dir written with `text`; NULL text: not written */
    const char *text;
    const char *expect1; /* both must appear in the message */
    const char *expect2;
};

static void test_errors(void) {
    static const struct err_case cases[] = {
        {"missing.json", NULL, "missing.json", "No such file"},
        {"bad.json", "{\"model\": {", "bad.json", "invalid JSON at line 1"},
        {"array.json", "[1, 2]", "array.json", "not a tokenizer.json"},
        {"wp.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "wp.json",
         "model type \"WordPiece\" is not supported"},
        {"uni.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "uni.json",
         "\"Unigram\""},
        {"pre.json",
         "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\"}}",
         "pre.json", "pre_tokenizer type \"Whitespace\""},
        {"norm.json", "{\"normalizer\": {\"type\": \"Lowercase\"}, \"model\": {\"type\": \"BPE\"}}",
         "norm.json", "normalizer type \"Lowercase\""},
        {"merge.json",
         "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"u\", \"vocab\": {\"u\": 0, \"a\": 1}, "
         "\"merges\": [\"a q\"]}}",
         "merge.json", "merge 0 (\"a\" \"q\"): the right part"},
        {"dropout.json",
         "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}",
         "dropout.json", "dropout 0.1"},
        {"split.json",
         "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
         "\"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\"}}",
         "split.json", "regex \"(\" does not compile"},
        {"beh.json",
         "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
         "\"behavior\": \"Contiguous\"}, \"model\": {\"type\": \"BPE\"}}",
         "beh.json", "Split behavior \"Contiguous\""},
        {"vocab.txt", "hello", "vocab.txt", "unknown tokenizer file"},
        {"bad.model", "not a protobuf", "bad.model", "not a SentencePiece model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct err_case *c = &cases[i];
        char p[512], err[1024] = "";
        struct tok *t = NULL;
        if (c->text) write_text(c->name, c->text);
        path_in(p, sizeof p, c->name);
        int rc = tok_open(p, &t, err, sizeof err);
        int ok = rc != 0 && !t && strstr(err, c->expect1) && strstr(err, c->expect2);
        if (!ok) fprintf(stderr, "error case %s: rc %d, message: %s\n", c->name, rc, err);
        CHECK(ok);
        tok_free(t);
    }
    char err[1024] = "", empty[512];
    struct tok *t = NULL;
    snprintf(empty, sizeof empty, "%s/empty", dir);
    mkdir(empty, 0755);
    CHECK(tok_open(empty, &t, err, sizeof err) != 0 && strstr(err, "empty") &&
          strstr(err, "neither tokenizer.json nor tokenizer.model"));
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_tok.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_byte_level();
    test_spm_style();
    test_roles_and_dir();
    test_threads();
    test_errors();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_tok");
}
