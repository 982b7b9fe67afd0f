#include "controller/server/worker_registry.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/lease_metadata.h"
#include "common/logging.h"
#include "common/peer_lists.h"
#include "common/staging_limits.h"

namespace wsync::controller {

namespace {

std::string RankKey(const std::string& group, int32_t rank) {
  return absl::StrCat(group, "/", rank);
}

absl::Status CheckRequest(const v1::RegisterWorkerRequest& req) {
  if (req.instance_id().empty()) {
    return absl::InvalidArgumentError("RegisterWorker: instance_id is empty");
  }
  if (req.memberships().empty()) {
    return absl::InvalidArgumentError("RegisterWorker: no group memberships");
  }
  if (req.staging_limit_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterWorker: negative staging_limit_bytes ", req.staging_limit_bytes()));
  }
  if (req.decision_slack_ms() < 0 || req.decision_slack_ms() > kMaxDecisionSlackMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterWorker: decision_slack_ms ", req.decision_slack_ms(), " is outside [0, ",
        kMaxDecisionSlackMs, "] (the worker's --decision_slack; at most one hour)"));
  }
  if (req.staging_budget_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterWorker: negative staging_budget_bytes ", req.staging_budget_bytes()));
  }
  absl::flat_hash_set<std::string> own_groups;
  for (const auto& m : req.memberships()) {
    if (m.group().empty() || absl::StrContains(m.group(), "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterWorker: bad group name '", m.group(), "' (empty or has '/')"));
    }
    if (m.group_size() <= 0 || m.rank() < 0 || m.rank() >= m.group_size()) {
      return absl::InvalidArgumentError(absl::StrCat("RegisterWorker: group '", m.group(),
                                                     "' rank ", m.rank(), " outside [0, ",
                                                     m.group_size(), ")"));
    }
    if (!own_groups.insert(m.group()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterWorker: group '", m.group(), "' listed twice"));
    }
  }
  return absl::OkStatus();
}

// A lease id: 128 bits from the kernel's CSPRNG, hex.
absl::StatusOr<std::string> NewLeaseSecret() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat("RegisterWorker: getrandom failed: errno ", errno));
    }
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

bool HasUnmappableBuffers(const v1::RegisterWorkerRequest& info) {
  return absl::c_any_of(info.buffers(), [](const v1::BufferInfo& b) {
    return b.location_case() == v1::BufferInfo::LOCATION_NOT_SET;
  });
}

}  // namespace

WorkerRegistry::WorkerRegistry(ControllerConfig config, ControllerMetrics* metrics)
    : config_(std::move(config)), metrics_(metrics) {}

void WorkerRegistry::SetLossListener(std::function<void(const WorkerLoss&)> listener) {
  on_loss_ = std::move(listener);
}

void WorkerRegistry::Deliver(const std::vector<WorkerLoss>& lost) {
  for (const WorkerLoss& loss : lost) {
    if (loss.wake_stream) loss.wake_stream();
  }
  if (!on_loss_) return;
  for (const WorkerLoss& loss : lost) on_loss_(loss);
}

WorkerRegistry::Worker* WorkerRegistry::FindAliveLocked(const std::string& lease_id) {
  auto it = workers_.find(lease_id);
  if (it == workers_.end() || !it->second->alive) return nullptr;
  return it->second.get();
}

std::string WorkerRegistry::DescribeLocked(const std::string& lease_id) {
  auto it = workers_.find(lease_id);
  if (it == workers_.end()) return "a worker whose lease ended";
  const v1::RegisterWorkerRequest& info = *it->second->info;
  std::vector<std::string> roles;
  for (const auto& m : info.memberships()) roles.push_back(RankKey(m.group(), m.rank()));
  return absl::StrCat("worker ", absl::StrJoin(roles, "+"), " (pid ", info.pid(), " on ",
                      info.node(), ")");
}

WorkerSnapshot WorkerRegistry::SnapshotLocked(const Worker& w) {
  WorkerSnapshot s;
  s.lease_id = w.lease_id;
  s.info = w.info;
  s.registration = w.registration;
  s.direct_writes_unavailable = w.direct_writes_unavailable;
  s.unmappable_buffers = w.unmappable_buffers;
  s.description = DescribeLocked(w.lease_id);
  return s;
}

