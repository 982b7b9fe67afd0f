// SyncCoordinator's records of a transfer and of what a sync of it decides
// before its lock (sync_coordinator.h keeps the syncs' own records), and who
// calls the trainer API. Plain data: the coordinator's mutex guards them.
#ifndef WSYNC_CONTROLLER_SERVER_SYNC_RECORDS_H_
#define WSYNC_CONTROLLER_SERVER_SYNC_RECORDS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/plan/routes.h"
#include "controller/server/warm_up.h"
#include "controller/server/worker_checks.h"
#include "controller/server/worker_registry.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// Who calls the trainer API, for the ownership checks (docs/security.md,
// "Transfer owners"): a transfer belongs to the identity that defined it;
// only that identity, or an admin, may redefine it, sync it or cancel its
// syncs. The default (anonymous admin) is what a plaintext controller without
// --tokens_file grants every caller.
struct TrainerCaller {
  std::string identity;  // "" when anonymous
  bool admin = true;     // role admin: acts on every transfer
};

namespace sync_records {

struct Transfer {
  std::string name;
  std::string source_group;
  std::string destination_group;
  v1::TransferSpec spec;    // as defined by the trainer
  uint64_t definition = 0;  // bumped by each DefineTransfer
  // A TransferState holding only `spec`, encoded once per definition: a
  // state save re-encodes only the fields that change (PersistLocked).
  std::shared_ptr<const std::string> spec_encoded;
  uint64_t spec_encoded_definition = 0;
  int64_t last_success_version = 0;
  int64_t generation = 0;
  std::vector<std::string> generation_leases;  // worker id -> lease
  bool generation_broken = false;
  std::string in_flight;  // sync id
  std::string last_sync;
  std::string plan_key;
  std::string owner;             // identity that defined it; "" unowned (see DefineTransfer)
  bool warm_up_enabled = false;  // --warm_up_on_define, less DefineTransfer's no_warm_up
  WarmUpRecord warm;
  // Destination rank -> the version it confirmed last (sync_rollout.cc).
  struct ServedRank {
    int64_t version = 0;
    std::string instance;  // the worker that confirmed it
    std::string replica;
    bool uncommitted = false;  // a later decided version it did not confirm
  };
  std::map<int32_t, ServedRank> served;
};
// The transfer bound to the workers registered now.
struct Resolved {
  v1::TransferSpec spec;                           // ranks, buffer names and staging cap filled in
  std::vector<WorkerSnapshot> workers;             // worker id -> worker
  std::vector<std::vector<v1::Membership>> roles;  // worker id -> roles
  StagingLimit staging;                            // the workers' tightest limit
  int32_t steps_cleared_by = -1;  // a worker without steps, had the spec a step latency
  std::string destination_group;
};
struct PlanForSync {
  std::shared_ptr<const v1::Plan> plan;
  bool cache_hit = false;
  double seconds = 0;
  // Worker id -> its part of the plan (unrouted).
  std::vector<std::shared_ptr<const v1::Plan>> parts;
  // Staged syncs: the receivers' shadow memory (CheckShadowBudgets).
  std::vector<v1::WorkerShadow> shadow;
};
// How a sync's buckets travel, decided before its lock is taken.
struct Dispatch {
  // Unset (UNSPECIFIED) when the plan moves nothing over the network; an
  // error when the workers share no transport (reported after the buffer
  // checks).
  absl::StatusOr<v1::TransportKind> transport = v1::TRANSPORT_KIND_UNSPECIFIED;
  std::vector<plan::WorkerPair> peer_writes;  // sorted
};
// One worker's part as routed for a sync.
struct RoutedPartRef {
  plan::WorkerRoutes routes;
  std::string key;  // SyncAssignment.part_key
  std::shared_ptr<const v1::Plan> part;
};

// Everything a sync of one transfer decides before its lock: the bound
// spec, the plan and its parts, the routes. Reused by the next sync while
// neither the definition nor the registry (WorkerRegistry::epoch) changed.
struct Prepared {
  uint64_t definition = 0;
  uint64_t registry_epoch = 0;
  Resolved resolved;
  PlanForSync plan;
  Dispatch dispatch;
  std::vector<RoutedPartRef> parts;
};

}  // namespace sync_records
}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_SYNC_RECORDS_H_
