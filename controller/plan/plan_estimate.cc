#include "controller/plan/plan_estimate.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "google/protobuf/repeated_field.h"

namespace wsync::plan {
namespace {

constexpr int64_t kCap = std::numeric_limits<int64_t>::max() / 4;

// off + len, saturated (both >= 0).
int64_t End(int64_t off, int64_t len) {
  return len > std::numeric_limits<int64_t>::max() - off ? std::numeric_limits<int64_t>::max()
                                                         : off + len;
}

int64_t SatMul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kCap / b ? kCap : a * b;
}

// Per tensor dim, the parts it is cut into (1: whole), for mesh layouts in
// the closed form (Replicate, at most one Shard per tensor dim, a mesh that
// matches its rank list); false otherwise.
bool ShardParts(const v1::TensorLayout& t, std::vector<int64_t>* parts) {
  parts->assign(t.shape_size(), 1);
  if (t.layout_case() != v1::TensorLayout::kMesh) return false;
  const v1::MeshLayout& m = t.mesh();
  if (m.mesh_shape_size() != m.placements_size()) return false;
  int64_t coords = 1;
  for (int64_t d : m.mesh_shape()) {
    if (d < 1) return false;
    coords = SatMul(coords, d);
  }
  if (coords != m.ranks_size()) return false;
  for (int i = 0; i < m.placements_size(); ++i) {
    const v1::Placement& p = m.placements(i);
    if (p.kind_case() == v1::Placement::kReplicate) continue;
    if (p.kind_case() != v1::Placement::kShard) return false;
    const int32_t dim = p.shard().dim();
    if (dim < 0 || dim >= t.shape_size() || (*parts)[dim] != 1) return false;
    (*parts)[dim] = m.mesh_shape(i);
  }
  return true;
}

// torch.chunk of a dim of size n into `parts`: how many non-empty chunks
// meet [lo, lo + len) (len >= 0, 0 <= lo <= n).
int64_t ChunksMeeting(int64_t n, int64_t parts, int64_t lo, int64_t len) {
  const int64_t hi = len > n - lo ? n : lo + len;
  if (hi <= lo) return 0;
  const int64_t chunk = n / parts + (n % parts != 0 ? 1 : 0);
  return (hi - 1) / chunk - lo / chunk + 1;
}

// Distinct shards of source tensor `t` that meet the region (off, len).
template <typename Dims>
int64_t ShardsMeeting(const v1::TensorLayout& t, const Dims& off, const Dims& len,
                      std::vector<int64_t>* parts) {
  const int ndim = t.shape_size();
  if (static_cast<int>(off.size()) != ndim || static_cast<int>(len.size()) != ndim) return 0;
  for (int d = 0; d < ndim; ++d) {
    if (t.shape(d) < 0 || off[d] < 0 || len[d] < 0 || off[d] > t.shape(d)) return 0;
  }
  const bool closed = ShardParts(t, parts);
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    n = SatMul(n, ChunksMeeting(t.shape(d), closed ? (*parts)[d] : 1, off[d], len[d]));
  }
  return closed ? n : std::min<int64_t>(n, 1);
}

// One source region a mapping reads, and where it lands (destination
// coordinates: the leading destination dims beyond the source's are fixed).
struct Region {
  const v1::TensorLayout* src = nullptr;
  std::vector<int64_t> src_off, src_len;  // source rank
  std::vector<int64_t> dst_off, dst_len;  // destination rank
};

// Fills r's destination box from its source box (SrcToDst's rule); false
// when the ranks cannot translate (validation rejects such a mapping).
bool PlaceRegion(const google::protobuf::RepeatedField<int64_t>& dst_offset,
                 const v1::TensorLayout& dst, Region* r) {
  const int src_rank = static_cast<int>(r->src_off.size());
  const int dst_rank = dst.shape_size();
  if (dst_offset.size() != dst_rank || static_cast<int>(r->src_len.size()) != src_rank) {
    return false;
  }
  const int n = std::min(src_rank, dst_rank);
  r->dst_off.assign(dst_offset.begin(), dst_offset.end());
  r->dst_len.assign(dst_rank, 1);
  for (int k = 0; k < n; ++k) r->dst_len[dst_rank - n + k] = r->src_len[src_rank - n + k];
  for (int d = 0; d < dst_rank; ++d) {
    if (r->dst_off[d] < 0 || r->dst_len[d] < 0 ||
        End(r->dst_off[d], r->dst_len[d]) > dst.shape(d)) {
      return false;
    }
  }
  return true;
}

