"""Inputs of the tokenizer benchmark without node (the GPU machines have python3 but no npm):

  bench_tok_gen.py corpus OUT [SIZE=100000000]
      the licence texts of /usr/share/common-licenses copied over and over with variations
      (paragraph order shuffled, numbered section headers, some words upper-case or
      capitalised, a line of other scripts now and then) until at least SIZE bytes: the recipe
      of bench_tok_corpus.mjs (not its bytes);
  bench_tok_gen.py tokenizer CORPUS OUT [MERGES=4000]
      a GPT-2-layout tokenizer.json (byte-level BPE, the ByteLevel pre-tokenizer with GPT-2's
      regex, <|endoftext|> added) whose merges are learned here from the first 4 MB of CORPUS:
      standard BPE training (most frequent adjacent pair first, ties by the pair's order of
      first appearance) over words split by an approximation of GPT-2's pattern in Python's re.
      The vocabulary is 256 bytes + MERGES + 1; the encoder then does GPT-2's work per byte
      (same regex, same merge loop) with a smaller table.
"""
import collections
import json
import os
import re
import sys


def corpus(out, size):
    d = "/usr/share/common-licenses"
    paras = []
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        if os.path.isfile(p):
            for q in re.split(r"\n\s*\n", open(p, encoding="utf-8", errors="replace").read()):
                if q.strip():
                    paras.append(q)
    extra = ["Größe und Straße — déjà vu.", "中文文本与日本語のテキスト。", "Ёжик в тумане, 123 456.",
             "emoji 😀👍🏽 and tabs\t\there", "    indented    code(x, y);"]
    seed = [7]

    def rnd(n):
        seed[0] = (seed[0] * 1103515245 + 12345) % 2147483648
        return seed[0] * n // 2147483648

    def word(m):
        w = m.group(0)
        return w.upper() if rnd(50) == 0 else w[0].upper() + w[1:] if rnd(30) == 0 else w

    written, copy = 0, 0
    with open(out, "wb") as f:
        while written < size:
            order = list(range(len(paras)))
            for i in range(len(order) - 1, 0, -1):
                j = rnd(i + 1)
                order[i], order[j] = order[j], order[i]
            parts = []
            for i in order:
                p = re.sub(r"\b[a-z]+\b", word, paras[i])
                if rnd(8) == 0:
                    p = f"Section {copy}.{i}\n{p}"
                if rnd(20) == 0:
                    p += "\n" + extra[rnd(len(extra))]
                parts.append(p)
            b = ("\n\n".join(parts) + "\n\n").encode()
            f.write(b)
            written += len(b)
            copy += 1


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# GPT-2's pattern with \p{L} / \p{N} approximated by Python's classes (training only; the
# tokenizer.json carries the real ByteLevel pre-tokenizer)
PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def tokenizer(src, out, merges_n):
    b2u = bytes_to_unicode()
    text = open(src, "rb").read(4 << 20).decode("utf-8", errors="ignore")
    counts = collections.Counter(PAT.findall(text))
    words = [[b2u[b] for b in w.encode()] for w in counts]
    freq = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    first = {}
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[a, b] += freq[i]
            where[a, b].add(i)
            first.setdefault((a, b), len(first))
    merges = []
    while len(merges) < merges_n and pairs:
        best = max(pairs, key=lambda p: (pairs[p], -first[p]))
        if pairs[best] <= 0:
            break
        merges.append(best)
        a, b = best
        ab = a + b
        for i in list(where[best]):
            w = words[i]
            for x, y in zip(w, w[1:]):  # take the word's pairs out
                pairs[x, y] -= freq[i]
            j, nw = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(ab)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            words[i] = nw
            for x, y in zip(nw, nw[1:]):  # and the new ones in
                pairs[x, y] += freq[i]
                where[x, y].add(i)
                first.setdefault((x, y), len(first))
        del pairs[best]
        for p in [p for p, c in pairs.items() if c <= 0]:
            del pairs[p]
    vocab = {b2u[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    eos = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eos, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab,
                  "merges": [f"{a} {b}" for a, b in merges]},
    }
    with open(out, "w") as f:
        json.dump(tok, f)
    print(f"# tokenizer {out}: {len(merges)} merges learned, vocabulary {eos + 1}",
          file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "corpus":
        corpus(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 100000000)
    elif len(sys.argv) >= 4 and sys.argv[1] == "tokenizer":
        tokenizer(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 4000)
    else:
        sys.exit(__doc__)
