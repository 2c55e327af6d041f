#!/bin/sh
# Scoped and expiring tenant tokens against the real loomd with curl:
# POST /v1/tenants/{id}/tokens with name/scopes/expires_in_s, the listing
# (never the token text or hash), 403 INSUFFICIENT_SCOPE for a read token on
# submit/cancel, 401 TOKEN_EXPIRED after expiry, the admin scope only on the
# tenant named "admin", bad fields refused, rotation (grace or at once), and
# the store holding hashes only.
# Usage: test_daemon_tokens.sh LOOMD
set -u
LOOMD=$1
command -v curl >/dev/null 2>&1 || { echo "SKIP: no curl binary"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
T=$(mktemp -d /tmp/loom-test-tokens-XXXXXX)
fail=0
PID=
check() { # check NAME CONDITION-RESULT
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
: >"$T/train_000.bin" # loomd sees $T: the submit check wants train_*.bin to match a file
LOOM_ADMIN_TOKEN=tok-admin LOOM_JOIN_TOKEN=j "$LOOMD" --listen 127.0.0.1:0 --data-dir "$T/d" \
    --log-level warn --data-roots "$T" >"$T/loomd.log" 2>&1 &
PID=$!
i=0
while [ ! -s "$T/d/loomd.addr" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i + 1)); done
URL=$(cat "$T/d/loomd.addr")
ADM="Authorization: Bearer tok-admin"
JSON="Content-Type: application/json"
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }
# req METHOD PATH TOKEN [BODY] -> body in $T/r.json, status printed
req() {
    if [ $# -ge 4 ]; then
        curl -s -o "$T/r.json" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $3" \
            -H "$JSON" -d "$4" "$URL$2"
    else
        curl -s -o "$T/r.json" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $3" "$URL$2"
    fi
}
code_is() { [ "$(jget '["error"]["code"]' <"$T/r.json")" = "$1" ]; }

TEN=$(curl -s -H "$ADM" -H "$JSON" -d '{"name":"scoped"}' "$URL/v1/tenants" | jget '["id"]')
[ -n "$TEN" ]; check "tenant $TEN" $?
st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin '{}')
FULL=$(jget '["token"]' <"$T/r.json")
[ "$st" = 201 ] && [ "$(jget '["scopes"]' <"$T/r.json")" = "['read', 'submit']" ] &&
    [ "$(jget '["expires_at"]' <"$T/r.json")" = None ]
check "default token: read+submit, no expiry" $?
st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin '{"name":"ci-reader","scopes":["read"]}')
READ=$(jget '["token"]' <"$T/r.json")
READ_ID=$(jget '["id"]' <"$T/r.json")
[ "$st" = 201 ] && [ "$(jget '["name"]' <"$T/r.json")" = ci-reader ]
check "read-only token issued" $?

cat >"$T/job.json" <<JOB
{"name":"tok-job","model":{"family":"gpt2","preset":"124m"},
 "data":{"train":"$T/train_*.bin"},"resources":{"device":"cpu"}}
JOB
st=$(curl -s -o "$T/r.json" -w '%{http_code}' -H "Authorization: Bearer $READ" -H "$JSON" \
    --data-binary @"$T/job.json" "$URL/v1/jobs")
[ "$st" = 403 ] && code_is INSUFFICIENT_SCOPE; check "read token: submit 403 INSUFFICIENT_SCOPE" $?
st=$(curl -s -o "$T/r.json" -w '%{http_code}' -H "Authorization: Bearer $FULL" -H "$JSON" \
    --data-binary @"$T/job.json" "$URL/v1/jobs")
