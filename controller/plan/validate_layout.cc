// Cross-fragment checks of a compiled side. Both are sweeps over fragments
// sorted by (rank, start), so a side with N fragments costs O(N log N) plus the
// pairs whose ranges actually overlap, never O(N^2) per tensor.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "controller/plan/layout_internal.h"

namespace wsync::plan::internal {
namespace {

struct ByteRange {
  int32_t rank;
  int32_t buffer;
  int64_t begin;
  int64_t end;
  int32_t tensor;
  int32_t frag;
};

bool IsDense(const CompiledFragment& f, int64_t elem_size, int64_t extent) {
  return extent == f.box.NumElements() * elem_size;
}

// Exact test for two fragments whose byte ranges overlap. Returns true when
// they share a byte or when disjointness cannot be proven cheaply.
//
// Idea: when all strides used (in bytes) form a divisibility chain, every byte
// offset decodes to unique coordinates in that chain (a virtual row-major
// parent array), and a fragment that does not wrap a level is a box there; two
// such boxes share an element iff they intersect. This covers the common
// cases: column blocks of one row-major buffer, views of a shared flat buffer.
bool MayShareBytes(const CompiledFragment& a, const CompiledFragment& b, int64_t es) {
  std::vector<int64_t> chain = {es};
  auto add_levels = [&](const CompiledFragment& f) {
    for (int d = 0; d < f.box.rank(); ++d) {
      if (f.box.length[d] > 1) chain.push_back(f.strides[d] * es);
    }
  };
  add_levels(a);
  add_levels(b);
  std::sort(chain.begin(), chain.end(), std::greater<int64_t>());
  chain.erase(std::unique(chain.begin(), chain.end()), chain.end());
  for (size_t k = 0; k + 1 < chain.size(); ++k) {
    if (chain[k] % chain[k + 1] != 0) return true;
  }
  const size_t levels = chain.size();
  struct Decoded {
    std::vector<int64_t> lo, hi;
    int64_t rem;
  };
  auto decode = [&](const CompiledFragment& f, Decoded* out) -> bool {
    out->lo.assign(levels, 0);
    out->hi.assign(levels, 0);
    int64_t r = f.byte_offset;
    for (size_t k = 0; k < levels; ++k) {
      out->lo[k] = r / chain[k];
      r %= chain[k];
      out->hi[k] = out->lo[k] + 1;
    }
    out->rem = r;
    for (int d = 0; d < f.box.rank(); ++d) {
      if (f.box.length[d] <= 1) continue;
      const size_t k = std::find(chain.begin(), chain.end(), f.strides[d] * es) - chain.begin();
      if (out->hi[k] != out->lo[k] + 1) return false;  // two dims on one level
      out->hi[k] = out->lo[k] + f.box.length[d];
    }
    for (size_t k = 1; k < levels; ++k) {
      if (out->hi[k] > chain[k - 1] / chain[k]) return false;  // wraps into the next level
    }
    return true;
  };
  Decoded da, db;
  if (!decode(a, &da) || !decode(b, &db) || da.rem != db.rem) return true;
  for (size_t k = 0; k < levels; ++k) {
    if (da.hi[k] <= db.lo[k] || db.hi[k] <= da.lo[k]) return false;
  }
  return true;
}

bool ExactAlias(const CompiledFragment& a, const CompiledFragment& b, int64_t esa, int64_t esb) {
  return esa == esb && a.byte_offset == b.byte_offset && a.strides == b.strides &&
         a.box.length == b.box.length;
}

}  // namespace

absl::Status ByteExtent(const CompiledFragment& f, int64_t elem_size, int64_t* extent) {
  int64_t last = 0;  // element offset of the last element
  for (int d = 0; d < f.box.rank(); ++d) {
    if (f.box.length[d] == 0) {
      *extent = 0;
      return absl::OkStatus();
    }
    int64_t step = 0;
    if (__builtin_mul_overflow(f.box.length[d] - 1, f.strides[d], &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", f.rank, " box ", f.box.ToString(),
                                                     ": strides [", absl::StrJoin(f.strides, ", "),
                                                     "] overflow int64"));
    }
  }
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, elem_size, extent)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", f.rank, " box ", f.box.ToString(), ": byte extent overflows int64"));
  }
  return absl::OkStatus();
}

