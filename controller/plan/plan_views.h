// The TensorViews of a plan built on an arena, each distinct view allocated
// once and shared by every piece that uses it (Piece.src / Piece.dst set with
// unsafe_arena_set_allocated_*). Views are in worker-local coordinates
// (buffer name index, byte offset, shape, strides), so the replicas of a
// destination, and a relay's source and its parent's destination, repeat
// them: Kimi-K2 Megatron 256 -> vLLM 16 x 8 has 849 k piece views and 5.8 k
// distinct ones. A plan built so must be treated as read-only (mutating one
// piece's view would change every piece sharing it); copies (CopyFrom,
// operator=, ExtractRankPlan, SplitRankPlans) are deep and private.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_VIEWS_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_VIEWS_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "google/protobuf/arena.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan::planner_detail {

// A view's fields; shape and strides point at `rank` values each.
struct ViewFields {
  int32_t buffer_name = 0;
  int64_t byte_offset = 0;
  int rank = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  v1::BufferSide side = v1::SOURCE_BUFFER;
};

// The fields of `v` (pointing into it); rank = its shape's size.
ViewFields FieldsOf(const v1::TensorView& v);

// Writes `f` into `v` (shape and strides reserved exactly: on an arena every
// growth step of a repeated field is a new array).
void FillView(const ViewFields& f, v1::TensorView* v);

class ViewTable {
 public:
  // `arena`: the plan's; nullptr (a plan on the heap) turns interning off.
  explicit ViewTable(google::protobuf::Arena* arena) : arena_(arena) {}

  bool interning() const { return arena_ != nullptr; }

  // The arena's view equal to `f`, created on first use. Only when
  // interning().
  v1::TensorView* Get(const ViewFields& f);

  size_t size() const { return views_.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(const ViewFields& f) const;
    size_t operator()(const v1::TensorView* v) const;
  };
  struct Eq {
    using is_transparent = void;
    bool operator()(const v1::TensorView* a, const v1::TensorView* b) const;
    bool operator()(const v1::TensorView* a, const ViewFields& b) const;
    bool operator()(const ViewFields& a, const v1::TensorView* b) const { return (*this)(b, a); }
  };

  google::protobuf::Arena* arena_;
  absl::flat_hash_set<v1::TensorView*, Hash, Eq> views_;
};

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_VIEWS_H_
