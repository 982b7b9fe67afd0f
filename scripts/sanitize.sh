#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of wsync with clang in
# its own build directory (${WSYNC_SAN_BUILD_DIR:-build-san}), instrumented
# for libFuzzer as well so scripts/fuzz.sh shares it, then the unit and
# integration tests under it (controller and worker processes the
# integration tests start are sanitized too). Line tables only: reports name
# file and line; full DWARF would cost a quarter more compile time.
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
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DWSYNC_SANITIZE=address,undefined -DWSYNC_FUZZ=ON -DWSYNC_BUILD_PYTHON=OFF >/dev/null
[ "$mode" = configure ] && exit 0
# By default the suites over the code that takes untrusted input (owner
# registrations and the descriptor socket, plan parts and their execution,
# peer buffer lists, spec JSON and wsyncctl, the checked-math helpers), the
# fuzz targets (replaying their corpora), and the integration tests, whose
# controller and worker processes are sanitized: the whole wire path end to
# end. WSYNC_SAN_ALL=1 builds and runs everything (about twice the time).
# Only what is built runs: CTest discovers a GoogleTest binary's cases when
# it is built (the others show up as <target>_NOT_BUILT, excluded below).
targets=(wsync_common_tests wsync_exec_tests wsync_block_fp8_exec_tests wsync_plane_tests
         wsync_tensor_table_test wsync_peer_buffers_test wsync_fd_inbox_test
         wsync_sync_runner_test wsync_tools_tests wsyncctl wsync_fuzzers
         wsync-controller wsync-worker sync_test failure_test invalid_request_test
         wsync_tls_file_stage_test)
[ "${WSYNC_SAN_ALL:-0}" = 1 ] && targets=(all)
ninja -C "$build" -j"${JOBS:-$(nproc)}" "${targets[@]}"
[ "$mode" = build ] && exit 0
# Any report fails its test: halt on the first error, UBSan included.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}
cd "$build"
# The deploy checks (label deploy: helm, schemas, image roots) test packaging,
# not memory safety, and need binaries the sanitized subset does not build.
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 900 -E '_NOT_BUILT$' -LE deploy \
  ${WSYNC_SAN_CTEST_ARGS:-}
