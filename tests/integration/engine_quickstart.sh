#!/bin/sh
# Quick-start corpus (the licence texts Debian installs in /usr/share/common-licenses, see
# docs/data.md): loom-data prepares byte-level shards, loom-worker trains a small GPT-2 on them,
# and the validation loss must fall: the last evaluation below the first one and below
# 0.8 x ln(256) = 4.44 (the loss of a uniform guess over the 256 byte tokens is 5.55).
# Usage: engine_quickstart.sh LOOM_DATA LOOM_WORKER. Exit 77 (skipped) without the corpus.
set -u
data_tool=$1
worker=$2
corpus=/usr/share/common-licenses
if [ ! -d "$corpus" ]; then
    echo "SKIP: $corpus not found (package base-files)"
    exit 77
fi
tmp=$(mktemp -d /tmp/loom-quickstart-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$data_tool" prepare --in "$corpus" --out "$tmp/data" >"$tmp/prepare.json" || {
    echo "FAIL: loom-data prepare"
    exit 1
}
cat >"$tmp/spec.json" <<SPEC
{"name": "quickstart-test",
 "model": {"family": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 64, "d_ff": 256,
           "vocab_size": 256, "seq_len": 64},
 "data": {"train": "$tmp/data/train_*.bin", "val": "$tmp/data/val_*.bin"},
 "train": {"steps": 40, "global_batch_tokens": 1024, "micro_batch": 8, "lr": 0.003,
           "min_lr": 0.0003, "warmup_steps": 4, "seed": 3, "eval_every": 10, "eval_batches": 8},
 "checkpoint": {"every_steps": 0, "keep": 1},
 "resources": {"device": "cpu"}}
SPEC
"$worker" --spec "$tmp/spec.json" --out "$tmp/out" --threads 1 >"$tmp/out.jsonl" 2>"$tmp/err.txt"
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL: loom-worker exited $rc"
    tail -5 "$tmp/err.txt"
    exit 1
fi
vals=$(grep '"type":"eval"' "$tmp/out.jsonl" | sed 's/.*"val_loss":\([0-9.e+-]*\).*/\1/')
echo "validation losses:" $vals
echo "$vals" | awk 'NR == 1 { first = $1 } { last = $1; n++ }
    END {
        if (n < 2) { print "FAIL: fewer than 2 evaluations"; exit 1 }
        if (!(last < first)) { print "FAIL: val loss did not fall: " first " -> " last; exit 1 }
        if (!(last < 0.8 * log(256))) { print "FAIL: val loss " last " not below 4.44"; exit 1 }
        print "ok: val loss " first " -> " last
    }'
