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

Rendezvous::Scope* Rendezvous::ScopeOfLocked(const std::string& key) {
  Scope* scope = nullptr;
  for (auto& [prefix, s] : scopes_) {
    if (absl::StartsWith(key, prefix)) scope = &s;
  }
  return scope;
}

absl::Status Rendezvous::CheckMember(const Scope& scope, const std::string& lease,
                                     const std::string& key, absl::string_view method) {
  if (scope.leases.contains(lease)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(method, ": key '", key, "' is in rendezvous scope '", scope.prefix,
                   "', whose transfer generation does not include the calling worker"));
}

absl::Status Rendezvous::Set(const v1::KvSetRequest& req) {
  if (!alive_(req.lease_id())) {
    return absl::NotFoundError(absl::StrCat("KvSet: lease '", req.lease_id(), "' is not alive"));
  }
  absl::MutexLock lock(&mu_);
  Scope* scope = ScopeOfLocked(req.key());
  if (scope == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KvSet: key '", req.key(), "' is outside every live rendezvous scope (stale generation?)"));
  }
  if (absl::Status st = CheckMember(*scope, req.lease_id(), req.key(), "KvSet"); !st.ok()) {
    return st;
  }
  auto old = scope->keys.find(req.key());
  const int64_t before =
      old == scope->keys.end() ? 0 : static_cast<int64_t>(old->first.size() + old->second.size());
  const int64_t after = static_cast<int64_t>(req.key().size() + req.value().size());
  if (quota_.bytes > 0 && scope->bytes - before + after > quota_.bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvSet: key '", req.key(), "' (", after, " bytes) would take rendezvous scope '",
        scope->prefix, "' to ", scope->bytes - before + after, " bytes, over its quota of ",
        quota_.bytes, " (--kv_scope_bytes)"));
  }
  if (quota_.keys > 0 && old == scope->keys.end() &&
      static_cast<int64_t>(scope->keys.size()) >= quota_.keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvSet: rendezvous scope '", scope->prefix, "' already holds ", scope->keys.size(),
        " keys, its quota (--kv_scope_keys); key '", req.key(), "' refused"));
  }
  scope->bytes += after - before;
  scope->keys[req.key()] = req.value();
  cv_.SignalAll();
  return absl::OkStatus();
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
      const Scope* scope = ScopeOfLocked(key);
      if (scope == nullptr) {
        return absl::AbortedError(absl::StrCat(
            "KvGet: key '", key, "' is outside every live rendezvous scope (generation ended)"));
      }
      if (absl::Status st = CheckMember(*scope, req.lease_id(), key, "KvGet"); !st.ok()) {
        return st;
      }
      auto it = scope->keys.find(key);
      if (it == scope->keys.end()) {
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
                           int64_t new_generation, const std::vector<std::string>& leases) {
  absl::MutexLock lock(&mu_);
  scopes_.erase(ScopePrefix(transfer, old_generation));
  const std::string prefix = ScopePrefix(transfer, new_generation);
  Scope& scope = scopes_[prefix];
  scope.prefix = prefix;
  scope.leases = absl::flat_hash_set<std::string>(leases.begin(), leases.end());
  scope.keys.clear();
  scope.bytes = 0;
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
