#include "worker/agent/agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/bucket_steps.h"
#include "common/lease_metadata.h"
#include "common/logging.h"
#include "common/peer_lists.h"
#include "common/plan_pieces.h"
#include "common/serving_state.h"
#include "common/shadow_extents.h"

namespace wsync::agent {

namespace {
std::vector<std::string> GroupsOf(const AgentOptions& o) {
  std::vector<std::string> groups;
  for (const auto& m : o.memberships) groups.push_back(m.group());
  return groups;
}

std::string Roles(const AgentOptions& o) {
  std::string out;
  for (const auto& m : o.memberships) {
    absl::StrAppend(&out, out.empty() ? "" : "+", m.group(), "/", m.rank());
  }
  return out;
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}
}  // namespace

WorkerAgent::WorkerAgent(AgentOptions options, WorkerMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      tensors_(GroupsOf(options_), options_.backend),
      serving_(options_.memberships),
      runner_(&tensors_, metrics,
              RunnerOptions{options_.round_timeout, options_.staging_limit_bytes, options_.backend,
                            options_.parts_cache_bytes, options_.staging_budget_bytes,
                            options_.test_corrupt_after_sync, options_.arenas,
                            options_.put_gate_timeout}),
      lane_(options_.controller_lane, Roles(options_)),
      progress_([this](const v1::ReportProgressRequest& p) {
        grpc::ClientContext ctx;
        ctx.set_deadline(In(absl::Seconds(2)));
        v1::ReportProgressResponse resp;
        stub_->ReportProgress(&ctx, p, &resp);  // best effort
      }),
      busy_(options_.busy_poll) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // op lists can be large
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(options_.controller,
                                       options_.controller_credentials != nullptr
                                           ? options_.controller_credentials
                                           : grpc::InsecureChannelCredentials(),
                                       args);
  stub_ = v1::WorkerService::NewStub(channel_);
}

WorkerAgent::~WorkerAgent() { Stop(); }

void WorkerAgent::Start() {
  // Before any thread: a decision wakes the exec thread (agent_exec.cc).
  gate_.SetWaker([this] {
    absl::MutexLock lock(&mu_);
    ++gate_wakes_;  // releasing mu_ re-evaluates the exec thread's condition
  });
  latch_.SetWaker([this] {  // an admission: a commit awaiting it goes on
    absl::MutexLock lock(&mu_);
    ++gate_wakes_;
  });
  session_ = std::thread([this] { SessionLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  exec_ = std::thread([this] { ExecLoop(); });
}

void WorkerAgent::Stop() {
  if (stop_.exchange(true)) return;
  runner_.Abort("", "worker is stopping");
  gate_.Abort("", "the worker is stopping");
  {
    absl::MutexLock lock(&mu_);
    if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
    lane_stream_cancel_.CancelAll();
  }
  for (std::thread* t : {&session_, &heartbeat_, &exec_}) {
    if (t->joinable()) t->join();
  }
}

std::string WorkerAgent::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_id_;
}

void WorkerAgent::SessionLoop() {
  absl::Duration backoff = absl::Milliseconds(50);
  while (!stop_.load()) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(options_.instance_id);
    for (const auto& m : options_.memberships) *req.add_memberships() = m;
    req.set_node(options_.node);
    req.set_device_uuid(options_.device_uuid);
    req.add_transports(options_.backend->transport_kind());
    for (const auto& c : options_.capabilities) req.add_capabilities(c);
    req.add_capabilities(kPeerListsOnceCapability);
    req.add_capabilities(kStagedSyncsCapability);
    req.add_capabilities(kPieceRunRowsCapability);
    req.add_capabilities(kBucketStepsCapability);
    req.set_staging_limit_bytes(options_.staging_limit_bytes);
    req.set_staging_budget_bytes(options_.staging_budget_bytes);
    req.set_decision_slack_ms(absl::ToInt64Milliseconds(options_.decision_slack));
    req.set_data_address(options_.data_address);
    req.set_pid(getpid());
    req.set_direct_write_domain(options_.direct_write_domain);
    for (const auto& u : options_.peer_gpu_uuids) req.add_peer_gpu_uuids(u);
    const uint64_t buffers_version = tensors_.version();
    for (auto& b : tensors_.BufferInfos()) *req.add_buffers() = std::move(b);
    v1::RegisterWorkerResponse resp;
    grpc::ClientContext rctx;
    rctx.set_deadline(In(absl::Seconds(5)));
    if (const std::string previous = lease(); !previous.empty()) {
      rctx.AddMetadata(kPreviousLeaseMetadata, previous);  // replaces it if still alive
    }
    grpc::Status s = stub_->RegisterWorker(&rctx, req, &resp);
    if (!s.ok()) {
      spdlog::warn("[worker {}] register: {} (retrying)", Roles(options_), s.error_message());
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
      continue;
    }
    backoff = absl::Milliseconds(50);
    grpc::ClientContext ctx;
    uint64_t epoch;
    {
      absl::MutexLock lock(&mu_);
      lease_id_ = resp.lease_id();
      epoch = ++lease_epoch_;
      heartbeat_interval_ = absl::Milliseconds(std::max<int64_t>(10, resp.heartbeat_interval_ms()));
      stream_ctx_ = &ctx;
      if (stop_.load()) ctx.TryCancel();
    }
    spdlog::info("[worker {}] registered (controller instance {})", Roles(options_),
                 resp.controller_instance());
    RejoinStaged(resp, epoch);  // staged syncs: the decisions that await this worker
    {
      absl::MutexLock lock(&push_mu_);
      if (pushed_lease_ != resp.lease_id()) pushed_version_ = 0;
      pushed_lease_ = resp.lease_id();
      pushed_version_ = std::max(pushed_version_, buffers_version);
    }
    // An owner that registered tensors while we were registering saw no lease
    // and could not forward them: send the current list now.
    PushBuffers(resp.lease_id());
    serving_.MarkUnsent();  // the new lease hears what the owner serves at once
    s = ReadAssignments(&ctx, resp.lease_id(), epoch);
    {
      absl::MutexLock lock(&mu_);
      stream_ctx_ = nullptr;
      lease_id_.clear();
      queue_.clear();  // their syncs failed with the lease
    }
    // Whatever runs belonged to the lost lease; the controller failed it.
    runner_.Abort("", "lease lost: " + s.error_message());
    // A staged sync awaiting the decision waits for the next registration's
    // word (RejoinStaged) or its deadline: the decision may be saved by a
    // controller that died (docs/staging.md).
    if (!stop_.load()) {
      spdlog::warn("[worker {}] assignment stream ended ({}); registering again", Roles(options_),
                   s.error_message());
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
}

void WorkerAgent::HeartbeatLoop() {
  while (!stop_.load()) {
    std::string lease_id;
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      lease_id = lease_id_;
      interval = heartbeat_interval_;
    }
    if (!lease_id.empty()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(In(interval));
      v1::HeartbeatRequest req;
      req.set_lease_id(lease_id);
      serving_.TakeChanged();  // this heartbeat carries the change
      for (auto& r : serving_.Reports(Status().last_version())) *req.add_serving() = std::move(r);
      v1::HeartbeatResponse resp;
      grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        // The controller forgot us (restart or expiry): end the stream, re-register.
        absl::MutexLock lock(&mu_);
        if (lease_id_ == lease_id && stream_ctx_ != nullptr) stream_ctx_->TryCancel();
        if (lease_id_ == lease_id) lane_stream_cancel_.Cancel(lease_epoch_);
      } else if (s.ok()) {
        RetryBuffersPush(lease_id);  // retries a push that failed (no-op when current)
      }
    }
    // An owner's SetServing cuts the wait short: the controller hears it now.
    for (absl::Duration slept; slept < interval && !stop_.load() && !serving_.TakeChanged();
         slept += absl::Milliseconds(20)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
}

void WorkerAgent::OnAssignment(const v1::Assignment& a, const std::string& lease_id,
                               uint64_t epoch) {
  if (a.has_sync()) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(Queued{a.sync(), lease_id, epoch, absl::Now()});
    return;
  }
  if (a.has_commit()) {
    gate_.Commit(a.commit().sync_id());
    return;
  }
  if (!a.has_abort()) return;
  const std::string& id = a.abort().sync_id();
  gate_.Abort(id, a.abort().reason());
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->assignment.sync_id() == id) {
        // The controller sends a part's op list once: keep it for later syncs.
        dropped_.push_back(std::move(*it));
        queue_.erase(it);
        dropped = true;
        break;
      }
    }
  }
  spdlog::info("[worker {}] abort of sync {}: {}", Roles(options_), id, a.abort().reason());
  if (!dropped) runner_.Abort(id, a.abort().reason());
}

