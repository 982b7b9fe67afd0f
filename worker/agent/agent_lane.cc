// WorkerAgent: the assignment stream over the controller's control fast lane
// (--controller_lane; controller/server/lane_server.h). A connection of its
// own, opened with LaneRequest.assignments; each assignment comes as one
// frame, written by the controller's lane thread as soon as it knows of it.
// The reader polls the socket without sleeping while the spin window of the
// low-latency mode lasts (busy_poll.h), else sleeps in poll(2) in slices of
// 100 ms. Its end (the controller's status, a broken connection, Stop) ends
// the lease as the gRPC stream's end does: the session registers again.
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/lane_client.h"
#include "common/logging.h"
#include "worker/agent/agent.h"

namespace wsync::agent {
namespace {
constexpr absl::Duration kRetryAfter = absl::Seconds(10);
constexpr absl::Duration kSlice = absl::Milliseconds(100);
}  // namespace

std::optional<grpc::Status> WorkerAgent::ReadAssignmentsLane(const std::string& lease_id,
                                                             uint64_t epoch) {
  const std::string& path = options_.controller_lane;
  if (path.empty() || absl::Now() < lane_stream_retry_) return std::nullopt;
  auto fall_back = [&](const absl::Status& why) -> std::optional<grpc::Status> {
    spdlog::warn(
        "[worker {}] control lane {}: assignments: {}; reading them over gRPC (lane "
        "retried in {})",
        lane_.who(), path, why.ToString(), absl::FormatDuration(kRetryAfter));
    lane_stream_retry_ = absl::Now() + kRetryAfter;
    return std::nullopt;
  };
  absl::StatusOr<std::unique_ptr<LaneClient>> lane = LaneClient::Connect(path);
  if (!lane.ok()) return fall_back(lane.status());
  v1::LaneRequest open;
  open.mutable_assignments()->set_lease_id(lease_id);
  absl::StatusOr<v1::LaneResponse> opened = (*lane)->Call(open, absl::Now() + absl::Seconds(5));
  if (!opened.ok()) return fall_back(opened.status());
  if (absl::Status st = LaneResponseStatus(*opened); !st.ok()) {
    return fall_back(
        absl::Status(st.code(), absl::StrCat("the controller refused: ", st.message())));
  }
  spdlog::info("[worker {}] receives assignments over the control lane {}", lane_.who(), path);
  const uint64_t call = opened->call_id();
  while (!stop_.load() && !lane_stream_cancel_.Cancelled(epoch)) {
    const bool spin = busy_.Spinning();
    absl::StatusOr<std::optional<v1::LaneResponse>> got =
        (*lane)->Receive(call, absl::Now() + kSlice, spin);
    if (!got.ok()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(got.status().message()));
    }
    if (!got->has_value()) continue;
    const v1::LaneResponse& resp = **got;
    if (resp.code() != 0)
      return grpc::Status(static_cast<grpc::StatusCode>(resp.code()), resp.message());
    if (!resp.has_assignment()) continue;
    busy_.Touch();
    OnAssignment(resp.assignment(), lease_id, epoch);
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "assignment stream cancelled");
}

}  // namespace wsync::agent
