// Child processes of the demo and the integration tests: each in its own
// process group; stopped with SIGTERM, then SIGKILL after a grace period.
#ifndef WSYNC_TOOLS_DEMO_PROCESS_H_
#define WSYNC_TOOLS_DEMO_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace wsync::demo {

class Child {
 public:
  // Starts argv[0] with `argv`; stdout/stderr go to `log_path` (appended) if
  // non-empty, else are inherited.
  static absl::StatusOr<Child> Spawn(const std::vector<std::string>& argv,
                                     const std::string& log_path);
  Child() = default;
  Child(Child&& o) noexcept { *this = std::move(o); }
  Child& operator=(Child&& o) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { Stop(absl::Seconds(3)); }

  pid_t pid() const { return pid_; }
  bool running();  // reaps it if it exited
  int exit_status() const { return status_; }
  // SIGKILL now (the test's crash), reaped.
  void Kill();
  // SIGTERM to its group, without waiting (stop many in parallel, then Stop).
  void Terminate();
  // SIGTERM to the group, SIGKILL after `grace`; reaped. Returns the wait status.
  int Stop(absl::Duration grace);

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

// CPU seconds (user + system) process `pid` used so far, read from
// /proc/<pid>/stat; -1 if unreadable.
double CpuSecondsOf(pid_t pid);

}  // namespace wsync::demo

#endif  // WSYNC_TOOLS_DEMO_PROCESS_H_
