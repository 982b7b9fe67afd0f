// Sends a running sync's progress to the controller off the sync's thread.
// The executor's progress callback must not wait for a round trip (two
// blocking ReportProgress calls per sync cost ~0.5 ms of a ~4 ms colocated
// sync): Post() keeps only the newest report and returns at once; a thread
// of its own delivers it, best effort. Reports of a sync the controller has
// already finished are ignored there.
#ifndef WSYNC_WORKER_AGENT_PROGRESS_REPORTER_H_
#define WSYNC_WORKER_AGENT_PROGRESS_REPORTER_H_

#include <functional>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::agent {

class ProgressReporter {
 public:
  // `send` delivers one report (blocking; called on the reporter's thread).
  explicit ProgressReporter(std::function<void(const v1::ReportProgressRequest&)> send);
  ~ProgressReporter();  // delivers nothing more; joins the thread
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Replaces any report not yet sent.
  void Post(v1::ReportProgressRequest report);
  // Reports posted and not yet sent (0 or 1), for tests.
  int pending() const;

 private:
  void Loop();

  const std::function<void(const v1::ReportProgressRequest&)> send_;
  mutable absl::Mutex mu_;
  std::optional<v1::ReportProgressRequest> next_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_PROGRESS_REPORTER_H_
