#include "catalog/model_config.h"

#include "gtest/gtest.h"

namespace wsync::catalog {
namespace {

int64_t Count(const std::vector<ModelTensor>& tensors) {
  int64_t n = 0;
  for (const ModelTensor& t : tensors) n += t.NumElements();
  return n;
}

TEST(ModelConfigTest, Llama3_8bMatchesCheckpoint) {
  auto m = FindModel("llama3-8b");
  ASSERT_TRUE(m.ok());
  const auto tensors = ModelTensors(*m, ExpertStyle::kSeparate);
  EXPECT_EQ(tensors.size(), 291u);
  EXPECT_EQ(Count(tensors), 8030261248);
  EXPECT_EQ(Count(tensors) * 2, 16060522496);  // 16.06 GB in bf16
}

TEST(ModelConfigTest, Qwen3_30bSeparateAndStackedExperts) {
  auto m = FindModel("qwen3-30b-a3b");
  ASSERT_TRUE(m.ok());
  const auto separate = ModelTensors(*m, ExpertStyle::kSeparate);
  EXPECT_EQ(separate.size(), 18867u);
  EXPECT_EQ(Count(separate) * 2, 61064245248);  // 61.06 GB in bf16
  const auto stacked = ModelTensors(*m, ExpertStyle::kStacked);
  EXPECT_EQ(stacked.size(), 3u + 48u * 12u);
  EXPECT_EQ(Count(stacked), Count(separate));
  EXPECT_EQ(stacked[9].name, "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(stacked[10].name, "model.layers.0.mlp.experts.gate_proj");
  EXPECT_EQ(stacked[10].shape, (std::vector<int64_t>{128, 768, 2048}));
  EXPECT_EQ(stacked[12].shape, (std::vector<int64_t>{128, 2048, 768}));
}

TEST(ModelConfigTest, LargeModelsParameterCounts) {
  EXPECT_EQ(ParameterCount(*FindModel("llama3-70b")), 70553706496);
  EXPECT_EQ(ParameterCount(*FindModel("qwen3-235b-a22b")), 235093634560);
  EXPECT_EQ(ParameterCount(*FindModel("deepseek-v3")), 671026419200);  // 671B w/o MTP
  const int64_t kimi = ParameterCount(*FindModel("kimi-k2"));
  EXPECT_EQ(kimi, 1026408232448);  // ~1.03T
}

TEST(ModelConfigTest, MlaTensorNamesAndShapes) {
  auto m = FindModel("kimi-k2");
  ASSERT_TRUE(m.ok());
  const auto t = ModelTensors(*m, ExpertStyle::kStacked);
  auto find = [&](const std::string& name) -> const ModelTensor* {
    for (const ModelTensor& x : t) {
      if (x.name == name) return &x;
    }
    return nullptr;
  };
  const std::string p = "model.layers.1.";
  ASSERT_NE(find(p + "self_attn.q_b_proj.weight"), nullptr);
  EXPECT_EQ(find(p + "self_attn.q_b_proj.weight")->shape, (std::vector<int64_t>{64 * 192, 1536}));
  EXPECT_EQ(find(p + "self_attn.kv_a_proj_with_mqa.weight")->shape,
            (std::vector<int64_t>{576, 7168}));
  EXPECT_EQ(find(p + "self_attn.kv_b_proj.weight")->shape, (std::vector<int64_t>{64 * 256, 512}));
  EXPECT_EQ(find(p + "self_attn.o_proj.weight")->shape, (std::vector<int64_t>{7168, 64 * 128}));
  EXPECT_EQ(find(p + "mlp.experts.gate_proj")->shape, (std::vector<int64_t>{384, 2048, 7168}));
  EXPECT_EQ(find(p + "mlp.shared_experts.down_proj.weight")->shape,
            (std::vector<int64_t>{7168, 2048}));
  EXPECT_TRUE(find(p + "mlp.gate.e_score_correction_bias")->keep_fp32);
  // Layer 0 is dense (first_k_dense_replace = 1).
  EXPECT_EQ(find("model.layers.0.mlp.gate_proj.weight")->shape,
            (std::vector<int64_t>{18432, 7168}));
  EXPECT_EQ(find("model.layers.0.mlp.experts.gate_proj"), nullptr);
}

TEST(ModelConfigTest, UnknownModelListsKnownOnes) {
  auto m = FindModel("gpt-5");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("llama3-8b"), std::string::npos);
}

}  // namespace
}  // namespace wsync::catalog
