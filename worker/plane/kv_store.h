// The key-value store a transport rendezvous runs on. The controller serves
// one over gRPC in production; InMemoryKvStore (threads of one process) and
// FileKvStore (processes sharing a directory) serve tests and benches.
// Keys are write-once per rendezvous: callers namespace them with a prefix
// unique to each transport generation.
#ifndef WSYNC_WORKER_PLANE_KV_STORE_H_
#define WSYNC_WORKER_PLANE_KV_STORE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wsync::transport {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Sets (or overwrites) key.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until key is set, up to `deadline`: DEADLINE_EXCEEDED naming the
  // key when it is not set by then. Must be safe to call from many threads.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) = 0;
};

class InMemoryKvStore : public KvStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// One file per key in `dir` (which must exist), written to a temporary name
// and renamed so that readers never see a partial value; Get polls.
class FileKvStore : public KvStore {
 public:
  explicit FileKvStore(std::string dir, absl::Duration poll_interval = absl::Milliseconds(5))
      : dir_(std::move(dir)), poll_interval_(poll_interval) {}
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) override;

 private:
  std::string PathFor(const std::string& key) const;
  const std::string dir_;
  const absl::Duration poll_interval_;
};

}  // namespace wsync::transport

#endif  // WSYNC_WORKER_PLANE_KV_STORE_H_
