// Rendezvous: the key-value store the workers' transports meet through. Keys
// live in scopes, one per transfer generation ("<transfer>/<generation>/");
// opening a transfer's next scope ends its previous one, and Gets waiting in
// an ended scope fail. A scope belongs to the leases of its generation's
// workers: only they may set or get its keys.
//
// Locking: one mutex, held only inside a call; the lease check (`alive`) runs
// without it, so the store never holds two owners' locks.
#ifndef WSYNC_CONTROLLER_SERVER_RENDEZVOUS_H_
#define WSYNC_CONTROLLER_SERVER_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "controller/server/wait_hub.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

// What one scope may hold: keys plus values, in bytes, and keys; 0: no limit.
struct RendezvousQuota {
  int64_t bytes = 0;  // --kv_scope_bytes
  int64_t keys = 0;   // --kv_scope_keys
};

class Rendezvous {
 public:
  using Quota = RendezvousQuota;
  // `alive(lease)`: whether the lease may use the store.
  explicit Rendezvous(std::function<bool(const std::string&)> alive, Quota quota = Quota());
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  static std::string ScopePrefix(const std::string& transfer, int64_t generation);

  // NOT_FOUND for a dead lease, FAILED_PRECONDITION outside every live scope,
  // PERMISSION_DENIED when the lease is not one of the scope's workers,
  // RESOURCE_EXHAUSTED when the scope would exceed its quota (naming the flag).
  absl::Status Set(const v1::KvSetRequest& req);
  // Waits up to req.timeout_ms for every key: DEADLINE_EXCEEDED naming the
  // missing ones, ABORTED once a key's scope ended, NOT_FOUND once the lease
  // died, PERMISSION_DENIED for a scope not of this lease, UNAVAILABLE at
  // shutdown.
  absl::StatusOr<v1::KvGetResponse> Get(const v1::KvGetRequest& req);
  // Ends `transfer`'s scope of `old_generation` (if open) and opens the one
  // of `new_generation`, owned by `leases` (the generation's workers).
  void OpenScope(const std::string& transfer, int64_t old_generation, int64_t new_generation,
                 const std::vector<std::string>& leases);
  // A lease ended: waiting Gets look at their lease again.
  void WakeAll();
  void Shutdown();
  // Runs `listener` (under the store's lock; it must not call back) on every
  // change a Get may be waiting for. Set before the store is shared.
  void SetChangeListener(std::function<void()> listener) { cv_.SetListener(std::move(listener)); }

 private:
  struct Scope {
    std::string prefix;
    absl::flat_hash_set<std::string> leases;  // its workers
    absl::flat_hash_map<std::string, std::string> keys;
    int64_t bytes = 0;  // of its keys and values
  };
  // The scope holding `key`; null when none does.
  Scope* ScopeOfLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when `lease` is one of `scope`'s workers; PERMISSION_DENIED otherwise.
  static absl::Status CheckMember(const Scope& scope, const std::string& lease,
                                  const std::string& key, absl::string_view method);

  const std::function<bool(const std::string&)> alive_;
  const Quota quota_;
  absl::Mutex mu_;
  ChangeSignal cv_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // By prefix.
  absl::flat_hash_map<std::string, Scope> scopes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_RENDEZVOUS_H_
