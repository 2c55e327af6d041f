// The benchmark text: the licence texts of /usr/share/common-licenses, copied over and over
// with variations (paragraph order shuffled, numbered section headers, some words upper-case
// or capitalised, numbers and a line of other scripts now and then) until at least SIZE bytes.
//   node bench_tok_corpus.mjs OUT [SIZE=100000000]
import { openSync, readdirSync, readFileSync, statSync, writeSync, closeSync } from "node:fs";

const [out, sizeArg] = process.argv.slice(2);
const size = Number(sizeArg || 100000000);
const dir = "/usr/share/common-licenses";
const paras = [];
for (const n of readdirSync(dir).sort()) {
  if (!statSync(`${dir}/${n}`).isFile()) continue;
  for (const p of readFileSync(`${dir}/${n}`, "utf8").split(/\n\s*\n/)) if (p.trim()) paras.push(p);
}
const extra = ["Größe und Straße — déjà vu.", "中文文本与日本語のテキスト。", "Ёжик в тумане, 123 456.",
  "emoji 😀👍🏽 and tabs\t\there", "    indented    code(x, y);"];
let seed = 7;
const rnd = (n) => ((seed = (seed * 1103515245 + 12345) % 2147483648), Math.floor((seed / 2147483648) * n));
const fd = openSync(out, "w");
let written = 0, copy = 0;
while (written < size) {
  const order = paras.map((_, i) => i);
  for (let i = order.length - 1; i > 0; i--) {
    const j = rnd(i + 1);
    [order[i], order[j]] = [order[j], order[i]];
  }
  const parts = [];
  for (const i of order) {
    let p = paras[i].replace(/\b([a-z]+)\b/g, (w) =>
      rnd(50) === 0 ? w.toUpperCase() : rnd(30) === 0 ? w[0].toUpperCase() + w.slice(1) : w);
    if (rnd(8) === 0) p = `Section ${copy}.${i}\n${p}`;
    if (rnd(20) === 0) p += "\n" + extra[rnd(extra.length)];
    parts.push(p);
  }
  const s = parts.join("\n\n") + "\n\n";
  const b = Buffer.from(s); // whole copies only: the file ends on a character boundary
  writeSync(fd, b);
  written += b.length;
  copy++;
}
closeSync(fd);
