// Reference for `loom-data chat`: renders each conversation of a JSONL file with the published
// chat template (written out here from the templates' documentation, not from Loom), encodes
// it with @huggingface/tokenizers and prints {"ids":[...],"mask":[...]} a line.
//   node chat_ref.mjs llama3|chatml TOKENIZER_JSON CASES.jsonl [--gen|--whole]
// --whole instead prints the ids of the rendered string tokenized in one piece, special
// tokens recognised (what tokenizing apply_chat_template's text gives), as a bare array.
// Template markers come from the file's added tokens; text between markers is encoded with
// the same file minus its added tokens, so marker text inside a message stays text (Loom's
// rule). mask: tokens whose bytes overlap an assistant message's content, and the assistant's
// closing marker. Byte spans come from the vocabulary strings (byte-level: one character is
// one byte).
import { readFileSync } from "node:fs";

const [tpl, tokPath, casesPath, genFlag] = process.argv.slice(2);
const gen = genFlag === "--gen";
const whole = genFlag === "--whole";
const { Tokenizer } = await import("@huggingface/tokenizers");
const file = JSON.parse(readFileSync(tokPath, "utf8"));
const marker = Object.fromEntries(file.added_tokens.map((a) => [a.content, a.id]));
const plain = new Tokenizer({ ...file, added_tokens: [] }, {});
const full = new Tokenizer(file, {});
const idToLen = new Map(Object.entries(file.model.vocab).map(([s, id]) => [id, [...s].length]));

// parts: {m: markerText, a: masked} or {t: text, a: isAssistantContent}
function render(msgs) {
  const p = [];
  if (tpl === "llama3") {
    p.push({ m: "<|begin_of_text|>" });
    for (const x of msgs) {
      const a = x.role === "assistant";
      p.push({ m: "<|start_header_id|>" }, { t: x.role }, { m: "<|end_header_id|>" },
        { t: "\n\n" }, { t: x.content.trim(), a }, { m: "<|eot_id|>", a });
    }
    if (gen) p.push({ m: "<|start_header_id|>" }, { t: "assistant" }, { m: "<|end_header_id|>" },
      { t: "\n\n" });
  } else {
    for (const x of msgs) {
      const a = x.role === "assistant";
      p.push({ m: "<|im_start|>" }, { t: x.role + "\n" }, { t: x.content, a },
        { m: "<|im_end|>", a }, { t: "\n" });
    }
    if (gen) p.push({ m: "<|im_start|>" }, { t: "assistant\n" });
  }
  return p;
}

for (const line of readFileSync(casesPath, "utf8").split("\n")) {
  if (!line) continue;
  const parts = render(JSON.parse(line).messages);
  if (whole) {
    const text = parts.map((x) => (x.m !== undefined ? x.m : x.t)).join("");
    console.log(JSON.stringify(full.encode(text, { add_special_tokens: false }).ids));
    continue;
  }
  const ids = [], mask = [];
  let run = [];
  const flush = () => {
    const text = run.map((r) => r.t).join("");
    if (!text) return (run = []);
    const spans = [];
    let off = 0;
    for (const r of run) {
      const n = Buffer.byteLength(r.t);
      if (r.a && n) spans.push([off, off + n]);
      off += n;
    }
    let at = 0;
    for (const id of plain.encode(text, { add_special_tokens: false }).ids) {
      const n = idToLen.get(id);
      ids.push(id);
      mask.push(spans.some(([s, e]) => at < e && at + n > s) ? 1 : 0);
      at += n;
    }
    run = [];
  };
  for (const x of parts) {
    if (x.m !== undefined) {
      flush();
      ids.push(marker[x.m]);
      mask.push(x.a ? 1 : 0);
    } else run.push(x);
  }
  flush();
  console.log(JSON.stringify({ ids, mask }));
}
