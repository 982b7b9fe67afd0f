#include "worker/embedded/embedded_worker.h"

#include <unistd.h>

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/busy_poll.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/node/backend_registry.h"

namespace wsync::embedded {
namespace {

absl::Status CheckOptions(const EmbeddedOptions& o) {
  if (o.memberships.empty()) {
    return absl::InvalidArgumentError("embedded worker: no group membership given");
  }
  for (const v1::Membership& m : o.memberships) {
    if (m.group().empty() || m.group_size() <= 0 || m.rank() < 0 || m.rank() >= m.group_size()) {
      return absl::InvalidArgumentError(absl::StrCat("embedded worker: bad membership '", m.group(),
                                                     ":", m.rank(), ":", m.group_size(),
                                                     "' (want group:rank:size, 0 <= rank < size)"));
    }
  }
  if (o.device < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedded worker: device must be a GPU index or -1 (host memory), got ", o.device));
  }
  if (absl::StatusOr<absl::Duration> busy = BusyPollWindow(o.busy_poll_ms, "busy_poll_ms");
      !busy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("embedded worker: ", busy.status().message(),
                                                   " (wsync-worker's --busy_poll_ms)"));
  }
  if (o.staging_limit_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedded worker: staging_limit_bytes must be >= 0, got ", o.staging_limit_bytes));
  }
  if (o.flip_ack_wait <= absl::ZeroDuration() || o.flip_ack_wait == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedded worker: flip_ack_wait must be a positive, finite time, got ",
                     absl::FormatDuration(o.flip_ack_wait)));
  }
  if (o.staging_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedded worker: staging_budget_bytes (wsync-worker's --staging_budget_bytes) must be "
        ">= 0 (0: no limit), got ",
        o.staging_budget_bytes));
  }
  if (o.metrics_port < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedded worker: metrics_port must be -1 (none), 0 (any) or a port, got ",
                     o.metrics_port));
  }
  return absl::OkStatus();
}

std::string DefaultNode() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string RandomInstance() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x-%d-embedded", rd(), rd(), getpid());
}

std::string DeviceName(int device) {
  return device < 0 ? "host memory" : absl::StrCat("cuda:", device);
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedWorker>> EmbeddedWorker::Create(EmbeddedOptions options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (options.node.empty()) options.node = DefaultNode();
  if (options.instance_id.empty()) options.instance_id = RandomInstance();
  absl::StatusOr<agent::ControllerCredentialSet> credentials =
      agent::ControllerCredentials(options.tls);
  if (!credentials.ok()) {
    return absl::Status(credentials.status().code(),
                        absl::StrCat("embedded worker: ", credentials.status().message()));
  }
  plane::BackendConfig config;
  config.device = options.device;
  config.data_address = options.data_address;
  auto backend = node::CreateBackend(node::BackendNameFor(config), config);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("embedded worker: ", backend.status().message()));
  }
  std::unique_ptr<agent::LocalEndpoint> local;
  if (!options.local_socket.empty()) {
    agent::LocalSocketOptions socket;
    socket.path = options.local_socket;
    auto opened = agent::LocalEndpoint::Open(std::move(socket));
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat("embedded worker: ", opened.status().message()));
    }
    local = *std::move(opened);
  }
  std::unique_ptr<EmbeddedWorker> w(new EmbeddedWorker(std::move(options), std::move(*backend),
                                                       *std::move(credentials), std::move(local)));
  if (w->local_ != nullptr) {
    if (absl::Status s = w->local_->Serve(w->agent_.get()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("embedded worker: ", s.message()));
    }
  }
  if (w->options_.metrics_port >= 0) {
    absl::Status s =
        w->metrics_.Serve(absl::StrCat(w->options_.metrics_host, ":", w->options_.metrics_port));
    if (!s.ok()) return s;
  }
  return w;
}

