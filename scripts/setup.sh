#!/usr/bin/env bash
# Installs every Debian package coverage needs. Idempotent: when everything is
# already installed it only runs one dpkg query (well under a second).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git sqlite3 python3
  libtorch-dev libopenblas0-pthread
  libcurl4-openssl-dev nlohmann-json3-dev libsqlite3-dev
  libgtest-dev libgmock-dev libtbb-dev libcli11-dev libfmt-dev libspdlog-dev
  libbenchmark-dev libcpp-httplib-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
