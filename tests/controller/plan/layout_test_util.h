// Builders for layout tests: placements, sides, mesh and explicit tensors.
#ifndef WSYNC_TESTS_CONTROLLER_PLAN_LAYOUT_TEST_UTIL_H_
#define WSYNC_TESTS_CONTROLLER_PLAN_LAYOUT_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/box.h"
#include "controller/plan/compiled_layout.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::plan::testing {

inline v1::Placement S(int dim) {
  v1::Placement p;
  p.mutable_shard()->set_dim(dim);
  return p;
}
inline v1::Placement SS(int dim, int split_factor) {
  v1::Placement p;
  p.mutable_strided_shard()->set_dim(dim);
  p.mutable_strided_shard()->set_split_factor(split_factor);
  return p;
}
inline v1::Placement R() {
  v1::Placement p;
  p.mutable_replicate();
  return p;
}
inline v1::Placement P(v1::ReduceOp op = v1::REDUCE_SUM) {
  v1::Placement p;
  p.mutable_partial()->set_op(op);
  return p;
}

inline BoxNd B(std::vector<int64_t> offset, std::vector<int64_t> length) {
  return BoxNd{DimVector(offset.begin(), offset.end()), DimVector(length.begin(), length.end())};
}

// A side with `n` ranks: worker 100 + i, node "node<i / 8>".
inline v1::Side MakeSide(int n, const std::string& name = "src") {
  v1::Side side;
  side.set_name(name);
  for (int i = 0; i < n; ++i) {
    v1::RankInfo* r = side.add_ranks();
    r->set_worker(100 + i);
    r->set_node("node" + std::to_string(i / 8));
  }
  return side;
}

inline v1::TensorLayout* AddTensor(v1::Side* side, const std::string& name,
                                   std::vector<int64_t> shape, v1::DType dtype = v1::FP32) {
  v1::TensorLayout* t = side->add_tensors();
  t->set_name(name);
  t->set_dtype(dtype);
  for (int64_t s : shape) t->add_shape(s);
  return t;
}

// Mesh tensor; `ranks` empty = identity 0..prod(mesh)-1.
inline v1::TensorLayout* AddMesh(v1::Side* side, const std::string& name,
                                 std::vector<int64_t> shape, std::vector<int64_t> mesh,
                                 std::vector<v1::Placement> placements,
                                 std::vector<int32_t> ranks = {}, v1::DType dtype = v1::FP32) {
  v1::TensorLayout* t = AddTensor(side, name, std::move(shape), dtype);
  v1::MeshLayout* m = t->mutable_mesh();
  int64_t n = 1;
  for (int64_t s : mesh) {
    m->add_mesh_shape(s);
    n *= s;
  }
  if (ranks.empty()) {
    for (int32_t i = 0; i < n; ++i) ranks.push_back(i);
  }
  for (int32_t r : ranks) m->add_ranks(r);
  for (const auto& p : placements) *m->add_placements() = p;
  return t;
}

inline v1::Fragment* AddFragment(v1::TensorLayout* t, int32_t rank, const BoxNd& box,
                                 const std::string& buffer = "", int64_t byte_offset = 0,
                                 std::vector<int64_t> strides = {}) {
  v1::Fragment* f = t->mutable_fragments()->add_fragments();
  f->set_rank(rank);
  for (int64_t o : box.offset) f->mutable_box()->add_offset(o);
  for (int64_t l : box.length) f->mutable_box()->add_length(l);
  f->set_buffer(buffer);
  f->set_byte_offset(byte_offset);
  for (int64_t s : strides) f->add_strides(s);
  return f;
}

// Fragments of `t` on `rank`, in the compiled (box, rank) order.
inline std::vector<CompiledFragment> OnRank(const CompiledTensor& t, int32_t rank) {
  std::vector<CompiledFragment> out;
  for (const auto& f : t.fragments()) {
    if (f.rank == rank) out.push_back(f);
  }
  return out;
}

}  // namespace wsync::plan::testing

#endif  // WSYNC_TESTS_CONTROLLER_PLAN_LAYOUT_TEST_UTIL_H_
