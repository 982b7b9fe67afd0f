// ControllerState: worker leases, assignment streams, rendezvous KV, Tick.
#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "controller/server/state.h"

namespace wsync::controller {

namespace {
std::string RankKey(const std::string& group, int32_t rank) {
  return absl::StrCat(group, "/", rank);
}
}  // namespace

ControllerState::ControllerState(ControllerConfig config, ControllerMetrics* metrics,
                                 PlanSource* plans)
    : config_(std::move(config)), metrics_(metrics), plans_(plans) {}

ControllerState::Worker* ControllerState::FindAliveLocked(const std::string& lease_id) {
  auto it = workers_.find(lease_id);
  if (it == workers_.end() || !it->second->alive) return nullptr;
  return it->second.get();
}

std::string ControllerState::DescribeLocked(const std::string& lease_id) {
  auto it = workers_.find(lease_id);
  if (it == workers_.end()) return absl::StrCat("lease ", lease_id);
  const Worker& w = *it->second;
  std::vector<std::string> roles;
  for (const auto& m : w.info.memberships()) roles.push_back(RankKey(m.group(), m.rank()));
  return absl::StrCat("worker ", absl::StrJoin(roles, "+"), " (pid ", w.info.pid(), " on ",
                      w.info.node(), ")");
}

absl::StatusOr<std::string> ControllerState::CommonTransportLocked(
    const std::string& transfer, const std::vector<std::string>& leases) {
  // A worker that lists no capabilities predates them: host memory over Gloo.
  auto offers = [&](const Worker& w, const std::string& kind) {
    if (w.info.capabilities().empty()) return kind == "gloo";
    return absl::c_linear_search(w.info.capabilities(), kind);
  };
  for (const char* kind : {"nccl", "gloo"}) {
    const std::string* missing = nullptr;
    for (const std::string& lease : leases) {
      auto it = workers_.find(lease);
      if (it == workers_.end() || !offers(*it->second, kind)) {
        missing = &lease;
        break;
      }
    }
    if (missing == nullptr) return std::string(kind);
  }
  std::string gpu, host;
  for (const std::string& lease : leases) {
    auto it = workers_.find(lease);
    if (it == workers_.end()) continue;
    std::string& slot = offers(*it->second, "nccl") ? gpu : host;
    if (slot.empty()) slot = DescribeLocked(lease);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "Sync: transfer '", transfer, "' mixes workers without a common transport: ",
      gpu.empty() ? "none" : gpu, " runs the GPU plane (nccl), ", host.empty() ? "none" : host,
      " runs on host memory (gloo); start every worker of a transfer with --device, or none"));
}

absl::StatusOr<v1::RegisterWorkerResponse> ControllerState::RegisterWorker(
    const v1::RegisterWorkerRequest& req) {
  if (req.instance_id().empty()) {
    return absl::InvalidArgumentError("RegisterWorker: instance_id is empty");
  }
  if (req.memberships().empty()) {
    return absl::InvalidArgumentError("RegisterWorker: no group memberships");
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
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("controller is shutting down");
  // Duplicate ranks and group sizes are checked against live leases of other
  // processes; the same instance re-registering replaces its old lease.
  std::vector<Worker*> replaced;
  for (const auto& m : req.memberships()) {
    auto it = ranks_.find(RankKey(m.group(), m.rank()));
    if (it != ranks_.end()) {
      Worker* holder = FindAliveLocked(it->second);
      if (holder != nullptr && holder->info.instance_id() != req.instance_id()) {
        return absl::AlreadyExistsError(
            absl::StrCat("group '", m.group(), "' rank ", m.rank(), " is already held by ",
                         DescribeLocked(holder->lease_id), ", lease ", holder->lease_id));
      }
    }
    for (const auto& [lease, w] : workers_) {
      if (!w->alive || w->info.instance_id() == req.instance_id()) continue;
      for (const auto& other : w->info.memberships()) {
        if (other.group() == m.group() && other.group_size() != m.group_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("group '", m.group(), "' has size ", other.group_size(), " (",
                           DescribeLocked(lease), ") but this worker says ", m.group_size()));
        }
      }
    }
  }
  for (auto& [lease, w] : workers_) {
    if (w->alive && w->info.instance_id() == req.instance_id()) replaced.push_back(w.get());
  }
  for (Worker* old : replaced) MarkDeadLocked(*old, "replaced by a new registration");

  auto w = std::make_unique<Worker>();
  w->lease_id = absl::StrCat("L", config_.instance, "-", next_id_++);
  w->info = req;
  w->registration = next_id_++;
  w->last_heartbeat = absl::Now();
  for (const auto& m : req.memberships()) ranks_[RankKey(m.group(), m.rank())] = w->lease_id;
  v1::RegisterWorkerResponse resp;
  resp.set_lease_id(w->lease_id);
  resp.set_lease_ttl_ms(absl::ToInt64Milliseconds(config_.lease_ttl));
  resp.set_heartbeat_interval_ms(std::max<int64_t>(1, resp.lease_ttl_ms() / 4));
  resp.set_controller_instance(config_.instance);
  std::fprintf(stderr, "[controller] registered %s as lease %s\n",
               absl::StrJoin(req.memberships(), "+",
                             [](std::string* out, const v1::Membership& m) {
                               absl::StrAppend(out, m.group(), "/", m.rank());
                             })
                   .c_str(),
               w->lease_id.c_str());
  workers_[w->lease_id] = std::move(w);
  cv_.SignalAll();
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> ControllerState::Heartbeat(const std::string& lease_id) {
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

absl::Status ControllerState::UpdateBuffers(const v1::UpdateBuffersRequest& req) {
  absl::MutexLock lock(&mu_);
  Worker* w = FindAliveLocked(req.lease_id());
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("lease '", req.lease_id(), "' is unknown or expired"));
  }
  *w->info.mutable_buffers() = req.buffers();
  w->registration = next_id_++;
  w->last_heartbeat = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ControllerState::OpenStream(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  Worker* w = FindAliveLocked(lease_id);
  if (w == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("lease '", lease_id, "' is unknown or expired; register again"));
  }
  w->stream_token = next_id_++;
  w->last_heartbeat = absl::Now();
  w->cv.SignalAll();  // an older stream of this lease ends
  return w->stream_token;
}

