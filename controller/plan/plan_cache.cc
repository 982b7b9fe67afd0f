#include "controller/plan/plan_cache.h"

#include <utility>

#include "controller/plan/plan_arena.h"
#include "google/protobuf/arena.h"

namespace wsync::plan {

absl::StatusOr<std::shared_ptr<const v1::Plan>> PlanCache::GetOrBuild(
    const v1::TransferSpec& spec) {
  const std::string key = PlanKey(spec);
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      auto it = entries_.find(key);
      if (it == entries_.end()) break;
      if (!it->second.building) {
        ++hits_;
        return it->second.plan;
      }
      auto ready = [this, &key]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        auto e = entries_.find(key);
        return e == entries_.end() || !e->second.building;
      };
      mu_.Await(absl::Condition(&ready));
    }
    ++misses_;
    entries_[key].building = true;
  }
  // The plan and all its messages live on one arena that the shared pointer
  // owns (aliasing constructor): no per-message heap allocation or free.
  std::shared_ptr<google::protobuf::Arena> arena = NewPlanArena();
  v1::Plan* built = google::protobuf::Arena::CreateMessage<v1::Plan>(arena.get());
  const absl::Status status = BuildPlanInto(spec, built, build_);
  const int64_t footprint = static_cast<int64_t>(arena->SpaceAllocated());
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    entries_.erase(key);
    return status;
  }
  std::shared_ptr<const v1::Plan> plan(arena, built);
  Entry& e = entries_[key];
  e.plan = plan;
  e.bytes = footprint;
  e.building = false;
  bytes_ += footprint;
  order_.push_back(key);
  auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return order_.size() > capacity_ ||
           (budget_bytes_ > 0 && bytes_ > budget_bytes_ && order_.size() > 1);
  };
  while (over()) {
    auto old = entries_.find(order_.front());
    bytes_ -= old->second.bytes;
    entries_.erase(old);
    order_.pop_front();
  }
  return plan;
}

std::shared_ptr<const v1::Plan> PlanCache::Lookup(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  return it == entries_.end() || it->second.building ? nullptr : it->second.plan;
}

int64_t PlanCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}
int64_t PlanCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}
int64_t PlanCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}
size_t PlanCache::size() const {
  absl::MutexLock lock(&mu_);
  return order_.size();
}

}  // namespace wsync::plan
