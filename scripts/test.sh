#!/usr/bin/env bash
# The whole test suite: builds, then runs every GoogleTest and integration
# test; then the ASan+UBSan build's tests and each fuzz target briefly
# (docs/testing.md). WSYNC_TEST_SANITIZE=0 skips the last two stages.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd "${WSYNC_BUILD_DIR:-build}" && ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600)
if [ "${WSYNC_TEST_SANITIZE:-1}" != 0 ]; then
  bash scripts/sanitize.sh
  bash scripts/fuzz.sh "${WSYNC_CI_FUZZ_SECONDS:-20}"
fi
