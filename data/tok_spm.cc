/* SentencePiece tokenizer.model (Llama 2, Mistral v0.1) through Debian's libsentencepiece: a
 * thin C interface over SentencePieceProcessor (compiled as C++, no C++ type crosses the
 * interface). The library's own normalization, dummy-prefix and byte-fallback rules apply;
 * encode adds no BOS/EOS (the library adds them only when asked through extra options).
 * Control and unknown pieces (<s>, </s>, <unk>) come from text only with TOK_ALLOW_SPECIAL:
 * the text is then cut at them and each piece between is encoded on its own. The processor's
 * const methods are thread-safe, so an encoder is just the processor itself. */
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "data/tok_impl.h"

namespace {

struct Spm {
    std::string path;
    sentencepiece::SentencePieceProcessor sp;
    std::vector<std::pair<std::string, int>> specials; /* longest first */
};

void set_err(char *err, size_t errlen, const std::string &msg) {
    std::snprintf(err, errlen, "%s", msg.c_str());
}

/* Index of the first invalid UTF-8 byte, or len. */
size_t utf8_bad(const char *s, size_t len) {
    const unsigned char *p = reinterpret_cast<const unsigned char *>(s);
    size_t i = 0;
    while (i < len) {
        unsigned char c = p[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (k == 0 || i + k > len) return i;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xc0) != 0x80) return i;
        uint32_t cp = k == 1 ? c : k == 2 ? (c & 0x1f) : k == 3 ? (c & 0x0f) : (c & 0x07);
        for (size_t j = 1; j < k; j++)
            cp = cp << 6 | (p[i + j] & 0x3f);
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += k;
    }
    return len;
}

int encode_piece(const Spm *m, const char *text, size_t len, struct tok_ids *out,
                 std::vector<int> &ids, char *err, size_t errlen) {
    if (len == 0) return 0;
    auto st = m->sp.Encode(absl::string_view(text, len), &ids);
    if (!st.ok()) {
        set_err(err, errlen, m->path + ": encode failed: " + st.ToString());
        return -1;
    }
    if (tok_ids_reserve(out, ids.size()) != 0) return -1;
    for (int id : ids)
        out->v[out->n++] = static_cast<uint32_t>(id);
    return 0;
}

} // namespace

extern "C" {

int tok_spm_load(const char *path, void **impl, char *err, size_t errlen) {
    try {
        Spm *m = new Spm;
        m->path = path;
        auto st = m->sp.Load(path);
        if (!st.ok()) {
            set_err(err, errlen,
                    std::string(path) + ": not a SentencePiece model: " + st.ToString());
            delete m;
            return -1;
        }
        for (int id = 0; id < m->sp.GetPieceSize(); id++)
            if (m->sp.IsControl(id) || m->sp.IsUnknown(id))
                if (!m->sp.IdToPiece(id).empty()) m->specials.emplace_back(m->sp.IdToPiece(id), id);
        std::sort(m->specials.begin(), m->specials.end(),
                  [](const auto &a, const auto &b) { return a.first.size() > b.first.size(); });
        *impl = m;
        return 0;
    } catch (const std::bad_alloc &) {
        set_err(err, errlen, std::string(path) + ": out of memory");
        return -1;
    }
}

static void spm_free(void *impl) {
    delete static_cast<Spm *>(impl);
}

static uint32_t spm_vocab_size(const void *impl) {
    return static_cast<uint32_t>(static_cast<const Spm *>(impl)->sp.GetPieceSize());
}

static int64_t spm_piece_id(const void *impl, const char *text) {
    const Spm *m = static_cast<const Spm *>(impl);
    int id = m->sp.PieceToId(text);
    /* PieceToId answers unk for unknown pieces: only the unk piece itself maps there. */
    if (id == m->sp.unk_id() && m->sp.IdToPiece(id) != text) return -1;
    return id;
}

static int64_t spm_role_id(const void *impl, const char *role) {
    const Spm *m = static_cast<const Spm *>(impl);
    int id = std::strcmp(role, "bos") == 0   ? m->sp.bos_id()
             : std::strcmp(role, "eos") == 0 ? m->sp.eos_id()
             : std::strcmp(role, "pad") == 0 ? m->sp.pad_id()
             : std::strcmp(role, "unk") == 0 ? m->sp.unk_id()
                                             : -1;
    return id;
}

static void *spm_enc_new(const void *impl) {
    return const_cast<void *>(impl);
}

static void spm_enc_free(void *) {}

static int spm_encode(void *enc, const char *text, size_t len, unsigned flags, struct tok_ids *out,
                      char *err, size_t errlen) {
    const Spm *m = static_cast<const Spm *>(enc);
    size_t n0 = out->n;
    if (errlen) err[0] = 0;
    try {
        size_t bad = utf8_bad(text, len);
        if (bad < len) {
            char msg[160];
            std::snprintf(msg, sizeof msg, ": input is not valid UTF-8 at byte %zu (0x%02x)", bad,
                          static_cast<unsigned char>(text[bad]));
            set_err(err, errlen, m->path + msg);
            return -1;
        }
        std::vector<int> ids;
        size_t seg = 0;
        if (flags & TOK_ALLOW_SPECIAL) {
            for (size_t i = 0; i < len; i++) {
                for (const auto &s : m->specials) {
                    if (s.first.size() > len - i ||
                        std::memcmp(text + i, s.first.data(), s.first.size()) != 0)
                        continue;
                    if (encode_piece(m, text + seg, i - seg, out, ids, err, errlen) != 0 ||
                        tok_ids_push(out, static_cast<uint32_t>(s.second)) != 0)
                        goto fail;
                    seg = i + s.first.size();
                    i = seg - 1;
                    break;
                }
            }
        }
        if (encode_piece(m, text + seg, len - seg, out, ids, err, errlen) != 0) goto fail;
        return 0;
    } catch (const std::bad_alloc &) {
    }
fail:
    if (!err[0]) set_err(err, errlen, m->path + ": out of memory");
    out->n = n0;
    return -1;
}

static int spm_decode(const void *impl, const uint32_t *ids, size_t n, char **text, size_t *len,
                      char *err, size_t errlen) {
    const Spm *m = static_cast<const Spm *>(impl);
    try {
        std::vector<int> v(n);
        for (size_t i = 0; i < n; i++) {
            if (ids[i] >= static_cast<uint32_t>(m->sp.GetPieceSize())) {
                char msg[160];
                std::snprintf(msg, sizeof msg,
                              ": token id %u at position %zu is not in the vocabulary (size %d)",
                              ids[i], i, m->sp.GetPieceSize());
                set_err(err, errlen, m->path + msg);
                return -1;
            }
            v[i] = static_cast<int>(ids[i]);
        }
        std::string s;
        auto st = m->sp.Decode(v, &s);
        if (!st.ok()) {
            set_err(err, errlen, m->path + ": decode failed: " + st.ToString());
            return -1;
        }
        char *p = static_cast<char *>(std::malloc(s.size() + 1));
        if (!p) throw std::bad_alloc();
        std::memcpy(p, s.data(), s.size());
        p[s.size()] = 0;
        *text = p;
        *len = s.size();
        return 0;
    } catch (const std::bad_alloc &) {
        set_err(err, errlen, m->path + ": out of memory");
        return -1;
    }
}

const struct tok_ops tok_spm_ops = {
    "sentencepiece", spm_free,     spm_vocab_size, spm_piece_id, spm_role_id,
    spm_enc_new,     spm_enc_free, spm_encode,     spm_decode,
};

} // extern "C"
