#include "catalog/case.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "catalog/vllm_fp8.h"
#include "common/status_macros.h"

namespace wsync::catalog {
namespace {

absl::StatusOr<int64_t> PositiveInt(absl::string_view text, absl::string_view what,
                                    absl::string_view whole) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < 1 || v > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", what, " '", text, "' in '", whole, "': expected a positive integer"));
  }
  return v;
}

// "AxB" -> {A, B}; "A" -> {A, 1}.
absl::StatusOr<std::pair<int64_t, int64_t>> Pair(absl::string_view text, absl::string_view what,
                                                 absl::string_view whole) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, 'x');
  if (parts.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", what, " '", text, "' in '", whole, "'"));
  }
  ASSIGN_OR_RETURN(int64_t a, PositiveInt(parts[0], what, whole));
  int64_t b = 1;
  if (parts.size() == 2) {
    ASSIGN_OR_RETURN(b, PositiveInt(parts[1], what, whole));
  }
  return std::make_pair(a, b);
}

std::string NodeName(int64_t index) { return absl::StrCat("node", index); }

}  // namespace

absl::StatusOr<TrainerParallel> ParseSource(absl::string_view text) {
  const std::string usage = "expected fsdp:N, hsdp:RxN or megatron:tpA,ppB,dpC[,epD]";
  TrainerParallel p;
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "fsdp:")) {
    ASSIGN_OR_RETURN(p.shards, PositiveInt(rest, "fsdp shard count", text));
    return p;
  }
  if (absl::ConsumePrefix(&rest, "hsdp:")) {
    std::vector<absl::string_view> parts = absl::StrSplit(rest, 'x');
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("bad source '", text, "': ", usage));
    }
    ASSIGN_OR_RETURN(p.replicas, PositiveInt(parts[0], "hsdp replica count", text));
    ASSIGN_OR_RETURN(p.shards, PositiveInt(parts[1], "hsdp shard count", text));
    return p;
  }
  if (absl::ConsumePrefix(&rest, "megatron:")) {
    p.kind = TrainerParallel::Kind::kMegatron;
    std::vector<const int64_t*> seen;
    for (absl::string_view f : absl::StrSplit(rest, ',')) {
      int64_t* slot = nullptr;
      absl::string_view value = f;
      if (absl::ConsumePrefix(&value, "tp"))
        slot = &p.tp;
      else if (absl::ConsumePrefix(&value, "pp"))
        slot = &p.pp;
      else if (absl::ConsumePrefix(&value, "dp"))
        slot = &p.dp;
      else if (absl::ConsumePrefix(&value, "ep"))
        slot = &p.ep;
      if (slot == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad megatron factor '", f, "' in '", text, "': ", usage));
      }
      if (std::find(seen.begin(), seen.end(), slot) != seen.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("megatron factor '", f, "' given twice in '", text, "'"));
      }
      seen.push_back(slot);
      ASSIGN_OR_RETURN(*slot, PositiveInt(value, "megatron factor", text));
    }
    return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("bad source '", text, "': ", usage));
}

absl::StatusOr<VllmGroup> ParseDestination(absl::string_view text) {
  absl::string_view rest = text;
  if (!absl::ConsumePrefix(&rest, "vllm-tp:")) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad destination '", text, "': expected vllm-tp:T[xR][,ep]"));
  }
  VllmGroup g;
  if (absl::ConsumeSuffix(&rest, ",ep")) g.expert_parallel = true;
  ASSIGN_OR_RETURN(auto tp_r, Pair(rest, "vllm tp x replicas", text));
  g.tp = tp_r.first;
  g.replicas = tp_r.second;
  return g;
}

absl::StatusOr<ExpertStyle> ParseExpertStyle(absl::string_view text) {
  if (text == "separate") return ExpertStyle::kSeparate;
  if (text == "stacked") return ExpertStyle::kStacked;
  return absl::InvalidArgumentError(
      absl::StrCat("bad expert style '", text, "': expected separate or stacked"));
}

absl::StatusOr<CaseOptions> ParseCase(absl::string_view model, absl::string_view source,
                                      absl::string_view destination, absl::string_view experts) {
  CaseOptions o;
  o.model = std::string(model);
  auto s = ParseSource(source);
  if (!s.ok()) return s.status();
  auto d = ParseDestination(destination);
  if (!d.ok()) return d.status();
  o.source = *s;
  o.destination = *d;
  if (!experts.empty()) {
    auto e = ParseExpertStyle(experts);
    if (!e.ok()) return e.status();
    o.expert_style = *e;
    o.expert_style_set = true;
  }
  return o;
}

