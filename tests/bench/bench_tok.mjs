// Benchmark (not a test): encode speed of JS tokenizers on the same text and chunks as
// bench_tok.c (about 64 KiB, ending before a line that starts with an ASCII letter).
//   node bench_tok.mjs TOKENIZER_JSON TEXT IMPL THREADS
// IMPL: tiktoken (WASM, "gpt2" encoding), js-tiktoken (pure JS, gpt2 ranks), hf
// (@huggingface/tokenizers loading TOKENIZER_JSON). THREADS > 1 deals the chunks round-robin
// to worker_threads. Wall time and the process's CPU time (all threads) of the timed pass are
// reported. A warm-up on the first 16 chunks of each thread, then a timed pass over all; prints one
// JSON line.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";

const require = createRequire(new URL("../tok/package.json", import.meta.url));

function chunks(buf) {
  const out = [];
  let at = 0;
  while (at < buf.length) {
    let end = Math.min(at + 65536, buf.length);
    while (end < buf.length && !(buf[end - 1] === 10 && ((buf[end] | 0x20) >= 97 && (buf[end] | 0x20) <= 122)))
      end++;
    out.push(buf.subarray(at, end).toString("utf8"));
    at = end;
  }
  return out;
}

async function encoder(impl, tokPath) {
  if (impl === "tiktoken") {
    const { get_encoding } = require("tiktoken");
    const t = get_encoding("gpt2");
    return (s) => t.encode(s, [], []).length;
  }
  if (impl === "js-tiktoken") {
    const { Tiktoken } = require("js-tiktoken/lite");
    const t = new Tiktoken(require("js-tiktoken/ranks/gpt2"));
    return (s) => t.encode(s, [], []).length;
  }
  if (impl === "hf") {
    const { Tokenizer } = await import(require.resolve("@huggingface/tokenizers").replace(/\.cjs$/, ".mjs"));
    const t = new Tokenizer(JSON.parse(readFileSync(tokPath, "utf8")), {});
    return (s) => t.encode(s, { add_special_tokens: false }).ids.length;
  }
  throw new Error(`unknown impl ${impl}`);
}

async function work(impl, tokPath, text, tid, n) {
  const enc = await encoder(impl, tokPath);
  const cs = chunks(readFileSync(text));
  const mine = cs.filter((_, i) => i % n === tid);
  return { enc, mine };
}

function pass(enc, mine) {
  let tokens = 0;
  for (const c of mine) tokens += enc(c);
  return tokens;
}

if (!isMainThread) {
  const { impl, tokPath, text, tid, n } = workerData;
  const { enc, mine } = await work(impl, tokPath, text, tid, n);
  pass(enc, mine.slice(0, 16)); // warm-up (JIT) on about 1 MB
  parentPort.postMessage({ ready: true });
  parentPort.once("message", () => parentPort.postMessage({ tokens: pass(enc, mine) }));
} else {
  const [tokPath, text, impl, threadsArg] = process.argv.slice(2);
  const n = Number(threadsArg || 1);
  const bytes = readFileSync(text).length;
  let tokens = 0, secs = 0, cpu0, cpuUsed;
  if (n === 1) {
    const { enc, mine } = await work(impl, tokPath, text, 0, 1);
    pass(enc, mine.slice(0, 16));
    cpu0 = process.cpuUsage(); // the whole process: worker threads included
    const t0 = process.hrtime.bigint();
    tokens = pass(enc, mine);
    secs = Number(process.hrtime.bigint() - t0) / 1e9;
    cpuUsed = process.cpuUsage(cpu0);
  } else {
    const ws = [];
    for (let i = 0; i < n; i++)
      ws.push(new Worker(new URL(import.meta.url), { workerData: { impl, tokPath, text, tid: i, n } }));
    await Promise.all(ws.map((w) => new Promise((r) => w.once("message", r))));
    cpu0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    const res = await Promise.all(ws.map((w) => new Promise((r) => { w.once("message", r); w.postMessage("go"); })));
    secs = Number(process.hrtime.bigint() - t0) / 1e9;
    tokens = res.reduce((a, r) => a + r.tokens, 0);
    cpuUsed = process.cpuUsage(cpu0);
    await Promise.all(ws.map((w) => w.terminate()));
  }
  const cpu = (cpuUsed.user + cpuUsed.system) / 1e6;
  console.log(JSON.stringify({ impl, threads: n, bytes, tokens, seconds: Number(secs.toFixed(3)),
    mb_per_s: Number((bytes / secs / 1e6).toFixed(2)), cpu_seconds: Number(cpu.toFixed(3)),
    mb_per_cpu_s: Number((bytes / cpu / 1e6).toFixed(2)) }));
}
