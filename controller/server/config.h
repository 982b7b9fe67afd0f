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
  std::string instance;  // random per controller start
  // Let worker pairs of one memory domain write destinations directly
  // (buckets routed ROUTE_PEER_WRITE); off: every bucket goes through the
  // transport.
  bool direct_writes = true;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_CONFIG_H_
