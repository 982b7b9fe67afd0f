#include "tools/case_flags.h"

#include "absl/strings/str_cat.h"
#include "catalog/case.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace wsync::tools {
namespace {

const char* const kValueFlags[] = {"model",         "source",        "destination",
                                   "gpus-per-node", "trainer-dtype", "inference-dtype",
                                   "experts"};

absl::Status FlagError(const std::string& flag, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--", flag, ": ", s.message()));
}

}  // namespace

void AddCaseFlags(FlagSpec* spec) {
  for (const char* f : kValueFlags) spec->value_flags.push_back(f);
  spec->bool_flags.push_back("colocated");
  spec->bool_flags.push_back("fp8-block");
}

bool HasCaseFlags(const Args& args) {
  for (const char* f : kValueFlags) {
    if (args.Has(f)) return true;
  }
  return args.Has("colocated") || args.Has("fp8-block");
}

std::string CaseFlagsUsage() {
  return absl::StrCat(
      "  --model NAME            one of: ", catalog::ModelNames(),
      "\n"
      "  --source S              fsdp:N | hsdp:RxN | megatron:tpA,ppB,dpC[,epD]\n"
      "  --destination D         vllm-tp:T[xR][,ep]  (R replicas of TP T; ep = experts over TP)\n"
      "  --gpus-per-node G       default 8\n"
      "  --colocated             inference rank i shares trainer rank i's GPU\n"
      "  --trainer-dtype T       fp32 | bf16 (default bf16)\n"
      "  --inference-dtype T     bf16 (default)\n"
      "  --fp8-block             vLLM fp8 serving: linear weights block-quantized to fp8 e4m3\n"
      "                          with an fp32 scale per 128x128 block (weight_scale_inv)\n"
      "  --experts S             separate (HF tensors) | stacked; default separate for\n"
      "                          fsdp/hsdp, stacked for megatron\n");
}

absl::StatusOr<v1::TransferSpec> SpecFromCaseFlags(const Args& args) {
  catalog::CaseOptions o;
  for (const char* required : {"model", "source", "destination"}) {
    if (!args.Has(required)) {
      return absl::InvalidArgumentError(absl::StrCat("--", required, " is required"));
    }
  }
  o.model = args.Value("model");
  auto source = catalog::ParseSource(args.Value("source"));
  if (!source.ok()) return FlagError("source", source.status());
  o.source = *source;
  auto dest = catalog::ParseDestination(args.Value("destination"));
  if (!dest.ok()) return FlagError("destination", dest.status());
  o.destination = *dest;
  ASSIGN_OR_RETURN(o.gpus_per_node, args.IntValue("gpus-per-node", 8));
  if (o.gpus_per_node < 1) {
    return absl::InvalidArgumentError("--gpus-per-node: must be >= 1");
  }
  o.colocated = args.Has("colocated");
  o.fp8_block = args.Has("fp8-block");
  if (args.Has("trainer-dtype")) {
    auto d = ParseDType(args.Value("trainer-dtype"));
    if (!d.ok()) return FlagError("trainer-dtype", d.status());
    o.trainer_dtype = *d;
  }
  if (args.Has("inference-dtype")) {
    auto d = ParseDType(args.Value("inference-dtype"));
    if (!d.ok()) return FlagError("inference-dtype", d.status());
    o.inference_dtype = *d;
  }
  if (args.Has("experts")) {
    auto s = catalog::ParseExpertStyle(args.Value("experts"));
    if (!s.ok()) return FlagError("experts", s.status());
    o.expert_style = *s;
    o.expert_style_set = true;
  }
  return catalog::BuildCase(o);
}

}  // namespace wsync::tools