absl::Status WorkerRegistry::CheckMembershipsLocked(const v1::RegisterWorkerRequest& req) {
  // Duplicate ranks and group sizes are checked against live leases of other
  // processes; the same instance re-registering replaces its old lease.
  for (const auto& m : req.memberships()) {
    auto it = ranks_.find(RankKey(m.group(), m.rank()));
    if (it != ranks_.end()) {
      Worker* holder = FindAliveLocked(it->second);
      if (holder != nullptr && holder->info->instance_id() != req.instance_id()) {
        return absl::AlreadyExistsError(absl::StrCat("group '", m.group(), "' rank ", m.rank(),
                                                     " is already held by ",
                                                     DescribeLocked(holder->lease_id)));
      }
    }
    for (const auto& [lease, w] : workers_) {
      if (!w->alive || w->info->instance_id() == req.instance_id()) continue;
      for (const auto& other : w->info->memberships()) {
        if (other.group() == m.group() && other.group_size() != m.group_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("group '", m.group(), "' has size ", other.group_size(), " (",
                           DescribeLocked(lease), ") but this worker says ", m.group_size()));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckReplacementLocked(const v1::RegisterWorkerRequest& req,
                                                    const std::string& identity,
                                                    const std::string& previous_lease) {
  for (auto& [lease, w] : workers_) {
    if (!w->alive || w->info->instance_id() != req.instance_id()) continue;
    // An instance id is listed (ListWorkers): taking over its lease needs
    // the lease's secret and the same authenticated identity.
    if (previous_lease != lease || w->identity != identity) {
      return absl::AlreadyExistsError(
          absl::StrCat("RegisterWorker: instance '", req.instance_id(), "' is held by live ",
                       DescribeLocked(lease), "; replacing it needs that lease's id (metadata ",
                       kPreviousLeaseMetadata, ")",
                       w->identity.empty() ? "" : absl::StrCat(" and identity '", w->identity, "'"),
                       " (this caller: '", identity, "')"));
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckCaller(const std::string& lease_id, const std::string& identity,
                                         absl::string_view method) {
  absl::MutexLock lock(&mu_);
  const Worker* w = FindAliveLocked(lease_id);
  if (w == nullptr || w->identity == identity) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(method, ": the lease of ", DescribeLocked(lease_id), " belongs to identity '",
                   w->identity, "', not to the caller '", identity, "'"));
}

absl::StatusOr<v1::RegisterWorkerResponse> WorkerRegistry::RegisterWorker(
    const v1::RegisterWorkerRequest& req, const std::string& identity,
    const std::string& previous_lease, const LeaseCertificate& certificate) {
  if (absl::Status st = CheckRequest(req); !st.ok()) return st;
  absl::StatusOr<std::string> lease_id = NewLeaseSecret();
  if (!lease_id.ok()) return lease_id.status();
  // Parsed once, outside the lock: the lane checks it on each call.
  std::shared_ptr<const CertificateIdentity> parsed =
      IdentifyCertificate(certificate.leaf_pem, certificate.chain_pem);
  std::vector<WorkerLoss> lost;
  v1::RegisterWorkerResponse resp;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("controller is shutting down");
    if (absl::Status st = CheckReplacementLocked(req, identity, previous_lease); !st.ok())
      return st;
    if (absl::Status st = CheckMembershipsLocked(req); !st.ok()) return st;
    for (auto& [lease, w] : workers_) {
      if (w->alive && w->info->instance_id() == req.instance_id()) {
        MarkDeadLocked(*w, "replaced by a new registration", &lost);
      }
    }
    auto w = std::make_unique<Worker>();
    w->lease_id = *std::move(lease_id);
    w->identity = identity;
    w->certificate = std::move(parsed);
    w->info = std::make_shared<const v1::RegisterWorkerRequest>(req);
    w->unmappable_buffers = HasUnmappableBuffers(*w->info);
    w->registration = next_id_++;
    w->last_heartbeat = absl::Now();
    for (const auto& m : req.memberships()) ranks_[RankKey(m.group(), m.rank())] = w->lease_id;
    resp.set_lease_id(w->lease_id);
    resp.set_lease_ttl_ms(absl::ToInt64Milliseconds(config_.lease_ttl));
    resp.set_heartbeat_interval_ms(std::max<int64_t>(1, resp.lease_ttl_ms() / 4));
    resp.set_controller_instance(config_.instance);
    spdlog::info("[controller] registered {} (identity '{}')",
                 absl::StrJoin(req.memberships(), "+",
                               [](std::string* out, const v1::Membership& m) {
                                 absl::StrAppend(out, m.group(), "/", m.rank());
                               }),
                 identity);
    workers_[w->lease_id] = std::move(w);
    epoch_.fetch_add(1);
    if (metrics_ != nullptr) metrics_->WorkerRegistered();
  }
  Deliver(lost);
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> WorkerRegistry::Heartbeat(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  Worker* w = FindAliveLocked(lease_id);
  if (w == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("lease '", lease_id, "' is unknown or expired; register again"));
  }
  w->last_heartbeat = absl::Now();
  v1::HeartbeatResponse resp;
  resp.set_lease_ttl_ms(absl::ToInt64Milliseconds(config_.lease_ttl));
  return resp;
}

absl::Status WorkerRegistry::UpdateBuffers(const v1::UpdateBuffersRequest& req) {
  absl::MutexLock lock(&mu_);
  Worker* w = FindAliveLocked(req.lease_id());
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("lease '", req.lease_id(), "' is unknown or expired"));
  }
  // Copy on write: snapshots handed out keep the list they were made with.
  auto info = std::make_shared<v1::RegisterWorkerRequest>(*w->info);
  *info->mutable_buffers() = req.buffers();
  w->info = std::move(info);
  w->unmappable_buffers = HasUnmappableBuffers(*w->info);
  w->registration = next_id_++;
  w->last_heartbeat = absl::Now();
  epoch_.fetch_add(1);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WorkerRegistry::OpenStream(const std::string& lease_id,
                                                    std::function<void()> wake) {
  std::function<void()> replaced;
  uint64_t token;
  {
    absl::MutexLock lock(&mu_);
    Worker* w = FindAliveLocked(lease_id);
    if (w == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("lease '", lease_id, "' is unknown or expired; register again"));
    }
    w->stream_token = next_id_++;
    w->last_heartbeat = absl::Now();
    w->cv.SignalAll();  // an older stream of this lease ends
    replaced = std::exchange(w->wake, std::move(wake));
    token = w->stream_token;
  }
  if (replaced) replaced();
  return token;
}

absl::StatusOr<std::optional<v1::Assignment>> WorkerRegistry::NextAssignment(
    const std::string& lease_id, uint64_t token, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shutdown_) return absl::UnavailableError("controller is shutting down");
    Worker* w = FindAliveLocked(lease_id);
    if (w == nullptr) return absl::NotFoundError(absl::StrCat("lease '", lease_id, "' ended"));
    if (w->stream_token != token) {
      return absl::AbortedError("another Assignments stream replaced this one");
    }
    if (!w->outbox.empty()) {
      v1::Assignment a = std::move(w->outbox.front());
      w->outbox.pop_front();
      return std::optional<v1::Assignment>(std::move(a));
    }
    if (wait <= absl::ZeroDuration()) return std::optional<v1::Assignment>();
    ++w->waiters;
    const bool timed_out = w->cv.WaitWithDeadline(&mu_, until);
    --w->waiters;
    if (timed_out) return std::optional<v1::Assignment>();
  }
}

void WorkerRegistry::CloseStream(const std::string& lease_id, uint64_t token,
                                 const std::string& why) {
  std::vector<WorkerLoss> lost;
  {
    absl::MutexLock lock(&mu_);
    Worker* w = FindAliveLocked(lease_id);
    if (w == nullptr || w->stream_token != token) return;
    w->stream_token = 0;
    MarkDeadLocked(*w, absl::StrCat("assignment stream closed: ", why), &lost);
  }
  Deliver(lost);
}

void WorkerRegistry::MarkDeadLocked(Worker& w, const std::string& reason,
                                    std::vector<WorkerLoss>* lost) {
  if (!w.alive) return;
  const std::string who = DescribeLocked(w.lease_id);
  spdlog::warn("[controller] {}: lease dead: {}", who, reason);
  w.alive = false;
  w.died_at = absl::Now();
  epoch_.fetch_add(1);
  w.outbox.clear();
  w.cv.SignalAll();
  std::function<void()> wake = std::exchange(w.wake, nullptr);
  for (const auto& m : w.info->memberships()) {
    auto it = ranks_.find(RankKey(m.group(), m.rank()));
    if (it != ranks_.end() && it->second == w.lease_id) ranks_.erase(it);
  }
  lost->push_back(WorkerLoss{w.lease_id, who, reason, std::move(wake)});
  if (metrics_ != nullptr) metrics_->LeaseLost();
}

bool WorkerRegistry::IsAlive(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  return FindAliveLocked(lease_id) != nullptr;
}

std::optional<std::shared_ptr<const CertificateIdentity>> WorkerRegistry::LiveCertificate(
    const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  const Worker* w = FindAliveLocked(lease_id);
  if (w == nullptr) return std::nullopt;
  return w->certificate;
}

std::optional<WorkerSnapshot> WorkerRegistry::Find(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  const Worker* w = FindAliveLocked(lease_id);
  if (w == nullptr) return std::nullopt;
  return SnapshotLocked(*w);
}

std::string WorkerRegistry::Describe(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  return DescribeLocked(lease_id);
}

WorkerRegistry::Group WorkerRegistry::FindGroup(const std::string& group) {
  absl::MutexLock lock(&mu_);
  Group g;
  for (const auto& [lease, w] : workers_) {
    if (!w->alive) continue;
    for (const auto& m : w->info->memberships()) {
      if (m.group() == group) g.size = m.group_size();
    }
  }
  for (int32_t rank = 0; rank < g.size; ++rank) {
    auto it = ranks_.find(RankKey(group, rank));
    const Worker* w = it == ranks_.end() ? nullptr : FindAliveLocked(it->second);
    g.ranks.push_back(w == nullptr ? std::nullopt : std::make_optional(SnapshotLocked(*w)));
  }
  return g;
}

WorkerRegistry::Counts WorkerRegistry::CountWorkers() {
  absl::MutexLock lock(&mu_);
  Counts c;
  for (const auto& [lease, w] : workers_) {
    ++c.registered;
    if (w->alive) ++c.alive;
  }
  return c;
}

bool WorkerRegistry::Push(const std::string& lease_id, v1::Assignment a) {
  std::function<void()> wake;
  {
    absl::MutexLock lock(&mu_);
    Worker* w = FindAliveLocked(lease_id);
    if (w == nullptr) return false;
    w->outbox.push_back(std::move(a));
    w->cv.Signal();
    wake = w->wake;
  }
  if (wake) wake();
  return true;
}

bool WorkerRegistry::MarkPartSent(const std::string& lease_id, const std::string& part_key) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(lease_id);
  return it != workers_.end() && it->second->parts_sent.insert(part_key).second;
}

