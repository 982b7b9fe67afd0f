// The bodies of the controller's calls that two front ends serve: gRPC
// (services.h) and the control fast lane (lane_server.h). A front end admits
// its caller its own way (auth.h: a certificate or a token on gRPC; a token,
// or a lease bound to the connection, on the lane), then runs these, so both
// reach the same owners with the same checks and errors.
#ifndef WSYNC_CONTROLLER_SERVER_HANDLERS_H_
#define WSYNC_CONTROLLER_SERVER_HANDLERS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/server/auth.h"
#include "controller/server/controller.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// For the coordinator's ownership checks (docs/security.md, "Transfer owners").
TrainerCaller AsTrainer(const Caller& c);

// ReportResult of an admitted worker: the parts it dropped are resent with
// its next assignments (forgotten before the report can end the sync), then
// the coordinator takes the report (possibly ending the sync on this thread).
absl::Status ReportResultCall(Controller& controller, const v1::ReportResultRequest& req);

// Sync of an admitted trainer: starts it. When the caller asked to wait
// (wait_ms > 0), *wait_until is when the wait ends (wait_ms, at most
// --max_wait); otherwise nullopt. INVALID_ARGUMENT for a negative wait_ms.
absl::StatusOr<v1::SyncResponse> StartSyncCall(Controller& controller, const v1::SyncRequest& req,
                                               const Caller& caller,
                                               std::optional<absl::Time>* wait_until);

// When WaitSync `req` stops waiting (timeout_ms 0: --max_wait).
absl::Time WaitSyncUntil(const Controller& controller, const v1::WaitSyncRequest& req);

// One look at a wait for sync `sync_id`'s end: nullopt while it runs and the
// wait has not `expired`; otherwise its status (still RUNNING when expired),
// or the coordinator's error (an unknown sync).
std::optional<absl::StatusOr<v1::SyncStatus>> PollSyncEnd(Controller& controller,
                                                          const std::string& sync_id, bool expired);

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_HANDLERS_H_
