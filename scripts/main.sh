#!/usr/bin/env bash
# The main job on the bundled data: set up, build, capture the seed models into
# the registry (skipped when already captured), and run the unit stage on the
# CPU backend. Extra arguments go to `coverage run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
REGISTRY=${COVERAGE_REGISTRY:-build/coverage.db}
./build/bin/coverage --registry "$REGISTRY" capture
set +e
./build/bin/coverage --registry "$REGISTRY" run --stage=unit "$@"
rc=$?
set -e
echo "registry: $REGISTRY (query it with ./build/bin/coverage --registry $REGISTRY registry stats)"
exit $rc