absl::StatusOr<std::optional<v1::Assignment>> ControllerState::NextAssignment(
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
    ++w->waiters;
    const bool timed_out = w->cv.WaitWithDeadline(&mu_, until);
    --w->waiters;
    if (timed_out) return std::optional<v1::Assignment>();
  }
}

void ControllerState::CloseStream(const std::string& lease_id, uint64_t token,
                                  const std::string& why) {
  absl::MutexLock lock(&mu_);
  Worker* w = FindAliveLocked(lease_id);
  if (w == nullptr || w->stream_token != token) return;
  w->stream_token = 0;
  MarkDeadLocked(*w, absl::StrCat("assignment stream closed: ", why));
}

void ControllerState::PushLocked(Worker& w, v1::Assignment a) {
  w.outbox.push_back(std::move(a));
  w.cv.Signal();
}

void ControllerState::MarkDeadLocked(Worker& w, const std::string& reason) {
  if (!w.alive) return;
  const std::string who = DescribeLocked(w.lease_id);
  std::fprintf(stderr, "[controller] %s lease %s dead: %s\n", who.c_str(), w.lease_id.c_str(),
               reason.c_str());
  w.alive = false;
  w.died_at = absl::Now();
  w.outbox.clear();
  w.cv.SignalAll();
  for (const auto& m : w.info.memberships()) {
    auto it = ranks_.find(RankKey(m.group(), m.rank()));
    if (it != ranks_.end() && it->second == w.lease_id) ranks_.erase(it);
  }
  // Every running sync this worker takes part in fails, naming it.
  for (auto& [id, sync] : syncs_) {
    if (sync->finished()) continue;
    for (const Participant& p : sync->parts) {
      if (p.lease_id != w.lease_id) continue;
      FinishLocked(*sync, v1::SYNC_FAILED, static_cast<int32_t>(absl::StatusCode::kUnavailable),
                   absl::StrCat(who, " lost: ", reason), p.worker, -1, -1, -1);
      break;
    }
  }
  cv_.SignalAll();
}

absl::Status ControllerState::KvSet(const v1::KvSetRequest& req) {
  absl::MutexLock lock(&mu_);
  if (FindAliveLocked(req.lease_id()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("KvSet: lease '", req.lease_id(), "' is not alive"));
  }
  for (auto& [prefix, scope] : kv_) {
    if (absl::StartsWith(req.key(), prefix)) {
      scope[req.key()] = req.value();
      cv_.SignalAll();
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "KvSet: key '", req.key(), "' is outside every live rendezvous scope (stale generation?)"));
}

