// Tests of the low-latency mode (common/busy_poll.h): whether a process's
// threads spin, read from the scheduler's accounting. A spinning thread is
// runnable all along (running, or waiting for a CPU on a loaded machine that
// gives it little: a spinner yields its core); a thread that sleeps is
// runnable only for the moments it works.
#ifndef WSYNC_TESTS_RUNNABLE_THREADS_H_
#define WSYNC_TESTS_RUNNABLE_THREADS_H_

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::testing {

// Per thread of `pid` (the calling thread not counted), nanoseconds spent
// runnable so far: running plus waiting for a CPU (schedstat).
inline std::map<std::string, int64_t> RunnableNanos(pid_t pid) {
  const std::string self = std::to_string(syscall(SYS_gettid));
  std::map<std::string, int64_t> out;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    const std::string tid = t.path().filename();
    if (tid == self) continue;
    std::ifstream in(t.path() / "schedstat");
    int64_t run = 0, wait = 0;
    if (in >> run >> wait) out[tid] = run + wait;
  }
  return out;
}

// The share of the next `window` each thread of `pid` spent runnable,
// largest first: near 1 for a spinner, loaded machine or not; small for a
// thread that sleeps between short bursts of work.
inline std::vector<double> RunnableShares(pid_t pid, absl::Duration window = absl::Seconds(1)) {
  const std::map<std::string, int64_t> before = RunnableNanos(pid);
  const absl::Time t0 = absl::Now();
  absl::SleepFor(window);
  const std::map<std::string, int64_t> after = RunnableNanos(pid);
  const double wall_ns = absl::ToDoubleNanoseconds(absl::Now() - t0);
  std::vector<double> shares;
  for (const auto& [tid, ns] : after) {
    auto it = before.find(tid);
    shares.push_back((ns - (it == before.end() ? 0 : it->second)) / wall_ns);
  }
  std::sort(shares.rbegin(), shares.rend());
  shares.resize(std::max<size_t>(shares.size(), 2), 0.0);
  return shares;
}

}  // namespace wsync::testing

#endif  // WSYNC_TESTS_RUNNABLE_THREADS_H_
