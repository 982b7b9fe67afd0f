// Stacking alike tensors (plan_stacking.h): finding the groups and building
// the stacked sides. The rewrite back is plan_unstack.cc.
#include <algorithm>
#include <limits>
#include <memory>

#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "controller/plan/plan_stacking.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan {
namespace {

using planner_detail::kMaxDims;
using planner_detail::MapEntry;
using planner_detail::Work;

// The geometry of a tensor's fragments: what must be equal between members
// (rank, box, strides, partial group), not where they lie.
bool SameGeometry(const CompiledTensor& a, const CompiledTensor& b) {
  if (a.dtype != b.dtype || a.shape != b.shape) return false;
  if (a.SharesFragmentsWith(b)) return true;
  if (a.num_fragments() != b.num_fragments()) return false;
  for (size_t f = 0; f < a.num_fragments(); ++f) {
    const CompiledFragment& x = a.fragment(f);
    const CompiledFragment& y = b.fragment(f);
    if (x.rank != y.rank || x.box != y.box || x.strides != y.strides ||
        x.partial_group != y.partial_group) {
      return false;
    }
  }
  return true;
}

class GeometryHasher {
 public:
  uint64_t Of(const CompiledTensor& t) {
    const std::vector<CompiledFragment>* key = &t.fragments();
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    size_t h = absl::HashOf(t.num_fragments());
    for (const CompiledFragment& f : t.fragments()) {
      h = absl::HashOf(h, f.rank, f.box.offset, f.box.length, f.strides, f.partial_group);
    }
    cache_.emplace(key, h);
    return h;
  }

 private:
  absl::flat_hash_map<const std::vector<CompiledFragment>*, uint64_t> cache_;
};

bool HasPartials(const CompiledTensor& t) {
  for (const CompiledFragment& f : t.fragments()) {
    if (f.partial_group != 0) return true;
  }
  return false;
}

// A member's byte span in fragment f's buffer, plus one element (elements).
absl::StatusOr<int64_t> MemberStrideElems(const CompiledFragment& f) {
  int64_t span = 1;
  for (int d = 0; d < f.box.rank(); ++d) {
    if (f.box.length[d] == 0) return 1;
    if (f.strides[d] < 0) return absl::InvalidArgumentError("negative stride");
    span += (f.box.length[d] - 1) * f.strides[d];
  }
  return span + 1;
}

class Stacker {
 public:
  Stacker(const v1::TransferSpec& spec, const CompiledSide& src, const CompiledSide& dst,
          const Work& w, StackedSides* out)
      : spec_(spec), src_(src), dst_(dst), w_(w), out_(out) {}

  absl::Status Run(int min_members);

 private:
  bool StackableDst(int32_t t) const;
  std::string DstKey(int32_t t);
  bool SameAsFirst(const std::vector<int32_t>& group, int32_t t) const;
  int32_t NameBlock(bool tensors, v1::BufferSide side, std::vector<int32_t> index);
  absl::StatusOr<CompiledTensor> StackTensor(const std::vector<const CompiledTensor*>& members,
                                             const std::string& name, v1::BufferSide side,
                                             CompiledSide* into);
  absl::Status AddGroup(const std::vector<int32_t>& members);
  void BuildSides(const std::vector<bool>& stacked_dst);

