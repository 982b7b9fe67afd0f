// CompileSide driver: side/tensor checks, explicit fragments, buffer
// interning, sorting. Mesh placements live in mesh_layout.cc, cross-fragment
// checks in validate_layout.cc.
#include "controller/plan/compiled_layout.h"

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "controller/plan/layout_internal.h"

namespace wsync::plan {

Interval ChunkInterval(int64_t n, int64_t parts, int64_t index) {
  const int64_t chunk = parts > 0 ? (n + parts - 1) / parts : 0;
  const int64_t begin = std::min(n, index * chunk);
  const int64_t end = std::min(n, (index + 1) * chunk);
  return {begin, end};
}

namespace internal {

std::string Where(const std::string& side, const std::string& tensor) {
  return absl::StrCat("side \"", side, "\" tensor \"", tensor, "\"");
}

}  // namespace internal

namespace {

using internal::Where;

class BufferInterner {
 public:
  explicit BufferInterner(std::vector<std::string>* names) : names_(names) {}
  int32_t Intern(const std::string& name) {
    // Consecutive fragments usually name the same buffer: skip the hash.
    if (last_ >= 0 && (*names_)[last_] == name) return last_;
    auto [it, inserted] = ids_.try_emplace(name, static_cast<int32_t>(names_->size()));
    if (inserted) names_->push_back(name);
    last_ = it->second;
    return last_;
  }

