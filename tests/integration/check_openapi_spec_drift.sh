#!/bin/sh
# test_daemon_openapi must notice when api/openapi.yaml's JobSpec schema and
# the job-spec field table drift apart, or its x-error-codes and
# api/errors.h: each edit below makes a copy of the file that disagrees in
# one way, and the check must fail naming what.
# Usage: check_openapi_spec_drift.sh build/bin/test_daemon_openapi api/openapi.yaml
bin=$1 yaml=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
# sed edit | text the failure must contain
while IFS='|' read -r edit want; do
    sed "$edit" "$yaml" > "$tmp/m.yaml"
    if cmp -s "$yaml" "$tmp/m.yaml"; then
        echo "FAIL: edit '$edit' changed nothing (the schema moved; update this test)"
        fail=1
        continue
    fi
    if "$bin" "$tmp/m.yaml" > /dev/null 2> "$tmp/err"; then
        echo "FAIL: edit '$edit' was not noticed"
        fail=1
    elif ! grep -q -- "$want" "$tmp/err"; then
        echo "FAIL: edit '$edit': expected '$want' in:"
        cat "$tmp/err"
        fail=1
    fi
done <<'EDITS'
s/fp32, fp8\]/fp32]/|train.precision names bf16|fp32|fp8
s/n_layer: {type: integer, minimum: 1, maximum: 1024}/n_layer: {type: integer, minimum: 1, maximum: 1000}/|model.n_layer: the table's maximum is 1024
/^        preemptible:/d|field preemptible
s/^        after: {type: array/        after: {type: string/|after is array in the table
s/keep: {type: integer, minimum: 1, maximum: 1000, default: 3}/keep: {type: integer, minimum: 1, maximum: 1000, default: 4}/|checkpoint.keep: default 3
s/^        priority:/        priorty: {type: integer}\n        priority:/|the schema lists priorty
s/budget_gib: {type: number, minimum: 0, exclusiveMinimum: true/budget_gib: {type: number, minimum: 0/|train.recompute.budget_gib: the table's minimum is exclusive 0
s/dropout: {type: number, minimum: 0, maximum: 1, exclusiveMaximum: true/dropout: {type: number, minimum: 0, maximum: 1/|train.lora.dropout: the table's maximum is exclusive 1
s/default: truncate}/default: drop}/|data.overlong: default truncate
s/^            init_from: {type: string/            init_frm: {type: string/|field model.init_from
s/chat_template: {type: string, enum: \[llama3, chatml, mistral\]}/chat_template: {type: string, enum: [none, llama3, chatml, mistral]}/|data.chat_template names llama3|chatml|mistral
s/    NODE_NOT_FOUND: {status: 404/    NODE_NOT_FOUND: {status: 400/|NODE_NOT_FOUND has status 400
/^    TP_FFN: {status/d|TP_FFN (422) is missing from x-error-codes
s/^    TP_HEADS: {status/    TP_HEAD: {status/|x-error-codes lists TP_HEAD
EDITS
[ $fail = 0 ] && echo "openapi spec drift: every edit noticed"
exit $fail
