#!/bin/sh
# Drives the real loomd with the curl binary, as users do (README "API by
# example"), and with loomctl (tables, --json, exit codes and the server's
# message on errors). Usage: test_daemon_curl.sh LOOMD LOOMCTL
set -u
LOOMD=$1
LOOMCTL=$2
command -v curl >/dev/null 2>&1 || { echo "SKIP: no curl binary"; exit 77; }
T=$(mktemp -d /tmp/loom-test-curl-XXXXXX)
fail=0
check() { # check NAME CONDITION-RESULT
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
: >"$T/train_000.bin" # loomd sees $T: the submit check wants train_*.bin to match a file
LOOM_ADMIN_TOKEN=curl-admin LOOM_JOIN_TOKEN=j "$LOOMD" --listen 127.0.0.1:0 --data-dir "$T/d" \
    --log-level warn --data-roots "$T" >"$T/loomd.log" 2>&1 &
PID=$!
i=0
while [ ! -s "$T/d/loomd.addr" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i + 1)); done
URL=$(cat "$T/d/loomd.addr")
ADM="Authorization: Bearer curl-admin"
JSON="Content-Type: application/json"
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" | head -n 1; }

out=$(curl -s "$URL/healthz")
echo "$out" | grep -q '"status":"ok"'; check "healthz" $?
curl -sI "$URL/healthz" | head -n 1 | grep -q " 200"; check "HEAD /healthz: 200" $?
TENANT=$(curl -s -H "$ADM" -H "$JSON" -d '{"name":"curl-team"}' "$URL/v1/tenants" | field id)
[ -n "$TENANT" ]; check "create tenant ($TENANT)" $?
TOKEN=$(curl -s -X POST -H "$ADM" "$URL/v1/tenants/$TENANT/tokens" | field token)
[ -n "$TOKEN" ]; check "issue token" $?
AUTH="Authorization: Bearer $TOKEN"
cat >"$T/job.json" <<JOB
{"name":"curl-job","model":{"family":"gpt2","preset":"124m"},
 "data":{"train":"$T/train_*.bin"},"resources":{"device":"cpu"},"labels":{"team":"nlp"}}
JOB
code=$(curl -s -o "$T/submit.out" -w '%{http_code}' -H "$AUTH" -H "$JSON" -H "Idempotency-Key: k1" \
    --data-binary @"$T/job.json" "$URL/v1/jobs")
[ "$code" = 201 ]; check "submit: 201" $?
JOB=$(field id <"$T/submit.out")
again=$(curl -s -H "$AUTH" -H "$JSON" -H "Idempotency-Key: k1" --data-binary @"$T/job.json" \
    "$URL/v1/jobs" | field id)
[ "$again" = "$JOB" ]; check "idempotent resubmit gives $JOB" $?
curl -s -H "$AUTH" "$URL/v1/jobs/$JOB" | grep -q '"state":"queued"'; check "get: queued" $?
curl -s -H "$AUTH" "$URL/v1/jobs?state=queued&label=team%3Dnlp&limit=10" | grep -q "$JOB"
check "list with filters" $?
code=$(curl -s -o /dev/null -w '%{http_code}' -H "$AUTH" -H 'Content-Type: text/plain' \
    --data-binary @"$T/job.json" "$URL/v1/jobs")
[ "$code" = 415 ]; check "text/plain: 415" $?
code=$(curl -s -o "$T/e.out" -w '%{http_code}' -H "$AUTH" -H "$JSON" -d '{"name":' "$URL/v1/jobs")
[ "$code" = 400 ] && grep -q INVALID_JSON "$T/e.out"; check "truncated: 400 INVALID_JSON" $?
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/jobs")
[ "$code" = 401 ]; check "no token: 401" $?
curl -s -X POST -H "$AUTH" "$URL/v1/jobs/$JOB/cancel" | grep -q '"state":"cancelled"'
check "cancel" $?
curl -s -H "$AUTH" "$URL/v1/jobs/$JOB/events" | grep -q '"reason":"cancelled by tenant"'
check "events" $?
curl -s "$URL/metrics" | grep -q 'loom_http_requests_total{method="POST",route="/v1/jobs",status="201"}'
check "metrics" $?

