// A running controller: gRPC server (worker + trainer services, grpc.health.v1,
// reflection), Prometheus exposer and the housekeeping thread.
#ifndef WSYNC_CONTROLLER_SERVER_SERVER_H_
#define WSYNC_CONTROLLER_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "controller/server/auth.h"
#include "controller/server/controller.h"
#include "controller/server/lane_server.h"
#include "controller/server/metrics.h"
#include "controller/server/plan_source.h"
#include "controller/server/services.h"
#include "controller/server/state_store.h"
#include "grpcpp/grpcpp.h"

namespace wsync::controller {

struct ServerOptions {
  std::string listen_address = "127.0.0.1:50051";  // port 0: pick one
  std::string metrics_address = "127.0.0.1:9464";  // empty: no metrics endpoint
  // Distinct `transfer` label values before the overflow value (metrics.h).
  int metrics_max_transfers = ControllerMetrics::kDefaultMaxTransferLabels;
  int64_t max_message_bytes = 256ll << 20;
  // Where transfers and delivered versions persist (state_store.h); empty:
  // nowhere (a restart forgets them).
  std::string state_file;
  StateFlush state_flush = StateFlush::kBackground;  // --state_fsync
  // A state file that cannot be read is moved aside and the controller
  // starts empty (instead of refusing to start).
  bool state_start_empty = false;
  ControllerConfig config;
  // TLS and callers (auth.h). The default needs cert_file / key_file; a
  // plaintext server (tests, a trusted network) sets auth.insecure.
  AuthOptions auth;
  // A client connection older than this is asked to go (GOAWAY) once: the
  // client's next calls open a new one, with a fresh TLS handshake, so that
  // rotated certificates and the CRL reach long-lived workers. Calls and
  // streams under way finish on the old connection. Zero: never.
  absl::Duration max_connection_age = absl::Minutes(30);
  // The control fast lane's Unix socket (lane_server.h); empty: none.
  std::string lane_socket;
};

class ControllerServer {
 public:
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(ServerOptions options);
  ~ControllerServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }
  // Health NOT_SERVING, streams and waits end, server stops (bounded).
  void Shutdown();

 private:
  ControllerServer() = default;

  std::unique_ptr<ControllerMetrics> metrics_;
  std::unique_ptr<PlanSource> plans_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<TrainerServiceImpl> trainer_service_;
  std::unique_ptr<LaneServer> lane_;  // null without --lane_socket
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread ticker_;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_SERVER_H_
