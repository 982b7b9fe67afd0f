#include "catalog/case.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace wsync::catalog {
namespace {

TEST(CaseTest, ParsesSources) {
  auto f = ParseSource("fsdp:8");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->NumRanks(), 8);
  auto h = ParseSource("hsdp:2x8");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->replicas, 2);
  EXPECT_EQ(h->NumRanks(), 16);
  auto m = ParseSource("megatron:tp2,pp2,dp4,ep2");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, TrainerParallel::Kind::kMegatron);
  EXPECT_EQ(m->NumRanks(), 16);
  EXPECT_EQ(m->ep, 2);
  EXPECT_EQ(SourceToString(*m), "megatron:tp2,pp2,dp4,ep2");
  for (const char* bad : {"fsdp:", "fsdp:0", "fsdp:x", "hsdp:8", "megatron:tp2,qq2",
                          "megatron:tp-1", "megatron:tp2,tp4", "ddp:8", ""}) {
    auto s = ParseSource(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("'"), std::string::npos) << s.status();
  }
}

TEST(CaseTest, ParsesDestinations) {
  auto d = ParseDestination("vllm-tp:16x8,ep");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tp, 16);
  EXPECT_EQ(d->replicas, 8);
  EXPECT_TRUE(d->expert_parallel);
  auto s = ParseDestination("vllm-tp:4");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->replicas, 1);
  EXPECT_FALSE(s->expert_parallel);
  for (const char* bad : {"vllm:4", "vllm-tp:", "vllm-tp:2x", "vllm-tp:2x3x4", "vllm-tp:0"}) {
    EXPECT_FALSE(ParseDestination(bad).ok()) << bad;
  }
}

// Every mapping reads inside an existing source tensor, every destination
// tensor is fed (mapping or same-named source of equal shape), and every
// source tensor feeds something.
void CheckConsistent(const v1::TransferSpec& spec) {
  absl::flat_hash_map<std::string, const v1::TensorLayout*> src;
  for (const auto& t : spec.source().tensors()) src[t.name()] = &t;
  absl::flat_hash_set<std::string> mapped_dst, used_src;
  for (const auto& m : spec.mappings()) {
    ASSERT_TRUE(src.contains(m.src())) << m.src();
    const auto& shape = src[m.src()]->shape();
    ASSERT_EQ(m.src_box().offset_size(), shape.size()) << m.src();
    for (int d = 0; d < shape.size(); ++d) {
      EXPECT_LE(m.src_box().offset(d) + m.src_box().length(d), shape[d]) << m.src();
    }
    mapped_dst.insert(m.dst());
    used_src.insert(m.src());
  }
  for (const auto& t : spec.destination().tensors()) {
    if (mapped_dst.contains(t.name())) continue;
    ASSERT_TRUE(src.contains(t.name())) << t.name();
    EXPECT_EQ(src[t.name()]->shape().size(), t.shape().size()) << t.name();
    used_src.insert(t.name());
  }
  for (const auto& [name, t] : src) EXPECT_TRUE(used_src.contains(name)) << name;
}

TEST(CaseTest, DisjointPlacementOnNodes) {
  CaseOptions o;
  o.model = "tiny-llama";
  o.source = *ParseSource("fsdp:4");
  o.destination = *ParseDestination("vllm-tp:2x2");
  o.gpus_per_node = 2;
  o.trainer_dtype = v1::FP32;
  auto spec = BuildCase(o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "tiny-llama fsdp:4 to vllm-tp:2x2");
  ASSERT_EQ(spec->source().ranks_size(), 4);
  ASSERT_EQ(spec->destination().ranks_size(), 4);
  EXPECT_EQ(spec->source().ranks(3).worker(), 3);
  EXPECT_EQ(spec->source().ranks(3).node(), "node1");
  EXPECT_EQ(spec->destination().ranks(0).worker(), 4);
  EXPECT_EQ(spec->destination().ranks(0).node(), "node2");
  EXPECT_EQ(spec->destination().ranks(3).node(), "node3");
  ASSERT_EQ(spec->options().allowed_casts_size(), 1);
  EXPECT_EQ(spec->options().allowed_casts(0).from(), v1::FP32);
  EXPECT_EQ(spec->options().allowed_casts(0).to(), v1::BF16);
  EXPECT_EQ(spec->source().tensors(0).dtype(), v1::FP32);
  EXPECT_EQ(spec->destination().tensors(0).dtype(), v1::BF16);
  CheckConsistent(*spec);
}