std::string WorkerAgent::Who() const { return Roles(options_); }

v1::SyncEvent WorkerAgent::EventOf(const v1::SyncAssignment& a, v1::SyncEvent::Kind kind) {
  v1::SyncEvent ev;
  ev.set_kind(kind);
  ev.set_sync_id(a.sync_id());
  ev.set_transfer(a.transfer());
  ev.set_version(a.version());
  return ev;
}

void WorkerAgent::PublishEnd(const v1::SyncAssignment& a, bool ok, const std::string& error,
                             bool untouched) {
  {
    absl::MutexLock lock(&mu_);
    if (ok) {
      ++syncs_ok_;
      last_version_ = std::max(last_version_, a.version());
      int64_t& applied = applied_[a.transfer()];
      applied = std::max(applied, a.version());
    } else {
      ++syncs_failed_;
    }
  }
  v1::SyncEvent ev = EventOf(a, v1::SyncEvent::FINISHED);
  ev.set_ok(ok);
  ev.set_error(error);
  ev.set_untouched(untouched);
  Publish(ev);
}

absl::StatusOr<std::string> WorkerAgent::HoldSyncs(std::string reason) {
  return latch_.Hold(std::move(reason), options_.hold_commit_wait);
}

bool WorkerAgent::RefuseIfHeldOrOlder(const v1::SyncAssignment& a, const std::string& lease_id) {
  const std::string held = latch_.held();
  int64_t applied = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = applied_.find(a.transfer());
    if (it != applied_.end()) applied = it->second;
  }
  // A staged sync writes shadows only: it stages while held, and its commit
  // waits for the owner to admit syncs (StepStaged).
  if (!held.empty() && a.staging().mode() == v1::STAGING_IN_PLACE) {
    Refuse(
        a, lease_id,
        absl::StrCat("worker ", Roles(options_), ": sync ", a.sync_id(), " (version ", a.version(),
                     ") refused, nothing written: its owner holds syncs off: ", held));
    return true;
  }
  if (a.version() < applied) {
    Refuse(a, lease_id,
           absl::StrCat("worker ", Roles(options_), ": sync ", a.sync_id(),
                        " refused, nothing written: it carries version ", a.version(),
                        " of transfer '", a.transfer(),
                        "' but this worker already applied version ", applied,
                        " (versions never go backwards; did the controller lose its state?)"));
    return true;
  }
  return false;
}

