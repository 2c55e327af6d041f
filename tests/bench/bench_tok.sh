#!/bin/sh
# Tokenizer encode speed: Loom's BPE (bench_tok) against tiktoken (WASM), js-tiktoken and
# @huggingface/tokenizers, GPT-2 vocabulary, the same ~100 MB of licence text, one thread and
# all threads, in one run. Not a test; results go to docs/perf.md.
#   tests/bench/bench_tok.sh BUILD_DIR [WORK_DIR=/tmp/loom-bench-tok] [SIZE=100000000]
set -eu
build=$(cd "$1" && pwd)
work=${2:-/tmp/loom-bench-tok}
size=${3:-100000000}
here=$(cd "$(dirname "$0")" && pwd)
threads=$(nproc)
mkdir -p "$work"
[ -d "$here/../tok/node_modules/tiktoken" ] || { echo "run tools/setup.sh first"; exit 1; }
[ -s "$work/corpus.txt" ] || node "$here/bench_tok_corpus.mjs" "$work/corpus.txt" "$size"
[ -s "$work/gpt2.json" ] || node "$here/../tok/make_gpt2_json.mjs" "$work/gpt2.json"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m) $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# corpus $(wc -c <"$work/corpus.txt") bytes"
"$build/bin/bench_tok" "$work/gpt2.json" "$work/corpus.txt" 1 "$threads"
for impl in tiktoken js-tiktoken hf; do
    for n in 1 "$threads"; do
        node "$here/bench_tok.mjs" "$work/gpt2.json" "$work/corpus.txt" "$impl" "$n"
    done
done
