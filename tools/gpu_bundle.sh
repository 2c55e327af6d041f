#!/bin/sh
# Packs what a run on a GPU machine without a compiler needs into the git-ignored .deps/:
#   .deps/gb.tar.xz  the named binaries of BUILD_DIR/bin, stripped (bin/<name>)
#   .deps/gl.tar.xz  the shared libraries they load from this machine's Debian packages
#                    (libmicrohttpd, jansson, SQLite, libcurl, ...), not the C runtime and
#                    not the CUDA/NVIDIA ones the GPU image brings
#   .deps/peers/     the PyTorch peers of ../shared/peers (PEERS= overrides)
# tests/gpu/device/unbundle.sh unpacks them there and runs the commands it is given.
# The carried files must stay under 64 MiB together: the script says when they do not.
# Usage: tools/gpu_bundle.sh BUILD_DIR [BINARY...]   (default: loom-worker loom-gpu-bench)
# Example:
#   cmake -S . -B build-cuda90 -G Ninja -DLOOM_CUDA=ON -DLOOM_GLOO=OFF \
#         -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real && cmake --build build-cuda90
#   tools/gpu_bundle.sh build-cuda90 loom-worker loom-gpu-bench test_fp8
set -eu
[ $# -ge 1 ] || { sed -n '2,15p' "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
shift
[ $# -ge 1 ] || set -- loom-worker loom-gpu-bench
deps=$root/.deps
rm -rf "$deps/gb" "$deps/gl"
mkdir -p "$deps/gb/bin" "$deps/gl"
for b in "$@"; do
    [ -x "$build/bin/$b" ] || { echo "gpu_bundle: $build/bin/$b is not built" >&2; exit 1; }
    strip -o "$deps/gb/bin/$b" "$build/bin/$b"
    # Each library the loader resolves here, but for the C runtime (the image's glibc is
    # the one to use) and the driver/toolkit libraries (the image's match its driver).
    ldd "$build/bin/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do
        case $(basename "$lib") in
        libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | \
            librt.so* | libresolv.so* | ld-linux* | libcuda.so* | libnvidia* | libcublas* | \
            libcudnn* | libnccl* | libcudart* | libnvrtc* | libnvJitLink*) ;;
        *) [ -e "$deps/gl/$(basename "$lib")" ] || cp -L "$lib" "$deps/gl/" ;;
        esac
    done
done
tar -cJf "$deps/gb.tar.xz" -C "$deps/gb" bin
tar -cJf "$deps/gl.tar.xz" -C "$deps/gl" .
peers=${PEERS:-$root/../shared/peers}
if [ -d "$peers" ]; then
    rm -rf "$deps/peers"
    cp -r "$peers" "$deps/peers"
else
    echo "gpu_bundle: no peers at $peers (PEERS=): the benches' PyTorch side will not run" >&2
fi
sz=$(du -cb "$deps/gb.tar.xz" "$deps/gl.tar.xz" ${peers:+"$deps/peers"} 2>/dev/null | tail -1 | cut -f1)
echo "gpu_bundle: $(ls "$deps/gb/bin" | tr '\n' ' ')+ $(ls "$deps/gl" | wc -l) libraries," \
    "$((sz / 1048576)) MiB to carry"
if [ "$sz" -ge $((64 * 1048576)) ]; then
    echo "gpu_bundle: over the 64 MiB carry limit: name fewer binaries" >&2
    exit 1
fi
echo 'carry: [".deps/gb.tar.xz", ".deps/gl.tar.xz", ".deps/peers"]'
echo "run:   tests/gpu/device/unbundle.sh 'tests/gpu/device/check_one_gpu.sh' ..."
