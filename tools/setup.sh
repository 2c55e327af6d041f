#!/bin/sh
# Installs what Loom needs to build on Debian 12 / Ubuntu 24.04 (needs root or sudo).
# Idempotent: packages already present are left alone. CUDA is not installed here:
# the CUDA parts build only where the toolkit already is (/usr/local/cuda).
set -e
pkgs="build-essential cmake pkg-config git ca-certificates curl python3 python3-yaml clang-format \
libmicrohttpd-dev libjansson-dev libsqlite3-dev libcurl4-openssl-dev libssl-dev libgloo-dev \
libomp-dev python3-numpy python3-torch openssl clang libclang-rt-dev libopenapi-client-perl"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "setup: installing$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

# Tokenizers (data/tok*): PCRE2, utf8proc and SentencePiece to build, libarchive for
# webdataset tar shards (data/prepare.c); the tokenizer tests
# compare with SentencePiece's own tools and Python module, and with npm packages (GPT-2,
# Llama 3, tiktoken, Hugging Face's JS tokenizers) installed from tests/tok/package-lock.json
# into the git-ignored tests/tok/node_modules.
tok_pkgs="libpcre2-dev libutf8proc-dev libsentencepiece-dev sentencepiece python3-sentencepiece \
libarchive-dev"
command -v node >/dev/null 2>&1 || tok_pkgs="$tok_pkgs nodejs"
command -v npm >/dev/null 2>&1 || tok_pkgs="$tok_pkgs npm"
tok_missing=""
for p in $tok_pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || tok_missing="$tok_missing $p"
done
if [ -n "$tok_missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "setup: installing$tok_missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $tok_missing
fi
tok_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/tok"
# node_modules/.loom-lock is the lock file it was installed from: reinstall when that changed.
if ! cmp -s "$tok_dir/package-lock.json" "$tok_dir/node_modules/.loom-lock" 2>/dev/null; then
    echo "setup: npm ci in tests/tok"
    (cd "$tok_dir" && npm ci --no-audit --no-fund --loglevel=error &&
        cp package-lock.json node_modules/.loom-lock)
fi
