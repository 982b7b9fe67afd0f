// The one internal representation of a side's layout: every tensor as a list
// of fragments (rank, global box, buffer, byte offset, strides). Both spec
// forms (DTensor-style mesh placements, explicit fragments) compile to it, and
// the planner only ever sees this form.
#ifndef WSYNC_CONTROLLER_PLAN_COMPILED_LAYOUT_H_
#define WSYNC_CONTROLLER_PLAN_COMPILED_LAYOUT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/box.h"
#include "common/dtype.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::plan {

struct CompiledFragment {
  int32_t rank = 0;  // side-local rank index
  BoxNd box;         // global coordinates of the tensor
  // Explicit fragments: index into CompiledSide::buffer_names. Mesh
  // fragments: kTensorBuffer (they lie in their tensor's one buffer, which
  // differs per tensor while the fragments are shared). Read it through
  // CompiledTensor::buffer(), never directly.
  int32_t own_buffer = 0;
  int64_t byte_offset = 0;    // of box.offset inside the buffer
  DimVector strides;          // element strides in the buffer, per dim
  int32_t partial_group = 0;  // 0: full values; else reduce the group
  v1::ReduceOp partial_op = v1::REDUCE_SUM;
};

inline constexpr int32_t kTensorBuffer = -1;

// A tensor's fragments live in a vector shared by every tensor of one mesh
// signature (see CompileSide): what differs between those tensors (name,
// buffer) is kept here, per tensor, and every field of a shared fragment
// (rank, box, byte offset within the tensor's buffer, strides, partial
// group) is a function of the signature alone. Explicit-fragment tensors own
// their vector (their buffers and byte offsets are per tensor).
struct CompiledTensor {
  std::string name;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;

  // Sorted by (box, rank).
  const std::vector<CompiledFragment>& fragments() const { return *fragments_; }
  const CompiledFragment& fragment(size_t i) const { return (*fragments_)[i]; }
  size_t num_fragments() const { return fragments_->size(); }
  // The buffer (index into CompiledSide::buffer_names) fragment f of this
  // tensor lies in.
  int32_t buffer(const CompiledFragment& f) const {
    return mesh_buffer_ >= 0 ? mesh_buffer_ : f.own_buffer;
  }
  // The tensor's one buffer when every fragment lies in it (mesh layouts),
  // else kTensorBuffer (explicit fragments name their own).
  int32_t mesh_buffer() const { return mesh_buffer_; }
  // Whether this tensor and `other` share one fragment vector (tests,
  // measurement).
  bool SharesFragmentsWith(const CompiledTensor& other) const {
    return fragments_ == other.fragments_;
  }
  // Mesh layouts: `fragments` (shared, every own_buffer kTensorBuffer) all in
  // buffer `buffer` >= 0. Explicit layouts: buffer kTensorBuffer, each
  // fragment's own_buffer names its buffer.
  void SetFragments(std::shared_ptr<const std::vector<CompiledFragment>> fragments,
                    int32_t buffer) {
    fragments_ = std::move(fragments);
    mesh_buffer_ = buffer;
  }

  // Destination only, block fp8 quantization (TensorLayout.block_quantization):
  // on the quantized tensor, its scale tensor's index, the block over the
  // last two dims, and per fragment the scale tensor's fragment (same rank)
  // whose box holds that fragment's blocks; on the scale tensor, the index of
  // the tensor it scales.
  int32_t scale_tensor = -1;
  int64_t quant_block[2] = {0, 0};
  std::vector<int32_t> scale_fragment;
  int32_t scales_for = -1;
  bool quantized() const { return scale_tensor >= 0; }

 private:
  std::shared_ptr<const std::vector<CompiledFragment>> fragments_ =
      std::make_shared<const std::vector<CompiledFragment>>();
  int32_t mesh_buffer_ = kTensorBuffer;
};

struct CompiledSide {
  std::string name;
  std::vector<int32_t> workers;    // rank -> global worker id
  std::vector<std::string> nodes;  // rank -> node name
  std::vector<std::string> buffer_names;
  std::vector<CompiledTensor> tensors;
  absl::flat_hash_map<std::string, int32_t> tensor_index;  // name -> tensors[i]

  const CompiledTensor* Find(const std::string& name) const {
    auto it = tensor_index.find(name);
    return it == tensor_index.end() ? nullptr : &tensors[it->second];
  }
};

enum class SideRole { kSource, kDestination };

// Compiles and validates one side. Mesh tensors of one signature (dtype,
// shape, mesh shape, ranks, placements) share one fragment vector, built and
// checked once; each keeps its own name and buffer. Errors name the side,
// tensor, rank and box:
// empty side, duplicate worker or tensor names, unknown ranks, bad shapes or
// dtypes, placements that do not fit the mesh, boxes out of range, strided
// views that overflow nothing they claim, and (destination only) overlapping
// boxes on one rank or partial placements.
absl::StatusOr<CompiledSide> CompileSide(const v1::Side& side, SideRole role);

// The per-dim global intervals that make up rank `coord`'s local shard under
// DTensor placements (exposed for tests and builders).
struct Interval {
  int64_t begin = 0;
  int64_t end = 0;
};
absl::StatusOr<std::vector<std::vector<Interval>>> MeshLocalIntervals(
    const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
    const std::vector<int64_t>& mesh_coord, const std::vector<v1::Placement>& placements);

// torch.chunk: chunk size ceil(n / parts); chunk i is [i*cs, min((i+1)*cs, n)),
// possibly empty.
Interval ChunkInterval(int64_t n, int64_t parts, int64_t index);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_COMPILED_LAYOUT_H_
