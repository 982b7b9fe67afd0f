#include "bench/gpu/issue_keys.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/bench_util.h"
#include "bench/gpu/slabs.h"
#include "common/status_macros.h"
#include "controller/plan/planner.h"
#include "worker/backends/cuda/cuda_data_ops_internal.h"
#include "worker/exec/bound_plan.h"

namespace wsync::bench {

absl::Status MeasureIssueKeys(const v1::TransferSpec& spec, const v1::Plan& plan, int32_t worker,
                              const std::string& label) {
  ASSIGN_OR_RETURN(v1::Plan rank_plan, plan::ExtractRankPlan(plan, worker));
  exec::BufferRegistry registry;
  // Never dereferenced: binding only checks ranges.
  char* const src_base = reinterpret_cast<char*>(uintptr_t{1} << 44);
  char* const dst_base = reinterpret_cast<char*>(uintptr_t{2} << 44);
  ASSIGN_OR_RETURN(auto src_need, BuffersOf(spec.source(), plan::SideRole::kSource, worker));
  ASSIGN_OR_RETURN(auto dst_need,
                   BuffersOf(spec.destination(), plan::SideRole::kDestination, worker));
  for (const auto& [name, b] : CarveSlab(src_need, src_base)) {
    RETURN_IF_ERROR(registry.Register(exec::BufferSide::kSource, name, b));
  }
  for (const auto& [name, b] : CarveSlab(dst_need, dst_base)) {
    RETURN_IF_ERROR(registry.Register(exec::BufferSide::kDestination, name, b));
  }
  ASSIGN_OR_RETURN(auto bound,
                   exec::BindPlan(rank_plan, worker, registry, transport::MemorySpace::kCuda));
  constexpr int kReps = 9;
  double total_build = 0, total_lookup = 0;
  int64_t total_items = 0, total_bytes = 0;
  for (const exec::BoundRound& round : bound->rounds) {
    if (round.copies.empty()) continue;
    std::vector<double> build, lookup;
    size_t key_bytes = 0;
    // A set holding one equal key, as the data ops' cache does on a hit.
    absl::flat_hash_set<std::string> cache = {
        cuda::data_ops_internal::CopyItemsKey('C', round.copies)};
    for (int i = 0; i < kReps; ++i) {
      const double t0 = Now();
      std::string key = cuda::data_ops_internal::CopyItemsKey('C', round.copies);
      const double t1 = Now();
      const bool hit = cache.find(key) != cache.end();
      const double t2 = Now();
      if (!hit) return absl::InternalError("an equal key missed");
      key_bytes = key.size();
      build.push_back(t1 - t0);
      lookup.push_back(t2 - t1);
    }
    total_build += Median(build);
    total_lookup += Median(lookup);
    total_items += static_cast<int64_t>(round.copies.size());
    total_bytes += static_cast<int64_t>(key_bytes);
    Result(absl::StrFormat(
        R"({"bench":"wsync_issue_keys","case":"%s","worker":%d,"round":%d,"copy_items":%d,"key_bytes":%d,"build_s":%.6f,"lookup_s":%.6f})",
        label, worker, round.index, round.copies.size(), key_bytes, Median(build), Median(lookup)));
  }
  Result(absl::StrFormat(
      R"({"bench":"wsync_issue_keys","case":"%s","worker":%d,"round":"all","copy_items":%d,"key_bytes":%d,"build_s":%.6f,"lookup_s":%.6f})",
      label, worker, total_items, total_bytes, total_build, total_lookup));
  return absl::OkStatus();
}

}  // namespace wsync::bench
