#!/bin/sh
# Runs one libFuzzer target for a bounded time on a scratch copy of its
# checked-in corpus (new inputs land in the scratch dir, not in the tree).
# Usage: run_fuzz.sh TARGET CORPUS_DIR SECONDS [FUZZER_FLAG...]. Exit: the fuzzer's (0 = no
# crash, leak or failed property in that time); on a failure the scratch dir
# (with the crash-* input) is kept and named.
set -eu
target=$1 corpus=$2 secs=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/loom-fuzz.XXXXXX")
mkdir "$work/corpus"
cp "$corpus"/* "$work/corpus/"
cd "$work"
rc=0
"$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 "$@" corpus || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "run_fuzz.sh: $target failed (exit $rc); inputs kept in $work"
    exit "$rc"
fi
rm -rf "$work"