EmbeddedWorker::EmbeddedWorker(EmbeddedOptions options, std::unique_ptr<plane::Backend> backend,
                               agent::ControllerCredentialSet credentials,
                               std::unique_ptr<agent::LocalEndpoint> local)
    : options_(std::move(options)),
      backend_(std::move(backend)),
      arenas_(backend_.get(), options_.flip_ack_wait),
      local_(std::move(local)) {
  agent::AgentOptions a;
  a.controller = options_.controller;
  a.controller_credentials = std::move(credentials.credentials);
  a.controller_tls_files = std::move(credentials.files);
  a.memberships = options_.memberships;
  a.node = options_.node;
  a.device_uuid = backend_->device_uuid();
  a.data_address = options_.data_address;
  a.capabilities = backend_->capabilities();
  a.instance_id = options_.instance_id;
  a.round_timeout = options_.round_timeout;
  a.staging_limit_bytes = options_.staging_limit_bytes;
  a.staging_budget_bytes = options_.staging_budget_bytes;
  a.busy_poll = *BusyPollWindow(options_.busy_poll_ms, "busy_poll_ms");  // checked in Create
  a.controller_lane = options_.controller_lane;
  a.backend = backend_.get();
  a.arenas = &arenas_;
  if (local_ != nullptr) a.fd_inbox = local_->fd_inbox();
  // No direct writes: no other process can map this process's memory.
  agent_ = std::make_unique<agent::WorkerAgent>(std::move(a), &metrics_);
}

EmbeddedWorker::~EmbeddedWorker() { Stop(); }

std::string EmbeddedWorker::Roles() const {
  std::vector<std::string> roles;
  for (const v1::Membership& m : options_.memberships) {
    roles.push_back(absl::StrCat(m.group(), ":", m.rank()));
  }
  return absl::StrJoin(roles, ",");
}

absl::Status EmbeddedWorker::Start() {
  absl::MutexLock lock(&mu_);
  if (stopped_) {
    return absl::FailedPreconditionError(
        absl::StrCat("embedded worker ", Roles(), ": stopped; create a new one"));
  }
  if (started_) {
    return absl::FailedPreconditionError(
        absl::StrCat("embedded worker ", Roles(), ": already started"));
  }
  started_ = true;
  agent_->Start();
  spdlog::info("embedded worker {} started ({}, controller {})", Roles(), backend_->Name(),
               options_.controller);
  return absl::OkStatus();
}

void EmbeddedWorker::Stop() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  stopped_ = true;
  if (local_ != nullptr) local_->StopServing();  // no registration reaches a stopped agent
  arenas_.Close();  // a sync awaiting the owner's AckFlip ends now, not after flip_ack_wait
  agent_->Stop();
  local_.reset();
  spdlog::info("embedded worker {} stopped", Roles());
}

bool EmbeddedWorker::running() const {
  absl::MutexLock lock(&mu_);
  return started_ && !stopped_;
}

bool EmbeddedWorker::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

absl::StatusOr<v1::RegisterTensorsResponse> EmbeddedWorker::Register(
    const std::string& group, std::vector<PointerTensor> tensors, bool replace) {
  absl::MutexLock lock(&mu_);
  if (stopped_) {
    const std::string who =
        tensors.empty() ? ""
                        : absl::StrCat("tensor '", tensors[0].name, "' of group '", group, "': ");
    return absl::FailedPreconditionError(
        absl::StrCat(who, "embedded worker ", Roles(), " is stopped"));
  }
  std::vector<agent::LocalTensor> local;
  for (PointerTensor& t : tensors) {
    if (t.device != options_.device) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", t.name, "' of group '", group, "': its memory is on ",
                       DeviceName(t.device), ", this worker moves ", DeviceName(options_.device)));
    }
    // A tensor in an arena a failed swap left unusable (its range may be
    // unmapped) is never registered: a sync would read or write it.
    if (absl::Status s = arenas_.CheckUsable(
            reinterpret_cast<const void*>(t.data), absl::StrCat("embedded worker ", Roles()),
            absl::StrCat("tensor '", t.name, "' of group '", group, "'"));
        !s.ok()) {
      return s;
    }
    // Nor one in the arena of a flip pair its owner left (commit-flip.md).
    if (absl::Status s = arenas_.CheckNotLeft(
            reinterpret_cast<const void*>(t.data), absl::StrCat("embedded worker ", Roles()),
            absl::StrCat("tensor '", t.name, "' of group '", group, "'"));
        !s.ok()) {
      return s;
    }
    agent::LocalTensor l;
    l.reg.set_name(t.name);
    l.reg.set_dtype(t.dtype);
    for (int64_t d : t.shape) l.reg.add_shape(d);
    l.data = reinterpret_cast<void*>(t.data);
    l.bytes = t.bytes;
    l.space = t.device < 0 ? plane::MemorySpace::kHost : plane::MemorySpace::kCuda;
    l.hold = std::move(t.hold);
    local.push_back(std::move(l));
  }
  return agent_->RegisterLocal(group, std::move(local), replace);
}

