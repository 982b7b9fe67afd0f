// Small TransferSpec pieces shared by the executor tests that run plans from
// the real planner (planned_sync_test, block_fp8_exec_test).
#ifndef WSYNC_TESTS_WORKER_EXEC_SPEC_HELPERS_H_
#define WSYNC_TESTS_WORKER_EXEC_SPEC_HELPERS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "wsync/v1/layout.pb.h"

namespace wsync::exec::testing {

// A side named `name` whose rank i runs on worker workers[i], all on one node.
inline v1::Side MakeSide(const std::string& name, const std::vector<int32_t>& workers) {
  v1::Side s;
  s.set_name(name);
  for (int32_t w : workers) {
    v1::RankInfo* r = s.add_ranks();
    r->set_worker(w);
    r->set_node("n0");
  }
  return s;
}

// torch.chunk: chunk size ceil(n / parts); later chunks shrink or vanish.
// {begin, length} of chunk i.
inline std::pair<int64_t, int64_t> Chunk(int64_t n, int parts, int i) {
  const int64_t c = (n + parts - 1) / parts;
  const int64_t begin = std::min(n, c * i);
  return {begin, std::min(n, begin + c) - begin};
}

// What rank r of `parts` holds of a [rows, cols] tensor under `placement`:
// its chunk along the shard dim, else the whole tensor.
struct Box2d {
  int64_t r0 = 0, c0 = 0;
  int64_t rows = 0, cols = 0;
};
inline Box2d RankBox(int64_t rows, int64_t cols, const v1::Placement& placement, int parts, int r) {
  Box2d b{0, 0, rows, cols};
  if (placement.has_shard()) {
    const bool by_rows = placement.shard().dim() == 0;
    auto [begin, n] = Chunk(by_rows ? rows : cols, parts, r);
    (by_rows ? b.r0 : b.c0) = begin;
    (by_rows ? b.rows : b.cols) = n;
  }
  return b;
}

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_SPEC_HELPERS_H_
