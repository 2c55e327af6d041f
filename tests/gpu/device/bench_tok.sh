#!/bin/bash
# Tokenizer thread scaling on the GPU machine's cores (no node/npm there, so Loom's encoder
# only; tests/bench/bench_tok.sh compares it with tiktoken and @huggingface/tokenizers where
# npm is): a ~100 MB corpus and a GPT-2-layout byte-level BPE tokenizer.json (merges learned
# from the corpus) made by tests/bench/bench_tok_gen.py, then bench_tok over the same text on
# 1, 2, 4, 8 and 16 threads (ids checked equal to the 1-thread run).
# Usage: tests/gpu/device/bench_tok.sh   (BUILD: the carried build folder; SIZE bytes)
# One "RESULT bench_tok ... threads=N mb_per_s=X speedup=S" line per thread count, then
# "SUMMARY: ..."; the corpus and tokenizer stay in /tmp/loom-bench-tok.
. "$(dirname "$0")/env.sh"
SIZE=${SIZE:-100000000}
w=/tmp/loom-bench-tok
mkdir -p "$w"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m) $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
[ -s "$w/corpus.txt" ] || python3 tests/bench/bench_tok_gen.py corpus "$w/corpus.txt" "$SIZE"
[ -s "$w/bpe.json" ] || python3 tests/bench/bench_tok_gen.py tokenizer "$w/corpus.txt" "$w/bpe.json" 4000
echo "# corpus $(wc -c <"$w/corpus.txt") bytes $(el)"
timeout 500 "$BIN/bench_tok" "$w/bpe.json" "$w/corpus.txt" 1 2 4 8 16 >"$OUT/bench_tok.out" 2>&1
r=$?
grep '^RESULT' "$OUT/bench_tok.out" || tail -5 "$OUT/bench_tok.out"
echo "SUMMARY: bench_tok=$r $(el)"