JOB=$(jget '["id"]' <"$T/r.json")
[ "$st" = 201 ]; check "read+submit token: submit 201 ($JOB)" $?
st=$(req GET "/v1/jobs/$JOB" "$READ")
[ "$st" = 200 ]; check "read token: get job 200" $?
st=$(req POST "/v1/jobs/$JOB/cancel" "$READ")
[ "$st" = 403 ] && code_is INSUFFICIENT_SCOPE; check "read token: cancel 403 INSUFFICIENT_SCOPE" $?
st=$(req GET "/v1/jobs/$JOB" "$READ")
[ "$(jget '["state"]' <"$T/r.json")" = queued ]; check "the refused cancel changed nothing" $?
st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin '{"scopes":["submit"]}')
SUB=$(jget '["token"]' <"$T/r.json")
st=$(req GET "/v1/jobs" "$SUB")
[ "$st" = 403 ] && code_is INSUFFICIENT_SCOPE; check "submit-only token: list 403" $?
st=$(req POST "/v1/jobs/$JOB/cancel" "$SUB")
[ "$st" = 200 ]; check "submit-only token: cancel 200" $?
st=$(req GET "/v1/tenants" "$FULL")
[ "$st" = 403 ] && code_is FORBIDDEN; check "tenant token on an admin route: 403 FORBIDDEN" $?

# expiry
# (the expiry is checked only after it has passed, so a slow machine cannot flake it)
st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin '{"name":"hour","expires_in_s":3600}')
HOUR=$(jget '["token"]' <"$T/r.json")
[ "$st" = 201 ] && [ "$(jget '["expires_at"]' <"$T/r.json")" != None ]
check "expiring token issued with expires_at" $?
st=$(req GET "/v1/jobs" "$HOUR")
[ "$st" = 200 ]; check "expiring token works before expiry" $?
st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin '{"name":"short","expires_in_s":1}')
SHORT=$(jget '["token"]' <"$T/r.json")
sleep 1.5
st=$(req GET "/v1/jobs" "$SHORT")
[ "$st" = 401 ] && code_is TOKEN_EXPIRED; check "after expiry: 401 TOKEN_EXPIRED" $?

# listing
st=$(req GET "/v1/tenants/$TEN/tokens" tok-admin)
[ "$st" = 200 ]; check "list tokens 200" $?
python3 - "$T/r.json" "$READ" "$FULL" "$READ_ID" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
items = d["items"]
assert len(items) == 5, items
text = open(sys.argv[1]).read()
assert sys.argv[2] not in text and sys.argv[3] not in text, "token text in the listing"
for it in items:
    assert set(it) >= {"id", "name", "scopes", "created_at", "last_used_at", "expires_at"}, it
    assert "token" not in it and "hash" not in it, it
r = [it for it in items if it["id"] == sys.argv[4]][0]
assert r["name"] == "ci-reader" and r["scopes"] == ["read"], r
assert r["last_used_at"] is not None, r
assert sum(1 for it in items if it["expires_at"] is not None) == 2, items
print("ok: listing has the fields, no secrets, last_used_at of the used token")
PY
check "listing contents" $?

# admin scope only for the tenant named admin
st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin '{"scopes":["admin"]}')
[ "$st" = 422 ] && code_is INVALID_FIELD; check "admin scope on another tenant: 422" $?
ADT=$(curl -s -H "$ADM" -H "$JSON" -d '{"name":"admin"}' "$URL/v1/tenants" | jget '["id"]')
st=$(req POST "/v1/tenants/$ADT/tokens" tok-admin '{"name":"ops","scopes":["admin","read"]}')
OPS=$(jget '["token"]' <"$T/r.json")
[ "$st" = 201 ]; check "admin scope on the admin tenant: 201" $?
st=$(req GET "/v1/tenants" "$OPS")
[ "$st" = 200 ]; check "admin-scoped token lists tenants" $?

# bad fields change nothing
for body in '{"scopes":["write"]}' '{"scopes":[]}' '{"scopes":"read"}' '{"expires_in_s":0}' \
    '{"expires_in_s":"1h"}' '{"name":"a b"}' '{"ttl":5}'; do
    st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin "$body")
    [ "$st" = 422 ]; check "bad body $body: 422 ($(jget '["error"]["code"]' <"$T/r.json"))" $?
done
st=$(req GET "/v1/tenants/$TEN/tokens" tok-admin)
[ "$(jget '["items"].__len__()' <"$T/r.json")" = 5 ]; check "refused bodies issued nothing" $?
st=$(req GET "/v1/tenants/t-000000000000/tokens" tok-admin)
[ "$st" = 404 ] && code_is TENANT_NOT_FOUND; check "tokens of an unknown tenant: 404" $?