  const v1::TransferSpec& spec_;
  const CompiledSide& src_;
  const CompiledSide& dst_;
  const Work& w_;
  StackedSides* out_;
  GeometryHasher hasher_;
  absl::flat_hash_map<std::string, int32_t> blocks_;
  std::vector<CompiledTensor> stacked_src_, stacked_dst_;
  std::vector<v1::TensorMapping> stacked_maps_;
};

bool Stacker::StackableDst(int32_t t) const {
  const CompiledTensor& d = dst_.tensors[t];
  if (d.quantized() || d.scales_for >= 0 || HasPartials(d)) return false;
  if (d.shape.size() + 1 > static_cast<size_t>(kMaxDims)) return false;
  if (w_.maps_of_dst[t].empty()) return false;
  for (int32_t e : w_.maps_of_dst[t]) {
    const MapEntry& m = w_.maps[e];
    if (m.src_rank != m.dst_rank || HasPartials(src_.tensors[m.src_tensor])) return false;
  }
  return true;
}

std::string Stacker::DstKey(int32_t t) {
  const CompiledTensor& d = dst_.tensors[t];
  std::string key = absl::StrCat(d.dtype, "|", hasher_.Of(d), "|");
  for (int64_t s : d.shape) absl::StrAppend(&key, s, ",");
  for (int32_t e : w_.maps_of_dst[t]) {
    const MapEntry& m = w_.maps[e];
    const CompiledTensor& s = src_.tensors[m.src_tensor];
    absl::StrAppend(&key, "|", s.dtype, ":", hasher_.Of(s), ":");
    for (int64_t v : s.shape) absl::StrAppend(&key, v, ",");
    for (int64_t v : m.src_offset) absl::StrAppend(&key, v, ",");
    for (int64_t v : m.src_length) absl::StrAppend(&key, v, ",");
    for (int64_t v : m.dst_offset) absl::StrAppend(&key, v, ",");
  }
  return key;
}

// Equal geometry with the group's first member, on both sides (the key is a
// hash of it).
bool Stacker::SameAsFirst(const std::vector<int32_t>& group, int32_t t) const {
  const int32_t first = group.front();
  if (!SameGeometry(dst_.tensors[first], dst_.tensors[t])) return false;
  const std::vector<int32_t>& a = w_.maps_of_dst[first];
  const std::vector<int32_t>& b = w_.maps_of_dst[t];
  if (a.size() != b.size()) return false;
  for (size_t j = 0; j < a.size(); ++j) {
    const MapEntry& x = w_.maps[a[j]];
    const MapEntry& y = w_.maps[b[j]];
    if (x.src_offset != y.src_offset || x.src_length != y.src_length ||
        x.dst_offset != y.dst_offset ||
        !SameGeometry(src_.tensors[x.src_tensor], src_.tensors[y.src_tensor])) {
      return false;
    }
  }
  return true;
}

int32_t Stacker::NameBlock(bool tensors, v1::BufferSide side, std::vector<int32_t> index) {
  std::string key(reinterpret_cast<const char*>(index.data()), index.size() * sizeof(int32_t));
  absl::StrAppend(&key, tensors ? "t" : "b", static_cast<int>(side));
  auto [it, inserted] = blocks_.emplace(std::move(key), out_->name_blocks.size());
  if (inserted) out_->name_blocks.push_back({tensors, side, std::move(index)});
  return it->second;
}

// The stacked tensor of `members` (alike), its fragments in virtual buffers
// appended to into->buffer_names and described in out_'s buffer table.
absl::StatusOr<CompiledTensor> Stacker::StackTensor(
    const std::vector<const CompiledTensor*>& members, const std::string& name,
    v1::BufferSide side, CompiledSide* into) {
  const CompiledTensor& first = *members.front();
  const int64_t m = static_cast<int64_t>(members.size());
  const int64_t elem = DTypeSize(first.dtype);
  auto frags = std::make_shared<std::vector<CompiledFragment>>();
  frags->reserve(first.num_fragments());
  auto& table = side == v1::SOURCE_BUFFER ? out_->src_buffers : out_->dst_buffers;
  for (size_t f = 0; f < first.num_fragments(); ++f) {
    const CompiledFragment& tf = first.fragment(f);
    ASSIGN_OR_RETURN(const int64_t stride, MemberStrideElems(tf));
    if (stride > std::numeric_limits<int64_t>::max() / 4 / m / elem) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": stacked buffer too large"));
    }
    const std::string vbuf = absl::StrCat(name, "#", f);
    CompiledFragment vf;
    vf.rank = tf.rank;
    vf.box.offset.push_back(0);
    vf.box.length.push_back(m);
    vf.box.offset.insert(vf.box.offset.end(), tf.box.offset.begin(), tf.box.offset.end());
    vf.box.length.insert(vf.box.length.end(), tf.box.length.begin(), tf.box.length.end());
    vf.own_buffer = static_cast<int32_t>(into->buffer_names.size());
    vf.byte_offset = 0;
    vf.strides.push_back(stride);
    vf.strides.insert(vf.strides.end(), tf.strides.begin(), tf.strides.end());
    into->buffer_names.push_back(vbuf);
    frags->push_back(std::move(vf));

    VirtualBuffer vb;
    vb.member_bytes = stride * elem;
    std::vector<int32_t> buffers(m);
    std::vector<int64_t> offsets(m);
    bool arithmetic = true;
    for (int64_t i = 0; i < m; ++i) {
      const CompiledFragment& mf = members[i]->fragment(f);
      buffers[i] = members[i]->buffer(mf);
      offsets[i] = mf.byte_offset;
      if (i >= 2 && offsets[i] - offsets[i - 1] != offsets[1] - offsets[0]) arithmetic = false;
    }
    vb.names = NameBlock(false, side, std::move(buffers));
    vb.offset_base = offsets[0];
    if (arithmetic) {
      vb.offset_step = m > 1 ? offsets[1] - offsets[0] : 0;
    } else {
      vb.offsets = std::move(offsets);
    }
    table.emplace(vbuf, std::move(vb));
  }
  CompiledTensor t;
  t.name = name;
  t.dtype = first.dtype;
  t.shape.push_back(m);
  t.shape.insert(t.shape.end(), first.shape.begin(), first.shape.end());
  t.SetFragments(std::move(frags), kTensorBuffer);
  return t;
}

