#!/usr/bin/env bash
# The main job on the bundled data: set up, build, capture the seed models into
# the registry (skipped when already captured), then `coverage nightly` on the
# simulated accelerator `sim` ($COVERAGE_BACKEND picks another backend): the
# unit stage, and the report (HTML, JUnit XML, JSON) against the previous run,
# whose path it prints last. Extra arguments go to `coverage nightly`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
REGISTRY=${COVERAGE_REGISTRY:-build/coverage.db}
./build/bin/coverage --registry "$REGISTRY" capture
echo "registry: $REGISTRY (query it with ./build/bin/coverage --registry $REGISTRY registry stats)"
set +e
./build/bin/coverage --registry "$REGISTRY" nightly --backend "${COVERAGE_BACKEND:-sim}" "$@"
rc=$?
set -e
exit $rc
