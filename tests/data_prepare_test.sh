#!/bin/sh
# Test of `loom-data prepare` and `loom-data check`: document count, byte-level
# tokens (a document starts with token 0, then its bytes), duplicates through
# symlinks read once, non-text files skipped, train + val = all tokens with a
# non-empty val split, deterministic output, check accepts the shards and rejects
# them for a too-small vocabulary. Usage: data_prepare_test.sh LOOM_DATA_BINARY
set -u
bin=$1
dir=$(mktemp -d /tmp/loom_test_prepare_XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir "$dir/in"
i=0
while [ $i -lt 300 ]; do echo "hello world, line $i of the first document"; i=$((i + 1)); done > "$dir/in/a.txt"
printf 'second document\n' > "$dir/in/b.txt"
ln -s a.txt "$dir/in/c_link.txt"
printf 'bin\000ary' > "$dir/in/d.bin"
abytes=$(wc -c < "$dir/in/a.txt")
bbytes=$(wc -c < "$dir/in/b.txt")
total=$((abytes + bbytes + 2))

out=$("$bin" prepare --in "$dir/in" --out "$dir/out" --val-fraction 0.2 --block-size 1000) ||
    fail "prepare exited $?"
echo "$out"
num() { echo "$out" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
[ "$(num documents)" = 2 ] || fail "documents: $(num documents), want 2 (link read once, binary skipped)"
train=$(num train_tokens); val=$(num val_tokens)
[ $((train + val)) = $total ] || fail "train $train + val $val != $total tokens"
[ "$val" -gt 0 ] && [ "$val" -lt $((total / 2)) ] || fail "val split $val of $total"
[ -f "$dir/out/train_000.bin" ] && [ -f "$dir/out/val_000.bin" ] || fail "shards missing"
size=$(wc -c < "$dir/out/train_000.bin")
[ "$size" = $((1024 + 2 * train)) ] || fail "train_000.bin has $size bytes for $train tokens"
# Header: magic 20240520, version 1, count; then tokens 0, 'h' (104), 'e' (101).
hdr=$(od -An -td4 -N12 "$dir/out/train_000.bin" | tr -s ' ' | sed 's/^ //')
[ "$hdr" = "20240520 1 $train" ] || fail "header '$hdr'"
toks=$(od -An -tu2 -j1024 -N6 "$dir/out/train_000.bin" | tr -s ' ' | sed 's/^ //')
[ "$toks" = "0 104 101" ] || fail "first tokens '$toks', want '0 104 101'"
grep -q '"tokenizer": "byte"' "$dir/out/meta.json" || fail "meta.json"

"$bin" prepare --in "$dir/in/a.txt,$dir/in/b.txt" --out "$dir/out2" --val-fraction 0.2 \
    --block-size 1000 > /dev/null || fail "second prepare"
cmp "$dir/out/train_000.bin" "$dir/out2/train_000.bin" || fail "not deterministic (train)"
cmp "$dir/out/val_000.bin" "$dir/out2/val_000.bin" || fail "not deterministic (val)"

"$bin" check "$dir/out/*.bin" --vocab-size 256 | grep -q '"ok":true' || fail "check rejected good shards"
"$bin" check "$dir/out/*.bin" --vocab-size 100 2> "$dir/err"
[ $? = 2 ] || fail "check with vocab 100 should exit 2"
grep -q "out of range for the model's vocab_size 100" "$dir/err" || fail "check message: $(cat "$dir/err")"
head -c 1500 "$dir/out/train_000.bin" > "$dir/trunc.bin"
"$bin" check "$dir/trunc.bin" 2> "$dir/err"
[ $? = 2 ] && grep -q "truncated" "$dir/err" || fail "truncated shard not reported"
"$bin" prepare --out "$dir/none" 2> /dev/null
[ $? = 2 ] || fail "prepare without inputs should exit 2"
# The quick-start corpus (docs/data.md): Debian's licence texts, when present.
if [ -d /usr/share/common-licenses ]; then
    out=$("$bin" prepare --in /usr/share/common-licenses --out "$dir/quick") || fail "quick-start prepare"
    [ "$(num train_tokens)" -gt 100000 ] && [ "$(num val_tokens)" -gt 4000 ] ||
        fail "quick-start corpus too small: $out"
    "$bin" check "$dir/quick/*.bin" --vocab-size 256 > /dev/null || fail "quick-start check"
else
    echo "note: /usr/share/common-licenses missing, quick-start corpus not checked"
fi
echo "ok"
