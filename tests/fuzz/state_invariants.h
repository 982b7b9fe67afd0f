// The controller state fuzzer's invariants (controller_state_fuzzer.cc):
// what must hold for every input, checked through what the controller
// reports (GetStatus, WaitSync). A violation prints what broke and aborts,
// which libFuzzer records as a crash.
//  - Restore: a restored controller reports every saved transfer's last
//    delivered version, every saved finished sync's outcome, and every
//    saved decided sync as running with its commit decided.
//  - Monotonic: a transfer's delivered version never goes backwards, and a
//    sync that ended keeps its one outcome (or is forgotten, never changed).
//  - Reload: a controller restored from the state the first one saved
//    reports the same delivered versions, the same served versions for each
//    transfer without a sync in flight, the same outcome of every sync both
//    know, and still awaits every decided sync the first one awaited.
#ifndef WSYNC_TESTS_FUZZ_STATE_INVARIANTS_H_
#define WSYNC_TESTS_FUZZ_STATE_INVARIANTS_H_

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "controller/server/controller.h"

namespace wsync::fuzz {

// Sync ids the invariants follow at most (the fuzzer's speed).
inline constexpr size_t kMaxFollowedSyncs = 64;

[[noreturn]] inline void Violated(const std::string& what) {
  std::fprintf(stderr, "controller_state_fuzzer: invariant violated: %s\n", what.c_str());
  std::abort();
}

// What a controller reports of its transfers and of the followed syncs.
struct Observed {
  std::map<std::string, int64_t> delivered;     // transfer -> last_success_version
  std::map<std::string, bool> in_flight;        // transfer -> a sync in flight
  std::map<std::string, std::string> served;    // transfer -> its replicas, serialized
  std::map<std::string, v1::SyncStatus> syncs;  // followed id -> status (known ones)
};

inline Observed Observe(controller::Controller& c, const std::set<std::string>& ids) {
  Observed o;
  const v1::GetStatusResponse status = c.syncs().GetStatus();
  for (const v1::TransferStatus& t : status.transfers()) {
    o.delivered[t.name()] = t.last_success_version();
    o.in_flight[t.name()] = t.in_flight_version() != 0;
    std::string& served = o.served[t.name()];
    for (const v1::ReplicaVersion& r : t.replicas()) {
      absl::StrAppend(&served, r.replica(), "=", r.version(), "/", r.state(), ";");
    }
  }
  for (const std::string& id : ids) {
    auto s = c.syncs().WaitSync(id, absl::Nanoseconds(1));
    if (s.ok()) o.syncs[id] = *s;
  }
  return o;
}

inline bool Ended(const v1::SyncStatus& s) { return s.phase() != v1::SYNC_RUNNING; }

// The ids of `state`'s syncs (recent, then decided), at most kMaxFollowedSyncs.
inline std::set<std::string> SavedSyncIds(const v1::ControllerState& state) {
  std::set<std::string> ids;
  for (const v1::SyncStatus& s : state.recent_syncs()) {
    if (ids.size() < kMaxFollowedSyncs) ids.insert(s.sync_id());
  }
  for (const v1::DecidedSync& d : state.decided_syncs()) {
    if (ids.size() < kMaxFollowedSyncs) ids.insert(d.status().sync_id());
  }
  return ids;
}

// Restore: `o` observed right after Restore(state).
inline void CheckRestored(const v1::ControllerState& state, const Observed& o) {
  std::map<std::string, int64_t> delivered;  // a repeated name: the last one
  for (const v1::TransferState& t : state.transfers())
    delivered[t.name()] = t.last_success_version();
  for (const auto& [name, version] : delivered) {
    auto it = o.delivered.find(name);
    if (it == o.delivered.end() || it->second != version) {
      Violated(absl::StrCat("restored transfer '", name, "' reports version ",
                            it == o.delivered.end() ? -1 : it->second, ", saved ", version));
    }
  }
  std::map<std::string, v1::SyncPhase> recent;  // a repeated id: the last one
  for (const v1::SyncStatus& s : state.recent_syncs()) recent[s.sync_id()] = s.phase();
  for (const auto& [id, status] : o.syncs) {
    auto r = recent.find(id);
    if (r != recent.end()) {
      if (status.phase() != r->second) {
        Violated(absl::StrCat("restored sync ", id, " reports phase ", status.phase(), ", saved ",
                              r->second));
      }
    } else if (Ended(status) || !status.commit_decided()) {
      Violated(absl::StrCat("restored decided sync ", id, " reports phase ", status.phase(),
                            " commit_decided ", status.commit_decided()));
    }
  }
  const std::set<std::string> followed = SavedSyncIds(state);
  for (const v1::DecidedSync& d : state.decided_syncs()) {
    const std::string& id = d.status().sync_id();
    if (followed.count(id) > 0 && delivered.count(d.status().transfer()) > 0 &&
        recent.count(id) == 0 && o.syncs.count(id) == 0) {
      Violated(absl::StrCat("decided sync ", id, " of transfer '", d.status().transfer(),
                            "' not restored"));
    }
  }
}

// Monotonic: `now` observed after `before`, in one controller's life.
inline void CheckMonotonic(const Observed& before, const Observed& now) {
  for (const auto& [name, version] : before.delivered) {
    auto it = now.delivered.find(name);
    if (it != now.delivered.end() && it->second < version) {
      Violated(absl::StrCat("transfer '", name, "' went back from version ", version, " to ",
                            it->second));
    }
  }
  for (const auto& [id, status] : before.syncs) {
    auto it = now.syncs.find(id);
    if (Ended(status) && it != now.syncs.end() && it->second.phase() != status.phase()) {
      Violated(absl::StrCat("sync ", id, " ended as phase ", status.phase(), ", then reports ",
                            it->second.phase()));
    }
  }
}

// Reload: `again` observed in a controller restored from what the one that
// reported `last` saved last.
inline void CheckReloaded(const Observed& last, const Observed& again) {
  for (const auto& [name, version] : last.delivered) {
    auto it = again.delivered.find(name);
    if (it == again.delivered.end() || it->second != version) {
      Violated(absl::StrCat("reloaded transfer '", name, "' reports version ",
                            it == again.delivered.end() ? -1 : it->second, ", before ", version));
    }
    if (!last.in_flight.at(name) && again.served.at(name) != last.served.at(name)) {
      Violated(absl::StrCat("reloaded transfer '", name, "' serves '", again.served.at(name),
                            "', before '", last.served.at(name), "'"));
    }
  }
  for (const auto& [id, status] : last.syncs) {
    auto it = again.syncs.find(id);
    const bool awaited =
        !Ended(status) && status.commit_decided() && last.delivered.count(status.transfer()) > 0;
    if (it == again.syncs.end()) {
      if (awaited) Violated(absl::StrCat("reload forgot decided sync ", id));
      continue;
    }
    if (Ended(status) && it->second.phase() != status.phase()) {
      Violated(absl::StrCat("reloaded sync ", id, " reports phase ", it->second.phase(),
                            ", before ended as ", status.phase()));
    }
    if (awaited && (Ended(it->second) || !it->second.commit_decided())) {
      Violated(absl::StrCat("reloaded decided sync ", id, " reports phase ", it->second.phase()));
    }
  }
}

}  // namespace wsync::fuzz

#endif  // WSYNC_TESTS_FUZZ_STATE_INVARIANTS_H_
