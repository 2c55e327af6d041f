#!/bin/sh
# loomd over HTTPS (--tls-cert/--tls-key): a CA and a server certificate are
# made here with the openssl CLI; curl --cacert and loomctl --ca / LOOM_CA
# must verify the server, plain HTTP on the port and a client without the CA
# must fail, and bad key files must stop start-up with a message naming them.
# With LOOM_AGENT, a loom-agent --ca registers over HTTPS and one without the
# CA does not. With LOOM_WORKER and LOOM_DATA too, a dp=2 job's two loom-worker ranks meet
# through loomd's rendezvous over HTTPS and finish.
# Usage: test_daemon_tls.sh LOOMD LOOMCTL [LOOM_AGENT [LOOM_WORKER LOOM_DATA]]. Exit 77 (not run) without curl,
# openssl or a libmicrohttpd built with TLS.
set -u
LOOMD=$1
LOOMCTL=$2
AGENT=${3:-}
WORKER=${4:-}
LOOMDATA=${5:-}
command -v curl >/dev/null 2>&1 || { echo "SKIP: no curl binary"; exit 77; }
command -v openssl >/dev/null 2>&1 || { echo "SKIP: no openssl binary"; exit 77; }
T=$(mktemp -d /tmp/loom-test-tls-XXXXXX)
fail=0
PID=
check() { # check NAME CONDITION-RESULT
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

# A CA, a server certificate for 127.0.0.1 signed by it, and an unrelated key.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=Loom test CA" \
    -keyout "$T/ca.key" -out "$T/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$T/srv.key" \
    -out "$T/srv.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$T/ext.cnf"
openssl x509 -req -in "$T/srv.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
    -days 2 -extfile "$T/ext.cnf" -out "$T/srv.pem" 2>/dev/null
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$T/other.key" 2>/dev/null
[ -s "$T/srv.pem" ] && [ -s "$T/other.key" ]; check "openssl made the CA and certificates" $?

# Start-up errors: a mismatched key, an unreadable file, one of the pair only.
start_fails() { # start_fails NAME PATTERN ARGS...
    name=$1
    pat=$2
    shift 2
    LOOM_ADMIN_TOKEN=a LOOM_JOIN_TOKEN=j timeout 10 "$LOOMD" --listen 127.0.0.1:0 \
        --data-dir "$T/bad" --log-level warn "$@" >"$T/bad.log" 2>&1
    rc=$?
    if grep -q "built without TLS" "$T/bad.log"; then
        echo "SKIP: libmicrohttpd lacks TLS (MHD_FEATURE_TLS)"
        exit 77
    fi
    [ $rc != 0 ] && [ $rc != 124 ] && grep -q "$pat" "$T/bad.log"
    check "$name (exit $rc)" $?
}
start_fails "mismatched key refused" "does not match the certificate" \
    --tls-cert "$T/srv.pem" --tls-key "$T/other.key"
start_fails "missing key file refused" "cannot read --tls-key $T/none.key" \
    --tls-cert "$T/srv.pem" --tls-key "$T/none.key"
start_fails "certificate without key refused" "go together" --tls-cert "$T/srv.pem"
start_fails "key given as certificate refused" "holds no PEM certificate" \
    --tls-cert "$T/srv.key" --tls-key "$T/srv.key"

LOOM_ADMIN_TOKEN=tls-admin LOOM_JOIN_TOKEN=j "$LOOMD" --listen 127.0.0.1:0 --data-dir "$T/d" \
    --log-level warn --auto-approve --tls-cert "$T/srv.pem" --tls-key "$T/srv.key" >"$T/loomd.log" 2>&1 &
PID=$!
i=0
while [ ! -s "$T/d/loomd.addr" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i + 1)); done
URL=$(cat "$T/d/loomd.addr")
case "$URL" in https://127.0.0.1:*) r=0 ;; *) r=1 ;; esac
check "loomd.addr names an https URL ($URL)" $r
PORT=${URL##*:}

out=$(curl -s --cacert "$T/ca.pem" "$URL/healthz")
echo "$out" | grep -q '"status":"ok"'; check "curl --cacert: healthz over TLS" $?
curl -s -o /dev/null --cacert "$T/ca.pem" "$URL/healthz" --tlsv1.1 --tls-max 1.1
[ $? != 0 ]; check "TLS 1.1 refused" $?
curl -s -o /dev/null --cacert "$T/ca.pem" --tlsv1.2 --tls-max 1.2 "$URL/healthz"
check "TLS 1.2 accepted" $?
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$PORT/healthz")
[ "$code" != 200 ]; check "plain http on the TLS port fails (got '$code')" $?
curl -s -o /dev/null "$URL/healthz"
rc=$?
[ $rc = 60 ]; check "curl without the CA fails verification (curl exit $rc)" $?

"$LOOMCTL" --url "$URL" --token tls-admin --ca "$T/ca.pem" tenant-create tls-team >"$T/c.out" 2>&1
check "loomctl --ca tenant-create" $?
LOOM_CA="$T/ca.pem" "$LOOMCTL" --url "$URL" --token tls-admin tenant-list >"$T/l.out" 2>&1
r=$?
[ $r = 0 ] && grep -q tls-team "$T/l.out"; check "loomctl with LOOM_CA lists the tenant" $?
"$LOOMCTL" --url "$URL" --token tls-admin tenant-list >"$T/n.out" 2>&1
r=$?
[ $r = 3 ] && grep -qi "certificate" "$T/n.out"
check "loomctl without the CA: exit 3, certificate error (exit $r)" $?
"$LOOMCTL" --url "$URL" --token tls-admin --ca "$T/other.key" tenant-list >/dev/null 2>&1
[ $? != 0 ]; check "loomctl with a wrong CA file fails" $?

if [ -n "$AGENT" ]; then
    LOOM_JOIN_TOKEN=j "$AGENT" --coordinator "$URL" --ca "$T/ca.pem" --name tls-node \
        --cpu-devices 2 --work-dir "$T/agent" --heartbeat-ms 200 --log-level warn \
        ${WORKER:+--worker "$WORKER"} \
        >"$T/agent.log" 2>&1 &
    APID=$!
    LOOM_JOIN_TOKEN=j "$AGENT" --coordinator "$URL" --name no-ca-node --cpu-devices 1 \
        --work-dir "$T/agent2" --heartbeat-ms 200 --retry-max-ms 200 >"$T/agent2.log" 2>&1 &
    APID2=$!
    i=0
    while [ $i -lt 100 ]; do
        "$LOOMCTL" --url "$URL" --token tls-admin --ca "$T/ca.pem" nodes >"$T/nodes.out" 2>&1
        grep -q "tls-node.*ready" "$T/nodes.out" && break
        sleep 0.1
        i=$((i + 1))
    done
    grep -q "tls-node.*ready" "$T/nodes.out"; check "loom-agent --ca registers over HTTPS" $?
    i=0
    while ! grep -qi "certificate" "$T/agent2.log" && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    grep -qi "certificate" "$T/agent2.log"; check "agent without the CA logs the certificate problem" $?
    "$LOOMCTL" --url "$URL" --token tls-admin --ca "$T/ca.pem" nodes >"$T/nodes.out" 2>&1
    ! grep -q no-ca-node "$T/nodes.out"; check "loom-agent without the CA is not registered" $?
    if [ -n "$WORKER" ] && [ -n "$LOOMDATA" ]; then
        # The workers' channel: two loom-worker ranks on tls-node meet through loomd's
        # rendezvous over HTTPS (LOOM_RDZV is an https URL; they inherit LOOM_CA from
        # the agent) and train to the end.
        python3 -c "print(' '.join('loom trains over tls %d' % i for i in range(3000)))" \
            >"$T/corpus.txt"
        "$LOOMDATA" prepare --in "$T/corpus.txt" --out "$T/shards" >"$T/prep.log" 2>&1
        check "loom-data prepare" $?
        TEN=$("$LOOMCTL" --url "$URL" --token tls-admin --ca "$T/ca.pem" --json \
            tenant-create tls-jobs --data-root "$T" | python3 -c \
            'import json,sys; print(json.load(sys.stdin)["id"])')
        TOK=$("$LOOMCTL" --url "$URL" --token tls-admin --ca "$T/ca.pem" --json \
            token-create "$TEN" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
        cat >"$T/job.json" <<JOB
{"name":"tls-dp2","model":{"family":"gpt2","n_layer":2,"n_head":2,"d_model":32,"d_ff":128,
 "vocab_size":256,"seq_len":16},"data":{"train":"$T/shards/train_*.bin"},
 "parallel":{"dp":2,"tp":1,"pp":1},"train":{"steps":4,"global_batch_tokens":128,
 "micro_batch":4,"precision":"fp32"},"resources":{"device":"cpu","gpus_per_node":2},
 "max_retries":0}
JOB
        LOOM_CA="$T/ca.pem" "$LOOMCTL" --url "$URL" --token "$TOK" --json submit "$T/job.json" \
            >"$T/sub.json" 2>&1
        JOBID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' \
            "$T/sub.json" 2>/dev/null)
        [ -n "$JOBID" ]; check "dp=2 job submitted over TLS ($JOBID)" $?
        state=
        i=0
        while [ $i -lt 600 ]; do
            state=$(LOOM_CA="$T/ca.pem" "$LOOMCTL" --url "$URL" --token "$TOK" --json get \
                "$JOBID" 2>/dev/null | python3 -c \
                'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null)
            case "$state" in succeeded | failed | cancelled) break ;; esac
            sleep 0.1
            i=$((i + 1))
        done
        [ "$state" = succeeded ]; check "two workers met over HTTPS and finished ($state)" $?
        if [ "$state" != succeeded ]; then
            LOOM_CA="$T/ca.pem" "$LOOMCTL" --url "$URL" --token "$TOK" logs "$JOBID" --rank 0 \
                --stream stderr 2>&1 | tail -20
        fi
    fi
    kill "$APID" "$APID2"
    wait "$APID" "$APID2" 2>/dev/null
fi

kill "$PID"
wait "$PID"
check "loomd stops cleanly" $?
PID=
[ $fail = 0 ] || { echo "--- loomd.log"; cat "$T/loomd.log"; }
exit $fail
