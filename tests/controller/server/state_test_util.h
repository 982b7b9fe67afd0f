// Helpers shared by the ControllerState tests.
#ifndef WSYNC_TESTS_CONTROLLER_SERVER_STATE_TEST_UTIL_H_
#define WSYNC_TESTS_CONTROLLER_SERVER_STATE_TEST_UTIL_H_

#include "wsync/v1/layout.pb.h"

namespace wsync::controller::state_testing {

// Tensor "w", 8 fp32 elements over an n-rank mesh: sharded on dim 0 or
// replicated.
inline v1::TensorLayout Tensor(int n, bool shard) {
  v1::TensorLayout t;
  t.set_name("w");
  t.set_dtype(v1::FP32);
  t.add_shape(8);
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

}  // namespace wsync::controller::state_testing

#endif  // WSYNC_TESTS_CONTROLLER_SERVER_STATE_TEST_UTIL_H_
