#!/bin/bash
# On the GPU machine: unpacks what tools/gpu_bundle.sh packed (carried as .deps/gb.tar.xz,
# .deps/gl.tar.xz and .deps/peers) and runs each argument as a command line, in order, with
#   BUILD=/tmp/gb (the stripped binaries, BUILD/bin), LD_LIBRARY_PATH starting with /tmp/gl
#   (the carried Debian libraries, less those the image already has), OUT=$OUT/log
#   (created; what is written under the device's $OUT comes back), NCCL_NVLS_ENABLE=0.
# Prints "== <command>" before and "== rc=<status>" after each one; exits with the first
# non-zero status (the later commands still run).
# Usage: tests/gpu/device/unbundle.sh 'CMD' ['CMD'...]
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
for f in .deps/gb.tar.xz .deps/gl.tar.xz; do
    [ -f "$f" ] || { echo "unbundle: $f was not carried (tools/gpu_bundle.sh makes it)" >&2; exit 1; }
done
mkdir -p /tmp/gb /tmp/gl
tar -xJf .deps/gb.tar.xz -C /tmp/gb && tar -xJf .deps/gl.tar.xz -C /tmp/gl || exit 1
for f in /tmp/gl/*; do
    # the image's own copy wins: it was built for that system
    ldconfig -p | grep -q " $(basename "$f") " && rm -f "$f"
done
export BUILD=/tmp/gb LD_LIBRARY_PATH=/tmp/gl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OUT=${OUT:-/tmp/loom-gpu}/log NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
rc=0
for c in "$@"; do
    echo "== $c"
    eval "$c"
    r=$?
    echo "== rc=$r"
    [ "$rc" -eq 0 ] && rc=$r
done
exit "$rc"
