// Reference for `loom-data prepare --format jsonl|completion`: encodes each line's fields
// with @huggingface/tokenizers (the file minus its added tokens, so special-token text stays
// text, as Loom encodes data) and prints {"ids":[...],"mask":[...]} a line, without the EOS
// that prepare appends (the test adds it).
//   node prepare_ref.mjs jsonl|completion TOKENIZER_JSON FILE.jsonl [TEXT_KEY]
// jsonl: ids of line[TEXT_KEY], mask all 1. completion: ids of prompt then of completion,
// encoded separately; mask 0 on the prompt, 1 on the completion.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [fmt, tokPath, inPath, key = "text"] = process.argv.slice(2);
// The npm packages are the ones tests/tok pins (tests/tok/node_modules, tools/setup.sh).
const req = createRequire(new URL("../tok/package.json", import.meta.url));
const mod = await import(pathToFileURL(req.resolve("@huggingface/tokenizers")).href);
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;
const file = JSON.parse(readFileSync(tokPath, "utf8"));
const plain = new Tokenizer({ ...file, added_tokens: [] }, {});
const enc = (s) => (s ? plain.encode(s, { add_special_tokens: false }).ids : []);
for (const line of readFileSync(inPath, "utf8").split("\n")) {
  if (!line.trim()) continue;
  const o = JSON.parse(line);
  let ids, mask;
  if (fmt === "jsonl") {
    ids = enc(o[key]);
    mask = ids.map(() => 1);
  } else {
    const p = enc(o.prompt), c = enc(o.completion);
    ids = [...p, ...c];
    mask = [...p.map(() => 0), ...c.map(() => 1)];
  }
  console.log(JSON.stringify({ ids, mask }));
}
