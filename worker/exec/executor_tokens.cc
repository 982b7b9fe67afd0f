// Direct writes' tokens (executor.h): ready tokens from the receivers to the
// senders that write them before the first put, done tokens back after the
// last.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/exec/executor.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {

using internal::Wrap;

absl::Status Executor::ExchangeTokens(const BoundPlan& plan, bool ready, absl::Time deadline,
                                      const std::function<void()>& on_posted) {
  // Ready tokens go from receivers to the senders that write them, done
  // tokens back. Their bytes carry nothing: arriving is the message.
  const std::vector<int32_t>& to = ready ? plan.direct_written_by : plan.direct_write_to;
  const std::vector<int32_t>& from = ready ? plan.direct_write_to : plan.direct_written_by;
  const int64_t tag = ready ? kReadyTokenTag : kDoneTokenTag;
  const char* what = ready ? "ready tokens" : "done tokens";
  const std::string where =
      absl::StrCat("worker ", plan.worker, ": direct-write ", what, " (to workers ",
                   absl::StrJoin(to, ","), ", from workers ", absl::StrJoin(from, ","), ")");
  if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
  }
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(where, ": the sync deadline passed"));
  }
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": this worker's data plane has no peer writer"));
  }
  constexpr size_t kTokenBytes = PeerWriter::kTokenBytes;
  auto slots = writer_->TokenSlots(to.size() + from.size());
  if (!slots.ok()) return Wrap(slots.status(), where);
  uint8_t* base = *slots;
  const uint64_t value = ready ? plan.ready_token : 0;
  for (size_t k = 0; k < to.size(); ++k) {
    RETURN_IF_ERROR(Wrap(writer_->WriteToken(base + k * kTokenBytes, value), where));
  }
  send_reqs_.clear();
  recv_reqs_.clear();
  for (size_t k = 0; k < to.size(); ++k) {
    send_reqs_.push_back({to[k], tag, base + k * kTokenBytes, kTokenBytes});
  }
  for (size_t k = 0; k < from.size(); ++k) {
    recv_reqs_.push_back({from[k], tag, base + (to.size() + k) * kTokenBytes, kTokenBytes});
  }
  const absl::Time round_deadline = std::min(deadline, absl::Now() + options_.round_timeout);
  const absl::Status s = transport_->RunRound(send_reqs_, recv_reqs_, round_deadline, on_posted);
  if (s.ok() && ready) {
    for (size_t k = 0; k < from.size(); ++k) {
      auto read = writer_->ReadToken(base + (to.size() + k) * kTokenBytes);
      if (!read.ok()) return Wrap(read.status(), where);
      const uint64_t got = *read;
      auto want = plan.expected_ready_tokens.find(from[k]);
      if (want == plan.expected_ready_tokens.end() || want->second != got) {
        return absl::AbortedError(absl::StrCat(
            where, ": worker ", from[k],
            "'s registered buffers differ from the ones this worker mapped for it (its owner "
            "registered again after the controller assigned the sync); nothing was written to it, "
            "the "
            "next sync uses the new registration"));
      }
    }
  }
  if (s.ok()) return s;
  if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(absl::StrCat(where, ": aborted: ", abort_reason_));
  }
  return absl::Status(s.code(), absl::StrCat(where, " failed: ", s.message()));
}

}  // namespace wsync::exec
