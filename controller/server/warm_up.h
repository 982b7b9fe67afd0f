// A transfer's warm-up as the sync coordinator tracks it (docs/warm-up.md):
// plain data, guarded by the coordinator's lock.
#ifndef WSYNC_CONTROLLER_SERVER_WARM_UP_H_
#define WSYNC_CONTROLLER_SERVER_WARM_UP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

struct WarmUpRecord {
  v1::WarmUpState state = v1::WARM_UP_OFF;
  std::string id;      // "<transfer>@warm#N", the assignments' sync_id
  std::string reason;  // PENDING / FAILED: why
  // What the last evaluation looked at: the transfer's definition and the
  // registry epoch. A warm-up is due again once either changed.
  uint64_t definition = 0;
  uint64_t epoch = 0;
  uint64_t launched_for = 0;  // the transfer definition `id` was launched for
  int64_t generation = 0;     // the transport generation it prepared
  // Identifies what it prepared: the generation and, per worker, its lease,
  // buffer registration and routed part. A WARM record with the signature
  // the transfer would get now needs no new warm-up.
  std::string signature;
  struct Worker {
    std::string lease_id;
    bool done = false;
  };
  std::vector<Worker> workers;  // by worker id
  absl::Time started;
  absl::Time deadline;
  absl::Time finished;  // InfinitePast while running
  bool running() const { return state == v1::WARM_UP_RUNNING; }
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_WARM_UP_H_
