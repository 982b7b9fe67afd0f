// DTensor placements -> per-rank fragments. Placements are applied in mesh-dim
// order to the per-dim list of global intervals that make up the local shard,
// always over *local positions* (what torch's left-to-right sharding and
// compute_local_shape_and_global_offset do). _StridedShard follows
// torch/distributed/tensor/placement_types.py (_StridedShard._split_tensor):
// torch.chunk(local, split_factor), torch.chunk(each chunk, mesh size), shard i
// = concatenation of piece i of every chunk.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/layout_internal.h"

namespace wsync::plan {
namespace {

// Appends [begin, end) to `out`, merging with the previous interval when the
// two are globally contiguous (they are always locally contiguous).
void AppendMerged(Interval iv, std::vector<Interval>* out) {
  if (iv.end <= iv.begin) return;
  if (!out->empty() && out->back().end == iv.begin) {
    out->back().end = iv.end;
  } else {
    out->push_back(iv);
  }
}

// The global intervals holding local positions [lo, hi) of `list`.
void SelectLocal(const std::vector<Interval>& list, int64_t lo, int64_t hi,
                 std::vector<Interval>* out) {
  int64_t pos = 0;
  for (const Interval& iv : list) {
    const int64_t len = iv.end - iv.begin;
    const int64_t a = std::max(lo, pos);
    const int64_t b = std::min(hi, pos + len);
    if (a < b) AppendMerged({iv.begin + (a - pos), iv.begin + (b - pos)}, out);
    pos += len;
    if (pos >= hi) break;
  }
}

int64_t TotalLength(const std::vector<Interval>& list) {
  int64_t n = 0;
  for (const Interval& iv : list) n += iv.end - iv.begin;
  return n;
}

std::string PlacementName(const v1::Placement& p) {
  switch (p.kind_case()) {
    case v1::Placement::kShard:
      return absl::StrCat("Shard(", p.shard().dim(), ")");
    case v1::Placement::kStridedShard:
      return absl::StrCat("_StridedShard(", p.strided_shard().dim(), ", ",
                          p.strided_shard().split_factor(), ")");
    case v1::Placement::kReplicate:
      return "Replicate()";
    case v1::Placement::kPartial:
      return absl::StrCat("Partial(", v1::ReduceOp_Name(p.partial().op()), ")");
    default:
      return "<unset>";
  }
}

// Placement checks that do not depend on the coordinate.
absl::Status CheckPlacement(const v1::Placement& p, int md, int ndim) {
  int32_t dim = 0;
  switch (p.kind_case()) {
    case v1::Placement::kShard:
      dim = p.shard().dim();
      break;
    case v1::Placement::kStridedShard:
      dim = p.strided_shard().dim();
      if (p.strided_shard().split_factor() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement ", md, " ", PlacementName(p), ": split_factor must be >= 1"));
      }
      break;
    case v1::Placement::kReplicate:
      return absl::OkStatus();
    case v1::Placement::kPartial:
      if (!v1::ReduceOp_IsValid(p.partial().op())) {
        return absl::InvalidArgumentError(absl::StrCat("placement ", md, " Partial: unknown op ",
                                                       static_cast<int>(p.partial().op())));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("placement ", md, " has no kind (shard/replicate/partial/strided_shard)"));
  }
  if (dim < 0 || dim >= ndim) {
    return absl::InvalidArgumentError(absl::StrCat("placement ", md, " ", PlacementName(p),
                                                   ": dim out of range for a ", ndim, "-d tensor"));
  }
  return absl::OkStatus();
}

// Shared by MeshLocalIntervals and AppendMeshFragments; reuses `iv` and
// `scratch` across calls (this runs once per rank per tensor).
absl::Status LocalIntervalsInto(const std::vector<int64_t>& shape,
                                const std::vector<int64_t>& mesh_shape,
                                const std::vector<int64_t>& mesh_coord,
                                const std::vector<v1::Placement>& placements,
                                std::vector<std::vector<Interval>>* iv,
                                std::vector<Interval>* scratch) {
  const int ndim = static_cast<int>(shape.size());
  if (mesh_coord.size() != mesh_shape.size() || placements.size() != mesh_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh has ", mesh_shape.size(), " dims but ",
                                                   placements.size(), " placements and a ",
                                                   mesh_coord.size(), "-d coordinate"));
  }
  iv->resize(ndim);
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape[", d, "] = ", shape[d], " < 0"));
    }
    (*iv)[d].clear();
    AppendMerged({0, shape[d]}, &(*iv)[d]);
  }
  for (size_t md = 0; md < mesh_shape.size(); ++md) {
    const int64_t parts = mesh_shape[md];
    const int64_t index = mesh_coord[md];
    if (parts < 1 || index < 0 || index >= parts) {
      return absl::InvalidArgumentError(absl::StrCat("mesh coordinate ", index, " on mesh dim ", md,
                                                     " of size ", parts, " is invalid"));
    }
    const v1::Placement& p = placements[md];
    RETURN_IF_ERROR(CheckPlacement(p, static_cast<int>(md), ndim));
    scratch->clear();
    if (p.kind_case() == v1::Placement::kShard) {
      std::vector<Interval>& list = (*iv)[p.shard().dim()];
      const Interval c = ChunkInterval(TotalLength(list), parts, index);
      SelectLocal(list, c.begin, c.end, scratch);
      list.swap(*scratch);
    } else if (p.kind_case() == v1::Placement::kStridedShard) {
      std::vector<Interval>& list = (*iv)[p.strided_shard().dim()];
      const int64_t n = TotalLength(list);
      const int64_t sf = p.strided_shard().split_factor();
      for (int64_t j = 0; j < sf; ++j) {
        const Interval chunk = ChunkInterval(n, sf, j);
        if (chunk.end <= chunk.begin) break;  // later chunks are empty too
        const Interval piece = ChunkInterval(chunk.end - chunk.begin, parts, index);
        SelectLocal(list, chunk.begin + piece.begin, chunk.begin + piece.end, scratch);
      }
      list.swap(*scratch);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::vector<Interval>>> MeshLocalIntervals(
    const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
    const std::vector<int64_t>& mesh_coord, const std::vector<v1::Placement>& placements) {
  std::vector<std::vector<Interval>> iv;
  std::vector<Interval> scratch;
  RETURN_IF_ERROR(LocalIntervalsInto(shape, mesh_shape, mesh_coord, placements, &iv, &scratch));
  return iv;
}

namespace {

template <typename... Args>
absl::Status MeshError(const std::string& where, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": mesh layout: ", args...));
}

// The mesh names each rank of the side at most once and has as many
// positions as ranks; *positions is their number.
absl::Status CheckMeshRanks(const std::string& where, const v1::MeshLayout& m, int32_t num_ranks,
                            int64_t* positions) {
  const int mdims = m.mesh_shape_size();
  if (m.placements_size() != mdims) {
    return MeshError(where, "mesh_shape has ", mdims, " dims but there are ", m.placements_size(),
                     " placements");
  }
  int64_t product = 1;
  bool overflow = false;
  for (int md = 0; md < mdims; ++md) {
    if (m.mesh_shape(md) < 1) {
      return MeshError(where, "mesh_shape[", md, "] = ", m.mesh_shape(md), " < 1");
    }
    overflow = overflow || __builtin_mul_overflow(product, m.mesh_shape(md), &product);
  }
  if (overflow || product != m.ranks_size()) {
    return MeshError(where, "mesh_shape [", absl::StrJoin(m.mesh_shape(), ", "), "] needs ",
                     overflow ? "more than 2^63" : absl::StrCat(product), " ranks but ranks lists ",
                     m.ranks_size());
  }
  std::vector<char> seen(num_ranks, 0);
  for (int i = 0; i < m.ranks_size(); ++i) {
    const int32_t r = m.ranks(i);
    if (r < 0 || r >= num_ranks) {
      return MeshError(where, "rank ", r, " (mesh position ", i, ") out of range: the side has ",
                       num_ranks, " ranks");
    }
    if (seen[r]) return MeshError(where, "rank ", r, " appears twice in the mesh");
    seen[r] = 1;
  }
  *positions = product;
  return absl::OkStatus();
}

// The mesh dims with Partial placements and their (common) reduce op.
struct PartialDims {
  bool any = false;
  v1::ReduceOp op = v1::REDUCE_SUM;
  std::vector<char> dim;  // per mesh dim: Partial
};

// Checks every placement (a destination holds no Partial values; Partial
// placements agree on the op) and collects the Partial ones.
absl::Status CheckPlacements(const std::string& where, const v1::MeshLayout& m, int ndim,
                             SideRole role, PartialDims* partial) {
  const int mdims = m.mesh_shape_size();
  partial->dim.assign(mdims, 0);
  for (int md = 0; md < mdims; ++md) {
    const v1::Placement& p = m.placements(md);
    absl::Status s = CheckPlacement(p, md, ndim);
    if (!s.ok()) return MeshError(where, s.message());
    if (p.kind_case() != v1::Placement::kPartial) continue;
    if (role == SideRole::kDestination) {
      return MeshError(where, "placement ", md, " ", PlacementName(p),
                       ": a destination cannot hold partial values");
    }
    if (partial->any && p.partial().op() != partial->op) {
      return MeshError(where, "Partial placements disagree on the reduce op (",
                       v1::ReduceOp_Name(partial->op), " vs ", v1::ReduceOp_Name(p.partial().op()),
                       ")");
    }
    partial->any = true;
    partial->op = p.partial().op();
    partial->dim[md] = 1;
  }
  return absl::OkStatus();
}

// One rank's local intervals and where they sit in its local buffer;
// reused from rank to rank (this loop makes every fragment of a large side).
struct RankIntervals {
  explicit RankIntervals(int ndim)
      : local_shape(ndim), first(ndim), pick(ndim), offset(ndim), length(ndim), strides(ndim) {}

  // From iv: each interval's local position, the local shape and its
  // row-major strides. False when the rank holds nothing of the tensor.
  bool Layout() {
    const int ndim = static_cast<int>(local_shape.size());
    bool empty = false;
    local_start.clear();
    for (int d = 0; d < ndim; ++d) {
      if (iv[d].empty()) empty = true;
      first[d] = local_start.size();
      int64_t pos = 0;
      for (const Interval& x : iv[d]) {
        local_start.push_back(pos);
        pos += x.end - x.begin;
      }
      local_shape[d] = pos;
    }
    if (empty) return false;
    for (int d = ndim - 1; d >= 0; --d) {
      strides[d] = d == ndim - 1 ? 1 : strides[d + 1] * local_shape[d + 1];
    }
    return true;
  }

  std::vector<std::vector<Interval>> iv;
  std::vector<Interval> scratch;
  std::vector<int64_t> local_shape;
  std::vector<int64_t> local_start;  // per interval, its local position
  std::vector<size_t> first;         // index of dim d's first interval in local_start
  std::vector<size_t> pick;
  std::vector<int64_t> offset, length, strides;
};

// One fragment per element of the cartesian product of the rank's per-dim
// intervals (after RankIntervals::Layout).
void AppendRankFragments(RankIntervals& ri, int32_t rank, int32_t buffer_id, int64_t elem_size,
                         int32_t group, v1::ReduceOp op, std::vector<CompiledFragment>* out) {
  const int ndim = static_cast<int>(ri.offset.size());
  std::fill(ri.pick.begin(), ri.pick.end(), 0);
  while (true) {
    int64_t elem_offset = 0;
    for (int d = 0; d < ndim; ++d) {
      const Interval& x = ri.iv[d][ri.pick[d]];
      ri.offset[d] = x.begin;
      ri.length[d] = x.end - x.begin;
      elem_offset += ri.local_start[ri.first[d] + ri.pick[d]] * ri.strides[d];
    }
    // Built in place: this loop makes every fragment of a large side.
    CompiledFragment& f = out->emplace_back();
    f.rank = rank;
    f.box.offset.assign(ri.offset.begin(), ri.offset.end());
    f.box.length.assign(ri.length.begin(), ri.length.end());
    f.own_buffer = buffer_id;
    f.byte_offset = elem_offset * elem_size;
    f.strides.assign(ri.strides.begin(), ri.strides.end());
    f.partial_group = group;
    f.partial_op = op;
    int d = ndim - 1;
    for (; d >= 0; --d) {
      if (++ri.pick[d] < ri.iv[d].size()) break;
      ri.pick[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

namespace internal {

absl::Status AppendMeshFragments(const std::string& where, const v1::TensorLayout& t,
                                 int32_t num_ranks, SideRole role, int32_t buffer_id,
                                 std::vector<CompiledFragment>* out) {
  const v1::MeshLayout& m = t.mesh();
  const int ndim = t.shape_size();
  const int mdims = m.mesh_shape_size();
  int64_t product = 0;
  RETURN_IF_ERROR(CheckMeshRanks(where, m, num_ranks, &product));
  PartialDims partial;
  RETURN_IF_ERROR(CheckPlacements(where, m, ndim, role, &partial));
  const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  const std::vector<int64_t> mesh_shape(m.mesh_shape().begin(), m.mesh_shape().end());
  const std::vector<v1::Placement> placements(m.placements().begin(), m.placements().end());
  const int64_t elem_size = DTypeSize(t.dtype());
  const v1::ReduceOp op = partial.any ? partial.op : v1::REDUCE_SUM;
  // Partial groups: dense ids in order of first appearance (row-major mesh
  // order) of the coordinate projected onto the non-Partial mesh dims.
  absl::flat_hash_map<int64_t, int32_t> group_ids;
  std::vector<int64_t> coord(mdims, 0);
  RankIntervals ri(ndim);
  out->reserve(out->size() + product);
  for (int64_t i = 0; i < product; ++i) {
    if (i > 0) {  // row-major increment
      for (int md = mdims - 1; md >= 0; --md) {
        if (++coord[md] < mesh_shape[md]) break;
        coord[md] = 0;
      }
    }
    RETURN_IF_ERROR(LocalIntervalsInto(shape, mesh_shape, coord, placements, &ri.iv, &ri.scratch));
    if (!ri.Layout()) continue;  // this rank holds nothing of the tensor
    int32_t group = 0;
    if (partial.any) {
      int64_t key = 0;
      for (int md = 0; md < mdims; ++md) {
        if (!partial.dim[md]) key = key * mesh_shape[md] + coord[md];
      }
      group = group_ids.try_emplace(key, static_cast<int32_t>(group_ids.size() + 1)).first->second;
    }
    AppendRankFragments(ri, m.ranks(static_cast<int>(i)), buffer_id, elem_size, group, op, out);
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace wsync::plan
