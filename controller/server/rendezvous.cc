#include "controller/server/rendezvous.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace wsync::controller {

namespace {
// A Get re-checks its lease at least this often (a loss also wakes it).
constexpr absl::Duration kRecheck = absl::Milliseconds(100);
}  // namespace

Rendezvous::Rendezvous(std::function<bool(const std::string&)> alive, Quota quota)
    : alive_(std::move(alive)), quota_(quota) {}

std::string Rendezvous::ScopePrefix(const std::string& transfer, int64_t generation) {
  return absl::StrCat(transfer, "/", generation, "/");
}

const absl::flat_hash_map<std::string, std::string>* Rendezvous::ScopeOfLocked(
    const std::string& key) {
  const absl::flat_hash_map<std::string, std::string>* scope = nullptr;
  for (const auto& [prefix, s] : scopes_) {
    if (absl::StartsWith(key, prefix)) scope = &s;
  }
  return scope;
}

absl::Status Rendezvous::Set(const v1::KvSetRequest& req) {
  if (!alive_(req.lease_id())) {
    return absl::NotFoundError(absl::StrCat("KvSet: lease '", req.lease_id(), "' is not alive"));
  }
  absl::MutexLock lock(&mu_);
  for (auto& [prefix, scope] : scopes_) {
    if (absl::StartsWith(req.key(), prefix)) {
      auto old = scope.find(req.key());
      const int64_t before =
          old == scope.end() ? 0 : static_cast<int64_t>(old->first.size() + old->second.size());
      const int64_t after = static_cast<int64_t>(req.key().size() + req.value().size());
      int64_t& used = scope_bytes_[prefix];
      if (quota_.bytes > 0 && used - before + after > quota_.bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "KvSet: key '", req.key(), "' (", after, " bytes) would take rendezvous scope '",
            prefix, "' to ", used - before + after, " bytes, over its quota of ", quota_.bytes,
            " (--kv_scope_bytes)"));
      }
      if (quota_.keys > 0 && old == scope.end() &&
          static_cast<int64_t>(scope.size()) >= quota_.keys) {
        return absl::ResourceExhaustedError(
            absl::StrCat("KvSet: rendezvous scope '", prefix, "' already holds ", scope.size(),
                         " keys, its quota (--kv_scope_keys); key '", req.key(), "' refused"));
      }
      used += after - before;
      scope[req.key()] = req.value();
      cv_.SignalAll();
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "KvSet: key '", req.key(), "' is outside every live rendezvous scope (stale generation?)"));
}

absl::StatusOr<v1::KvGetResponse> Rendezvous::Get(const v1::KvGetRequest& req) {
  const absl::Time until = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, req.timeout_ms()));
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return absl::UnavailableError("controller is shutting down");
    }
    if (!alive_(req.lease_id())) {
      return absl::NotFoundError(absl::StrCat("KvGet: lease '", req.lease_id(), "' is not alive"));
    }
    absl::MutexLock lock(&mu_);
    std::vector<std::string> missing;
    v1::KvGetResponse resp;
    for (const std::string& key : req.keys()) {
      const auto* scope = ScopeOfLocked(key);
      if (scope == nullptr) {
        return absl::AbortedError(absl::StrCat(
            "KvGet: key '", key, "' is outside every live rendezvous scope (generation ended)"));
      }
      auto it = scope->find(key);
      if (it == scope->end()) {
        missing.push_back(key);
      } else {
        resp.add_values(it->second);
      }
    }
    if (missing.empty()) return resp;
    if (shutdown_) continue;  // reported at the top
    cv_.WaitWithDeadline(&mu_, std::min(until, absl::Now() + kRecheck));
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(
          absl::StrCat("KvGet: after ", req.timeout_ms(),
                       " ms still missing keys: ", absl::StrJoin(missing, ", ")));
    }
  }
}

void Rendezvous::OpenScope(const std::string& transfer, int64_t old_generation,
                           int64_t new_generation) {
  absl::MutexLock lock(&mu_);
  scopes_.erase(ScopePrefix(transfer, old_generation));
  scope_bytes_.erase(ScopePrefix(transfer, old_generation));
  scopes_[ScopePrefix(transfer, new_generation)];
  cv_.SignalAll();  // waiters in the old scope end
}

void Rendezvous::WakeAll() {
  absl::MutexLock lock(&mu_);
  cv_.SignalAll();
}

void Rendezvous::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  cv_.SignalAll();
}

}  // namespace wsync::controller
