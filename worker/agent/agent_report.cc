// WorkerAgent: delivering reports to the controller, and waiting for the
// workers that write into this one (agent.h).
#include <algorithm>
#include <chrono>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "worker/agent/agent.h"

namespace wsync::agent {
namespace {

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// A failure after which the same report may get through: the channel was
// down (a reconnect, a rotated certificate, a controller restarting) or the
// answer was lost. The controller's own refusals are final.
bool WorthRetrying(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

void WorkerAgent::Report(v1::ReportResultRequest r, const std::string& lease_id,
                         absl::Duration patience) {
  busy_.Touch();  // the spin window counts from the last sync's end
  r.set_lease_id(lease_id);
  r.set_reported_unix_us(absl::ToUnixMicros(absl::Now()));
  if (std::optional<absl::Status> sent = lane_.Report(r, absl::Now() + absl::Seconds(5))) {
    if (!sent->ok()) {
      spdlog::warn("[worker {}] report of {} not delivered: {}", Who(), r.sync_id(),
                   std::string(sent->message()));
    }
    return;
  }
  const absl::Time give_up = absl::Now() + patience;
  absl::Duration pause = absl::Milliseconds(50);
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::ReportResultResponse resp;
    const grpc::Status s = stub_->ReportResult(&ctx, r, &resp);
    if (s.ok()) {
      if (attempt > 1) {
        spdlog::info("[worker {}] report of {} delivered at attempt {}", Who(), r.sync_id(),
                     attempt);
      }
      return;
    }
    if (!WorthRetrying(s) || stop_.load() || absl::Now() + pause >= give_up) {
      spdlog::warn("[worker {}] report of {} not delivered ({} attempts): {}", Who(), r.sync_id(),
                   attempt, s.error_message());
      return;
    }
    if (attempt == 1) {
      spdlog::warn("[worker {}] report of {}: {}; trying again for up to {}", Who(), r.sync_id(),
                   s.error_message(), absl::FormatDuration(patience));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(1));
  }
}

std::string WorkerAgent::AwaitWriters(const v1::SyncAssignment& a, const std::string& lease_id) {
  // A writer that neither reports nor heartbeats is declared lost by the
  // controller within its lease TTL; 10 s past the deadline covers that.
  const absl::Time until = absl::FromUnixMillis(a.deadline_unix_ms()) + absl::Seconds(10);
  v1::AwaitWritersResponse resp;
  for (int32_t w : a.direct_written_by()) resp.add_pending(w);
  while (!stop_.load() && absl::Now() < until && resp.pending_size() > 0) {
    v1::AwaitWritersRequest req;
    req.set_lease_id(lease_id);
    req.set_sync_id(a.sync_id());
    *req.mutable_workers() = resp.pending();
    const absl::Duration slice = std::min(absl::Seconds(1), until - absl::Now());
    req.set_timeout_ms(absl::ToInt64Milliseconds(slice));
    grpc::ClientContext ctx;
    ctx.set_deadline(In(slice + absl::Seconds(5)));
    v1::AwaitWritersResponse next;
    const grpc::Status s = stub_->AwaitWriters(&ctx, req, &next);
    if (!s.ok()) {
      spdlog::warn("[worker {}] AwaitWriters for {}: {}", Who(), a.sync_id(), s.error_message());
      absl::SleepFor(std::min(absl::Milliseconds(200), slice));
      continue;
    }
    resp = std::move(next);
  }
  return absl::StrJoin(resp.pending(), ",");
}

}  // namespace wsync::agent
