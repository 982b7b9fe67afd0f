// The controller's settings, shared by its state owners (worker_registry.h,
// sync_coordinator.h).
#ifndef WSYNC_CONTROLLER_SERVER_CONFIG_H_
#define WSYNC_CONTROLLER_SERVER_CONFIG_H_

#include <string>

#include "absl/time/time.h"

namespace wsync::controller {

struct ControllerConfig {
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration sync_deadline = absl::Seconds(120);
  // How long a failure a worker reports about its peers waits for its cause
  // (a peer's loss, the other workers' reports) before it settles; also how
  // long past its deadline a sync waits for the workers' own deadline
  // reports (sync_coordinator.h). --failure_grace.
  absl::Duration failure_grace = absl::Seconds(1);
  std::string instance;  // random per controller start
  // Let worker pairs of one memory domain write destinations directly
  // (buckets routed ROUTE_PEER_WRITE); off: every bucket goes through the
  // transport.
  bool direct_writes = true;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_CONFIG_H_
