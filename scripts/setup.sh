#!/usr/bin/env bash
# Installs, only when missing, every Debian package that the build, the tests and the product need.
# Idempotent; runs `apt-get update` only when something must be installed. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git clang-format clang-14 libclang-rt-14-dev
  libpqxx-dev libhiredis-dev libboost-dev libboost-system-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libssl-dev
  postgresql-15 postgresql-client-15 redis-server redis-tools
  python3 ca-certificates curl procps util-linux
  chromium  # the dashboard's browser test
)
command -v node >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
