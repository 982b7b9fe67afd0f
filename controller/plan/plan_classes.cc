#include "controller/plan/plan_classes.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace wsync::plan::planner_detail {
namespace {

// Interns signatures (flat int64 encodings) as dense class ids.
class Interner {
 public:
  int32_t Intern(std::vector<int64_t>* key) {
    auto [it, inserted] = ids_.try_emplace(std::move(*key), static_cast<int32_t>(ids_.size()));
    key->clear();
    return it->second;
  }
  int32_t size() const { return static_cast<int32_t>(ids_.size()); }

 private:
  absl::flat_hash_map<std::vector<int64_t>, int32_t> ids_;
};

void PutBox(const BoxArena& boxes, int32_t id, std::vector<int64_t>* key) {
  const int rank = boxes.rank(id);
  key->push_back(rank);
  key->insert(key->end(), boxes.offset(id), boxes.offset(id) + rank);
  key->insert(key->end(), boxes.length(id), boxes.length(id) + rank);
}

void PutHeader(DType dtype, const std::vector<int64_t>& shape, std::vector<int64_t>* key) {
  key->push_back(static_cast<int64_t>(dtype));
  key->push_back(static_cast<int64_t>(shape.size()));
  key->insert(key->end(), shape.begin(), shape.end());
}

void SourceClasses(const Work& w, TensorClasses* out) {
  const size_t n = w.src->tensors.size();
  out->src_class.assign(n, -1);
  out->hg_begin.assign(n, 0);
  out->hg_count.assign(n, 0);
  Interner classes;
  std::vector<int64_t> key;
  for (size_t t = 0; t < n; ++t) {
    const CompiledTensor& ct = w.src->tensors[t];
    const int32_t count = w.src_hg_count[t];
    const int32_t begin = count == 0 ? 0 : w.src_hg_begin[t];
    out->hg_begin[t] = begin;
    out->hg_count[t] = count;
    PutHeader(ct.dtype, ct.shape, &key);
    key.push_back(count);
    for (int32_t i = 0; i < count; ++i) {
      const HolderGroup& hg = w.holder_groups[begin + i];
      PutBox(w.boxes, hg.box, &key);
      key.push_back(hg.full_count > 0 ? 1 : 0);
      key.push_back(hg.part_count);
      for (int32_t p = 0; p < hg.part_count; ++p) {
        const PartialGroup& pg = w.partial_groups[w.holder_parts[hg.part_begin + p]];
        key.push_back(pg.frag_count);
        key.push_back(static_cast<int64_t>(pg.op));
      }
    }
    out->src_class[t] = classes.Intern(&key);
  }
  out->num_src_classes = classes.size();
}

void PutVector(const std::vector<int64_t>& v, std::vector<int64_t>* key) {
  key->insert(key->end(), v.begin(), v.end());
}

void DestinationClasses(const Work& w, TensorClasses* out) {
  const size_t n = w.dst->tensors.size();
  out->dst_class.assign(n, -1);
  out->group_begin.assign(n, 0);
  out->group_count.assign(n, 0);
  for (size_t g = 0; g < w.dst_groups.size(); ++g) {
    const int32_t t = w.dst_groups[g].dst_tensor;
    if (out->group_count[t]++ == 0) out->group_begin[t] = static_cast<int32_t>(g);
  }
  Interner classes;
  std::vector<int64_t> key;
  for (size_t t = 0; t < n; ++t) {
    if (out->group_count[t] == 0) continue;
    const CompiledTensor& ct = w.dst->tensors[t];
    PutHeader(ct.dtype, ct.shape, &key);
    key.push_back(ct.quantized() ? 1 : 0);
    key.push_back(ct.quant_block[0]);
    key.push_back(ct.quant_block[1]);
    key.push_back(out->group_count[t]);
    for (int32_t g = 0; g < out->group_count[t]; ++g) {
      const DstGroup& dg = w.dst_groups[out->group_begin[t] + g];
      const BoxNd& box = ct.fragment(dg.frag_begin).box;
      key.push_back(box.rank());
      key.insert(key.end(), box.offset.begin(), box.offset.end());
      key.insert(key.end(), box.length.begin(), box.length.end());
      key.push_back(dg.frag_count);
    }
    key.push_back(static_cast<int64_t>(w.maps_of_dst[t].size()));
    for (int32_t mid : w.maps_of_dst[t]) {
      const MapEntry& m = w.maps[mid];
      key.push_back(out->src_class[m.src_tensor]);
      key.push_back(m.src_rank);
      key.push_back(m.dst_rank);
      PutVector(m.src_offset, &key);
      PutVector(m.src_length, &key);
      PutVector(m.dst_offset, &key);
      PutVector(m.dst_length, &key);
    }
    out->dst_class[t] = classes.Intern(&key);
  }
  out->num_dst_classes = classes.size();
}

}  // namespace

TensorClasses FindTensorClasses(const Work& w) {
  TensorClasses out;
  SourceClasses(w, &out);
  DestinationClasses(w, &out);
  return out;
}

}  // namespace wsync::plan::planner_detail