void WorkerRegistry::ForgetPartSent(const std::string& lease_id, const std::string& part_key) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(lease_id);
  if (it != workers_.end()) it->second->parts_sent.erase(part_key);
}

void WorkerRegistry::MarkDirectWritesUnavailable(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(lease_id);
  if (it == workers_.end() || it->second->direct_writes_unavailable) return;
  it->second->direct_writes_unavailable = true;
  epoch_.fetch_add(1);
}

void WorkerRegistry::Tick() {
  std::vector<WorkerLoss> lost;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    int registered = 0;
    int alive = 0;
    std::vector<std::string> prune;
    for (auto& [lease, w] : workers_) {
      if (w->alive && now - w->last_heartbeat > config_.lease_ttl) {
        MarkDeadLocked(*w,
                       absl::StrCat("lease expired: no heartbeat for ",
                                    absl::ToInt64Milliseconds(now - w->last_heartbeat), " ms"),
                       &lost);
      }
      if (!w->alive && w->waiters == 0 && now - w->died_at > 5 * config_.lease_ttl) {
        prune.push_back(lease);
      }
      ++registered;
      if (w->alive) ++alive;
    }
    for (const auto& lease : prune) workers_.erase(lease);
    if (metrics_ != nullptr) {
      metrics_->SetWorkers(registered - static_cast<int>(prune.size()), alive);
    }
  }
  Deliver(lost);
}

void WorkerRegistry::Shutdown() {
  std::vector<std::function<void()>> wakes;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    for (auto& [lease, w] : workers_) {
      w->cv.SignalAll();
      if (w->wake) wakes.push_back(std::exchange(w->wake, nullptr));
    }
  }
  for (const auto& wake : wakes) wake();
}

}  // namespace wsync::controller