namespace {

constexpr int32_t kUnused = -1, kShared = -2;

// Per buffer: the one mesh tensor using it, kShared when several tensors or
// an explicit one do, kUnused when none does. A buffer used by one mesh
// tensor alone needs no check: on each rank that tensor's fragments tile
// the buffer exactly. This is the common case and keeps large sides free of
// a global sort.
std::vector<int32_t> BufferOwners(const CompiledSide& side, const std::vector<bool>& from_mesh) {
  std::vector<int32_t> owner(side.buffer_names.size(), kUnused);
  auto own = [&](int32_t buffer, size_t ti) {
    int32_t& o = owner[buffer];
    if (o == kUnused) {
      o = from_mesh[ti] ? static_cast<int32_t>(ti) : kShared;
    } else if (o != static_cast<int32_t>(ti)) {
      o = kShared;
    }
  };
  for (size_t ti = 0; ti < side.tensors.size(); ++ti) {
    const CompiledTensor& t = side.tensors[ti];
    if (t.mesh_buffer() >= 0) {  // one buffer for all its fragments: O(1)
      if (t.num_fragments() > 0) own(t.mesh_buffer(), ti);
      continue;
    }
    for (const CompiledFragment& f : t.fragments()) own(t.buffer(f), ti);
  }
  return owner;
}

// The byte ranges of every non-empty fragment in a shared buffer, in tensor
// order. A mesh tensor alone in its buffer costs O(1): its (possibly
// shared) fragments are never walked.
absl::Status SharedRanges(const CompiledSide& side, const std::vector<int32_t>& owner,
                          const std::vector<int64_t>& elem_size, std::vector<ByteRange>* ranges) {
  for (size_t ti = 0; ti < side.tensors.size(); ++ti) {
    const CompiledTensor& t = side.tensors[ti];
    if (t.mesh_buffer() >= 0 && owner[t.mesh_buffer()] != kShared) continue;
    for (size_t fi = 0; fi < t.num_fragments(); ++fi) {
      const CompiledFragment& f = t.fragment(fi);
      const int32_t buffer = t.buffer(f);
      if (owner[buffer] != kShared) continue;
      int64_t extent = 0;
      absl::Status s = ByteExtent(f, elem_size[ti], &extent);
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(side.name, t.name), ": ", s.message()));
      }
      if (extent == 0) continue;
      ranges->push_back({f.rank, buffer, f.byte_offset, f.byte_offset + extent,
                         static_cast<int32_t>(ti), static_cast<int32_t>(fi)});
    }
  }
  return absl::OkStatus();
}

// Stable bucketing by rank, then (buffer, begin) within a rank. Ranges are
// produced in tensor order, which in packed flat buffers is usually already
// offset order, so most buckets need no sort at all.
void SortByRankAndBuffer(size_t num_ranks, std::vector<ByteRange>* ranges) {
  std::vector<size_t> rank_start(num_ranks + 1, 0);
  for (const ByteRange& r : *ranges) ++rank_start[r.rank + 1];
  for (size_t r = 1; r < rank_start.size(); ++r) rank_start[r] += rank_start[r - 1];
  {
    std::vector<ByteRange> bucketed(ranges->size());
    std::vector<size_t> fill(rank_start.begin(), rank_start.end() - 1);
    for (const ByteRange& r : *ranges) bucketed[fill[r.rank]++] = r;
    ranges->swap(bucketed);
  }
  auto less = [](const ByteRange& a, const ByteRange& b) {
    return std::tie(a.buffer, a.begin, a.end, a.tensor, a.frag) <
           std::tie(b.buffer, b.begin, b.end, b.tensor, b.frag);
  };
  for (size_t r = 0; r + 1 < rank_start.size(); ++r) {
    auto first = ranges->begin() + rank_start[r], last = ranges->begin() + rank_start[r + 1];
    if (!std::is_sorted(first, last, less)) std::sort(first, last, less);
  }
}

