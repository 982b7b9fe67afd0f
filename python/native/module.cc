// wsync._native: the catalog's vLLM layout builders for Python
// (python/wsync/vllm.py turns an HF config into the ModelConfig dict these
// functions take). Results are serialized wsync.v1 protobuf messages, so the
// Python side parses them with its generated stubs; catalog errors raise
// ValueError with the catalog's message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "catalog/case.h"
#include "catalog/model_config.h"
#include "catalog/sides.h"
#include "catalog/vllm_hf.h"
#include "common/dtype.h"
#include "wsync/v1/layout.pb.h"

namespace py = pybind11;

namespace wsync::catalog {
namespace {

template <typename T>
T OrRaise(absl::StatusOr<T> v) {
  if (!v.ok()) throw py::value_error(std::string(v.status().message()));
  return *std::move(v);
}

// Integer fields of ModelConfig by their C++ names.
std::map<std::string, int64_t ModelConfig::*> IntFields() {
  return {{"hidden", &ModelConfig::hidden},
          {"intermediate", &ModelConfig::intermediate},
          {"num_layers", &ModelConfig::num_layers},
          {"num_heads", &ModelConfig::num_heads},
          {"num_kv_heads", &ModelConfig::num_kv_heads},
          {"head_dim", &ModelConfig::head_dim},
          {"vocab", &ModelConfig::vocab},
          {"q_lora_rank", &ModelConfig::q_lora_rank},
          {"kv_lora_rank", &ModelConfig::kv_lora_rank},
          {"qk_nope_head_dim", &ModelConfig::qk_nope_head_dim},
          {"qk_rope_head_dim", &ModelConfig::qk_rope_head_dim},
          {"v_head_dim", &ModelConfig::v_head_dim},
          {"num_experts", &ModelConfig::num_experts},
          {"moe_intermediate", &ModelConfig::moe_intermediate},
          {"num_shared_experts", &ModelConfig::num_shared_experts},
          {"first_dense_layers", &ModelConfig::first_dense_layers}};
}

ModelConfig ConfigFromDict(const py::dict& d) {
  ModelConfig c;
  const auto ints = IntFields();
  for (const auto& [key, value] : d) {
    const std::string k = py::cast<std::string>(key);
    if (auto it = ints.find(k); it != ints.end()) {
      c.*(it->second) = py::cast<int64_t>(value);
    } else if (k == "name" || k == "source") {
      (k == "name" ? c.name : c.source) = py::cast<std::string>(value);
    } else if (k == "qk_norm" || k == "router_bias") {
      (k == "qk_norm" ? c.qk_norm : c.router_bias) = py::cast<bool>(value);
    } else if (k == "attention") {
      const std::string a = py::cast<std::string>(value);
      if (a != "gqa" && a != "mla") {
        throw py::value_error(absl::StrCat("model config: attention '", a, "': expected gqa|mla"));
      }
      c.attention = a == "mla" ? Attention::kMla : Attention::kGqa;
    } else {
      throw py::value_error(absl::StrCat("model config: unknown field '", k, "'"));
    }
  }
  return c;
}

py::dict ConfigToDict(const ModelConfig& c) {
  py::dict d;
  for (const auto& [k, field] : IntFields()) d[py::str(k)] = c.*field;
  d["name"] = c.name;
  d["source"] = c.source;
  d["qk_norm"] = c.qk_norm;
  d["router_bias"] = c.router_bias;
  d["attention"] = c.attention == Attention::kMla ? "mla" : "gqa";
  return d;
}

// A TransferSpec holding the destination side's tensors and the mappings.
py::bytes VllmDestination(const py::dict& config, int64_t tp, int64_t replicas,
                          bool expert_parallel, const std::string& dtype,
                          const std::string& experts, bool qkv_bias, bool tie_word_embeddings,
                          bool fp8_block) {
  const ModelConfig model = ConfigFromDict(config);
  HfExtras extras{qkv_bias, tie_word_embeddings, fp8_block};
  VllmGroup group{tp, replicas, expert_parallel};
  const v1::DType d = OrRaise(ParseDType(dtype));
  const ExpertStyle style = OrRaise(ParseExpertStyle(experts));
  BuiltGroup built;
  {
    py::gil_scoped_release release;
    built = OrRaise(BuildVllmTensorsForHf(model, extras, style, group, d));
  }
  v1::TransferSpec spec;
  for (auto& t : built.tensors) *spec.mutable_destination()->add_tensors() = std::move(t);
  for (auto& m : built.mappings) *spec.add_mappings() = std::move(m);
  return py::bytes(spec.SerializeAsString());
}

const char* KindName(ParallelKind k) {
  switch (k) {
    case ParallelKind::kVocab:
      return "vocab";
    case ParallelKind::kColumn:
      return "column";
    case ParallelKind::kRow:
      return "row";
    case ParallelKind::kReplicated:
      return "replicated";
    case ParallelKind::kExpertColumn:
      return "expert_column";
    case ParallelKind::kExpertRow:
      return "expert_row";
  }
  return "replicated";
}

// The trainer's tensors of a model in HF naming, as dicts.
py::list ModelTensorList(const py::dict& config, const std::string& experts) {
  py::list out;
  const ExpertStyle style = OrRaise(ParseExpertStyle(experts));
  for (const ModelTensor& t : ModelTensors(ConfigFromDict(config), style)) {
    py::dict d;
    d["name"] = t.name;
    d["shape"] = t.shape;
    d["kind"] = KindName(t.kind);
    d["layer"] = t.layer;
    d["last_stage"] = t.last_stage;
    d["stacked"] = t.stacked;
    d["expert"] = t.expert;
    d["keep_fp32"] = t.keep_fp32;
    out.append(d);
  }
  return out;
}

}  // namespace
}  // namespace wsync::catalog

namespace wsync::python {
void BindWorker(py::module_& m);  // worker_module.cc
void BindClient(py::module_& m);  // trainer_channel.cc
}  // namespace wsync::python

PYBIND11_MODULE(_native, m) {
  using namespace wsync::catalog;
  m.doc() = "wsync's C++ catalog: vLLM destination layouts for a model config";
  m.def("vllm_destination", &VllmDestination, py::arg("config"), py::arg("tp"),
        py::arg("replicas") = 1, py::arg("expert_parallel") = false, py::arg("dtype") = "bf16",
        py::arg("experts") = "separate", py::arg("qkv_bias") = false,
        py::arg("tie_word_embeddings") = false, py::arg("fp8_block") = false,
        "Serialized wsync.v1.TransferSpec: destination tensors (vLLM parameters, explicit "
        "fragments) and the mappings from the trainer's HF-named tensors.");
  m.def(
      "catalog_model",
      [](const std::string& name) { return ConfigToDict(OrRaise(FindModel(name))); },
      py::arg("name"), "The catalog's ModelConfig of `name` as a dict.");
  m.def("model_tensors", &ModelTensorList, py::arg("config"), py::arg("experts") = "separate",
        "The trainer's tensors of a model (HF names, shapes, Megatron split kind, layer).");
  m.def("catalog_models", []() {
    py::list names;
    for (const ModelConfig& c : AllModels()) names.append(c.name);
    return names;
  });
  py::module_ worker = m.def_submodule("worker", "The embedded wsync worker (use wsync.embedded).");
  wsync::python::BindWorker(worker);
  py::module_ client = m.def_submodule("client", "The controller's TrainerService over gRPC C++ "
                                                 "(use wsync.Client).");
  wsync::python::BindClient(client);
}
