// vLLM fp8 serving in the catalog: which tensors are block-quantized, their
// scale tensors, and plans from tiny cases replayed element by element (the
// oracle compares every fp8 byte and scale against a reference quantization).
#include <set>
#include <string>

#include "catalog/case.h"
#include "catalog/vllm_fp8.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/planner.h"
#include "controller/verify/replay.h"
#include "gtest/gtest.h"

namespace wsync::catalog {
namespace {

TEST(VllmFp8Test, NamesAndSelection) {
  EXPECT_TRUE(IsBlockFp8Linear("model.layers.3.self_attn.q_b_proj.weight"));
  EXPECT_TRUE(IsBlockFp8Linear("model.layers.3.mlp.experts.w13_weight"));
  EXPECT_TRUE(IsBlockFp8Linear("model.layers.3.mlp.experts.w2_weight.17"));
  EXPECT_FALSE(IsBlockFp8Linear("model.embed_tokens.weight"));
  EXPECT_FALSE(IsBlockFp8Linear("lm_head.weight"));
  EXPECT_FALSE(IsBlockFp8Linear("model.layers.3.mlp.gate.weight"));
  EXPECT_FALSE(IsBlockFp8Linear("model.layers.3.input_layernorm.weight"));
  EXPECT_EQ(ScaleTensorName("a.o_proj.weight"), "a.o_proj.weight_scale_inv");
  EXPECT_EQ(ScaleTensorName("a.experts.w13_weight.3"), "a.experts.w13_weight_scale_inv.3");
}

CaseOptions Options(const char* model, const char* source, const char* destination) {
  CaseOptions o;
  o.model = model;
  o.source = *ParseSource(source);
  o.destination = *ParseDestination(destination);
  o.gpus_per_node = 4;
  o.fp8_block = true;
  return o;
}

// DeepSeek-V3 / Kimi-K2 as vLLM serves them: every linear weight fp8 with
// scales, nothing else; the destination side compiles (scales validated).
TEST(VllmFp8Test, RealModelsQuantizeEveryLinearWeight) {
  for (const char* model : {"deepseek-v3", "kimi-k2"}) {
    for (const char* dest : {"vllm-tp:16x1,ep", "vllm-tp:8x1"}) {
      SCOPED_TRACE(std::string(model) + " " + dest);
      BuiltGroup g;
      auto config = FindModel(model);
      ASSERT_TRUE(config.ok());
      auto built = BuildVllmTensors(*config, ExpertStyle::kStacked, *ParseDestination(dest),
                                    v1::BF16);
      ASSERT_TRUE(built.ok()) << built.status();
      g = *std::move(built);
      int kept = 0;
      ASSERT_TRUE(QuantizeLinearWeightsBlockFp8(&g, &kept).ok());
      EXPECT_EQ(kept, 0);
      int quantized = 0, scales = 0, linear = 0;
      std::set<std::string> names;
      for (const v1::TensorLayout& t : g.tensors) names.insert(t.name());
      for (const v1::TensorLayout& t : g.tensors) {
        if (IsBlockFp8Linear(t.name())) {
          ++linear;
          EXPECT_EQ(t.dtype(), v1::FP8_E4M3) << t.name();
          EXPECT_TRUE(names.count(t.block_quantization().scale_tensor())) << t.name();
        } else if (t.name().find("_scale_inv") != std::string::npos) {
          ++scales;
          EXPECT_EQ(t.dtype(), v1::FP32);
        } else {
          EXPECT_NE(t.dtype(), v1::FP8_E4M3) << t.name();
        }
        quantized += t.has_block_quantization();
      }
      EXPECT_GT(linear, 0);
      EXPECT_EQ(quantized, linear);
      EXPECT_EQ(scales, linear);
      v1::Side side;
      side.set_name("vllm");
      int64_t ranks = 0;
      for (const v1::TensorLayout& t : g.tensors) {
        for (const v1::Fragment& f : t.fragments().fragments()) {
          ranks = std::max<int64_t>(ranks, f.rank() + 1);
        }
        *side.add_tensors() = t;
      }
      for (int64_t r = 0; r < ranks; ++r) side.add_ranks()->set_worker(static_cast<int32_t>(r));
      auto compiled = plan::CompileSide(side, plan::SideRole::kDestination);
      ASSERT_TRUE(compiled.ok()) << compiled.status();
    }
  }
}

TEST(VllmFp8Test, TinyCasesPlanAndReplay) {
  struct C {
    const char* source;
    const char* destination;
    bool colocated;
  };
  for (const C& c : {C{"fsdp:2", "vllm-tp:1x2", false}, C{"megatron:tp2,dp2", "vllm-tp:1x2,ep", false},
                     C{"fsdp:4", "vllm-tp:1x2", true}}) {
    SCOPED_TRACE(std::string(c.source) + " -> " + c.destination);
    CaseOptions o = Options("tiny-mla", c.source, c.destination);
    o.colocated = c.colocated;
    auto spec = BuildCase(o);
    ASSERT_TRUE(spec.ok()) << spec.status();
    int quantized = 0;
    for (const v1::TensorLayout& t : spec->destination().tensors()) {
      quantized += t.has_block_quantization();
    }
    EXPECT_GT(quantized, 0);
    auto plan = plan::BuildPlan(*spec);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan::VerifyPlan(*spec, *plan).ok()) << plan::VerifyPlan(*spec, *plan);
  }
}

}  // namespace
}  // namespace wsync::catalog
