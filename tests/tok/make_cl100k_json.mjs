// Writes a tiktoken-style tokenizer.json from js-tiktoken's cl100k_base ranks (the layout Meta
// and others publish for tiktoken vocabularies): byte-level vocabulary = the ranks, merges
// derived from them (for every token, each split into two tokens, ordered by the token's rank
// and then the parts' ranks, as Hugging Face's converter does), ignore_merges (tiktoken takes a
// piece found whole), cl100k's split regex as js-tiktoken ships it (Split, Isolated) then
// ByteLevel without regex, and cl100k's special tokens.
//   node make_cl100k_json.mjs OUT.json
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { Tiktoken } = require("js-tiktoken/lite");
const ranks = require("js-tiktoken/ranks/cl100k_base");
const t = new Tiktoken(ranks);
const b2u = [];
let n = 0;
for (let b = 0; b < 256; b++) {
  const keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  b2u[b] = String.fromCodePoint(keep ? b : 256 + n++);
}
const str = (bytes) => Array.from(bytes, (b) => b2u[b]).join("");
const vocab = {};
const rankOf = new Map();
for (const [rank, bytes] of t.textMap) {
  const s = str(bytes);
  vocab[s] = rank;
  rankOf.set(s, rank);
}
const merges = [];
for (const [rank, bytes] of t.textMap) {
  if (bytes.length < 2) continue;
  const s = [...str(bytes)];
  const local = [];
  for (let i = 1; i < s.length; i++) {
    const l = s.slice(0, i).join(""), r = s.slice(i).join("");
    if (rankOf.has(l) && rankOf.has(r)) local.push([l, r, rank]);
  }
  local.sort((a, b) => rankOf.get(a[0]) - rankOf.get(b[0]) || rankOf.get(a[1]) - rankOf.get(b[1]));
  merges.push(...local);
}
merges.sort((a, b) => a[2] - b[2]);
const added = Object.entries(ranks.special_tokens).map(([content, id]) => ({ id, content,
  single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
const tok = {
  version: "1.0",
  added_tokens: added,
  normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: ranks.pat_str }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
    vocab, merges: merges.map((m) => [m[0], m[1]]) },
};
writeFileSync(process.argv[2], JSON.stringify(tok));
