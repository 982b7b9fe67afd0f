// Helpers shared by the executor's source files (executor.cc,
// executor_round.cc, executor_tokens.cc); not part of its interface.
#ifndef WSYNC_WORKER_EXEC_EXECUTOR_INTERNAL_H_
#define WSYNC_WORKER_EXEC_EXECUTOR_INTERNAL_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/exec/bound_plan.h"

namespace wsync::exec::internal {

// Mailbox slots (executor.h): peer worker w owns slots kSlotsPerPeer * w +
// these offsets of every mailbox it posts into.
inline constexpr int64_t kReadySeq = 0;
inline constexpr int64_t kReadyFingerprint = 1;
inline constexpr int64_t kDone = 2;
inline constexpr int64_t kParts = 3;  // parts of its puts landed (checksums)
inline constexpr int64_t kPhase = 4;  // the first put phase it has not finished (phase_gates.h)
inline constexpr int64_t kSlotsPerPeer = 5;

// `s` with `where` in front of its message (OK stays OK).
inline absl::Status Wrap(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

// "worker W round R".
inline std::string RoundWhere(const BoundPlan& plan, const BoundRound& round) {
  return absl::StrCat("worker ", plan.worker, " round ", round.index);
}

inline double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// The direct-write peers of `plan`'s worker (whom it writes or who write
// it), ascending.
inline std::vector<int32_t> DirectPeers(const BoundPlan& plan) {
  std::set<int32_t> peers(plan.direct_write_to.begin(), plan.direct_write_to.end());
  peers.insert(plan.direct_written_by.begin(), plan.direct_written_by.end());
  return {peers.begin(), peers.end()};
}

// A round that neither stages nor transfers: it waits for no peer.
inline bool LocalOnly(const BoundRound& r) {
  return r.sends.empty() && r.recvs.empty() && r.pack.empty() && r.unpack.empty();
}

}  // namespace wsync::exec::internal

#endif  // WSYNC_WORKER_EXEC_EXECUTOR_INTERNAL_H_
