// plan_runs_check: the piece-run oracle on one catalog case (wsyncctl plan's
// case flags). Plans the case twice on plan arenas, with piece runs
// (BuildOptions::emit_piece_runs, the default) and without, and checks that
// the first, its runs checked (CheckPlanRuns) and written out
// (ExpandPlanRuns), equals the second byte for byte once each bucket's pieces
// are put in bucket-offset order (tests/common/plan_runs_util.h: run members
// follow a bucket's other pieces). `wsyncctl plan --no-piece-runs` prints the
// plan without runs, which bench/plan_runs_check.sh compares with main's.
//
//   plan_runs_check --model M --source S --destination D [case flags]
// Prints one line: pieces, runs, records and serialized bytes with and
// without runs, and OK or what differs. Exit 0 iff equal.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/plan_pieces.h"
#include "controller/plan/plan_arena.h"
#include "controller/plan/planner.h"
#include "google/protobuf/arena.h"
#include "tests/common/plan_runs_util.h"
#include "tools/args.h"
#include "tools/case_flags.h"

namespace wsync::bench {
namespace {

struct Counts {
  int64_t pieces = 0, runs = 0, members = 0, bytes = 0;
};

Counts CountOf(const v1::Plan& plan) {
  Counts c;
  for (const v1::Bucket& b : plan.buckets()) {
    c.pieces += b.pieces_size();
    c.runs += b.runs_size();
    for (const v1::PieceRun& r : b.runs()) c.members += RunMembers(r);
  }
  c.bytes = static_cast<int64_t>(plan.ByteSizeLong());
  return c;
}

// The first bucket (index) whose canonical form differs, or -1.
int FirstDifferentBucket(const v1::Plan& a, const v1::Plan& b) {
  const int n = std::min(a.buckets_size(), b.buckets_size());
  for (int i = 0; i < n; ++i) {
    if (a.buckets(i).SerializeAsString() != b.buckets(i).SerializeAsString()) return i;
  }
  return a.buckets_size() == b.buckets_size() ? -1 : n;
}

int Main(int argc, char** argv) {
  tools::FlagSpec flags;
  tools::AddCaseFlags(&flags);
  auto args = tools::ParseArgs(std::vector<std::string>(argv + 1, argv + argc), flags);
  if (!args.ok() || !tools::HasCaseFlags(*args)) {
    std::fprintf(stderr, "usage: plan_runs_check --model M --source S --destination D [...]: %s\n",
                 args.ok() ? "no case" : std::string(args.status().message()).c_str());
    return 2;
  }
  auto spec = tools::SpecFromCaseFlags(*args);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  plan::BuildOptions build;
  build.record_plan_seconds = false;
  std::shared_ptr<google::protobuf::Arena> arena_on = plan::NewPlanArena();
  auto* with = google::protobuf::Arena::CreateMessage<v1::Plan>(arena_on.get());
  if (absl::Status s = plan::BuildPlanInto(*spec, with, build); !s.ok()) {
    std::fprintf(stderr, "plan with runs: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  build.emit_piece_runs = false;
  std::shared_ptr<google::protobuf::Arena> arena_off = plan::NewPlanArena();
  auto* without = google::protobuf::Arena::CreateMessage<v1::Plan>(arena_off.get());
  if (absl::Status s = plan::BuildPlanInto(*spec, without, build); !s.ok()) {
    std::fprintf(stderr, "plan without runs: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const Counts on = CountOf(*with), off = CountOf(*without);
  std::printf(
      "pieces %lld -> %lld plain + %lld runs (%lld members), records %lld -> %lld, "
      "bytes %lld -> %lld: ",
      static_cast<long long>(off.pieces), static_cast<long long>(on.pieces),
      static_cast<long long>(on.runs), static_cast<long long>(on.members),
      static_cast<long long>(off.pieces), static_cast<long long>(on.pieces + on.runs),
      static_cast<long long>(off.bytes), static_cast<long long>(on.bytes));
  if (absl::Status s = CheckPlanRuns(*with); !s.ok()) {
    std::printf("FAILED: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (off.runs != 0) {
    std::printf("FAILED: the plan without runs has %lld\n", static_cast<long long>(off.runs));
    return 1;
  }
  v1::Plan expanded = ExpandPlanRuns(*with);  // on the heap: deep copies
  v1::Plan reference = *without;
  testing::CanonicalPieceOrder(&expanded);
  testing::CanonicalPieceOrder(&reference);
  if (expanded.SerializeAsString() != reference.SerializeAsString()) {
    const int b = FirstDifferentBucket(expanded, reference);
    std::printf("FAILED: expanded plan differs (first differing bucket index %d)\n", b);
    return 1;
  }
  std::printf("OK, expanded equal\n");
  return 0;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) { return wsync::bench::Main(argc, argv); }
