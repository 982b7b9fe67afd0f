#include "controller/server/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace wsync::controller {

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(ServerOptions options) {
  std::unique_ptr<ControllerServer> s(new ControllerServer());
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options.auth);
  if (!auth.ok()) return auth.status();
  s->auth_ = *std::move(auth);
  s->metrics_ = std::make_unique<ControllerMetrics>(options.metrics_max_transfers);
  if (!options.metrics_address.empty()) {
    absl::Status st = s->metrics_->Serve(options.metrics_address);
    if (!st.ok()) return st;
  }
  const ControllerLimits& limits = options.config.limits;
  plan::BuildOptions build;
  build.max_buckets = limits.max_plan_buckets;
  build.max_pieces = limits.max_plan_pieces;
  build.stacking = limits.plan_stacking;
  s->plans_ = std::make_unique<PlanSource>(64, limits.plan_cache_bytes, build);
  v1::ControllerState saved;
  if (!options.state_file.empty()) {
    s->store_ = std::make_unique<StateStore>(options.state_file, options.state_flush);
    s->metrics_->CountFlushFailuresOf(s->store_.get());
    absl::StatusOr<v1::ControllerState> loaded = s->store_->Load();
    if (!loaded.ok() && !options.state_start_empty) return loaded.status();
    if (!loaded.ok()) {
      absl::StatusOr<std::string> aside = s->store_->MoveAside();
      spdlog::warn("[controller] {}; starting empty (--state_start_empty){}",
                   loaded.status().ToString(),
                   aside.ok() ? absl::StrCat(", the file moved to ", *aside)
                              : absl::StrCat(": ", aside.status().ToString()));
    } else {
      saved = *std::move(loaded);
      spdlog::info("[controller] state from {}: {} transfers, {} sync outcomes", options.state_file,
                   saved.transfers_size(), saved.recent_syncs_size());
    }
  }
  s->controller_ = std::make_unique<Controller>(options.config, s->metrics_.get(), s->plans_.get(),
                                                s->store_.get());
  s->controller_->syncs().Restore(saved);
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(s->controller_.get(), s->auth_.get());
  s->trainer_service_ = std::make_unique<TrainerServiceImpl>(s->controller_.get(), s->auth_.get());

  if (!options.lane_socket.empty()) {
    LaneOptions lane;
    lane.socket_path = options.lane_socket;
    lane.busy_poll = options.config.limits.busy_poll;
    if (options.config.limits.max_waiters > 0) lane.max_waits = options.config.limits.max_waiters;
    absl::StatusOr<std::unique_ptr<LaneServer>> started =
        LaneServer::Start(std::move(lane), s->controller_.get(), s->auth_.get());
    if (!started.ok()) return started.status();
    s->lane_ = *std::move(started);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, s->auth_->ServerCredentials(), &s->port_);
  builder.RegisterService(s->worker_service_.get());
  builder.RegisterService(s->trainer_service_.get());
  const int max = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max);
  builder.SetMaxSendMessageSize(max);
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_AGE_MS,
        static_cast<int>(
            std::min<int64_t>(absl::ToInt64Milliseconds(options.max_connection_age), INT32_MAX)));
  }
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("controller: cannot listen on ", options.listen_address));
  }
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus(false);

  ControllerServer* self = s.get();
  s->ticker_ = std::thread([self] {
    while (!self->stop_.load()) {
      self->controller_->Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  });
  self->controller_->Tick();
  health->SetServingStatus(true);
  return s;
}

void ControllerServer::Shutdown() {
  if (stop_.exchange(true)) return;
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(false);
  if (controller_ != nullptr) controller_->Shutdown();  // null when Start failed early
  if (lane_ != nullptr) lane_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (ticker_.joinable()) ticker_.join();
}

ControllerServer::~ControllerServer() { Shutdown(); }

}  // namespace wsync::controller
