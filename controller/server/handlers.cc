#include "controller/server/handlers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::controller {

TrainerCaller AsTrainer(const Caller& c) { return {c.identity, c.role >= Role::kAdmin}; }

absl::Status ReportResultCall(Controller& controller, const v1::ReportResultRequest& req) {
  // Before the report can end the sync: the next assignments resend them.
  for (const std::string& key : req.dropped_part_keys()) {
    controller.workers().ForgetPartSent(req.lease_id(), key);
  }
  return controller.syncs().ReportResult(req);
}

absl::StatusOr<v1::SyncResponse> StartSyncCall(Controller& controller, const v1::SyncRequest& req,
                                               const Caller& caller,
                                               std::optional<absl::Time>* wait_until) {
  wait_until->reset();
  if (req.wait_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Sync: negative wait_ms ", req.wait_ms()));
  }
  absl::StatusOr<v1::SyncResponse> started = controller.syncs().StartSync(req, AsTrainer(caller));
  if (started.ok() && req.wait_ms() > 0) {
    *wait_until =
        absl::Now() + std::min(absl::Milliseconds(req.wait_ms()), controller.limits().max_wait);
  }
  return started;
}

absl::Time WaitSyncUntil(const Controller& controller, const v1::WaitSyncRequest& req) {
  // timeout_ms 0: until the sync ends (its deadline bounds that), at most --max_wait.
  const absl::Duration max_wait = controller.limits().max_wait;
  return absl::Now() + (req.timeout_ms() > 0
                            ? std::min(absl::Milliseconds(req.timeout_ms()), max_wait)
                            : max_wait);
}

std::optional<absl::StatusOr<v1::SyncStatus>> PollSyncEnd(Controller& controller,
                                                          const std::string& sync_id,
                                                          bool expired) {
  int64_t seen = -1;
  absl::StatusOr<v1::SyncStatus> status =
      controller.syncs().NextSyncUpdate(sync_id, &seen, absl::ZeroDuration());
  if (status.ok() && status->phase() == v1::SYNC_RUNNING && !expired) return std::nullopt;
  return status;
}

}  // namespace wsync::controller
