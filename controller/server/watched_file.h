// WatchedFile: a configuration file the controller re-reads when it changes
// (--tokens_file, --tls_crl_file): whether it changed (size or mtime) since
// the last look, looked at (stat) at most once per interval.
//
// Thread-safe.
#ifndef WSYNC_CONTROLLER_SERVER_WATCHED_FILE_H_
#define WSYNC_CONTROLLER_SERVER_WATCHED_FILE_H_

#include <sys/stat.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wsync::controller {

// The whole file; NOT_FOUND naming `what` (e.g. the flag) and the path.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what);

class WatchedFile {
 public:
  // `flag` names the file in errors ("--tokens_file").
  WatchedFile(std::string path, std::string flag, absl::Duration interval)
      : path_(std::move(path)), flag_(std::move(flag)), interval_(interval) {}

  // True on the first call and when the file's size or mtime changed since
  // the last call that looked (none within `interval` of it looks: false);
  // NOT_FOUND naming the flag when it cannot be stat'ed.
  absl::StatusOr<bool> Changed() ABSL_LOCKS_EXCLUDED(mu_);
  // The next look reports a change whatever the file's state (after a load
  // of it failed: it is retried, not taken as seen).
  void Forget() ABSL_LOCKS_EXCLUDED(mu_);
  // ReadWholeFile of it.
  absl::StatusOr<std::string> Read() const { return ReadWholeFile(path_, flag_); }

  const std::string& path() const { return path_; }
  const std::string& flag() const { return flag_; }

 private:
  const std::string path_;
  const std::string flag_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  struct timespec mtime_ ABSL_GUARDED_BY(mu_) = {};
  off_t size_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_WATCHED_FILE_H_
