#!/usr/bin/env bash
# Run here, before scripts/device-check.sh is run on a GPU machine that has
# PyTorch, CUDA, CMake and a compiler but none of the project's C++ libraries
# (and no network): downloads the Debian packages of those libraries into
# .devdeps/ (ignored by git), to be carried to that machine, where
# device-check.sh unpacks them into a folder of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
cd .devdeps
apt-get download -qq \
  nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 \
  libtbb-dev libtbb12 libtbbmalloc2 libsqlite3-dev libsqlite3-0 libcurl4-openssl-dev libcurl4
ls -1 *.deb | wc -l | xargs echo "device-deps: packages in .devdeps/:"
du -sh . | cut -f1 | xargs echo "device-deps: size"
