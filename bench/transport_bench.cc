// Host transport throughput on loopback: rank 0 sends `--bytes` to rank 1 in
// `--bucket`-sized buckets, all posted in one round (as the executor does),
// next to a plain memcpy of the same bytes in the same chunks. Ranks are
// threads of this process by default, or two processes (--fork) that meet
// through a FileKvStore.
//
//   transport_bench [--bytes=1073741824] [--bucket=67108864] [--iters=5] [--fork]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "worker/backends/host/gloo_transport.h"
#include "worker/plane/kv_store.h"

namespace {

using wsync::transport::GlooTransport;
using wsync::transport::GlooTransportOptions;
using wsync::transport::KvStore;
using wsync::transport::RecvRequest;
using wsync::transport::SendRequest;

struct Args {
  int64_t bytes = int64_t{1} << 30;
  int64_t bucket = int64_t{64} << 20;
  int iters = 5;
  bool fork = false;
};

bool ParseInt(const char* arg, const char* name, int64_t* out) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *out = std::strtoll(arg + n + 1, nullptr, 10);
  return true;
}

// Runs one rank: `iters` rounds of the whole payload; returns per-iteration
// seconds (measured between the rank's own barrier-free round start/end).
absl::StatusOr<std::vector<double>> RunRank(int rank, KvStore* store, const std::string& prefix,
                                            const Args& a) {
  GlooTransportOptions o;
  o.rank = rank;
  o.size = 2;
  o.store = store;
  o.prefix = prefix;
  auto t = GlooTransport::Create(o);
  if (!t.ok()) return t.status();
  std::vector<uint8_t> buf(static_cast<size_t>(a.bytes));
  for (size_t i = 0; i < buf.size(); i += 4096) buf[i] = static_cast<uint8_t>(i / 4096 + rank);
  std::vector<double> seconds;
  // Iteration 0 warms up (page faults, TCP windows) and is not reported.
  for (int it = 0; it <= a.iters; ++it) {
    std::vector<SendRequest> sends;
    std::vector<RecvRequest> recvs;
    for (int64_t off = 0, tag = 0; off < a.bytes; off += a.bucket, ++tag) {
      const size_t n = static_cast<size_t>(std::min(a.bucket, a.bytes - off));
      if (rank == 0) sends.push_back({1, tag, buf.data() + off, n});
      if (rank == 1) recvs.push_back({0, tag, buf.data() + off, n});
    }
    const absl::Time start = absl::Now();
    absl::Status s = (*t)->RunRound(sends, recvs, absl::Now() + absl::Seconds(300));
    if (!s.ok()) return s;
    const double took = absl::ToDoubleSeconds(absl::Now() - start);
    if (it > 0) seconds.push_back(took);
    if (it == 0 && rank == 1) spdlog::info("warm-up round: {:.3f} s", took);
  }
  if (rank == 1) {
    for (size_t i = 0; i < buf.size(); i += 4096) {
      if (buf[i] != static_cast<uint8_t>(i / 4096)) {
        return absl::DataLossError(absl::StrCat("byte ", i, " wrong after transfer"));
      }
    }
  }
  return seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Flags into *a; false (after logging why) on an unknown or bad one.
bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    int64_t iters = 0;
    if (ParseInt(argv[i], "--bytes", &a->bytes) || ParseInt(argv[i], "--bucket", &a->bucket))
      continue;
    if (ParseInt(argv[i], "--iters", &iters)) {
      a->iters = static_cast<int>(iters);
      continue;
    }
    if (std::strcmp(argv[i], "--fork") == 0) {
      a->fork = true;
      continue;
    }
    spdlog::error("unknown argument {}", argv[i]);
    return false;
  }
  if (a->bytes <= 0 || a->bucket <= 0 || a->iters < 1) {
    spdlog::error("--bytes, --bucket and --iters must be positive");
    return false;
  }
  return true;
}

// memcpy baseline: same bytes, same chunking, fresh destination pages
// touched once beforehand; per-iteration seconds after a warm-up.
std::vector<double> TimeMemcpy(const Args& a) {
  std::vector<double> seconds;
  std::vector<uint8_t> src(static_cast<size_t>(a.bytes), 1), dst(static_cast<size_t>(a.bytes), 0);
  for (int it = 0; it <= a.iters; ++it) {
    const absl::Time start = absl::Now();
    for (int64_t off = 0; off < a.bytes; off += a.bucket) {
      std::memcpy(dst.data() + off, src.data() + off,
                  static_cast<size_t>(std::min(a.bucket, a.bytes - off)));
    }
    if (it > 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return seconds;
}

// Both ranks as threads of this process (an in-memory store); rank 1's times.
absl::StatusOr<std::vector<double>> RunThreads(const std::string& prefix, const Args& a) {
  wsync::transport::InMemoryKvStore store;
  absl::StatusOr<std::vector<double>> r0 = absl::UnknownError(""), r1 = absl::UnknownError("");
  std::thread t0([&] { r0 = RunRank(0, &store, prefix, a); });
  r1 = RunRank(1, &store, prefix, a);
  t0.join();
  if (!r0.ok() || !r1.ok()) {
    return absl::InternalError(
        absl::StrCat("transfer failed: ", r0.status().ToString(), " / ", r1.status().ToString()));
  }
  return r1;
}

// Rank 0 in a forked child (a file store); rank 1's times.
absl::StatusOr<std::vector<double>> RunProcesses(const std::string& prefix, const Args& a) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("wsync_bench_", getpid())).string();
  std::filesystem::create_directories(dir);
  const pid_t child = ::fork();
  if (child == 0) {
    wsync::transport::FileKvStore store(dir);
    _exit(RunRank(0, &store, prefix, a).ok() ? 0 : 1);
  }
  wsync::transport::FileKvStore store(dir);
  auto r1 = RunRank(1, &store, prefix, a);
  int status = 0;
  waitpid(child, &status, 0);
  std::filesystem::remove_all(dir);
  if (!r1.ok() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("transfer failed: ", r1.status().ToString()));
  }
  return r1;
}

}  // namespace

int main(int argc, char** argv) {
  wsync::InitLogging("transport_bench");
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 2;
  const std::vector<double> memcpy_s = TimeMemcpy(a);
  const std::string prefix = absl::StrCat("bench/", getpid());
  auto recv_s = a.fork ? RunProcesses(prefix, a) : RunThreads(prefix, a);
  if (!recv_s.ok()) {
    spdlog::error("{}", std::string(recv_s.status().message()));
    return 1;
  }
  const double gb = static_cast<double>(a.bytes) / 1e9;
  const double t_gloo = Median(*recv_s), t_copy = Median(memcpy_s);
  std::printf("payload %.3f GB in %lld-byte buckets, %d iterations (median), ranks as %s\n", gb,
              static_cast<long long>(a.bucket), a.iters, a.fork ? "processes" : "threads");
  std::printf("gloo-tcp loopback : %8.3f s  %7.2f GB/s\n", t_gloo, gb / t_gloo);
  std::printf("memcpy            : %8.3f s  %7.2f GB/s\n", t_copy, gb / t_copy);
  std::printf("ratio gloo/memcpy : %8.3f\n", t_copy / t_gloo);
  return 0;
}
