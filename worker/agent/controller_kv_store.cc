#include "worker/agent/controller_kv_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::agent {

namespace {
absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}
}  // namespace

absl::Status ControllerKvStore::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::KvSetRequest req;
  req.set_lease_id(lease_id_);
  req.set_key(key);
  req.set_value(value);
  v1::KvSetResponse resp;
  grpc::Status s = stub_->KvSet(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("rendezvous KvSet '", key, "'"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ControllerKvStore::Get(const std::string& key, absl::Time deadline) {
  constexpr absl::Duration kSlice = absl::Milliseconds(250);
  while (true) {
    if (aborted_ != nullptr && aborted_->load()) {
      return absl::AbortedError(absl::StrCat("rendezvous aborted while waiting for '", key, "'"));
    }
    const absl::Time now = absl::Now();
    const absl::Duration wait = std::max(absl::ZeroDuration(), std::min(kSlice, deadline - now));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(now + wait + absl::Seconds(5)));
    v1::KvGetRequest req;
    req.set_lease_id(lease_id_);
    req.add_keys(key);
    req.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    v1::KvGetResponse resp;
    grpc::Status s = stub_->KvGet(&ctx, req, &resp);
    if (s.ok() && resp.values_size() == 1) return resp.values(0);
    if (!s.ok() && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return FromGrpc(s, absl::StrCat("rendezvous KvGet '", key, "'"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous key '", key, "' not set by the deadline"));
    }
  }
}

}  // namespace wsync::agent
