#!/bin/sh
# Online backup and restore of loomd's store with deploy/loom-backup.sh:
# loomd runs and takes writes (jobs submitted before and during the backup);
# the backup must pass integrity_check, carry the tokens, and a second loomd
# started on a restored data dir must serve the tenant's token and the jobs
# submitted before the backup. Pruning keeps only KEEP backups.
# Uses the sqlite3 shell when installed, else Python's sqlite3 module; runs
# the other path too when both exist.
# Usage: ops_backup.sh BIN_DIR SOURCE_DIR
set -u
bin=$(cd "$1" && pwd)
src=$2
tmp=$(mktemp -d /tmp/loom-ops-backup.XXXXXX)
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null; done
    for p in $pids; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/loomd.log" ] && tail -20 "$tmp/loomd.log"; exit 1; }
# loomd generates its bootstrap tokens into the data dir (no LOOM_*_TOKEN), so
# the backup must carry them and the restored loomd must accept the same ones.
unset LOOM_ADMIN_TOKEN LOOM_JOIN_TOKEN LOOM_URL LOOM_TOKEN LOOM_CONFIG

# Sets $started_url. Not called in $(...): the pid must reach the cleanup list
# of this shell, or a loomd outlives the test.
start_loomd() { # data-dir log
    "$bin/loomd" --listen 127.0.0.1:0 --data-dir "$1" >> "$2" 2>&1 &
    pids="$pids $!"
    i=0
    while [ ! -s "$1/loomd.addr" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ -s "$1/loomd.addr" ] || fail "loomd did not start on $1"
    started_url=$(cat "$1/loomd.addr")
}
# curl METHOD URL TOKEN [BODY] -> body on stdout; fails on HTTP >= 400
api() {
    if [ $# -ge 4 ]; then
        curl -sf -X "$1" -H "Authorization: Bearer $3" -H 'Content-Type: application/json' \
            -d "$4" "$2"
    else
        curl -sf -X "$1" -H "Authorization: Bearer $3" "$2"
    fi
}
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }

start_loomd "$tmp/d" "$tmp/loomd.log"
url=$started_url
ADMIN=$(cat "$tmp/d/admin.token")
tid=$(api POST "$url/v1/tenants" $ADMIN '{"name":"acme"}' | field '["id"]') || fail "tenant"
tok=$(api POST "$url/v1/tenants/$tid/tokens" $ADMIN '{}' | field '["token"]') || fail "token"
printf '\0\0\0\0' > "$tmp/train.bin"
spec() {
    printf '{"name":"%s","model":{"family":"gpt2","n_layer":2,"n_head":2,"d_model":64,' "$1"
    printf '"d_ff":256,"vocab_size":256,"seq_len":32},"data":{"train":"%s"},' "$tmp/train.bin"
    printf '"parallel":{"dp":1},"train":{"steps":10,"global_batch_tokens":128,"micro_batch":4,'
    printf '"precision":"fp32"},"resources":{"device":"cpu","gpus_per_node":1}}'
}
for n in 1 2 3 4 5; do
    api POST "$url/v1/jobs" "$tok" "$(spec before-$n)" > /dev/null || fail "submit before-$n"
done
# Writes continue while the backups run.
( for n in $(seq 1 40); do api POST "$url/v1/jobs" "$tok" "$(spec during-$n)" > /dev/null; done ) &
writer=$!

modes="default"
command -v sqlite3 >/dev/null 2>&1 && modes="$modes python"
for mode in $modes; do
    if [ "$mode" = python ]; then
        out=$(LOOM_BACKUP_PYTHON=1 sh "$src/deploy/loom-backup.sh" "$tmp/d" "$tmp/bk-$mode" 2) ||
            fail "backup ($mode)"
    else
        out=$(sh "$src/deploy/loom-backup.sh" "$tmp/d" "$tmp/bk-$mode" 2) || fail "backup ($mode)"
    fi
    [ -s "$out" ] || fail "no backup file ($mode)"
    [ -f "${out%.db}.admin.token" ] || fail "admin.token not kept ($mode)"
    [ "$(stat -c %a "$out")" = 600 ] || fail "backup mode $(stat -c %a "$out"), want 600"
    python3 - "$out" <<'PY' || fail "backup content ($mode)"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
n = c.execute("SELECT COUNT(*) FROM jobs WHERE name LIKE 'before-%'").fetchone()[0]
assert n == 5, "jobs before the backup: %d" % n
PY
    # Restore into a fresh data dir and serve it.
    mkdir -p "$tmp/r-$mode"
    cp "$out" "$tmp/r-$mode/loom.db"
    cp "${out%.db}.admin.token" "$tmp/r-$mode/admin.token"
    cp "${out%.db}.join.token" "$tmp/r-$mode/join.token"
    start_loomd "$tmp/r-$mode" "$tmp/loomd-r.log"
    url2=$started_url
    api GET "$url2/v1/tenants" "$ADMIN" > /dev/null || fail "restored admin token refused ($mode)"
    n=$(api GET "$url2/v1/jobs?limit=100&name=before-3" "$tok" | field '["items"].__len__()') ||
        fail "restored loomd does not accept the tenant token ($mode)"
    [ "$n" = 1 ] || fail "restored store lacks job before-3 ($mode): $n"
    echo "backup ($mode): $(basename "$out") restored and served"
done
wait $writer

# Pruning: three more backups with KEEP=2 leave two.
for n in 1 2 3; do
    sleep 1
    sh "$src/deploy/loom-backup.sh" "$tmp/d" "$tmp/prune" 2 > /dev/null || fail "backup $n"
done
c=$(ls "$tmp/prune"/loom-*.db | wc -l)
[ "$c" = 2 ] || fail "prune kept $c backups, want 2"
ls "$tmp/prune" | grep -q partial && fail "partial file left"
echo PASS
