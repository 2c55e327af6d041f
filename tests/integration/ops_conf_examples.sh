#!/bin/sh
# Checks deploy/loomd.conf.example and deploy/loom-agent.conf.example:
#   1. they are what deploy/gen_conf_examples.sh makes from the built binaries'
#      --help (every option listed, defaults and help current);
#   2. with every setting uncommented at its default, loomd starts with the
#      file (--config) and loom-agent accepts it (keeps running, retrying an
#      unreachable coordinator, instead of exiting with a config error).
# Usage: ops_conf_examples.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
tmp=$(mktemp -d /tmp/loom-ops-conf.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
rc=0

mkdir "$tmp/gen"
sh "$src/deploy/gen_conf_examples.sh" "$bin" "$tmp/gen" || { echo "FAIL: generator failed"; exit 1; }
for f in loomd.conf.example loom-agent.conf.example; do
    if ! diff -u "$src/deploy/$f" "$tmp/gen/$f"; then
        echo "FAIL: deploy/$f is stale: run deploy/gen_conf_examples.sh BUILD/bin"
        rc=1
    fi
done
n=$(grep -c '^#[a-z][a-z0-9-]* =' "$src/deploy/loomd.conf.example")
m=$("$bin/loomd" --help | grep -c '^  --')
# every option but --config itself
[ "$n" -eq $((m - 1)) ] || { echo "FAIL: loomd.conf.example lists $n of $((m - 1)) settings"; rc=1; }

# Uncomment every setting that has a value.
for f in loomd loom-agent; do
    sed -n 's/^#\([a-z][a-z0-9-]* = .*\)$/\1/p' "$src/deploy/$f.conf.example" > "$tmp/$f.conf"
done
"$bin/loomd" --config "$tmp/loomd.conf" --listen 127.0.0.1:0 --data-dir "$tmp/d" \
    > "$tmp/loomd.log" 2>&1 &
pid=$!
i=0
while [ ! -s "$tmp/d/loomd.addr" ] && [ $i -lt 100 ] && kill -0 $pid 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
done
if [ -s "$tmp/d/loomd.addr" ]; then
    echo "loomd started with $(wc -l < "$tmp/loomd.conf") settings from the example"
else
    echo "FAIL: loomd did not start with the uncommented example:"
    cat "$tmp/loomd.log"
    rc=1
fi
kill $pid 2>/dev/null
wait $pid 2>/dev/null

"$bin/loom-agent" --config "$tmp/loom-agent.conf" --coordinator http://127.0.0.1:9 \
    --work-dir "$tmp/a" --cpu-devices 1 > "$tmp/agent.log" 2>&1 &
pid=$!
sleep 1.5
if kill -0 $pid 2>/dev/null; then
    echo "loom-agent accepted $(wc -l < "$tmp/loom-agent.conf") settings from the example"
    kill $pid
    wait $pid 2>/dev/null
else
    echo "FAIL: loom-agent exited with the uncommented example:"
    cat "$tmp/agent.log"
    rc=1
fi
[ $rc -eq 0 ] && echo "PASS"
exit $rc
