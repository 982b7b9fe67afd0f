#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of wsync with clang in
# its own build directory (${WSYNC_SAN_BUILD_DIR:-build-san}), instrumented
# for libFuzzer as well so scripts/fuzz.sh shares it, then the unit and
# integration tests under it (controller and worker processes the
# integration tests start are sanitized too).
#   scripts/sanitize.sh           configure, build, run the tests
#   scripts/sanitize.sh build     configure and build only
#   scripts/sanitize.sh configure configure only
# Not built here: the Python extension and its tests (python/): the module
# would have to be loaded into an uninstrumented python3 with the ASan
# runtime preloaded, and those tests drive the same C++ through the worker
# and controller processes the integration tests already cover.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-test}
build=${WSYNC_SAN_BUILD_DIR:-build-san}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DWSYNC_SANITIZE=address,undefined -DWSYNC_FUZZ=ON -DWSYNC_BUILD_PYTHON=OFF >/dev/null
[ "$mode" = configure ] && exit 0
ninja -C "$build" -j"${JOBS:-$(nproc)}"
[ "$mode" = build ] && exit 0
# Any report fails its test: halt on the first error, UBSan included.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}
cd "$build"
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 900 ${WSYNC_SAN_CTEST_ARGS:-}
