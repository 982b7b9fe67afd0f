#!/usr/bin/env bash
# The whole test suite: builds, then runs every GoogleTest and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd "${WSYNC_BUILD_DIR:-build}"
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600