// Shards of r's source tensor meeting the part of r that destination box
// (off, len) holds.
int64_t ShardsMeetingHeld(const Region& r, const google::protobuf::RepeatedField<int64_t>& off,
                          const google::protobuf::RepeatedField<int64_t>& len,
                          std::vector<int64_t>* so, std::vector<int64_t>* sl,
                          std::vector<int64_t>* parts) {
  const int dr = static_cast<int>(r.dst_off.size());
  const int sr = static_cast<int>(r.src_off.size());
  if (off.size() != dr || len.size() != dr) return 0;
  for (int d = 0; d < dr; ++d) {
    if (off[d] < 0 || len[d] < 0) return 0;
  }
  for (int d = 0; d < dr; ++d) {  // most fragments miss most regions: test first
    if (std::min(End(off[d], len[d]), End(r.dst_off[d], r.dst_len[d])) <=
        std::max(off[d], r.dst_off[d])) {
      return 0;
    }
  }
  const int n = std::min(sr, dr);
  *so = r.src_off;
  *sl = r.src_len;
  for (int d = 0; d < dr; ++d) {
    const int64_t lo = std::max(off[d], r.dst_off[d]);
    const int64_t hi = std::min(End(off[d], len[d]), End(r.dst_off[d], r.dst_len[d]));
    const int k = d - (dr - n);
    if (k < 0) continue;  // a fixed leading destination dim
    (*so)[sr - n + k] = r.src_off[sr - n + k] + (lo - r.dst_off[d]);
    (*sl)[sr - n + k] = hi - lo;
  }
  return ShardsMeeting(*r.src, *so, *sl, parts);
}

}  // namespace

int64_t MinPiecesFromSpec(const v1::TransferSpec& spec) {
  absl::flat_hash_map<std::string_view, const v1::TensorLayout*> sources;
  for (const v1::TensorLayout& t : spec.source().tensors()) sources.emplace(t.name(), &t);
  absl::flat_hash_map<std::string_view, int> dst_index;
  for (int i = 0; i < spec.destination().tensors_size(); ++i) {
    dst_index.emplace(spec.destination().tensors(i).name(), i);
  }
  std::vector<std::vector<Region>> regions(spec.destination().tensors_size());
  for (const v1::TensorMapping& m : spec.mappings()) {
    auto s = sources.find(m.src());
    auto d = dst_index.find(m.dst());
    if (s == sources.end() || d == dst_index.end()) continue;
    Region r;
    r.src = s->second;
    r.src_off.assign(m.src_box().offset().begin(), m.src_box().offset().end());
    r.src_len.assign(m.src_box().length().begin(), m.src_box().length().end());
    const v1::TensorLayout& dt = spec.destination().tensors(d->second);
    if (PlaceRegion(m.dst_offset(), dt, &r)) {
      regions[d->second].push_back(std::move(r));
    }
  }
  // Scale tensors of block fp8 destinations are written by quantization.
  absl::flat_hash_set<std::string_view> scales;
  for (const v1::TensorLayout& t : spec.destination().tensors()) {
    if (t.has_block_quantization()) scales.insert(t.block_quantization().scale_tensor());
  }
  std::vector<int64_t> parts, so, sl;
  int64_t total = 0;
  int64_t budget = kMinPiecesWorkBudget;
  for (int i = 0; i < spec.destination().tensors_size(); ++i) {
    const v1::TensorLayout& dt = spec.destination().tensors(i);
    std::vector<Region>& rs = regions[i];
    if (rs.empty() && !scales.contains(dt.name())) {  // fed whole by its namesake
      auto s = sources.find(dt.name());
      if (s == sources.end()) continue;
      Region r;
      r.src = s->second;
      r.src_off.assign(s->second->shape_size(), 0);
      r.src_len.assign(s->second->shape().begin(), s->second->shape().end());
      google::protobuf::RepeatedField<int64_t> zero;
      zero.Resize(dt.shape_size(), 0);
      if (PlaceRegion(zero, dt, &r)) rs.push_back(std::move(r));
    }
    // Explicit tensors cost fragments x regions: within the budget, or
    // skipped (counted as nothing, which still bounds).
    const bool explicit_dst = dt.layout_case() != v1::TensorLayout::kMesh;
    if (explicit_dst) {
      const int64_t cost = SatMul(dt.fragments().fragments_size(), rs.size());
      if (cost > budget) continue;
      budget -= cost;
    }
    for (const Region& r : rs) {
      int64_t n = 0;
      if (!explicit_dst) {
        n = ShardsMeeting(*r.src, r.src_off, r.src_len, &parts);  // every element is held
      } else {
        // Explicit fragments may leave elements unheld: the most shards any
        // one fragment's part of the region meets.
        for (const v1::Fragment& f : dt.fragments().fragments()) {
          n = std::max(n,
                       ShardsMeetingHeld(r, f.box().offset(), f.box().length(), &so, &sl, &parts));
        }
      }
      total = std::min(kCap, total + n);
    }
  }
  return total;
}

}  // namespace wsync::plan
