#include "catalog/vllm_hf.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "catalog/sides.h"
#include "catalog/vllm_fp8.h"
#include "common/status_macros.h"

namespace wsync::catalog {
namespace {

// "x.weight" -> "x.bias".
std::string BiasName(absl::string_view weight) {
  absl::ConsumeSuffix(&weight, ".weight");
  return absl::StrCat(weight, ".bias");
}

// Keeps dim 0 of a box / offset list.
template <typename Repeated>
void KeepFirst(Repeated* values) {
  values->Truncate(std::min(values->size(), 1));
}

// The fused qkv bias of every layer, derived from the fused weight's layout:
// the same rows of the same sources, without the hidden dim.
void AddQkvBiases(BuiltGroup* group) {
  BuiltGroup biases;
  for (const v1::TensorLayout& t : group->tensors) {
    if (!absl::EndsWith(t.name(), "qkv_proj.weight")) continue;
    v1::TensorLayout b = t;
    b.set_name(BiasName(t.name()));
    KeepFirst(b.mutable_shape());
    for (v1::Fragment& f : *b.mutable_fragments()->mutable_fragments()) {
      f.set_buffer(BiasName(f.buffer()));
      KeepFirst(f.mutable_box()->mutable_offset());
      KeepFirst(f.mutable_box()->mutable_length());
    }
    biases.tensors.push_back(std::move(b));
    for (const v1::TensorMapping& m : group->mappings) {
      if (m.dst() != t.name()) continue;
      v1::TensorMapping bm = m;
      bm.set_dst(BiasName(m.dst()));
      bm.set_src(BiasName(m.src()));
      KeepFirst(bm.mutable_dst_offset());
      KeepFirst(bm.mutable_src_box()->mutable_offset());
      KeepFirst(bm.mutable_src_box()->mutable_length());
      biases.mappings.push_back(std::move(bm));
    }
  }
  group->Append(std::move(biases));
}

void DropTensor(BuiltGroup* group, const std::string& name) {
  auto& t = group->tensors;
  t.erase(std::remove_if(t.begin(), t.end(),
                         [&](const v1::TensorLayout& l) { return l.name() == name; }),
          t.end());
  auto& m = group->mappings;
  m.erase(std::remove_if(m.begin(), m.end(),
                         [&](const v1::TensorMapping& x) { return x.dst() == name; }),
          m.end());
}

}  // namespace

absl::StatusOr<BuiltGroup> BuildVllmTensorsForHf(const ModelConfig& model, const HfExtras& extras,
                                                 ExpertStyle source_style, const VllmGroup& group,
                                                 v1::DType dtype) {
  if (extras.qkv_bias && model.attention != Attention::kGqa) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.name, ": qkv biases need GQA attention (MLA has none)"));
  }
  ASSIGN_OR_RETURN(BuiltGroup out, BuildVllmTensors(model, source_style, group, dtype));
  if (extras.qkv_bias) AddQkvBiases(&out);
  if (extras.tie_word_embeddings) DropTensor(&out, "lm_head.weight");
  if (extras.fp8_block) RETURN_IF_ERROR(QuantizeLinearWeightsBlockFp8(&out));
  return out;
}

}  // namespace wsync::catalog
