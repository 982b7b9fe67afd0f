// Shared pieces of the GPU benchmarks: one process per GPU (forked before
// anything touches CUDA, as in production where each worker is a process),
// rendezvous through a FileKvStore in a fresh directory, medians, and result
// lines ("RESULT {json}") that scripts/gpu_run.sh collects.
#ifndef WSYNC_BENCH_GPU_BENCH_UTIL_H_
#define WSYNC_BENCH_GPU_BENCH_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/logging.h"

// A CUDA or NCCL call in a benchmark's int-returning function: on failure,
// print the call and its error code, and return 3.
#define CK(x)                                                                \
  do {                                                                       \
    auto e_ = (x);                                                           \
    if (e_ != 0) {                                                           \
      spdlog::error("{}:{} {} failed: {}", __FILE__, __LINE__, #x, (int)e_); \
      return 3;                                                              \
    }                                                                        \
  } while (0)

namespace wsync::bench {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A fresh rendezvous directory under $TMPDIR (or /tmp).
inline std::string MakeStoreDir(const char* tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp ? tmp : "/tmp") + "/wsync-" + tag + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    std::perror("mkdtemp");
    std::exit(2);
  }
  return buf.data();
}

// Runs fn(rank) in `n` child processes; returns 0 when all exit 0.
inline int ForkRanks(int n, const std::function<int(int)>& fn) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      std::fflush(stdout);
      _exit(fn(r));
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

inline void Result(const std::string& json) {
  std::printf("RESULT %s\n", json.c_str());
  std::fflush(stdout);
}

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_BENCH_UTIL_H_
