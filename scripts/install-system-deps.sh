#!/usr/bin/env bash
# System packages the tests need: a C++ compiler with OpenMP (CPU kernels),
# Xvfb and Qt's xcb platform libraries (napari GUI tests).  Installs only what
# is missing; needs root (or sudo) for apt-get.
set -euo pipefail
pkgs=(g++ xvfb xauth libxcb-icccm4 libxcb-keysyms1 libxcb-xinerama0 libxcb-image0 libxcb-render-util0
      libxcb-randr0 libxcb-shape0 libxcb-xfixes0 libxcb-xkb1 libxkbcommon-x11-0 libxkbcommon0 libgl1 libegl1
      libglib2.0-0 libdbus-1-3 libfontconfig1 libxrender1 libxi6)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing system packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
