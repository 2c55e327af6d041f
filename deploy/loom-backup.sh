#!/bin/sh
# Online backup of loomd's store while loomd runs: SQLite's backup API (the
# sqlite3 shell's .backup, else Python's sqlite3.Connection.backup) copies a
# consistent snapshot of loom.db (WAL mode: readers do not block loomd's
# writer), the copy is checked with PRAGMA integrity_check and only then
# renamed into place. The bootstrap tokens (admin.token, join.token) are kept
# next to it (mode 0600) when they exist, so a restore needs nothing else.
# Old backups beyond KEEP are deleted. See docs/operations.md ("Back up").
#
# Usage: loom-backup.sh [DATA_DIR (/var/lib/loom)] [DEST_DIR (/var/backups/loom)] [KEEP (14)]
# Prints the backup's path. Exit 0 ok, 1 failed (nothing half-written is left).
set -eu
data=${1:-/var/lib/loom}
dest=${2:-/var/backups/loom}
keep=${3:-14}
db="$data/loom.db"
[ -f "$db" ] || { echo "loom-backup: no store at $db" >&2; exit 1; }
umask 077
mkdir -p "$dest"
ts=$(date -u +%Y%m%dT%H%M%SZ)
out="$dest/loom-$ts.db"
tmp="$out.partial"
rm -f "$tmp"
trap 'rm -f "$tmp"' EXIT

# LOOM_BACKUP_PYTHON=1 forces the Python path (tests use it to cover both).
if [ -z "${LOOM_BACKUP_PYTHON:-}" ] && command -v sqlite3 >/dev/null 2>&1; then
    # .timeout: wait up to 10 s for loomd's write lock instead of failing.
    sqlite3 "$db" ".timeout 10000" ".backup '$tmp'"
    check=$(sqlite3 "$tmp" "PRAGMA integrity_check;")
    version=$(sqlite3 "$tmp" "SELECT COALESCE(MAX(version),0) FROM schema_version;")
else
    set -- $(python3 - "$db" "$tmp" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1], timeout=10)
dst = sqlite3.connect(sys.argv[2])
src.backup(dst, pages=1024)
src.close()
print(dst.execute("PRAGMA integrity_check").fetchone()[0])
print(dst.execute("SELECT COALESCE(MAX(version),0) FROM schema_version").fetchone()[0])
dst.close()
PY
    )
    check=$1
    version=$2
fi
if [ "$check" != "ok" ]; then
    echo "loom-backup: integrity check of the copy failed: $check" >&2
    exit 1
fi
mv "$tmp" "$out"
trap - EXIT
for t in admin.token join.token; do
    [ -f "$data/$t" ] && cp "$data/$t" "$dest/loom-$ts.$t"
done
# Prune: keep the newest $keep backups (names sort by time).
ls -1 "$dest"/loom-*.db 2>/dev/null | sort -r | tail -n +$((keep + 1)) | while read -r old; do
    rm -f "$old" "${old%.db}.admin.token" "${old%.db}.join.token"
done
echo "loom-backup: $out (schema version $version, $(wc -c < "$out") bytes)" >&2
echo "$out"
