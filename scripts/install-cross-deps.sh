#!/usr/bin/env bash
# The aarch64 cross toolchain and qemu-user for tests/test_aarch64_kernels.py (issue 21): the
# kernels are cross-compiled for ARMv8 and run under qemu-aarch64 (correctness only, no speed).
# Installs only what is missing; needs root (or sudo) for apt-get; Debian/Ubuntu only.
set -euo pipefail
command -v dpkg-query >/dev/null || { echo "install-cross-deps: not a Debian system, skipped"; exit 0; }
pkgs=(g++-aarch64-linux-gnu qemu-user)
. "$(dirname "${BASH_SOURCE[0]}")/apt-install-missing.sh"
apt_install_missing cross-build "${pkgs[@]}"
