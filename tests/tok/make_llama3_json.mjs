// Writes a Llama 3 tokenizer.json from the vocabulary and merges that llama3-tokenizer-js
// ships (Meta's Llama 3 tokenizer): byte-level BPE with ignore_merges, the Llama 3 split regex
// (Split, Isolated) then ByteLevel without its own regex, and the 256 special tokens from id
// 128000 (<|begin_of_text|>, <|eot_id|>, <|reserved_special_token_N|>, ...) as special added
// tokens, as in Meta's published file.
//   node make_llama3_json.mjs OUT.json
import { writeFileSync } from "node:fs";

const llama3 = (await import("llama3-tokenizer-js")).default;
const pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const vocab = {};
const added = [];
llama3.vocabById.forEach((s, id) => {
  if (id < 128000) vocab[s] = id;
  else added.push({ id, content: s, single_word: false, lstrip: false, rstrip: false,
                    normalized: false, special: true });
});
const merges = [...llama3.merges.entries()].sort((a, b) => a[1] - b[1]).map((e) => e[0]);
const tok = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: null,
  pre_tokenizer: {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
           end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
           vocab, merges },
};
writeFileSync(process.argv[2], JSON.stringify(tok));