 private:
  absl::flat_hash_map<std::string, int32_t> ids_;
  std::vector<std::string>* names_;
  int32_t last_ = -1;
};

// Element strides never let two elements of one fragment share an address:
// sorted by stride, every dim must step over the whole extent of the smaller
// ones (torch's non-overlapping condition). Zero strides only on length-1 dims.
bool SelfAliases(const CompiledFragment& f) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, length)
  for (int d = 0; d < f.box.rank(); ++d) {
    if (f.box.length[d] > 1) dims.push_back({f.strides[d], f.box.length[d]});
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the smaller dims
  for (const auto& [stride, length] : dims) {
    if (stride < span) return true;
    span = stride * (length - 1) + span;
  }
  return false;
}

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

// Fragment `in`'s rank, box (inside the tensor's shape), strides (none:
// row-major; never negative) and byte offset (not negative) into *f.
// Errors carry no prefix (CompileExplicit adds it).
absl::Status ReadFragment(const v1::TensorLayout& t, const v1::Fragment& in, int32_t num_ranks,
                          CompiledFragment* f) {
  const int ndim = t.shape_size();
  if (in.rank() < 0 || in.rank() >= num_ranks) {
    return Bad(absl::StrCat("rank out of range: the side has ", num_ranks, " ranks"));
  }
  if (in.box().offset_size() != ndim || in.box().length_size() != ndim) {
    return Bad(absl::StrCat("box has ", in.box().offset_size(), " offsets and ",
                            in.box().length_size(), " lengths but the tensor has ", ndim, " dims"));
  }
  f->rank = in.rank();
  f->box.offset.assign(in.box().offset().begin(), in.box().offset().end());
  f->box.length.assign(in.box().length().begin(), in.box().length().end());
  for (int d = 0; d < ndim; ++d) {
    if (f->box.offset[d] < 0 || f->box.length[d] < 0 ||
        f->box.length[d] > t.shape(d) - f->box.offset[d]) {
      return Bad(absl::StrCat("box ", f->box.ToString(), " (offset ", f->box.offset[d], ", length ",
                              f->box.length[d], " on dim ", d, ") is outside shape [",
                              absl::StrJoin(t.shape(), ", "), "]"));
    }
  }
  if (in.strides_size() == 0) {
    f->strides = RowMajorStrides(f->box.length);
  } else if (in.strides_size() != ndim) {
    return Bad(absl::StrCat("box ", f->box.ToString(), ": ", in.strides_size(), " strides for a ",
                            ndim, "-d tensor"));
  } else {
    f->strides.assign(in.strides().begin(), in.strides().end());
  }
  for (int d = 0; d < ndim; ++d) {
    if (f->strides[d] < 0) {
      return Bad(absl::StrCat("box ", f->box.ToString(), ": negative stride ", f->strides[d],
                              " on dim ", d));
    }
  }
  if (in.byte_offset() < 0) {
    return Bad(
        absl::StrCat("box ", f->box.ToString(), ": negative byte_offset ", in.byte_offset()));
  }
  return absl::OkStatus();
}

// Non-empty fragment f: explicit strides map no two elements to one
// address (row-major never aliases), and its bytes from `byte_offset` fit
// int64.
absl::Status CheckBytes(const v1::Fragment& in, int64_t elem_size, CompiledFragment* f) {
  if (in.strides_size() != 0 && SelfAliases(*f)) {
    return Bad(absl::StrCat("box ", f->box.ToString(), ": strides [",
                            absl::StrJoin(f->strides, ", "),
                            "] map two elements to the same address"));
  }
  f->byte_offset = in.byte_offset();
  int64_t extent = 0;
  RETURN_IF_ERROR(internal::ByteExtent(*f, elem_size, &extent));
  if (extent > INT64_MAX - f->byte_offset) {
    return Bad(absl::StrCat("box ", f->box.ToString(), ": byte range overflows int64"));
  }
  return absl::OkStatus();
}

// The partial groups of one tensor's explicit fragments: the index (into
// the output) of each group's first fragment, and its (group, rank) pairs.
struct PartialGroups {
  absl::flat_hash_map<int32_t, size_t> first;
  absl::flat_hash_set<std::pair<int32_t, int32_t>> ranks;
};

// Fragment f's partial_group (if any): a source's, a valid op, the same box
// and op as the group's other fragments, one fragment per rank.
absl::Status ReadPartial(const v1::Fragment& in, SideRole role,
                         const std::vector<CompiledFragment>& out, PartialGroups* groups,
                         CompiledFragment* f) {
  if (in.partial_group() < 0) {
    return Bad(
        absl::StrCat("box ", f->box.ToString(), ": negative partial_group ", in.partial_group()));
  }
  if (in.partial_group() == 0) return absl::OkStatus();
  if (role == SideRole::kDestination) {
    return Bad(absl::StrCat("box ", f->box.ToString(), ": partial_group ", in.partial_group(),
                            " on a destination (a destination cannot hold partial values)"));
  }
  if (!v1::ReduceOp_IsValid(in.partial_op())) {
    return Bad(absl::StrCat("box ", f->box.ToString(), ": unknown partial_op ",
                            static_cast<int>(in.partial_op())));
  }
  f->partial_group = in.partial_group();
  f->partial_op = in.partial_op();
  auto [it, inserted] = groups->first.try_emplace(f->partial_group, out.size());
  if (!inserted) {
    const CompiledFragment& g = out[it->second];
    if (g.box != f->box || g.partial_op != f->partial_op) {
      return Bad(absl::StrCat("box ", f->box.ToString(), " op ", v1::ReduceOp_Name(f->partial_op),
                              ": partial_group ", f->partial_group, " already holds box ",
                              g.box.ToString(), " op ", v1::ReduceOp_Name(g.partial_op), " (rank ",
                              g.rank, "); a group must share one box and op"));
    }
  }
  if (!groups->ranks.insert({f->partial_group, f->rank}).second) {
    return Bad(absl::StrCat("box ", f->box.ToString(), ": rank appears twice in partial_group ",
                            f->partial_group));
  }
  return absl::OkStatus();
}

absl::Status CompileExplicit(const std::string& where, const v1::TensorLayout& t, int32_t num_ranks,
                             SideRole role, BufferInterner* buffers,
                             std::vector<CompiledFragment>* out) {
  const int64_t elem_size = DTypeSize(t.dtype());
  const auto& frags = t.fragments().fragments();
  PartialGroups groups;
  out->reserve(out->size() + frags.size());
  for (int i = 0; i < frags.size(); ++i) {
    const v1::Fragment& in = frags[i];
    auto err = [&](const absl::Status& s) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " fragment ", i, " (rank ", in.rank(), "): ", s.message()));
    };
    CompiledFragment f;
    if (absl::Status s = ReadFragment(t, in, num_ranks, &f); !s.ok()) return err(s);
    if (f.box.Empty()) continue;  // holds nothing; the planner never needs it
    if (absl::Status s = CheckBytes(in, elem_size, &f); !s.ok()) return err(s);
    f.own_buffer = buffers->Intern(in.buffer().empty() ? t.name() : in.buffer());
    if (absl::Status s = ReadPartial(in, role, *out, &groups, &f); !s.ok()) return err(s);
    out->push_back(std::move(f));
  }
  return absl::OkStatus();
}

