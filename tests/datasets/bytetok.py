"""A byte-level tokenizer.json for tests: GPT-2's byte-to-unicode table and no merges, so the
id of every byte is its value and <|endoftext|> (EOS) is 256; the expected ids of any text are
its UTF-8 bytes, computed without Loom.

  import bytetok; bytetok.write_tokenizer(PATH); bytetok.encode(text)  # bytes + [256]
"""
import json

EOS = 256
VOCAB = 257


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(path):
    b2u = bytes_to_unicode()
    tj = {
        "version": "1.0",
        "added_tokens": [{"id": EOS, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {b2u[b]: b for b in range(256)}, "merges": []},
    }
    with open(path, "w") as f:
        json.dump(tj, f)


def encode(text):
    return list(text.encode()) + [EOS]
