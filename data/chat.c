/* Chat templates as C functions (see data/chat.h). A renderer gathers a run of text between
 * marker tokens, remembers which byte ranges of it are assistant content, and encodes the run
 * whole when the next marker comes; the mask of a mixed run follows the tokens' byte spans
 * (exact for byte-level BPE, whose tokens decode to their own bytes). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "data/chat.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)

int chat_template_parse(const char *name, enum chat_template *out) {
    static const struct {
        const char *name;
        enum chat_template tpl;
    } names[] = {{"llama3", CHAT_LLAMA3}, {"chatml", CHAT_CHATML}, {"mistral", CHAT_MISTRAL}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (name && strcmp(name, names[i].name) == 0) {
            *out = names[i].tpl;
            return 0;
        }
    return -1;
}

void chat_mask_free(struct chat_mask *m) {
    if (!m) return;
    free(m->v);
    memset(m, 0, sizeof *m);
}

#define MAX_SPANS 8

struct render {
    struct tok *t;
    struct tok_enc *enc; /* NULL: t's own encoder */
    struct tok_ids *ids;
    struct chat_mask *mask;
    struct buf run; /* text since the last marker */
    size_t span[MAX_SPANS][2];
    int nspan;
    char *err;
    size_t errlen;
};

static int push(struct render *r, uint32_t id, int masked) {
    if (tok_ids_reserve(r->ids, 1) != 0 ||
        buf_grow_array(&r->mask->v, &r->mask->cap, r->mask->n + 1, 1, 256) != 0) {
        snprintf(r->err, r->errlen, "chat: out of memory");
        return -1;
    }
    r->ids->v[r->ids->n++] = id;
    r->mask->v[r->mask->n++] = (uint8_t)(masked != 0);
    return 0;
}

static int add_text(struct render *r, const char *s, size_t n, int assistant) {
    if (assistant && n) {
        if (r->nspan == MAX_SPANS) {
            snprintf(r->err, r->errlen, "chat: internal: too many spans in one run");
            return -1;
        }
        r->span[r->nspan][0] = r->run.len;
        r->span[r->nspan][1] = r->run.len + n;
        r->nspan++;
    }
    if (buf_append(&r->run, s, n) != 0) {
        snprintf(r->err, r->errlen, "chat: out of memory");
        return -1;
    }
    return 0;
}

/* Encode the pending run and mask its tokens. */
static int flush(struct render *r) {
    if (r->run.len == 0) return 0;
    size_t n0 = r->ids->n;
    if ((r->enc ? tok_encode_with(r->enc, r->run.p, r->run.len, 0, r->ids, r->err, r->errlen)
                : tok_encode(r->t, r->run.p, r->run.len, 0, r->ids, r->err, r->errlen)) != 0)
        return -1;
    size_t n1 = r->ids->n;
    if (buf_grow_array(&r->mask->v, &r->mask->cap, n1, 1, 256) != 0) {
        snprintf(r->err, r->errlen, "chat: out of memory");
        return -1;
    }
    int all = r->nspan == 1 && r->span[0][0] == 0 && r->span[0][1] == r->run.len;
    size_t at = 0;
    for (size_t i = n0; i < n1; i++) {
        int m = all;
        if (!all && r->nspan) {
            char *piece = NULL;
            size_t len = 0;
            if (tok_decode(r->t, &r->ids->v[i], 1, &piece, &len, r->err, r->errlen) != 0) return -1;
            free(piece);
            for (int s = 0; s < r->nspan && !m; s++)
                m = at < r->span[s][1] && at + len > r->span[s][0];
            at += len;
        }
        r->mask->v[i] = (uint8_t)m;
    }
    r->mask->n = n1;
    buf_reset(&r->run);
    r->nspan = 0;
    return 0;
}

/* A marker token by its text (or role name such as "bos"). */
static int marker(struct render *r, const char *name, int masked) {
    if (flush(r) != 0) return -1;
    int64_t id = tok_token_id(r->t, name);
    if (id < 0) {
        snprintf(r->err, r->errlen, "chat: the tokenizer has no %s token for this template", name);
        return -1;
    }
    return push(r, (uint32_t)id, masked);
}

