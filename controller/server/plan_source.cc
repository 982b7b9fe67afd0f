#include "controller/server/plan_source.h"

#include <algorithm>
#include <utility>

namespace wsync::controller {

absl::StatusOr<PlanSource::Result> PlanSource::Get(const v1::TransferSpec& spec) {
  // A miss counted during our call is ours unless another caller missed at
  // the same moment; the flag only feeds metrics and status, never logic.
  const int64_t misses_before = cache_.misses();
  absl::StatusOr<std::shared_ptr<const v1::Plan>> plan = cache_.GetOrBuild(spec);
  if (!plan.ok()) return plan.status();
  Result r;
  r.plan = *std::move(plan);
  r.cache_hit = cache_.misses() == misses_before;
  r.seconds = r.cache_hit ? 0.0 : r.plan->summary().plan_seconds();
  return r;
}

std::shared_ptr<const std::vector<plan::WorkerPair>> PlanSource::PeerWritePairs(
    const v1::Plan& plan) {
  {
    absl::MutexLock lock(&mu_);
    auto it = peer_write_pairs_.find(plan.key());
    if (it != peer_write_pairs_.end()) return it->second;
  }
  // Scanned unlocked: other plans' syncs do not wait on this one. Two
  // concurrent first syncs of one key may both scan; the first result stays.
  auto pairs =
      std::make_shared<const std::vector<plan::WorkerPair>>(plan::PeerWriteEligiblePairs(plan));
  absl::MutexLock lock(&mu_);
  ++peer_write_scans_;
  // Plans leave the cache oldest first; the pairs of evicted ones go in bulk.
  if (peer_write_pairs_.size() >= std::max<size_t>(capacity_, 1)) peer_write_pairs_.clear();
  return peer_write_pairs_.try_emplace(plan.key(), std::move(pairs)).first->second;
}

int64_t PlanSource::peer_write_scans() const {
  absl::MutexLock lock(&mu_);
  return peer_write_scans_;
}

}  // namespace wsync::controller
