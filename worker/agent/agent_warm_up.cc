// WorkerAgent: warm-up assignments (docs/warm-up.md).
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "worker/agent/agent.h"

namespace wsync::agent {

void WorkerAgent::RunWarmUp(const Queued& q) {
  const v1::SyncAssignment& a = q.assignment;
  const std::string held = latch_.held();
  const absl::Time run_start = absl::Now();
  v1::ReportResultRequest r;
  if (!held.empty()) {
    // Its peer mappings and staging would touch memory the owner may have
    // put to sleep; the first sync prepares what it needs instead.
    runner_.CachePlan(a);
    r.set_sync_id(a.sync_id());
    r.set_warm_up(true);
    r.set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
    r.set_message(absl::StrCat("worker ", a.worker(), ": warm-up ", a.sync_id(),
                               " skipped: its owner holds syncs off: ", held));
    r.set_round(-1);
    r.set_op(-1);
    r.set_peer(-1);
  } else {
    r = runner_.WarmUp(a, stub_, q.lease_id);
  }
  r.set_received_unix_us(absl::ToUnixMicros(q.received));
  r.set_queued_seconds(absl::ToDoubleSeconds(run_start - q.received));
  r.set_run_seconds(absl::ToDoubleSeconds(absl::Now() - run_start));
  const bool ok = r.code() == 0;
  if (metrics_ != nullptr) {
    metrics_->WarmUp(ok, r.run_seconds());
    metrics_->ChannelsCreated(runner_.channels_created());
  }
  if (ok) {
    spdlog::info("[worker {}] warm-up {} of transfer '{}': bind {:.3f} s, setup {:.3f} s, {} peers",
                 a.worker(), a.sync_id(), a.transfer(), r.bind_seconds(), r.setup_seconds(),
                 r.peers_greeted());
  } else {
    spdlog::warn("[worker {}] warm-up {} of transfer '{}' failed: {}", a.worker(), a.sync_id(),
                 a.transfer(), r.message());
  }
  Report(std::move(r), q.lease_id);
}

}  // namespace wsync::agent
