#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/; clang, -fsanitize=fuzzer,address,
# undefined, in scripts/sanitize.sh's build directory) and runs each for
# SECONDS (default 60), starting from its checked-in seed corpus
# (tests/fuzz/corpus/<target>/). New inputs go to $build/fuzz/<target>/
# corpus, crashes to $build/fuzz/<target>/; any crash fails the script.
#   scripts/fuzz.sh [SECONDS]      one target after the other
#   FUZZ_PARALLEL=1 scripts/fuzz.sh 600   all at once, at nice 10
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
build=${WSYNC_SAN_BUILD_DIR:-build-san}
targets=(layout_json_fuzzer transfer_spec_fuzzer plan_part_fuzzer register_tensors_fuzzer
  controller_state_fuzzer lane_frame_fuzzer)
bash scripts/sanitize.sh configure
ninja -C "$build" -j"${JOBS:-$(nproc)}" "${targets[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
run() {
  local t=$1 out="$build/fuzz/$1"
  mkdir -p "$out/corpus"
  # -rss_limit_mb / -malloc_limit_mb: an input that asks for gigabytes is a
  # finding (the limits the code under test should have enforced).
  nice -n "${FUZZ_NICE:-0}" "$build/tests/fuzz/$t" -max_total_time="$secs" -timeout=20 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix="$out/" "$out/corpus" "tests/fuzz/corpus/$t" >"$out/log" 2>&1
}
status=0
if [ "${FUZZ_PARALLEL:-0}" = 1 ]; then
  export FUZZ_NICE=10
  pids=()
  for t in "${targets[@]}"; do run "$t" & pids+=($!); done
  for i in "${!targets[@]}"; do wait "${pids[$i]}" || status=1; done
else
  for t in "${targets[@]}"; do run "$t" || status=1; done
fi
for t in "${targets[@]}"; do
  log="$build/fuzz/$t/log"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  crashes=$(ls "$build/fuzz/$t" | grep -cE '^(crash|leak|timeout|oom)-' || true)
  echo "fuzz $t: ${secs}s, ${execs:-?} execs, ${cov:-cov: ?}, ${crashes} crashes/leaks/timeouts/ooms"
  if grep -qE 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:' "$log"; then
    status=1
    grep -m1 -A30 -E 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:' "$log"
  fi
done
exit $status