absl::Status Stacker::AddGroup(const std::vector<int32_t>& members) {
  const int32_t g = out_->groups++;
  out_->members += static_cast<int64_t>(members.size());
  std::vector<const CompiledTensor*> dsts;
  for (int32_t t : members) dsts.push_back(&dst_.tensors[t]);
  const std::string dname = absl::StrCat(kStackPrefix, "d", g);
  ASSIGN_OR_RETURN(CompiledTensor vd,
                   StackTensor(dsts, dname, v1::DESTINATION_BUFFER, &out_->dst));
  stacked_dst_.push_back(std::move(vd));
  const std::vector<int32_t>& entries = w_.maps_of_dst[members.front()];
  for (size_t j = 0; j < entries.size(); ++j) {
    std::vector<const CompiledTensor*> srcs;
    std::vector<int32_t> src_index;
    for (int32_t t : members) {
      const int32_t s = w_.maps[w_.maps_of_dst[t][j]].src_tensor;
      srcs.push_back(&src_.tensors[s]);
      src_index.push_back(s);
    }
    const std::string sname = absl::StrCat(kStackPrefix, "s", g, ".", j);
    ASSIGN_OR_RETURN(CompiledTensor vs, StackTensor(srcs, sname, v1::SOURCE_BUFFER, &out_->src));
    stacked_src_.push_back(std::move(vs));
    out_->tensor_names.emplace(sname,
                               NameBlock(true, v1::SOURCE_BUFFER, std::move(src_index)));
    const MapEntry& e = w_.maps[entries[j]];
    v1::TensorMapping& map = stacked_maps_.emplace_back();
    map.set_dst(dname);
    map.set_src(sname);
    map.add_dst_offset(0);
    for (int64_t v : e.dst_offset) map.add_dst_offset(v);
    map.mutable_src_box()->add_offset(0);
    map.mutable_src_box()->add_length(static_cast<int64_t>(members.size()));
    for (size_t d = 0; d < e.src_offset.size(); ++d) {
      map.mutable_src_box()->add_offset(e.src_offset[d]);
      map.mutable_src_box()->add_length(e.src_length[d]);
    }
  }
  return absl::OkStatus();
}

// Copies `side`'s kept tensors (in order), then `extra`, into `into`
// (whose buffer_names already holds the side's and the virtual buffers),
// translating scale tensor links.
void CopyTensors(const CompiledSide& side, const std::vector<bool>& keep,
                 std::vector<CompiledTensor> extra, CompiledSide* into) {
  std::vector<int32_t> index(side.tensors.size(), -1);
  for (size_t t = 0; t < side.tensors.size(); ++t) {
    if (!keep[t]) continue;
    index[t] = static_cast<int32_t>(into->tensors.size());
    into->tensors.push_back(side.tensors[t]);
  }
  for (CompiledTensor& t : into->tensors) {
    if (t.scale_tensor >= 0) t.scale_tensor = index[t.scale_tensor];
    if (t.scales_for >= 0) t.scales_for = index[t.scales_for];
  }
  for (CompiledTensor& t : extra) into->tensors.push_back(std::move(t));
  into->tensor_index.reserve(into->tensors.size());
  for (size_t t = 0; t < into->tensors.size(); ++t) {
    into->tensor_index.emplace(into->tensors[t].name, static_cast<int32_t>(t));
  }
}

