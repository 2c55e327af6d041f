// Deterministic test corpus for the tokenizer tests: the licence texts of
// /usr/share/common-licenses (one file after another, as lines) followed by generated lines
// that stress pre-tokenizers and BPE: many scripts, emoji (ZWJ sequences, flags, skin tones),
// whitespace runs (spaces, tabs, CR, NBSP, ideographic space), digit runs, contractions in
// every case, punctuation runs, very long words, code, and special-token look-alikes.
//   node gen_corpus.mjs OUT [MIN_BYTES] [--specials]
// Lines never contain "\n"; invalid UTF-8 never occurs (JS strings are written as UTF-8;
// lone surrogates are not generated).
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";

const out = process.argv[2];
const minBytes = Number(process.argv[3] || 1100000);
const specials = process.argv.includes("--specials");
let seed = 12345;
const rnd = (n) => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return Math.floor((seed / 2147483648) * n);
};
const pick = (a) => a[rnd(a.length)];

const lines = [];
const lic = "/usr/share/common-licenses";
for (const name of readdirSync(lic).sort()) {
  const p = `${lic}/${name}`;
  if (!statSync(p).isFile()) continue;
  for (const l of readFileSync(p, "utf8").split("\n")) lines.push(l);
}
const words = lines.join(" ").split(/\s+/).filter((w) => w.length > 0);

const scripts = [
  "Der schnelle braune Fuchs springt über den faulen Hund — Größe, Straße, Ärger.",
  "Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë au delà des îles.",
  "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёжик в тумане!",
  "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Αλφάβητο: αβγδεζηθικλμνξοπρστυφχψω",
  "我能吞下玻璃而不伤身体。中华人民共和国成立于1949年10月1日。",
  "私はガラスを食べられます。それは私を傷つけません。カタカナ・ひらがな・漢字",
  "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요. 한국어 텍스트입니다",
  "أنا قادر على أكل الزجاج و هذا لا يؤلمني. العربية ١٢٣٤٥٦",
  "אני יכול לאכול זכוכית וזה לא מזיק לי. עברית",
  "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती. हिन्दी ०१२३",
  "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ ภาษาไทย",
  "Tôi có thể ăn thủy tinh mà không hại gì. Tiếng Việt có dấu: ắ ặ ẫ ữ ự",
  "Mogę jeść szkło i mi nie szkodzi. Zażółć gęślą jaźń. Čeština: příliš žluťoučký kůň",
  "Κάτι ελληνικό · ελληνικά; ¿Qué tal? ¡Olé! « guillemets » „Anführung“ 『括弧』",
  "e\u0301 a\u0308 o\u0303 combining: n\u0303 A\u030a \u1e9b\u0323 ﬁ ﬂ ＡＢＣ１２３ ①②③ ™ ℃",
];
const emoji = [
  "😀", "😃🎉", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🇩🇪🇯🇵", "🏳️‍🌈", "❤️", "🤷‍♀️", "🧑🏿‍🚀",
  "🐍🦀🐪", "☕", "✔︎", "🔥🔥🔥", "𝕳𝖊𝖑𝖑𝖔", "𐍈𐌰", "🀄",
];
const spaces = [" ", "  ", "   ", "\t", "\t\t", " \t ", "\r", " \r ", "\u00a0", "\u3000",
  "\u2003", "\u00a0\u00a0 ", "        ", " ".repeat(33), "\t ".repeat(9), "\u200b"];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve",
  "'M", "'LL", "'D", "'x", "''", "'"];
const punct = ["...", "!!!", "?!", "--", "—", "()", "[]{}", "<>", "@#$%^&*", "\"'", ";;", "::",
  "//", "\\\\", "~~~", "`code`", "==>", "<=", "!=", "&&", "||", "_", "__init__"];
const code = [
  "int main(int argc, char **argv) { return argc > 1 ? 0 : 1; }",
  "    for (size_t i = 0; i < n; i++) sum += x[i] * 0.5e-3;",
  "def f(x):\treturn {'a': [1, 2, 3], \"b\": None}  # comment",
  "SELECT id, name FROM users WHERE email LIKE '%@example.org' ORDER BY 2 DESC;",
  "https://example.com/path?q=1&r=%20two#frag user@host.example",
  "0x7fffffff 0b1010 1e10 3.14159 -42 +7 1,000,000 12:34:56 2026-12-01T09:45:00Z",
];
const special = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
  "<|end_header_id|>", "<|im_start|>", "<s>", "</s>", "<|endoftext", "<|eot_id|", "< |eot_id|>"];

function digits() {
  let s = "";
  const n = 1 + rnd(25);
  for (let i = 0; i < n; i++) s += String(rnd(10));
  return s;
}
function longWord() {
  const base = pick(["a", "ab", "xyz", "th", "é", "ü", "z", "Ω", "中", "9", "-", "aa", " "]);
  return base.repeat(40 + rnd(300));
}
const gens = [
  () => pick(words),
  () => pick(scripts),
  () => pick(emoji),
  () => pick(spaces),
  () => pick(words) + pick(contractions),
  () => pick(contractions),
  () => digits(),
  () => pick(punct),
  () => pick(code),
  () => (rnd(40) === 0 ? longWord() : pick(words).toUpperCase()),
  () => (specials ? pick(special) : pick(words)),
  () => String.fromCodePoint(0x20 + rnd(0x2fff)).replace(/[\n\ud800-\udfff]/g, "?"),
];
let size = Buffer.byteLength(lines.join("\n"));
while (size < minBytes) {
  let l = "";
  const n = 1 + rnd(30);
  for (let i = 0; i < n; i++) l += pick(gens)() + (rnd(3) ? " " : "");
  l = l.replace(/\n/g, " ");
  lines.push(l);
  size += Buffer.byteLength(l) + 1;
}
writeFileSync(out, lines.join("\n") + "\n");
