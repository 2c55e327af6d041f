#!/bin/sh
# Fails when a tracked C/C++/CUDA source differs from .clang-format's layout.
# Usage: tests/check_format.sh [clang-format binary]
cf=${1:-clang-format}
bad=0
for f in $(git ls-files '*.c' '*.h' '*.cc' '*.cu' '*.cuh'); do
    if ! "$cf" --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "not formatted: $f (run: $cf -i $f)"
        bad=1
    fi
done
exit $bad
