// part_expand_bench: what binding a worker's part of a stacked (or any) plan
// costs. Plans one catalog case (wsyncctl plan's case flags), extracts the
// part of --worker (default: the first destination worker) and prints its
// records, the pieces they stand for, and:
//  * written out: the time and heap of its piece runs written out as
//    v1::Piece messages (ExpandRuns; what binders did before session 26);
//  * bound: BindPlan's time, the heap its BoundPlan holds and the resident
//    memory it adds (VmRSS, VmHWM), against the worker's destination
//    buffers registered at addresses that are reserved, never touched.
//    PART_BENCH_BIND_ONLY=1 binds without writing the runs out first (so
//    that no freed memory of that step is reused by the bind).
//
//   part_expand_bench --model M --source S --destination D [case flags] [--worker W]
#include <malloc.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/plan_pieces.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/plan_arena.h"
#include "controller/plan/planner.h"
#include "google/protobuf/arena.h"
#include "tools/args.h"
#include "tools/case_flags.h"
#include "tools/demo/layout_data.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/buffer_registry.h"

namespace wsync::bench {
namespace {

size_t HeapInUse() { return mallinfo2().uordblks + mallinfo2().hblkhd; }

// The process's resident and peak resident memory (VmRSS, VmHWM), bytes.
std::pair<int64_t, int64_t> Resident() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  int64_t rss = 0, hwm = 0;
  char line[256];
  while (f != nullptr && std::fgets(line, sizeof line, f) != nullptr) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) rss = kb << 10;
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) hwm = kb << 10;
  }
  if (f != nullptr) std::fclose(f);
  return {rss, hwm};
}

// Binds `part` for `worker` (a destination worker) against its destination
// buffers, reserved address space only (bind reads no tensor memory).
int BindInPlace(const v1::TransferSpec& spec, const v1::Plan& part, int32_t worker) {
  absl::StatusOr<plan::CompiledSide> dst =
      plan::CompileSide(spec.destination(), plan::SideRole::kDestination);
  if (!dst.ok()) {
    std::fprintf(stderr, "compile: %s\n", std::string(dst.status().message()).c_str());
    return 1;
  }
  int rank = -1;
  for (int r = 0; r < spec.destination().ranks_size(); ++r) {
    if (spec.destination().ranks(r).worker() == worker) rank = r;
  }
  if (rank < 0) {
    std::fprintf(stderr, "worker %d is no destination rank\n", worker);
    return 1;
  }
  exec::BufferRegistry registry;
  const std::vector<std::vector<demo::BufferSpec>> buffers = demo::BuffersPerRank(*dst);
  for (const demo::BufferSpec& b : buffers[rank]) {
    static char empty;
    void* at = b.bytes == 0 ? &empty
                            : mmap(nullptr, static_cast<size_t>(b.bytes), PROT_NONE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) {
      std::fprintf(stderr, "reserving %lld bytes failed\n", static_cast<long long>(b.bytes));
      return 1;
    }
    absl::Status s = registry.Register(exec::BufferSide::kDestination, b.name,
                                       exec::RegisteredBuffer{at, b.bytes, b.dtype});
    if (!s.ok()) {
      std::fprintf(stderr, "register: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  const size_t before = HeapInUse();
  const auto [rss_before, hwm_before] = Resident();
  const auto start = std::chrono::steady_clock::now();
  auto bound = exec::BindPlan(part, worker, registry, transport::MemorySpace::kHost);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!bound.ok()) {
    std::fprintf(stderr, "bind: %s\n", std::string(bound.status().message()).c_str());
    return 1;
  }
  const auto [rss_after, hwm_after] = Resident();
  std::printf(
      "bound: %.3f s, the BoundPlan holds %.1f MB of heap; resident %+.1f MB, peak resident "
      "%.1f -> %.1f MB\n",
      seconds, (HeapInUse() - before) / 1e6, (rss_after - rss_before) / 1e6, hwm_before / 1e6,
      hwm_after / 1e6);
  return 0;
}

int Main(int argc, char** argv) {
  tools::FlagSpec flags;
  tools::AddCaseFlags(&flags);
  flags.value_flags.push_back("worker");
  auto args = tools::ParseArgs(std::vector<std::string>(argv + 1, argv + argc), flags);
  if (!args.ok() || !tools::HasCaseFlags(*args)) {
    std::fprintf(stderr,
                 "usage: part_expand_bench --model M --source S --destination D [...]: %s\n",
                 args.ok() ? "no case" : std::string(args.status().message()).c_str());
    return 2;
  }
  auto spec = tools::SpecFromCaseFlags(*args);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  std::shared_ptr<google::protobuf::Arena> arena = plan::NewPlanArena();
  auto* full = google::protobuf::Arena::CreateMessage<v1::Plan>(arena.get());
  plan::BuildOptions build;
  build.max_pieces = 4'000'000;  // wsync-controller's --max_plan_pieces: stacked where over
  if (absl::Status s = plan::BuildPlanInto(*spec, full, build); !s.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::StatusOr<int64_t> worker_flag =
      args->IntValue("worker", spec->destination().ranks(0).worker());
  if (!worker_flag.ok()) {
    std::fprintf(stderr, "%s\n", std::string(worker_flag.status().message()).c_str());
    return 2;
  }
  const int32_t worker = static_cast<int32_t>(*worker_flag);
  absl::StatusOr<v1::Plan> part = plan::ExtractRankPlan(*full, worker);
  if (!part.ok()) {
    std::fprintf(stderr, "part: %s\n", std::string(part.status().message()).c_str());
    return 1;
  }
  int64_t records = 0;
  for (const v1::Bucket& b : part->buckets()) records += b.pieces_size() + b.runs_size();
  full->Clear();  // the whole plan is no longer needed: its memory is not the bind's
  if (std::getenv("PART_BENCH_BIND_ONLY") != nullptr) return BindInPlace(*spec, *part, worker);
  const size_t before = HeapInUse();
  const auto start = std::chrono::steady_clock::now();
  std::deque<v1::Bucket> expanded;
  int64_t pieces = 0;
  for (const v1::Bucket& b : part->buckets()) {
    if (b.runs_size() == 0) {
      pieces += b.pieces_size();
      continue;
    }
    pieces += expanded.emplace_back(ExpandRuns(b)).pieces_size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t after = HeapInUse();
  std::printf(
      "worker %d: %d buckets, %lld records for %lld pieces, part %.1f MB serialized\nwritten "
      "out: %.3f s, %.1f MB of heap (%.0f B per piece)\n",
      worker, part->buckets_size(), static_cast<long long>(records), static_cast<long long>(pieces),
      part->ByteSizeLong() / 1e6, seconds, (after - before) / 1e6,
      pieces > 0 ? static_cast<double>(after - before) / pieces : 0.0);
  expanded.clear();
  return BindInPlace(*spec, *part, worker);
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) { return wsync::bench::Main(argc, argv); }