void WorkerAgent::Refuse(const v1::SyncAssignment& a, const std::string& lease_id,
                         const std::string& error) {
  runner_.CachePlan(a);  // the op list comes once per plan key
  spdlog::warn("[worker {}] {}", Roles(options_), error);
  v1::ReportResultRequest r;
  r.set_sync_id(a.sync_id());
  r.set_code(static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  r.set_message(error);
  r.set_round(-1);
  r.set_op(-1);
  r.set_peer(-1);
  Report(r, lease_id, /*patience=*/absl::ZeroDuration());  // on the stream's thread
  PublishEnd(a, /*ok=*/false, error, /*untouched=*/true);
}

void WorkerAgent::Publish(const v1::SyncEvent& e) {
  v1::SyncEvent stamped = e;
  stamped.set_unix_us(absl::ToUnixMicros(absl::Now()));  // before anything it causes
  absl::MutexLock lock(&mu_);
  for (const auto& q : subscribers_) q->Push(stamped);
}

absl::Status WorkerAgent::PublishRead(const v1::SyncEvent& e) {
  v1::SyncEvent stamped = e;
  stamped.set_unix_us(absl::ToUnixMicros(absl::Now()));
  std::vector<std::pair<std::shared_ptr<EventQueue>, uint64_t>> sent;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& q : subscribers_) sent.emplace_back(q, q->Push(stamped));
  }
  const absl::Time deadline = absl::Now() + options_.staged_flush_timeout;
  std::vector<std::string> unread;
  for (const auto& [q, number] : sent) {
    if (!q->AwaitRead(number, deadline)) unread.push_back(q->who());
  }
  if (unread.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat(unread.size(), " of ", sent.size(),
                   " owner(s) subscribed to this worker's events did not read ",
                   v1::SyncEvent::Kind_Name(e.kind()), " of sync ", e.sync_id(), " within ",
                   absl::FormatDuration(options_.staged_flush_timeout),
                   " (--staged_flush_timeout): ", absl::StrJoin(unread, "; ")));
}

