#!/bin/sh
# The audit log against the real loomd: state-changing admin and tenant
# requests (refused ones too) become rows with actor, tenant, method, route,
# object id, peer address and status; reads are not recorded; GET /v1/audit
# filters (since, actor, limit), is admin only and refuses bad queries; the
# retention sweep deletes rows older than --audit-retention-days at start-up.
# Usage: test_daemon_audit.sh LOOMD
set -u
LOOMD=$1
command -v curl >/dev/null 2>&1 || { echo "SKIP: no curl binary"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
T=$(mktemp -d /tmp/loom-test-audit-XXXXXX)
: >"$T/train_000.bin" # loomd sees $T: the submit check wants train_*.bin to match a file
fail=0
PID=
check() { # check NAME CONDITION-RESULT
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
start() { # start [ARGS...]
    rm -f "$T/d/loomd.addr"
    LOOM_ADMIN_TOKEN=aud-admin LOOM_JOIN_TOKEN=j "$LOOMD" --listen 127.0.0.1:0 --data-dir "$T/d" \
        --log-level warn --data-roots "$T" "$@" >>"$T/loomd.log" 2>&1 &
    PID=$!
    i=0
    while [ ! -s "$T/d/loomd.addr" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i + 1)); done
    URL=$(cat "$T/d/loomd.addr")
}
stop() { kill "$PID"; wait "$PID"; PID=; }
JSON="Content-Type: application/json"
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }
req() { # req METHOD PATH TOKEN [BODY]: body in $T/r.json, status printed
    if [ $# -ge 4 ]; then
        curl -s -o "$T/r.json" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $3" \
            -H "$JSON" -d "$4" "$URL$2"
    else
        curl -s -o "$T/r.json" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $3" "$URL$2"
    fi
}

start
req POST /v1/tenants aud-admin '{"name":"audited"}' >/dev/null
TEN=$(jget '["id"]' <"$T/r.json")
req POST "/v1/tenants/$TEN/tokens" aud-admin '{"name":"main"}' >/dev/null
TOK=$(jget '["token"]' <"$T/r.json")
KID=$(jget '["id"]' <"$T/r.json")
req POST "/v1/tenants/$TEN/tokens" aud-admin '{"scopes":["read"]}' >/dev/null
RTOK=$(jget '["token"]' <"$T/r.json")
RKID=$(jget '["id"]' <"$T/r.json")
cat >"$T/job.json" <<JOB
{"name":"aud-job","model":{"family":"gpt2","preset":"124m"},
 "data":{"train":"$T/train_*.bin"},"resources":{"device":"cpu"}}
JOB
curl -s -o "$T/r.json" -H "Authorization: Bearer $TOK" -H "$JSON" --data-binary @"$T/job.json" \
    "$URL/v1/jobs"
JOB=$(jget '["id"]' <"$T/r.json")
st=$(req POST "/v1/jobs/$JOB/cancel" "$RTOK")
[ "$st" = 403 ]; check "read token cancel refused ($st)" $?
req GET /v1/jobs "$TOK" >/dev/null
req GET "/v1/jobs/$JOB" "$TOK" >/dev/null
req POST /v1/tenants wrong-token '{"name":"intruder"}' >/dev/null
req POST "/v1/jobs/$JOB/cancel" "$TOK" >/dev/null
req DELETE "/v1/tenants/$TEN/tokens/$RKID" aud-admin >/dev/null

st=$(req GET /v1/audit aud-admin)
[ "$st" = 200 ]; check "GET /v1/audit 200" $?
python3 - "$T/r.json" "$TEN" "$KID" "$JOB" "$RKID" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["items"]
ten, kid, job, rkid = sys.argv[2:]
got = [(i["actor"], i["method"], i["route"], i["object_id"], i["status"]) for i in items]
want = [
    ("admin", "POST", "/v1/tenants", ten, 201),
    ("admin", "POST", "/v1/tenants/{id}/tokens", kid, 201),
    ("admin", "POST", "/v1/tenants/{id}/tokens", rkid, 201),
    (kid, "POST", "/v1/jobs", job, 201),
    (rkid, "POST", "/v1/jobs/{id}/cancel", job, 403),
    ("", "POST", "/v1/tenants", "", 401),
    (kid, "POST", "/v1/jobs/{id}/cancel", job, 200),
    ("admin", "DELETE", "/v1/tenants/{id}/tokens/{tid}", rkid, 200),
]
assert got == want, "\n%s\n!=\n%s" % (got, want)
assert all(i["remote"] == "127.0.0.1" for i in items), items
assert [i["tenant_id"] for i in items if i["actor"] == kid] == [ten, ten], items
assert all(i["tenant_id"] == "" for i in items if i["actor"] == "admin"), items
assert items[3]["path"] == "/v1/jobs" and items[6]["path"] == "/v1/jobs/%s/cancel" % job
assert all(i["at"].endswith("Z") for i in items)
seqs = [i["seq"] for i in items]
assert seqs == sorted(seqs)
print("ok: 8 rows, in order, with actor/tenant/route/object/remote/status; no reads")
PY
check "audit rows" $?
req GET "/v1/audit?actor=$KID" aud-admin >/dev/null
[ "$(jget '["items"].__len__()' <"$T/r.json")" = 2 ]; check "actor filter: 2 rows of $KID" $?
req GET "/v1/audit?limit=3" aud-admin >/dev/null
[ "$(jget '["items"][2]["route"]' <"$T/r.json")" = "/v1/tenants/{id}/tokens" ] &&
    [ "$(jget '["items"].__len__()' <"$T/r.json")" = 3 ]
check "limit=3: the first 3 rows" $?
req GET "/v1/audit?since=2999-01-01" aud-admin >/dev/null
[ "$(jget '["items"].__len__()' <"$T/r.json")" = 0 ]; check "since in the future: none" $?
req GET "/v1/audit?since=2000-01-01T00:00:00Z" aud-admin >/dev/null
[ "$(jget '["items"].__len__()' <"$T/r.json")" = 8 ]; check "since in the past: all 8" $?
st=$(req GET "/v1/audit?limit=0" aud-admin)
[ "$st" = 400 ] && [ "$(jget '["error"]["code"]' <"$T/r.json")" = INVALID_QUERY ]
check "limit=0: 400 INVALID_QUERY" $?
st=$(req GET "/v1/audit?limit=abc" aud-admin)
[ "$st" = 400 ]; check "limit=abc: 400" $?
st=$(req GET "/v1/audit?since=yesterday" aud-admin)
[ "$st" = 400 ] && [ "$(jget '["error"]["code"]' <"$T/r.json")" = INVALID_TIME ]
check "since=yesterday: 400 INVALID_TIME" $?
st=$(req GET /v1/audit "$TOK")
[ "$st" = 403 ]; check "tenant token: 403" $?
st=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/audit")
[ "$st" = 401 ]; check "no token: 401" $?
stop

# retention: rows 10 and 2 days old; keep 5 days
python3 - "$T/d/loom.db" <<'PY'
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1])
now = int(time.time() * 1000)
for days, tag in ((10, "old"), (2, "recent"), (400, "ancient")):
    db.execute("INSERT INTO audit(at, actor, method, route, path, status) VALUES (?,?,?,?,?,?)",
               (now - days * 86400000, "test-" + tag, "POST", "/v1/tenants", "/v1/tenants", 201))
db.commit()
PY
start --audit-retention-days 0
req GET "/v1/audit?limit=1000" aud-admin >/dev/null
[ "$(jget '["items"].__len__()' <"$T/r.json")" = 11 ]; check "retention 0 keeps everything" $?
stop
start --audit-retention-days 5
req GET "/v1/audit?limit=1000" aud-admin >/dev/null
python3 - "$T/r.json" <<'PY'
import json, sys
actors = [i["actor"] for i in json.load(open(sys.argv[1]))["items"]]
assert "test-old" not in actors and "test-ancient" not in actors, actors
assert "test-recent" in actors and len(actors) == 9, actors
print("ok: 10- and 400-day rows deleted, the 2-day row and today's kept")
PY
check "retention 5 days" $?
stop
[ $fail = 0 ] || { echo "--- loomd.log"; cat "$T/loomd.log"; }
exit $fail
