// Tests of the low-latency mode (common/busy_poll.h): whether a process's
// threads spin, read from their scheduler state. A spinning thread stays
// runnable (state R in /proc/<pid>/task/<tid>/stat) even on a loaded machine
// that gives it little CPU (a spinner yields its core); a thread that sleeps
// is runnable only for the moments it works.
#ifndef WSYNC_TESTS_RUNNABLE_THREADS_H_
#define WSYNC_TESTS_RUNNABLE_THREADS_H_

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::testing {

// Threads of `pid` in state R now, the calling thread not counted.
inline int RunnableThreads(pid_t pid) {
  const std::string self = std::to_string(syscall(SYS_gettid));
  int n = 0;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    if (t.path().filename() == self) continue;
    std::ifstream in(t.path() / "stat");
    std::string line;
    std::getline(in, line);
    const size_t paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'R') ++n;
  }
  return n;
}

// The share of `samples` looks, 2 ms apart, that saw at least `threads` of
// `pid`'s threads runnable at once.
inline double ShareRunnable(pid_t pid, int threads, int samples = 150) {
  int hits = 0;
  for (int i = 0; i < samples; ++i) {
    if (RunnableThreads(pid) >= threads) ++hits;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return static_cast<double>(hits) / samples;
}

}  // namespace wsync::testing

#endif  // WSYNC_TESTS_RUNNABLE_THREADS_H_
