// Helpers shared by the controller state tests (tests/controller/server).
#ifndef WSYNC_TESTS_CONTROLLER_SERVER_CONTROLLER_TEST_UTIL_H_
#define WSYNC_TESTS_CONTROLLER_SERVER_CONTROLLER_TEST_UTIL_H_

#include <cstdint>

#include "wsync/v1/controller.pb.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::controller::controller_testing {

// Tensor "w", `elems` fp32 elements over an n-rank mesh: sharded on dim 0 or
// replicated.
inline v1::TensorLayout Tensor(int n, bool shard, int64_t elems = 8) {
  v1::TensorLayout t;
  t.set_name("w");
  t.set_dtype(v1::FP32);
  t.add_shape(elems);
  auto* mesh = t.mutable_mesh();
  mesh->add_mesh_shape(n);
  for (int r = 0; r < n; ++r) mesh->add_ranks(r);
  if (shard) {
    mesh->add_placements()->mutable_shard()->set_dim(0);
  } else {
    mesh->add_placements()->mutable_replicate();
  }
  return t;
}

// Transfer "t": group "src" (2 ranks, sharded) -> group "dst" (1 rank,
// replicated): 3 workers, src/0 = 0, src/1 = 1, dst/0 = 2.
inline v1::DefineTransferRequest SimpleTransfer(int64_t elems = 8) {
  v1::DefineTransferRequest req;
  req.set_name("t");
  req.set_source_group("src");
  req.set_destination_group("dst");
  *req.mutable_spec()->mutable_source()->add_tensors() = Tensor(2, true, elems);
  *req.mutable_spec()->mutable_destination()->add_tensors() = Tensor(1, false, elems);
  return req;
}

}  // namespace wsync::controller::controller_testing

#endif  // WSYNC_TESTS_CONTROLLER_SERVER_CONTROLLER_TEST_UTIL_H_