# Rotation: a new secret with the same name and scopes; the old one is revoked
# at once (grace_s 0, the default) or stays valid for the grace.
st=$(req POST "/v1/tenants/$TEN/tokens" tok-admin '{"name":"rot","scopes":["read"]}')
ROT=$(jget '["token"]' <"$T/r.json")
ROT_ID=$(jget '["id"]' <"$T/r.json")
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT_ID/rotate" tok-admin '{"grace_s":6}')
ROT2=$(jget '["token"]' <"$T/r.json")
ROT2_ID=$(jget '["id"]' <"$T/r.json")
[ "$st" = 201 ] && [ "$(jget '["name"]' <"$T/r.json")" = rot ] &&
    [ "$(jget '["scopes"]' <"$T/r.json")" = "['read']" ] && [ "$ROT2" != "$ROT" ] &&
    [ "$(jget '["rotated_from"]["id"]' <"$T/r.json")" = "$ROT_ID" ] &&
    [ "$(jget '["rotated_from"]["revoked"]' <"$T/r.json")" = False ]
check "rotate with grace 6 s: new secret, same name and scopes" $?
s1=$(req GET /v1/jobs "$ROT")
c1=$(jget '.get("error",{}).get("message")' <"$T/r.json")
s2=$(req GET /v1/jobs "$ROT2")
[ "$s1" = 200 ] && [ "$s2" = 200 ]
check "both secrets work during the grace ($s1 $s2 $c1)" $?
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT2_ID/rotate" tok-admin '{"grace_s":-1}')
[ "$st" = 422 ] && code_is INVALID_GRACE; check "grace_s -1: 422 INVALID_GRACE" $?
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT2_ID/rotate" tok-admin '{"grace_s":604801}')
[ "$st" = 422 ] && code_is INVALID_GRACE; check "grace_s over a week: 422 INVALID_GRACE" $?
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT2_ID/rotate" tok-admin '{"grace":1}')
[ "$st" = 422 ] && code_is UNKNOWN_FIELD; check "unknown rotation field: 422" $?
[ "$(req GET /v1/jobs "$ROT2")" = 200 ]; check "refused rotations changed nothing" $?
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT_ID/rotate" "$FULL" '{}')
[ "$st" = 403 ]; check "a tenant token cannot rotate: $st" $?
sleep 6.2
st=$(req GET /v1/jobs "$ROT")
[ "$st" = 401 ] && code_is TOKEN_EXPIRED; check "old secret expired after the grace ($st)" $?
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT_ID/rotate" tok-admin '{}')
[ "$st" = 404 ] && code_is TOKEN_NOT_FOUND; check "an expired token cannot be rotated" $?
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT2_ID/rotate" tok-admin)
ROT3=$(jget '["token"]' <"$T/r.json")
[ "$st" = 201 ] && [ "$(jget '["rotated_from"]["revoked"]' <"$T/r.json")" = True ]
check "rotate without a body: old one revoked at once" $?
st=$(req GET /v1/jobs "$ROT2")
[ "$st" = 401 ] && code_is UNAUTHORIZED; check "the revoked secret gets 401 at once" $?
[ "$(req GET /v1/jobs "$ROT3")" = 200 ]; check "the newest secret works" $?
st=$(req POST "/v1/tenants/$TEN/tokens/$ROT2_ID/rotate" tok-admin '{}')
[ "$st" = 404 ]; check "a revoked token cannot be rotated again" $?

kill "$PID"
wait "$PID"
PID=
# the store keeps 32-byte hashes only
python3 - "$T/d/loom.db" "$READ" "$FULL" <<'PY'
import sqlite3, sys, hashlib
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT hash FROM tokens").fetchall()
assert rows and all(len(h) == 32 for (h,) in rows), rows
hs = {bytes(h) for (h,) in rows}
for tok in sys.argv[2:]:
    assert hashlib.sha256(tok.encode()).digest() in hs
dump = "\n".join(db.iterdump())
assert all(tok not in dump for tok in sys.argv[2:]), "token text stored"
print("ok: tokens stored as SHA-256 only")
PY
check "store holds hashes only" $?
[ $fail = 0 ] || { echo "--- loomd.log"; cat "$T/loomd.log"; }
exit $fail
