#!/usr/bin/env bash
# System packages the tests need: a C++ compiler with OpenMP (CPU kernels),
# Xvfb and Qt's xcb platform libraries (napari GUI tests).  Installs only what
# is missing; needs root (or sudo) for apt-get.
set -euo pipefail
pkgs=(g++ xvfb xauth libxcb-icccm4 libxcb-keysyms1 libxcb-xinerama0 libxcb-image0 libxcb-render-util0
      libxcb-randr0 libxcb-shape0 libxcb-xfixes0 libxcb-xkb1 libxkbcommon-x11-0 libxkbcommon0 libgl1 libegl1
      libglib2.0-0 libdbus-1-3 libfontconfig1 libxrender1 libxi6)
. "$(dirname "${BASH_SOURCE[0]}")/apt-install-missing.sh"
apt_install_missing system "${pkgs[@]}"
