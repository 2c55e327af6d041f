#!/bin/sh
# The README's test command: set-up, a build in build/ (reused when it exists;
# .ci/run removes it first), every test (ctest), then a sanitizer build of the
# host code (address,undefined, build-asan/) running the sanitize-labelled tests again. GPU tests report "no GPU" and are not counted as passed.
set -e
cd "$(dirname "$0")/.."
./tools/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_WERROR=ON
cmake --build build -j "$jobs"
# (the namespaced multi-host cluster, label netns, runs from .ci/run with its own budget)
ctest --test-dir build --output-on-failure -j "$jobs" -LE 'gpu|netns'
# GPU tests: run them where a GPU is, and say so where none is.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ctest --test-dir build --output-on-failure -L gpu
else
    echo "test.sh: no GPU found: gpu-labelled tests NOT run (not counted as passed)"
fi
if [ "${LOOM_SKIP_SANITIZE:-0}" != 1 ]; then
    cmake -S . -B build-asan -DLOOM_CUDA=OFF -DLOOM_SANITIZE=address,undefined \
        -DCMAKE_BUILD_TYPE=Debug -DLOOM_WERROR=ON
    cmake --build build-asan -j "$jobs"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ctest --test-dir build-asan --output-on-failure -j "$jobs" -L sanitize
fi
# Coverage-guided fuzzing (tests/fuzz.cmake): 30 s per target where clang is.
if command -v clang >/dev/null 2>&1; then
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DLOOM_FUZZ=ON -DLOOM_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo
    cmake --build build-fuzz -j "$jobs" --target fuzz_jobspec fuzz_safetensors
    ctest --test-dir build-fuzz --output-on-failure -L fuzz
else
    echo "test.sh: no clang: fuzz-labelled tests NOT run (not counted as passed)"
fi
echo "test.sh: all tests passed"
