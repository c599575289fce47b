#!/usr/bin/env bash
# Installs every Debian package coverage needs, and the browser test's npm
# packages (tests/browser). Idempotent: when everything is already there it
# only runs one dpkg query and hashes one lock file (well under a second).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git sqlite3 python3
  libtorch-dev libopenblas0-pthread
  libcurl4-openssl-dev nlohmann-json3-dev libsqlite3-dev
  libgtest-dev libgmock-dev libtbb-dev libcli11-dev libfmt-dev libspdlog-dev
  libbenchmark-dev libcpp-httplib-dev
  chromium
)
# Node and npm only when missing: a Node.js from elsewhere (e.g. NodeSource,
# which bundles npm) must not be replaced by Debian's, which conflicts with it.
command -v node >/dev/null || PACKAGES+=(nodejs)
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "setup: packages done"
fi

# The browser test's packages, exactly as locked; again only when
# node_modules is missing or the lock changed since the last install.
BROWSER=tests/browser
STAMP=$BROWSER/node_modules/.setup-lock-sha256
lock_sum=$(sha256sum "$BROWSER/package-lock.json" | cut -d' ' -f1)
if [[ ! -f $STAMP || $(<"$STAMP") != "$lock_sum" ]]; then
  echo "setup: npm ci in $BROWSER"
  npm ci --prefix "$BROWSER" --no-audit --no-fund --loglevel=error >/dev/null
  echo "$lock_sum" >"$STAMP"
else
  echo "setup: $BROWSER/node_modules matches its lock"
fi
