// Rolling waves (docs/staging-rollout.md, "Rolling waves"): the pure parts of a
// staged sync's rollout, free of the coordinator's state so that they are
// tested alone. A replica is one model copy: the destination ranks that
// commit together. The coordinator (sync_rollout.cc) groups a decided sync's
// receivers into replicas, starts waves of at most `max_unavailable`
// replicas, the next once every replica of the previous one confirmed or was
// listed uncommitted, and refuses syncs that would leave a replica more than
// `max_staleness` versions behind.
#ifndef WSYNC_CONTROLLER_SERVER_ROLLOUT_H_
#define WSYNC_CONTROLLER_SERVER_ROLLOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::controller {

// The most a policy may ask for (far above any real pool; it bounds labels
// and counts).
inline constexpr int32_t kMaxRolloutValue = 1 << 20;

// OK, or INVALID_ARGUMENT naming transfer `transfer` and the field when
// `policy` is negative or above kMaxRolloutValue, or asks for waves
// (max_unavailable > 0) of an in-place transfer (`mode`): an in-place
// receiver writes its live tensors, unavailable for the whole transfer.
absl::Status CheckRolloutPolicy(const std::string& transfer, const v1::RolloutPolicy& policy,
                                v1::StagingMode mode);

// A receiver of a decided staged sync as the rollout sees it.
struct RolloutMember {
  size_t part = 0;    // its index among the sync's participants
  int32_t rank = -1;  // its destination group rank (-1: none)
  std::string label;  // its owner's replica label ("": none reported)
};

struct RolloutReplica {
  std::string label;
  std::vector<int32_t> ranks;  // ascending
  std::vector<size_t> parts;   // participants, in member order
  int32_t wave = -1;           // -1: its wave has not started
};

// The label of ranks [first, first + n): "ranks-<first>-<last>".
std::string RankBlockLabel(int32_t first, int32_t n);

// `replica_ranks` > 0: consecutive blocks of that many ranks (labels
// RankBlockLabel); else the members' labels, the unlabelled together.
// Ordered by their lowest rank.
std::vector<RolloutReplica> GroupReplicas(const std::vector<RolloutMember>& members,
                                          int32_t replica_ranks);

enum class ReplicaPhase {
  kWaiting,     // its wave has not started, a rank still awaits the commit
  kCommitting,  // CommitSync sent, a rank not confirmed yet
  kHeld,        // no rank committing, one held by its owner (commit_held):
                // it waits for its owner, not for a wave; the next wave starts
  kDone,        // every rank confirmed or was listed uncommitted
};

// The replicas (indices) to start now: none while one is committing; else
// the first `max_unavailable` waiting ones in order (every one when 0).
std::vector<size_t> NextWave(const std::vector<ReplicaPhase>& phases, int32_t max_unavailable);

// How many more waves the replicas in `phases` need (the committing one
// counts as one).
int32_t WavesLeft(const std::vector<ReplicaPhase>& phases, int32_t max_unavailable);

// OK, or FAILED_PRECONDITION naming every replica of `replicas` (the
// controller's view of what each serves) whose version is older than
// `version` - `max_staleness` (0: no bound), the transfer and the way out.
// Replicas whose version is unknown (0) count as not behind.
absl::Status CheckStaleness(const std::string& transfer, int64_t version, int64_t last_delivered,
                            int32_t max_staleness, const std::vector<v1::ReplicaVersion>& replicas);

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_ROLLOUT_H_