// Whether ranges a and e (overlapping in bytes) may share them: fragments
// of one mesh tensor on one rank tile its local buffer; a source may alias
// exactly; strided fragments may interleave without sharing a byte.
bool OverlapAllowed(const CompiledSide& side, const std::vector<bool>& from_mesh,
                    const std::vector<int64_t>& elem_size, SideRole role, const ByteRange& a,
                    const ByteRange& e) {
  if (a.tensor == e.tensor && from_mesh[e.tensor]) return true;
  const CompiledFragment& fa = side.tensors[a.tensor].fragment(a.frag);
  const CompiledFragment& fe = side.tensors[e.tensor].fragment(e.frag);
  const int64_t esa = elem_size[a.tensor], ese = elem_size[e.tensor];
  if (role == SideRole::kSource && ExactAlias(fa, fe, esa, ese)) return true;
  const bool both_dense = IsDense(fa, esa, a.end - a.begin) && IsDense(fe, ese, e.end - e.begin);
  return !both_dense && esa == ese && !MayShareBytes(fa, fe, esa);
}

}  // namespace

absl::Status CheckByteOverlaps(const CompiledSide& side, const std::vector<bool>& from_mesh,
                               SideRole role) {
  const std::vector<int32_t> owner = BufferOwners(side, from_mesh);
  std::vector<int64_t> elem_size(side.tensors.size());
  for (size_t ti = 0; ti < side.tensors.size(); ++ti) {
    elem_size[ti] = DTypeSize(side.tensors[ti].dtype);
  }
  std::vector<ByteRange> ranges;
  if (absl::Status s = SharedRanges(side, owner, elem_size, &ranges); !s.ok()) return s;
  SortByRankAndBuffer(side.workers.size(), &ranges);
  // Sweep each (rank, buffer) by begin, keeping the ranges still open.
  std::vector<const ByteRange*> active;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ByteRange& e = ranges[i];
    if (i == 0 || e.rank != ranges[i - 1].rank || e.buffer != ranges[i - 1].buffer) {
      active.clear();
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](const ByteRange* a) { return a->end <= e.begin; }),
                 active.end());
    for (const ByteRange* a : active) {
      if (OverlapAllowed(side, from_mesh, elem_size, role, *a, e)) continue;
      const CompiledTensor& ta = side.tensors[a->tensor];
      const CompiledTensor& te = side.tensors[e.tensor];
      return absl::InvalidArgumentError(absl::StrCat(
          "side \"", side.name, "\" rank ", e.rank, " buffer \"", side.buffer_names[e.buffer],
          "\": bytes [", a->begin, ", ", a->end, ") of tensor \"", ta.name, "\" box ",
          ta.fragment(a->frag).box.ToString(), " overlap bytes [", e.begin, ", ", e.end,
          ") of tensor \"", te.name, "\" box ", te.fragment(e.frag).box.ToString()));
    }
    active.push_back(&e);
  }
  return absl::OkStatus();
}

absl::Status CheckDestinationBoxOverlaps(const CompiledSide& side,
                                         const std::vector<bool>& from_mesh) {
  std::vector<const CompiledFragment*> order;
  for (size_t ti = 0; ti < side.tensors.size(); ++ti) {
    if (from_mesh[ti]) continue;  // a mesh gives each rank one disjoint shard
    const CompiledTensor& t = side.tensors[ti];
    order.clear();
    for (const CompiledFragment& f : t.fragments()) order.push_back(&f);
    const bool scalar = t.shape.empty();
    auto lo = [&](const CompiledFragment* f) { return scalar ? 0 : f->box.offset[0]; };
    auto hi = [&](const CompiledFragment* f) {
      return scalar ? 1 : f->box.offset[0] + f->box.length[0];
    };
    std::sort(order.begin(), order.end(),
              [&](const CompiledFragment* a, const CompiledFragment* b) {
                return a->rank != b->rank ? a->rank < b->rank : lo(a) < lo(b);
              });
    std::vector<const CompiledFragment*> active;
    for (size_t i = 0; i < order.size(); ++i) {
      const CompiledFragment* f = order[i];
      if (i > 0 && order[i - 1]->rank != f->rank) active.clear();
      active.erase(std::remove_if(active.begin(), active.end(),
                                  [&](const CompiledFragment* a) { return hi(a) <= lo(f); }),
                   active.end());
      for (const CompiledFragment* a : active) {
        if (scalar || Intersect(a->box, f->box).has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(side.name, t.name), ": rank ", f->rank, " holds boxes ",
                           a->box.ToString(), " and ", f->box.ToString(),
                           " which overlap (a destination element must have one "
                           "home per rank)"));
        }
      }
      active.push_back(f);
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan::internal