v1::LocalStatusResponse EmbeddedWorker::Status() { return agent_->Status(); }

absl::Status EmbeddedWorker::SetServing(const v1::SetServingRequest& req) {
  absl::MutexLock lock(&mu_);
  if (stopped_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SetServing for group '", req.group(), "': embedded worker ", Roles(), " is stopped"));
  }
  return agent_->SetServing(req);
}

absl::StatusOr<std::string> EmbeddedWorker::HoldSyncs(std::string reason) {
  return agent_->HoldSyncs(std::move(reason));
}

std::shared_ptr<agent::EventQueue> EmbeddedWorker::Subscribe(const std::string& who) {
  return agent_->Subscribe(who);
}

void EmbeddedWorker::Unsubscribe(const std::shared_ptr<agent::EventQueue>& q) {
  agent_->Unsubscribe(q);
}

int EmbeddedWorker::metrics_port() const {
  return options_.metrics_port >= 0 ? metrics_.port() : -1;
}

}  // namespace wsync::embedded

namespace wsync::embedded {

namespace {

WeightArena ArenaOf(const agent::WeightArenas::Entry& e) {
  WeightArena out;
  out.handle = e.handle;
  out.base = reinterpret_cast<uintptr_t>(e.arena->base());
  out.bytes = e.arena->bytes();
  out.device = e.arena->device();
  out.hold = e.arena;
  return out;
}

}  // namespace

absl::Status EmbeddedWorker::CheckArenaDevice(int device, const std::string& who) const {
  if (stopped()) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": stopped, no weight arena"));
  }
  if (device != options_.device) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": a weight arena on ", DeviceName(device), " but this worker moves ",
                     DeviceName(options_.device), " (its `device` option)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WeightArena> EmbeddedWorker::CreateWeightArena(int device, int64_t bytes,
                                                              const std::string& name) {
  const std::string who = absl::StrCat("embedded worker ", options_.instance_id);
  RETURN_IF_ERROR(CheckArenaDevice(device, who));
  absl::StatusOr<agent::WeightArenas::Entry> e = arenas_.Create(bytes, name, who);
  if (!e.ok()) return e.status();
  return ArenaOf(*e);
}

absl::StatusOr<std::pair<WeightArena, WeightArena>> EmbeddedWorker::CreateFlipArenas(
    int device, int64_t bytes, const std::string& name) {
  const std::string who = absl::StrCat("embedded worker ", options_.instance_id);
  RETURN_IF_ERROR(CheckArenaDevice(device, who));
  auto pair = arenas_.CreatePair(bytes, name, who);
  if (!pair.ok()) return pair.status();
  return std::make_pair(ArenaOf(pair->first), ArenaOf(pair->second));
}

absl::Status EmbeddedWorker::AckFlip(int64_t handle) {
  absl::Status s = arenas_.Ack(handle);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("embedded worker ", Roles(), ": ", s.message()));
  }
  return s;
}

absl::Status EmbeddedWorker::FreeWeightArena(int64_t handle) {
  absl::Status s = arenas_.Free(handle);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("embedded worker ", options_.instance_id, ": ", s.message()));
  }
  return s;
}

}  // namespace wsync::embedded
