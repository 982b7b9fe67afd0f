// libFuzzer target: a TransferSpec as the controller receives it
// (DefineTransfer: binary proto) through validation and planning, within
// tests/fuzz/spec_limits.h. A spec that plans must also replay correctly
// (controller/verify, the planner's test oracle) and split into rank parts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "controller/plan/compiled_layout.h"
#include "controller/plan/planner.h"
#include "controller/verify/replay.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "tests/fuzz/spec_limits.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace {

// Replay host memory above this is skipped (a fragment may sit at any offset).
constexpr int64_t kMaxReplayBytes = int64_t{16} << 20;
constexpr int kMaxBuckets = 4096;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wsync::v1::TransferSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!wsync::fuzz::SpecWithinLimits(spec)) return 0;
  wsync::plan::BuildOptions options;
  options.record_plan_seconds = false;
  auto plan = wsync::plan::BuildPlan(spec, options);
  if (!plan.ok()) return 0;
  for (const wsync::v1::RankPlan& r : plan->ranks()) {
    (void)wsync::plan::ExtractRankPlan(*plan, r.worker());
  }
  if (plan->buckets_size() > kMaxBuckets) return 0;
  auto source = wsync::plan::CompileSide(spec.source(), wsync::plan::SideRole::kSource);
  auto destination =
      wsync::plan::CompileSide(spec.destination(), wsync::plan::SideRole::kDestination);
  if (!source.ok() || !destination.ok()) {
    std::fprintf(stderr, "a spec that planned does not compile\n");
    std::abort();
  }
  auto bytes = wsync::plan::ReplayBufferBytes(*source, *destination);
  if (!bytes.ok()) return 0;
  int64_t total = 0;
  for (const auto& [key, b] : *bytes) {
    if (b > kMaxReplayBytes || (total += b) > kMaxReplayBytes) return 0;
  }
  absl::Status verified = wsync::plan::VerifyPlan(spec, *plan);
  if (!verified.ok()) {
    std::fprintf(stderr, "plan of an accepted spec does not verify: %s\n",
                 std::string(verified.message()).c_str());
    std::abort();
  }
  return 0;
}