// (box, rank) order of CompiledTensor::fragments; buffer and byte offset
// break the remaining ties so that the order is deterministic.
bool FragmentLess(const CompiledFragment& a, const CompiledFragment& b) {
  const size_t n = a.box.offset.size();
  for (size_t d = 0; d < n; ++d) {
    if (a.box.offset[d] != b.box.offset[d]) return a.box.offset[d] < b.box.offset[d];
  }
  for (size_t d = 0; d < n; ++d) {
    if (a.box.length[d] != b.box.length[d]) return a.box.length[d] < b.box.length[d];
  }
  return std::tie(a.rank, a.own_buffer, a.byte_offset) <
         std::tie(b.rank, b.own_buffer, b.byte_offset);
}

// Sorts through an index permutation: each fragment moves once. Meshes
// often yield fragments already in order (row-major coordinates of plain
// Shard placements); checking first skips most of the sorting.
void SortFragments(std::vector<CompiledFragment>* frags) {
  if (std::is_sorted(frags->begin(), frags->end(), FragmentLess)) return;
  std::vector<uint32_t> order(frags->size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return FragmentLess((*frags)[a], (*frags)[b]); });
  std::vector<CompiledFragment> sorted;
  sorted.reserve(frags->size());
  for (uint32_t i : order) sorted.push_back(std::move((*frags)[i]));
  frags->swap(sorted);
}

