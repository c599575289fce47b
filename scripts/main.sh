#!/usr/bin/env bash
# The main job on the bundled data: set up, build, capture the seed models into
# the registry (skipped when already captured), and run the unit stage on the
# simulated accelerator `sim` ($COVERAGE_BACKEND picks another backend). Extra
# arguments go to `coverage run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
REGISTRY=${COVERAGE_REGISTRY:-build/coverage.db}
./build/bin/coverage --registry "$REGISTRY" capture
set +e
./build/bin/coverage --registry "$REGISTRY" run --stage=unit --backend "${COVERAGE_BACKEND:-sim}" "$@"
rc=$?
set -e
echo "registry: $REGISTRY (query it with ./build/bin/coverage --registry $REGISTRY registry stats)"
if [ "$rc" -eq 1 ]; then
  echo "exit 1: the backend under test has failing cases (the findings above); harness errors exit 2"
fi
exit $rc