absl::StatusOr<v1::KvGetResponse> ControllerState::KvGet(const v1::KvGetRequest& req) {
  const absl::Time until = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, req.timeout_ms()));
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shutdown_) return absl::UnavailableError("controller is shutting down");
    if (FindAliveLocked(req.lease_id()) == nullptr) {
      return absl::NotFoundError(absl::StrCat("KvGet: lease '", req.lease_id(), "' is not alive"));
    }
    std::vector<std::string> missing;
    v1::KvGetResponse resp;
    for (const std::string& key : req.keys()) {
      const absl::flat_hash_map<std::string, std::string>* scope = nullptr;
      for (const auto& [prefix, s] : kv_) {
        if (absl::StartsWith(key, prefix)) scope = &s;
      }
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
    if (cv_.WaitWithDeadline(&mu_, until)) {
      return absl::DeadlineExceededError(
          absl::StrCat("KvGet: after ", req.timeout_ms(),
                       " ms still missing keys: ", absl::StrJoin(missing, ", ")));
    }
  }
}

void ControllerState::OpenScopeLocked(Transfer& t) {
  const std::string old_prefix = absl::StrCat(t.name, "/", t.generation, "/");
  kv_.erase(old_prefix);
  ++t.generation;
  kv_[absl::StrCat(t.name, "/", t.generation, "/")];
  cv_.SignalAll();  // waiters in the old scope end
}

void ControllerState::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  int registered = 0;
  int alive = 0;
  std::vector<std::string> prune;
  for (auto& [lease, w] : workers_) {
    if (w->alive && now - w->last_heartbeat > config_.lease_ttl) {
      MarkDeadLocked(*w, absl::StrCat("lease expired: no heartbeat for ",
                                      absl::ToInt64Milliseconds(now - w->last_heartbeat), " ms"));
    }
    if (!w->alive && w->waiters == 0 && now - w->died_at > 5 * config_.lease_ttl) {
      prune.push_back(lease);
    }
    ++registered;
    if (w->alive) ++alive;
  }
  for (const auto& lease : prune) workers_.erase(lease);
  for (auto& [id, sync] : syncs_) {
    if (sync->finished() || now < sync->deadline) continue;
    std::vector<std::string> pending;
    int32_t first = -1;
    for (const Participant& p : sync->parts) {
      if (p.done) continue;
      if (first < 0) first = p.worker;
      pending.push_back(absl::StrCat(DescribeLocked(p.lease_id), " [worker ", p.worker, "]"));
    }
    FinishLocked(
        *sync, v1::SYNC_FAILED, static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded),
        absl::StrCat("sync deadline of ", absl::FormatDuration(sync->deadline - sync->start),
                     " exceeded; not done: ", absl::StrJoin(pending, ", ")),
        first, -1, -1, -1);
  }
  while (sync_order_.size() > 256) {
    auto it = syncs_.find(sync_order_.front());
    if (it != syncs_.end() && !it->second->finished()) break;
    if (it != syncs_.end()) syncs_.erase(it);
    sync_order_.pop_front();
  }
  if (metrics_ != nullptr) metrics_->SetWorkers(registered - static_cast<int>(prune.size()), alive);
}

void ControllerState::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  cv_.SignalAll();
  for (auto& [lease, w] : workers_) w->cv.SignalAll();
}

v1::ListWorkersResponse ControllerState::ListWorkers(const std::string& group) {
  absl::MutexLock lock(&mu_);
  v1::ListWorkersResponse resp;
  const absl::Time now = absl::Now();
  for (const auto& [lease, w] : workers_) {
    bool match = group.empty();
    for (const auto& m : w->info.memberships()) match = match || m.group() == group;
    if (!match) continue;
    v1::RegisteredWorker* info = resp.add_workers();
    info->set_lease_id(lease);
    info->set_instance_id(w->info.instance_id());
    *info->mutable_memberships() = w->info.memberships();
    info->set_node(w->info.node());
    info->set_device_uuid(w->info.device_uuid());
    *info->mutable_capabilities() = w->info.capabilities();
    info->set_data_address(w->info.data_address());
    info->set_alive(w->alive);
    info->set_ms_since_heartbeat(absl::ToInt64Milliseconds(now - w->last_heartbeat));
    *info->mutable_buffers() = w->info.buffers();
    info->set_pid(w->info.pid());
    info->set_streaming(w->stream_token != 0);
    info->set_direct_write_domain(w->info.direct_write_domain());
    *info->mutable_peer_gpu_uuids() = w->info.peer_gpu_uuids();
  }
  std::sort(resp.mutable_workers()->begin(), resp.mutable_workers()->end(),
            [](const v1::RegisteredWorker& a, const v1::RegisteredWorker& b) {
              return std::make_pair(a.memberships(0).group(), a.memberships(0).rank()) <
                     std::make_pair(b.memberships(0).group(), b.memberships(0).rank());
            });
  return resp;
}

}  // namespace wsync::controller