void Stacker::BuildSides(const std::vector<bool>& stacked_dst) {
  std::vector<bool> keep_src(src_.tensors.size(), false);
  std::vector<bool> keep_dst(dst_.tensors.size(), false);
  for (size_t t = 0; t < dst_.tensors.size(); ++t) {
    if (stacked_dst[t]) continue;
    keep_dst[t] = true;
    for (int32_t e : w_.maps_of_dst[t]) keep_src[w_.maps[e].src_tensor] = true;
  }
  CopyTensors(src_, keep_src, std::move(stacked_src_), &out_->src);
  CopyTensors(dst_, keep_dst, std::move(stacked_dst_), &out_->dst);
  *out_->spec.mutable_options() = spec_.options();
  for (const v1::TensorMapping& m : spec_.mappings()) {
    auto it = dst_.tensor_index.find(m.dst());
    if (it != dst_.tensor_index.end() && stacked_dst[it->second]) continue;
    *out_->spec.add_mappings() = m;
  }
  for (v1::TensorMapping& m : stacked_maps_) *out_->spec.add_mappings() = std::move(m);
}

bool UsesPrefix(const CompiledSide& side) {
  for (const CompiledTensor& t : side.tensors) {
    if (absl::StartsWith(t.name, kStackPrefix)) return true;
  }
  for (const std::string& b : side.buffer_names) {
    if (absl::StartsWith(b, kStackPrefix)) return true;
  }
  return false;
}

absl::Status Stacker::Run(int min_members) {
  // Groups by key, in destination order; members checked against the first.
  absl::flat_hash_map<std::string, int32_t> group_of;
  std::vector<std::vector<int32_t>> groups;
  for (int32_t t = 0; t < static_cast<int32_t>(dst_.tensors.size()); ++t) {
    if (!StackableDst(t)) continue;
    auto [it, inserted] = group_of.emplace(DstKey(t), static_cast<int32_t>(groups.size()));
    if (inserted) groups.emplace_back();
    std::vector<int32_t>& g = groups[it->second];
    if (g.empty() || SameAsFirst(g, t)) g.push_back(t);
  }
  for (auto [from, to] : {std::pair(&src_, &out_->src), std::pair(&dst_, &out_->dst)}) {
    to->name = from->name;
    to->workers = from->workers;
    to->nodes = from->nodes;
    to->buffer_names = from->buffer_names;
  }
  std::vector<bool> stacked_dst(dst_.tensors.size(), false);
  for (std::vector<int32_t>& g : groups) {
    if (static_cast<int>(g.size()) < std::max(2, min_members)) continue;
    // Members by their first fragment's byte offset: the members of one
    // buffer offset (the same expert slot of each layer's stacked buffer)
    // are then neighbours, and runs cover them all.
    auto offset = [&](int32_t t) {
      const CompiledTensor& d = dst_.tensors[t];
      return d.num_fragments() == 0 ? int64_t{0} : d.fragment(0).byte_offset;
    };
    std::stable_sort(g.begin(), g.end(),
                     [&](int32_t a, int32_t b) { return offset(a) < offset(b); });
    RETURN_IF_ERROR(AddGroup(g));
    for (int32_t t : g) stacked_dst[t] = true;
  }
  if (out_->groups > 0) BuildSides(stacked_dst);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StackedSides> StackSides(const v1::TransferSpec& spec, const CompiledSide& source,
                                        const CompiledSide& destination, int min_members) {
  Work w;
  w.spec = &spec;
  w.src = &source;
  w.dst = &destination;
  RETURN_IF_ERROR(planner_detail::ResolveOptions(spec.options(), &w.opt));
  RETURN_IF_ERROR(planner_detail::IndexWorkers(&w));
  RETURN_IF_ERROR(planner_detail::ValidateAndMap(&w));
  StackedSides out;
  if (UsesPrefix(source) || UsesPrefix(destination)) return out;
  RETURN_IF_ERROR(Stacker(spec, source, destination, w, &out).Run(min_members));
  return out;
}

}  // namespace wsync::plan
