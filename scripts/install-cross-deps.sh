#!/usr/bin/env bash
# The aarch64 cross toolchain and qemu-user for tests/test_aarch64_kernels.py (issue 21): the
# kernels are cross-compiled for ARMv8 and run under qemu-aarch64 (correctness only, no speed).
# Installs only what is missing; needs root (or sudo) for apt-get; Debian/Ubuntu only.
set -euo pipefail
command -v dpkg-query >/dev/null || { echo "install-cross-deps: not a Debian system, skipped"; exit 0; }
pkgs=(g++-aarch64-linux-gnu qemu-user)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing cross-build packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
