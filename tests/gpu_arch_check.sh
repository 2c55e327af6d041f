#!/bin/sh
# Checks that a CUDA build carries machine code for every architecture it was
# configured for (by default sm_80 A100, sm_86 A10 / RTX 3090, sm_89 L40S / L4 /
# RTX 4090, sm_90 H100 / H20 / H200) and compute_90 PTX for newer GPUs: in
# loom-worker itself and in each kernel object of libloom_cuda.a (so a missing
# architecture in one .cu file is caught even if another file has it).
#
# usage: gpu_arch_check.sh BIN_DIR LIB_DIR 80-real,86-real,89-real,90-real,90-virtual
# (the CMAKE_CUDA_ARCHITECTURES list; ',' or ';' between entries)
# Exit 77 (reported "Not Run" by ctest) when BIN_DIR/loom-worker has no CUDA code:
# the build was made without the CUDA backend. Uses cuobjdump when installed, else
# tests/fatbin_archs.py (objcopy + the fat binary headers).
set -u
bin="$1/loom-worker"
lib="$(cd "$2" 2>/dev/null && pwd)/libloom_cuda.a"
archs="$3"
here=$(dirname "$0")

list_archs() { # FILE -> lines sm_NN / compute_NN
    if command -v cuobjdump >/dev/null 2>&1; then
        { cuobjdump --list-elf "$1" 2>/dev/null | sed -n 's/.*\.\(sm_[0-9]*\)\..*/\1/p'
          cuobjdump --list-ptx "$1" 2>/dev/null | sed -n 's/.*\.sm_\([0-9]*\)\..*/compute_\1/p'
        } | sort -u
    else
        python3 "$here/fatbin_archs.py" "$1" 2>/dev/null
    fi
}

if [ ! -x "$bin" ] || ! objdump -h "$bin" | grep -q '\.nv_fatbin'; then
    echo "gpu_arch_check: $bin has no .nv_fatbin section (no CUDA backend in this build): not run"
    exit 77
fi

want=""
for a in $(echo "$archs" | tr ';,' '  '); do
    n=${a%%-*}
    case "$a" in
    *-real) want="$want sm_$n" ;;
    *-virtual) want="$want compute_$n" ;;
    *) want="$want sm_$n compute_$n" ;;
    esac
done
echo "gpu_arch_check: expecting:$want"

fail=0
check() { # LABEL FILE
    have=$(list_archs "$2" | tr '\n' ' ')
    for w in $want; do
        case " $have " in
        *" $w "*) ;;
        *) echo "FAIL: $1 lacks $w (has: $have)"; fail=1 ;;
        esac
    done
    echo "$1: $have"
}

check loom-worker "$bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -f "$lib" ]; then
    (cd "$tmp" && ar x "$lib")
    n=0
    for o in "$tmp"/*.cu.o; do
        [ -f "$o" ] || continue
        check "$(basename "$o")" "$o"
        n=$((n + 1))
    done
    if [ "$n" -eq 0 ]; then echo "FAIL: no .cu objects in $lib"; fail=1; fi
else
    echo "FAIL: $lib not found"
    fail=1
fi
[ "$fail" -eq 0 ] && echo "gpu_arch_check: ok"
exit "$fail"
