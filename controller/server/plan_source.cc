#include "controller/server/plan_source.h"

#include "absl/time/clock.h"
#include "controller/plan/planner.h"

namespace wsync::controller {

absl::StatusOr<PlanSource::Result> PlanSource::Get(const v1::TransferSpec& spec) {
  const std::string key = plan::PlanKey(spec);
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      ++hits_;
      return Result{it->second, true, 0.0};
    }
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Plan> built = plan::BuildPlan(spec);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!built.ok()) return built.status();
  auto plan = std::make_shared<const v1::Plan>(*std::move(built));
  absl::MutexLock lock(&mu_);
  ++misses_;
  auto [it, inserted] = plans_.emplace(key, plan);
  if (inserted) {
    order_.push_back(key);
    while (order_.size() > capacity_) {
      plans_.erase(order_.front());
      order_.pop_front();
    }
  }
  return Result{it->second, false, seconds};
}

int64_t PlanSource::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t PlanSource::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace wsync::controller