template <typename T>
void AppendRaw(const T& v, std::string* key) {
  key->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Everything a mesh tensor's fragments depend on besides its name and
// buffer: dtype (byte offsets), shape, mesh shape, ranks and placements.
std::string MeshSignature(const v1::TensorLayout& t) {
  const v1::MeshLayout& m = t.mesh();
  std::string key;
  key.reserve(64 + 8 * (t.shape_size() + m.mesh_shape_size()) + 4 * m.ranks_size() +
              16 * m.placements_size());
  AppendRaw(static_cast<int32_t>(t.dtype()), &key);
  AppendRaw(static_cast<int32_t>(t.shape_size()), &key);
  for (int64_t d : t.shape()) AppendRaw(d, &key);
  AppendRaw(static_cast<int32_t>(m.mesh_shape_size()), &key);
  for (int64_t d : m.mesh_shape()) AppendRaw(d, &key);
  AppendRaw(static_cast<int32_t>(m.ranks_size()), &key);
  key.append(reinterpret_cast<const char*>(m.ranks().data()),
             sizeof(int32_t) * static_cast<size_t>(m.ranks_size()));
  AppendRaw(static_cast<int32_t>(m.placements_size()), &key);
  for (const v1::Placement& p : m.placements()) {
    AppendRaw(static_cast<int32_t>(p.kind_case()), &key);
    switch (p.kind_case()) {
      case v1::Placement::kShard:
        AppendRaw(p.shard().dim(), &key);
        break;
      case v1::Placement::kStridedShard:
        AppendRaw(p.strided_shard().dim(), &key);
        AppendRaw(p.strided_shard().split_factor(), &key);
        break;
      case v1::Placement::kPartial:
        AppendRaw(static_cast<int32_t>(p.partial().op()), &key);
        break;
      default:
        break;
    }
  }
  return key;
}

using SharedFragments = std::shared_ptr<const std::vector<CompiledFragment>>;

// The fragments of each mesh signature of one side, built, validated and
// sorted once and shared by every tensor of that signature. Sound because
// AppendMeshFragments reads nothing of the tensor but the signature (its
// buffer is left to CompiledTensor) and its checks depend on the signature
// and the side's rank count only.
class MeshFragmentCache {
 public:
  absl::StatusOr<SharedFragments> Get(const std::string& where, const v1::TensorLayout& t,
                                      int32_t num_ranks, SideRole role) {
    std::string key = MeshSignature(t);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    std::vector<CompiledFragment> frags;
    RETURN_IF_ERROR(
        internal::AppendMeshFragments(where, t, num_ranks, role, kTensorBuffer, &frags));
    SortFragments(&frags);
    auto shared = std::make_shared<const std::vector<CompiledFragment>>(std::move(frags));
    cache_.emplace(std::move(key), shared);
    return shared;
  }

 private:
  absl::flat_hash_map<std::string, SharedFragments> cache_;
};

absl::Status CheckTensorHeader(const std::string& where, const v1::TensorLayout& t) {
  if (t.name().empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty name"));
  if (DTypeSize(t.dtype()) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dtype ",
                                                   v1::DType_IsValid(t.dtype())
                                                       ? v1::DType_Name(t.dtype())
                                                       : absl::StrCat(static_cast<int>(t.dtype())),
                                                   " is not a concrete type"));
  }
  // Bytes of the whole tensor must fit in int64 so that no offset overflows.
  int64_t bytes = DTypeSize(t.dtype());
  for (int d = 0; d < t.shape_size(); ++d) {
    if (t.shape(d) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape [", absl::StrJoin(t.shape(), ", "), "] has negative dim ", d));
    }
    if (t.shape(d) > 0 && bytes > INT64_MAX / t.shape(d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape [", absl::StrJoin(t.shape(), ", "), "] is too large (bytes overflow)"));
    }
    bytes *= t.shape(d);
  }
  if (t.layout_case() == v1::TensorLayout::LAYOUT_NOT_SET) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no layout (needs \"mesh\" or \"fragments\")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CompiledSide> CompileSide(const v1::Side& side, SideRole role) {
  const std::string side_desc = absl::StrCat(role == SideRole::kSource ? "source" : "destination",
                                             " side \"", side.name(), "\"");
  if (side.ranks_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(side_desc, ": no ranks"));
  }
  if (side.tensors_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(side_desc, ": no tensors"));
  }
  CompiledSide out;
  out.name = side.name();
  out.workers.reserve(side.ranks_size());
  out.nodes.reserve(side.ranks_size());
  absl::flat_hash_map<int32_t, int32_t> worker_rank;
  for (int r = 0; r < side.ranks_size(); ++r) {
    const v1::RankInfo& info = side.ranks(r);
    if (info.worker() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(side_desc, ": rank ", r, " has negative worker id ", info.worker()));
    }
    auto [it, inserted] = worker_rank.try_emplace(info.worker(), r);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(side_desc, ": ranks ", it->second, " and ", r,
                                                     " both have worker id ", info.worker()));
    }
    out.workers.push_back(info.worker());
    out.nodes.push_back(info.node());
  }

  BufferInterner buffers(&out.buffer_names);
  MeshFragmentCache meshes;
  std::vector<bool> from_mesh;
  out.tensors.reserve(side.tensors_size());
  out.tensor_index.reserve(side.tensors_size());
  for (const v1::TensorLayout& t : side.tensors()) {
    const std::string where = Where(side.name(), t.name());
    RETURN_IF_ERROR(CheckTensorHeader(where, t));
    if (!out.tensor_index.try_emplace(t.name(), static_cast<int32_t>(out.tensors.size())).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate tensor name"));
    }
    CompiledTensor ct;
    ct.name = t.name();
    ct.dtype = t.dtype();
    ct.shape.assign(t.shape().begin(), t.shape().end());
    if (t.has_mesh()) {
      const int32_t buf = buffers.Intern(t.mesh().buffer().empty() ? t.name() : t.mesh().buffer());
      ASSIGN_OR_RETURN(SharedFragments frags, meshes.Get(where, t, side.ranks_size(), role));
      ct.SetFragments(std::move(frags), buf);
    } else {
      std::vector<CompiledFragment> frags;
      RETURN_IF_ERROR(CompileExplicit(where, t, side.ranks_size(), role, &buffers, &frags));
      SortFragments(&frags);
      ct.SetFragments(std::make_shared<const std::vector<CompiledFragment>>(std::move(frags)),
                      kTensorBuffer);
    }
    from_mesh.push_back(t.has_mesh());
    out.tensors.push_back(std::move(ct));
  }
  if (role == SideRole::kDestination) {
    RETURN_IF_ERROR(internal::CheckDestinationBoxOverlaps(out, from_mesh));
  }
  RETURN_IF_ERROR(internal::CheckByteOverlaps(out, from_mesh, role));
  RETURN_IF_ERROR(internal::ResolveBlockQuantization(side, role, &out));
  return out;
}

}  // namespace wsync::plan