static int text(struct render *r, const char *s, int assistant) {
    return add_text(r, s, strlen(s), assistant);
}

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int render_llama3(struct render *r, const struct chat_msg *m, size_t n, int gen) {
    if (marker(r, "<|begin_of_text|>", 0) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        int a = strcmp(m[i].role, "assistant") == 0;
        const char *c = m[i].content;
        size_t len = strlen(c);
        while (len && is_ws(*c)) /* the template's `| trim` */
            c++, len--;
        while (len && is_ws(c[len - 1]))
            len--;
        if (marker(r, "<|start_header_id|>", 0) || text(r, m[i].role, 0) ||
            marker(r, "<|end_header_id|>", 0) || text(r, "\n\n", 0) || add_text(r, c, len, a) ||
            marker(r, "<|eot_id|>", a))
            return -1;
    }
    if (gen && (marker(r, "<|start_header_id|>", 0) || text(r, "assistant", 0) ||
                marker(r, "<|end_header_id|>", 0) || text(r, "\n\n", 0)))
        return -1;
    return flush(r);
}

static int render_chatml(struct render *r, const struct chat_msg *m, size_t n, int gen) {
    for (size_t i = 0; i < n; i++) {
        int a = strcmp(m[i].role, "assistant") == 0;
        if (marker(r, "<|im_start|>", 0) || text(r, m[i].role, 0) || text(r, "\n", 0) ||
            text(r, m[i].content, a) || marker(r, "<|im_end|>", a) || text(r, "\n", 0))
            return -1;
    }
    if (gen && (marker(r, "<|im_start|>", 0) || text(r, "assistant\n", 0))) return -1;
    return flush(r);
}

static int render_mistral(struct render *r, const struct chat_msg *m, size_t n, int gen) {
    const char *sys = NULL;
    size_t first = 0, last_user = 0;
    if (n && strcmp(m[0].role, "system") == 0) {
        sys = m[0].content;
        first = 1;
    }
    for (size_t i = first; i < n; i++) {
        const char *want = (i - first) % 2 == 0 ? "user" : "assistant";
        if (strcmp(m[i].role, want) != 0) {
            snprintf(r->err, r->errlen,
                     "chat: mistral: message %zu has role \"%s\", expected \"%s\" (after an "
                     "optional system message, user and assistant alternate)",
                     i, m[i].role, want);
            return -1;
        }
        if (strcmp(want, "user") == 0) last_user = i;
    }
    if (marker(r, "bos", 0) != 0) return -1;
    for (size_t i = first; i < n; i++) {
        if (strcmp(m[i].role, "user") == 0) {
            /* mistral-common puts the system prompt before the last user message. */
            if (text(r, "[INST] ", 0) ||
                (sys && i == last_user && (text(r, sys, 0) || text(r, "\n\n", 0))) ||
                text(r, m[i].content, 0) || text(r, " [/INST]", 0) || flush(r))
                return -1;
        } else if (text(r, m[i].content, 1) || marker(r, "eos", 1)) {
            return -1;
        }
    }
    (void)gen; /* the prompt ends with [/INST]: nothing to add */
    return flush(r);
}

int chat_render(struct tok *t, enum chat_template tpl, const struct chat_msg *msgs, size_t n,
                int add_generation_prompt, struct tok_ids *ids, struct chat_mask *mask, char *err,
                size_t errlen) {
    return chat_render_with(t, NULL, tpl, msgs, n, add_generation_prompt, ids, mask, err, errlen);
}

int chat_render_with(struct tok *t, struct tok_enc *enc, enum chat_template tpl,
                     const struct chat_msg *msgs, size_t n, int add_generation_prompt,
                     struct tok_ids *ids, struct chat_mask *mask, char *err, size_t errlen) {
    struct render r = {.t = t,
                       .enc = enc,
                       .ids = ids,
                       .mask = mask,
                       .run = BUF_INIT,
                       .err = err,
                       .errlen = errlen};
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content || !*msgs[i].role) {
            ERR("chat: message %zu needs a role and a content", i);
            return -1;
        }
        if (tpl == CHAT_MISTRAL && strcmp(msgs[i].role, "system") != 0 &&
            strcmp(msgs[i].role, "user") != 0 && strcmp(msgs[i].role, "assistant") != 0) {
            ERR("chat: message %zu has role \"%s\" (mistral knows system, user, assistant)", i,
                msgs[i].role);
            return -1;
        }
        if (strcmp(msgs[i].role, "system") == 0 && i > 0 && tpl == CHAT_MISTRAL) {
            ERR("chat: mistral: message %zu: a system message must come first", i);
            return -1;
        }
    }
    size_t n0 = ids->n, m0 = mask->n;
    int rc = tpl == CHAT_LLAMA3   ? render_llama3(&r, msgs, n, add_generation_prompt)
             : tpl == CHAT_CHATML ? render_chatml(&r, msgs, n, add_generation_prompt)
                                  : render_mistral(&r, msgs, n, add_generation_prompt);
    buf_free(&r.run);
    if (rc != 0) {
        ids->n = n0;
        mask->n = m0;
    }
    return rc;
}
