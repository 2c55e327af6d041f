#!/bin/sh
# Installs what Loom needs to build on Debian 12 / Ubuntu 24.04 (needs root or sudo).
# Idempotent: packages already present are left alone. CUDA is not installed here:
# the CUDA parts build only where the toolkit already is (/usr/local/cuda).
set -e
pkgs="build-essential cmake pkg-config git ca-certificates curl python3 python3-yaml clang-format \
libmicrohttpd-dev libjansson-dev libsqlite3-dev libcurl4-openssl-dev libssl-dev libgloo-dev \
libomp-dev python3-numpy python3-torch openssl"
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
