// SyncRunner::WarmUp (docs/warm-up.md): a sync's preparation without its
// data.
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/agent/sync_runner.h"

namespace wsync::agent {

v1::ReportResultRequest SyncRunner::WarmUp(const v1::SyncAssignment& a,
                                           std::shared_ptr<v1::WorkerService::Stub> stub,
                                           const std::string& lease_id) {
  v1::ReportResultRequest r = Begin(a);
  r.set_warm_up(true);
  auto finish = [&](const absl::Status& s) {
    if (!s.ok()) {
      r.set_code(static_cast<int32_t>(s.code()));
      r.set_message(absl::StrCat("warm-up: ", s.message()));
    }
    for (std::string& key : parts_.TakeEvicted()) r.add_dropped_part_keys(std::move(key));
    End();
    return r;
  };
  const std::string plan_id = PlanId(a);
  CachePlan(a);
  const std::shared_ptr<const v1::Plan> part = parts_.Get(plan_id);
  if (part == nullptr) {
    r.add_dropped_part_keys(plan_id);
    return finish(absl::FailedPreconditionError(absl::StrCat(
        "worker ", a.worker(), ": no cached op list for plan ", plan_id,
        " (never received, or evicted under --parts_cache_bytes=", parts_.budget_bytes(), ")")));
  }
  absl::Time t = absl::Now();
  auto bound = Bind(a, *part, &r);
  if (!bound.ok()) return finish(bound.status());
  // Held: a failure below clears bound_.
  const std::shared_ptr<const exec::BoundPlan> plan = bound->plan;
  const uint64_t registry_generation = bound->registry->generation();
  r.set_bind_seconds(absl::ToDoubleSeconds(absl::Now() - t));
  t = absl::Now();
  auto ch = EnsureChannel(a, stub, lease_id);
  if (!ch.ok()) {
    plane_.Drop(a.transfer());
    return finish(ch.status());
  }
  exec::Executor* executor = (*ch)->executor.get();
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.load()) running_executor_ = executor;
  }
  absl::StatusOr<int32_t> greeted =
      aborted_.load()
          ? absl::CancelledError(absl::StrCat("aborted before the first message: ", AbortReason()))
          : executor->WarmUp(*plan, registry_generation,
                             absl::FromUnixMillis(a.deadline_unix_ms()));
  r.set_setup_seconds(absl::ToDoubleSeconds(absl::Now() - t));
  if (!greeted.ok()) {
    {
      absl::MutexLock lock(&mu_);
      running_executor_ = nullptr;
    }
    plane_.Drop(a.transfer());  // its transport is unusable, as after a failed sync
    return finish(greeted.status());
  }
  r.set_peers_greeted(*greeted);
  return finish(absl::OkStatus());
}

}  // namespace wsync::agent
