#include "worker/agent/lane_reporter.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace wsync::agent {

void LaneReporter::GiveUpLocked(const absl::Status& why) {
  spdlog::warn("[worker {}] control lane {}: {}; reporting over gRPC (lane retried in {})", who_,
               path_, why.ToString(), absl::FormatDuration(kRetryAfter));
  client_.reset();
  bound_lease_.clear();
  retry_after_ = absl::Now() + kRetryAfter;
}

bool LaneReporter::ReadyLocked(const std::string& lease, absl::Time deadline) {
  if (client_ == nullptr || client_->broken()) {
    bound_lease_.clear();
    absl::StatusOr<std::unique_ptr<LaneClient>> c = LaneClient::Connect(path_);
    if (!c.ok()) {
      GiveUpLocked(c.status());
      return false;
    }
    client_ = *std::move(c);
  }
  if (bound_lease_ == lease) return true;
  v1::LaneRequest hello;
  hello.mutable_hello()->set_lease_id(lease);
  absl::StatusOr<v1::LaneResponse> resp = client_->Call(std::move(hello), deadline);
  if (!resp.ok()) {
    GiveUpLocked(resp.status());
    return false;
  }
  if (absl::Status st = LaneResponseStatus(*resp); !st.ok()) {
    GiveUpLocked(absl::Status(st.code(), absl::StrCat("the controller refused: ", st.message())));
    return false;
  }
  spdlog::info("[worker {}] reports over the control lane {}", who_, path_);
  bound_lease_ = lease;
  return true;
}

std::optional<absl::Status> LaneReporter::Report(const v1::ReportResultRequest& r,
                                                 absl::Time deadline) {
  if (path_.empty()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (absl::Now() < retry_after_ || !ReadyLocked(r.lease_id(), deadline)) return std::nullopt;
  v1::LaneRequest req;
  *req.mutable_report() = r;
  absl::StatusOr<v1::LaneResponse> resp = client_->Call(std::move(req), deadline);
  if (!resp.ok()) {
    GiveUpLocked(resp.status());
    return std::nullopt;
  }
  absl::Status st = LaneResponseStatus(*resp);
  if (absl::IsUnauthenticated(st)) {
    // The lane's admission (the lease died, or the certificate it registered
    // with was revoked): gRPC admits by the certificate this call presents,
    // so the report goes there, to be delivered or refused as gRPC decides.
    GiveUpLocked(absl::Status(st.code(), absl::StrCat("the controller refused: ", st.message())));
    return std::nullopt;
  }
  return st;
}

}  // namespace wsync::agent
