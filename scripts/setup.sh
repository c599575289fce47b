#!/usr/bin/env bash
# Installs every Debian package coverage needs, the project virtual
# environment .venv/ with the pinned Python packages of requirements.txt
# (PyTorch 2.13.0 CPU, whose libtorch the C++ build links, and
# transformers), and the browser test's npm packages (tests/browser).
# Idempotent: when everything is already there it only runs one dpkg query
# and hashes two lock files (well under a second).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git sqlite3 python3
  libcurl4-openssl-dev nlohmann-json3-dev libsqlite3-dev
  libgtest-dev libgmock-dev libtbb-dev libcli11-dev libfmt-dev
  libbenchmark-dev libcpp-httplib-dev
  chromium
  clang libclang-rt-dev  # the fuzz targets (fuzz/): clang with libFuzzer and the sanitizer runtimes
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

# The project venv, exactly as pinned; again only when it is missing or
# requirements.txt changed since the last install. pip takes torch 2.13.0
# (CPU) from the wheel on this machine's disk where there is one.
VENV=.venv
VSTAMP=$VENV/.setup-requirements-sha256
req_sum=$(sha256sum requirements.txt | cut -d' ' -f1)
if [[ ! -x $VENV/bin/python || ! -f $VSTAMP || $(<"$VSTAMP") != "$req_sum" ]]; then
  echo "setup: installing requirements.txt into $VENV"
  [[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
  echo "$req_sum" >"$VSTAMP"
else
  echo "setup: $VENV matches requirements.txt"
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