std::string SourceToString(const TrainerParallel& p) {
  if (p.kind == TrainerParallel::Kind::kMegatron) {
    std::string s = absl::StrCat("megatron:tp", p.tp, ",pp", p.pp, ",dp", p.dp);
    if (p.ep > 1) absl::StrAppend(&s, ",ep", p.ep);
    return s;
  }
  if (p.replicas > 1) return absl::StrCat("hsdp:", p.replicas, "x", p.shards);
  return absl::StrCat("fsdp:", p.shards);
}

std::string DestinationToString(const VllmGroup& g) {
  return absl::StrCat("vllm-tp:", g.tp, "x", g.replicas, g.expert_parallel ? ",ep" : "");
}

v1::LinkModel DefaultLinkModel() {
  v1::LinkModel m;
  m.set_nvlink_bytes_per_second(370e9);
  m.set_nic_bytes_per_second(50e9);
  m.set_local_copy_bytes_per_second(2e12);
  m.set_round_latency_seconds(50e-6);
  return m;
}

absl::StatusOr<v1::TransferSpec> BuildCase(const CaseOptions& o) {
  ASSIGN_OR_RETURN(ModelConfig model, FindModel(o.model));
  if (o.gpus_per_node < 1) {
    return absl::InvalidArgumentError("gpus per node must be >= 1");
  }
  if (o.inference_dtype != v1::BF16 && o.inference_dtype != v1::FP16 &&
      o.inference_dtype != v1::FP32) {
    return absl::InvalidArgumentError(
        "inference dtype must be bf16, fp16 or fp32 (for block fp8 serving add --fp8-block)");
  }
  if (o.trainer_dtype != v1::BF16 && o.trainer_dtype != v1::FP32 && o.trainer_dtype != v1::FP16) {
    return absl::InvalidArgumentError("trainer dtype must be fp32, bf16 or fp16");
  }
  const ExpertStyle style = o.expert_style_set ? o.expert_style
                            : o.source.kind == TrainerParallel::Kind::kMegatron
                                ? ExpertStyle::kStacked
                                : ExpertStyle::kSeparate;
  v1::TransferSpec spec;
  spec.set_name(absl::StrCat(model.name, " ", SourceToString(o.source), " to ",
                             DestinationToString(o.destination), o.colocated ? " colocated" : "",
                             o.fp8_block ? " fp8-block" : ""));
  const int64_t S = o.source.NumRanks();
  const int64_t D = o.destination.tp * o.destination.replicas;
  constexpr int64_t kMaxRanks = 1 << 16;
  if (S > kMaxRanks || D > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("case has ", S, " trainer and ", D,
                                                   " inference ranks; at most ", kMaxRanks,
                                                   " per side are supported"));
  }
  const int64_t G = o.gpus_per_node;
  v1::Side* src = spec.mutable_source();
  src->set_name("trainer");
  for (int64_t i = 0; i < S; ++i) {
    v1::RankInfo* r = src->add_ranks();
    r->set_worker(static_cast<int32_t>(i));
    r->set_node(NodeName(i / G));
  }
  ASSIGN_OR_RETURN(std::vector<v1::TensorLayout> trainer,
                   BuildTrainerTensors(model, style, o.source, o.trainer_dtype));
  for (v1::TensorLayout& t : trainer) *src->add_tensors() = std::move(t);

  v1::Side* dst = spec.mutable_destination();
  dst->set_name("vllm");
  const int64_t first_node = (S + G - 1) / G;
  for (int64_t j = 0; j < D; ++j) {
    v1::RankInfo* r = dst->add_ranks();
    // Colocated ranks beyond the trainer's get fresh workers on fresh nodes.
    const bool shared = o.colocated && j < S;
    const int64_t worker = shared ? j : S + j;
    r->set_worker(static_cast<int32_t>(worker));
    r->set_node(NodeName(shared ? j / G : (o.colocated ? worker / G : first_node + j / G)));
  }
  ASSIGN_OR_RETURN(BuiltGroup vllm,
                   BuildVllmTensors(model, style, o.destination, o.inference_dtype));
  if (o.fp8_block) RETURN_IF_ERROR(QuantizeLinearWeightsBlockFp8(&vllm));
  for (v1::TensorLayout& t : vllm.tensors) *dst->add_tensors() = std::move(t);
  for (v1::TensorMapping& m : vllm.mappings) *spec.add_mappings() = std::move(m);

  v1::PlanOptions* opt = spec.mutable_options();
  if (o.trainer_dtype != o.inference_dtype) {
    v1::Cast* c = opt->add_allowed_casts();
    c->set_from(o.trainer_dtype);
    c->set_to(o.inference_dtype);
  }
  *opt->mutable_link_model() = DefaultLinkModel();
  return spec;
}

}  // namespace wsync::catalog
