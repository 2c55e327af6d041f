/* Chat templates: a conversation (role, content messages) to token ids plus a mask of the
 * tokens the assistant wrote, for training with loss on the assistant's turns only.
 *
 * Templates are pure C functions, one per family, rendering what the family's published
 * template renders (no Jinja):
 *   llama3   <|begin_of_text|> then <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
 *            for each message, CONTENT trimmed of surrounding whitespace (Meta Llama 3);
 *   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n for each message (Qwen2 and other ChatML
 *            models; no default system message is added);
 *   mistral  <s>[INST] USER [/INST]ASSISTANT</s>... (Mistral v0.1/v0.2 instruct, the way
 *            mistral-common's SentencePiece tokenizer builds it: each instruction and each
 *            answer encoded on its own; a system message is put before the first user message
 *            with a blank line); roles must alternate user/assistant.
 * Marker tokens come from the tokenizer by text; message text is encoded as plain text, so a
 * marker written inside a message never becomes a marker token. Text runs between markers are
 * encoded whole, as tokenizing the rendered string does; the mask marks every token that
 * overlaps an assistant message's content, and the assistant's closing marker (<|eot_id|>,
 * <|im_end|>, </s>). */
#ifndef LOOM_DATA_CHAT_H
#define LOOM_DATA_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "data/tok.h"

enum chat_template { CHAT_LLAMA3, CHAT_CHATML, CHAT_MISTRAL };

struct chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
};

/* Mask bytes parallel to the ids (1: written by the assistant). Caller owns v. */
struct chat_mask {
    uint8_t *v;
    size_t n, cap;
};

/* "llama3" | "chatml" | "mistral"; -1 for other names. */
int chat_template_parse(const char *name, enum chat_template *out);

/* Render msgs[0..n) with template tpl through tokenizer t, appending to ids and mask (which
 * stay parallel). add_generation_prompt appends the header of an assistant turn (unmasked).
 * Returns 0, or -1 with a message in err naming the message index and the value (unknown role,
 * roles out of order, a marker token the tokenizer lacks). Not thread-safe for one t (uses
 * tok_encode). */
int chat_render(struct tok *t, enum chat_template tpl, const struct chat_msg *msgs, size_t n,
                int add_generation_prompt, struct tok_ids *ids, struct chat_mask *mask, char *err,
                size_t errlen);

/* chat_render through a per-thread encoder of t (data/tok.h): several threads may render with
 * one t at once, each with its own enc. */
int chat_render_with(struct tok *t, struct tok_enc *enc, enum chat_template tpl,
                     const struct chat_msg *msgs, size_t n, int add_generation_prompt,
                     struct tok_ids *ids, struct chat_mask *mask, char *err, size_t errlen);
void chat_mask_free(struct chat_mask *m);

#endif
