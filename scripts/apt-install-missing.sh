# Sourced by scripts/install-*-deps.sh: apt_install_missing WHAT PKG... installs the Debian packages
# among PKG... that dpkg does not list as installed (none missing: does nothing); WHAT names them in
# the one line it prints.  Needs root (or sudo) for apt-get.
apt_install_missing() {
  local what=$1 p
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$what packages: all installed ($*)"
    return 0
  fi
  echo "installing $what packages: ${missing[*]}"
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