# loomctl
export LOOM_URL="$URL" LOOM_TOKEN="$TOKEN"
"$LOOMCTL" submit "$T/job.json" >"$T/ctl.out" 2>&1
grep -q '^submitted j-' "$T/ctl.out"; check "loomctl submit" $?
J2=$(sed -n 's/^submitted \(j-[0-9a-f]*\).*/\1/p' "$T/ctl.out")
"$LOOMCTL" list | grep -q "^$J2 .*queued"; check "loomctl list (table)" $?
"$LOOMCTL" --json list --state queued | grep -q "\"id\": \"$J2\""; check "loomctl --json list" $?
"$LOOMCTL" get "$J2" | grep -q '^state *queued'; check "loomctl get" $?
"$LOOMCTL" cancel "$J2" | grep -q "$J2 cancelled"; check "loomctl cancel" $?
"$LOOMCTL" events "$J2" | grep -q 'cancelled by tenant'; check "loomctl events" $?
"$LOOMCTL" get j-000000000000 >"$T/ctl.err" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "404 JOB_NOT_FOUND: no job 'j-000000000000'" "$T/ctl.err"
check "loomctl error: exit 1 and the server's message" $?
echo '{"name":"x","model":{"family":"gpt2","preset":"124m"},"parallel":{"tp":5}}' >"$T/bad.json"
"$LOOMCTL" submit "$T/bad.json" >"$T/ctl.err" 2>&1
[ $? = 1 ] && grep -q "422" "$T/ctl.err"; check "loomctl invalid spec: 422 shown" $?
LOOM_URL=http://127.0.0.1:1 "$LOOMCTL" list >/dev/null 2>&1
[ $? = 3 ]; check "loomctl unreachable: exit 3" $?
LOOM_TOKEN=curl-admin "$LOOMCTL" tenant-list | grep -q curl-team; check "loomctl tenant-list" $?
LOOM_TOKEN=curl-admin "$LOOMCTL" list --tenant "$TENANT" | grep -q "^$J2 "
check "loomctl list --tenant (admin)" $?
LOOM_TOKEN=curl-admin "$LOOMCTL" tenant-update "$TENANT" --gpu-quota 6 | grep -q '"gpu_quota": 6'
check "loomctl tenant-update" $?

head -c 10485760 /dev/zero | tr '\0' ' ' >"$T/big.json"
code=$(curl -s -o "$T/e.out" -w '%{http_code}' -H "$AUTH" -H "$JSON" --data-binary @"$T/big.json" \
    "$URL/v1/jobs")
[ "$code" = 413 ] && grep -q PAYLOAD_TOO_LARGE "$T/e.out"; check "10 MB body with curl: 413" $?

kill -TERM $PID
wait $PID
check "SIGTERM exit 0" $?

# --help prints the config table; exit 0
"$LOOMD" --help >"$T/help.out" 2>&1
[ $? = 0 ] && grep -q "max-body" "$T/help.out" && grep -q "rate-limit" "$T/help.out"
check "loomd --help" $?

# Bootstrap tokens without env: generated once into 0600 files, stable across restarts;
# a config file sets values (max-body = 2048 -> a 3000-byte body is refused).
printf 'max-body = 2048\nlog-level = warn\n' >"$T/loomd.conf"
start_plain() {
    rm -f "$T/d2/loomd.addr"
    env -u LOOM_ADMIN_TOKEN -u LOOM_JOIN_TOKEN "$LOOMD" --listen 127.0.0.1:0 --data-dir "$T/d2" \
        --config "$T/loomd.conf" >>"$T/loomd2.log" 2>&1 &
    PID=$!
    i=0
    while [ ! -s "$T/d2/loomd.addr" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i + 1)); done
    URL=$(cat "$T/d2/loomd.addr")
}
start_plain
A1=$(cat "$T/d2/admin.token")
[ "$(stat -c %a "$T/d2/admin.token")" = 600 ] && [ "$(stat -c %a "$T/d2/join.token")" = 600 ]
check "admin.token and join.token are mode 0600" $?
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $A1" "$URL/v1/tenants")
[ "$code" = 200 ]; check "generated admin token works" $?
head -c 3000 /dev/zero | tr '\0' ' ' >"$T/mid.json"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $A1" -H "$JSON" \
    --data-binary @"$T/mid.json" "$URL/v1/tenants")
[ "$code" = 413 ]; check "config file max-body = 2048 applies" $?
kill -TERM $PID
wait $PID
start_plain
[ "$(cat "$T/d2/admin.token")" = "$A1" ]; check "admin token stable across restarts" $?
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $A1" "$URL/v1/tenants")
[ "$code" = 200 ]; check "same token after restart" $?
kill -TERM $PID
wait $PID
if [ $fail = 0 ]; then rm -rf "$T"; echo "test_daemon_curl: all passed"; else
    echo "test_daemon_curl: FAILED (data in $T)"; cat "$T/loomd.log"; fi
exit $fail