TEST(CaseTest, ColocatedSharesWorkers) {
  CaseOptions o;
  o.model = "tiny-qwen3-moe";
  o.source = *ParseSource("fsdp:4");
  o.destination = *ParseDestination("vllm-tp:2x2,ep");
  o.colocated = true;
  auto spec = BuildCase(o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(spec->destination().ranks(j).worker(), j);
    EXPECT_EQ(spec->destination().ranks(j).node(), spec->source().ranks(j).node());
  }
  EXPECT_EQ(spec->options().allowed_casts_size(), 0);
  CheckConsistent(*spec);
}

TEST(CaseTest, MegatronMeshes) {
  CaseOptions o;
  o.model = "tiny-mla";
  o.source = *ParseSource("megatron:tp2,pp3,dp2,ep2");
  o.destination = *ParseDestination("vllm-tp:2x1");
  auto spec = BuildCase(o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  CheckConsistent(*spec);
  const v1::TensorLayout* gate = nullptr;
  const v1::TensorLayout* o_proj = nullptr;
  for (const auto& t : spec->source().tensors()) {
    if (t.name() == "model.layers.1.mlp.experts.gate_proj") gate = &t;
    if (t.name() == "model.layers.2.self_attn.o_proj.weight") o_proj = &t;
  }
  ASSERT_NE(gate, nullptr);
  // Stage 1 = ranks 4..7; mesh (edp 1, ep 2, tp 2).
  EXPECT_EQ(
      std::vector<int64_t>(gate->mesh().mesh_shape().begin(), gate->mesh().mesh_shape().end()),
      (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(std::vector<int>(gate->mesh().ranks().begin(), gate->mesh().ranks().end()),
            (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(gate->mesh().placements(1).shard().dim(), 0);
  EXPECT_EQ(gate->mesh().placements(2).shard().dim(), 1);
  ASSERT_NE(o_proj, nullptr);
  // Stage 2: rank = tp + 2 * (dp + 2 * 2).
  EXPECT_EQ(std::vector<int>(o_proj->mesh().ranks().begin(), o_proj->mesh().ranks().end()),
            (std::vector<int>{8, 9, 10, 11}));
  EXPECT_EQ(o_proj->mesh().placements(1).shard().dim(), 1);
}

TEST(CaseTest, ClearErrors) {
  CaseOptions o;
  o.model = "tiny-llama";
  o.source = *ParseSource("megatron:tp4");  // 2 kv heads
  o.destination = *ParseDestination("vllm-tp:2");
  auto s = BuildCase(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("kv heads"), std::string::npos) << s.status();
  o.source = *ParseSource("fsdp:2");
  o.destination = *ParseDestination("vllm-tp:3");
  s = BuildCase(o);
  ASSERT_FALSE(s.ok());
  // The 128 padded vocab rows do not split over 3 ranks either (vLLM, too,
  // builds embed_tokens, and fails there, before the layers).
  EXPECT_NE(s.status().message().find("model.embed_tokens.weight padded vocab"), std::string::npos)
      << s.status();
  o.destination = *ParseDestination("vllm-tp:2,ep");
  EXPECT_FALSE(BuildCase(o).ok());                  // dense model
  o.source = *ParseSource("megatron:tp512,dp512");  // 262144 ranks
  o.destination = *ParseDestination("vllm-tp:2");
  s = BuildCase(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("at most"), std::string::npos) << s.status();
  o.source = *ParseSource("fsdp:2");
  o.model = "nope";
  EXPECT_EQ(BuildCase(o).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace wsync::catalog