absl::StatusOr<v1::RegisterTensorsResponse> WorkerAgent::RegisterTensors(
    const v1::RegisterTensorsRequest& req, const Registrant& who) {
  TensorTable::FdBatches fds;
  for (const v1::TensorRegistration& t : req.tensors()) {
    if (!t.has_cuda_vmm() || fds.count(t.cuda_vmm().fd_token()) != 0) continue;
    const std::string what = absl::StrCat("tensor '", t.name(), "' of group '", req.group(), "'");
    if (options_.fd_inbox == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what,
                       ": this worker has no descriptor socket (CUDA virtual memory "
                       "needs wsync-worker --device with its local socket)"));
    }
    auto batch = options_.fd_inbox->Claim(t.cuda_vmm().fd_token(), what);
    if (!batch.ok()) return batch.status();
    fds.emplace(t.cuda_vmm().fd_token(), *std::move(batch));
  }
  auto resp = tensors_.Register(req, fds, who);
  if (!resp.ok()) return resp;
  const std::string lease_id = lease();
  if (!lease_id.empty()) PushBuffers(lease_id);
  return resp;
}

absl::StatusOr<v1::RegisterTensorsResponse> WorkerAgent::RegisterLocal(
    const std::string& group, std::vector<LocalTensor> tensors, bool replace) {
  auto resp = tensors_.RegisterLocal(group, std::move(tensors), replace);
  if (!resp.ok()) return resp;
  const std::string lease_id = lease();
  if (!lease_id.empty()) PushBuffers(lease_id);
  return resp;
}

void WorkerAgent::PushBuffers(const std::string& lease_id) {
  absl::MutexLock lock(&push_mu_);
  PushBuffersLocked(lease_id);
}

void WorkerAgent::RetryBuffersPush(const std::string& lease_id) {
  // A push in flight (a registration's) is not waited for: the heartbeat
  // must not stall behind its deadline.
  if (!push_mu_.TryLock()) return;
  PushBuffersLocked(lease_id);
  push_mu_.Unlock();
}

void WorkerAgent::PushBuffersLocked(const std::string& lease_id) {
  // The controller checks plans against these before a sync starts.
  // Read before the list: a registration in between is pushed again later.
  const uint64_t version = tensors_.version();
  if (pushed_lease_ == lease_id && pushed_version_ >= version) return;
  v1::UpdateBuffersRequest u;
  u.set_lease_id(lease_id);
  for (auto& b : tensors_.BufferInfos()) *u.add_buffers() = std::move(b);
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(5)));
  v1::UpdateBuffersResponse ur;
  grpc::Status s = stub_->UpdateBuffers(&ctx, u, &ur);
  if (!s.ok()) {
    // Registered locally; the heartbeat loop (or the next registration)
    // sends them again.
    spdlog::warn("[worker {}] UpdateBuffers: {}", Roles(options_), s.error_message());
    return;
  }
  if (pushed_lease_ != lease_id) pushed_version_ = 0;
  pushed_lease_ = lease_id;
  pushed_version_ = std::max(pushed_version_, version);
}

std::shared_ptr<EventQueue> WorkerAgent::Subscribe(const std::string& who) {
  absl::MutexLock lock(&mu_);
  auto q = std::make_shared<EventQueue>(absl::StrCat(
      "owner #", ++subscriptions_, " (", who, ", subscribed at ",
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), ")"));
  subscribers_.push_back(q);
  return q;
}

void WorkerAgent::Unsubscribe(const std::shared_ptr<EventQueue>& q) {
  absl::MutexLock lock(&mu_);
  subscribers_.erase(std::remove(subscribers_.begin(), subscribers_.end(), q), subscribers_.end());
  if (q != nullptr) q->Close();
}

v1::LocalStatusResponse WorkerAgent::Status() {
  absl::MutexLock lock(&mu_);
  v1::LocalStatusResponse s;
  s.set_registered(!lease_id_.empty());
  s.set_lease_id(lease_id_);
  s.set_last_version(last_version_);
  s.set_syncs_ok(syncs_ok_);
  s.set_syncs_failed(syncs_failed_);
  return s;
}

absl::Status WorkerAgent::SetServing(const v1::SetServingRequest& req) {
  if (absl::Status s = serving_.Set(req); !s.ok()) return s;
  if (metrics_ != nullptr) {
    metrics_->Serving(req.group(), req.version(), ServingStateName(req.state()));
  }
  return absl::OkStatus();
}

}  // namespace wsync::agent
