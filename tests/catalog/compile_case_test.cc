// Every tiny catalog case compiles on both sides (CompileSide validates
// shapes, ranks, boxes, byte overlaps), for several layouts.
#include "absl/strings/str_cat.h"
#include "catalog/case.h"
#include "controller/plan/compiled_layout.h"
#include "gtest/gtest.h"

namespace wsync::catalog {
namespace {

struct Case {
  const char* model;
  const char* source;
  const char* destination;
  bool colocated;
  const char* experts;  // "" = default
};

std::vector<Case> TinyCases() {
  return {
      {"tiny-llama", "fsdp:4", "vllm-tp:2x2", false, ""},
      {"tiny-llama", "hsdp:2x2", "vllm-tp:4", true, ""},
      {"tiny-llama", "megatron:tp2,pp2,dp1", "vllm-tp:8x1", false, ""},  // tp 8 > 2 kv heads
      {"tiny-qwen3-moe", "fsdp:4", "vllm-tp:2x2", false, ""},
      {"tiny-qwen3-moe", "fsdp:4", "vllm-tp:4x1,ep", true, "stacked"},
      {"tiny-qwen3-moe", "megatron:tp2,pp2,dp2,ep2", "vllm-tp:2x2,ep", false, ""},
      {"tiny-qwen3-moe", "megatron:tp1,pp1,dp4,ep4", "vllm-tp:2x1", false, "separate"},
      {"tiny-mla", "fsdp:3", "vllm-tp:2x1", false, ""},
      {"tiny-mla", "megatron:tp2,pp3,dp2,ep2", "vllm-tp:4x2,ep", false, ""},
  };
}

absl::StatusOr<v1::TransferSpec> Build(const Case& c) {
  auto o = ParseCase(c.model, c.source, c.destination, c.experts);
  if (!o.ok()) return o.status();
  o->colocated = c.colocated;
  o->gpus_per_node = 4;
  o->trainer_dtype = v1::FP32;
  return BuildCase(*o);
}

TEST(CompileCaseTest, TinyCasesCompileOnBothSides) {
  for (const Case& c : TinyCases()) {
    SCOPED_TRACE(absl::StrCat(c.model, " ", c.source, " -> ", c.destination));
    auto spec = Build(c);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto src = plan::CompileSide(spec->source(), plan::SideRole::kSource);
    ASSERT_TRUE(src.ok()) << src.status();
    auto dst = plan::CompileSide(spec->destination(), plan::SideRole::kDestination);
    ASSERT_TRUE(dst.ok()) << dst.status();
    EXPECT_EQ(src->tensors.size(), static_cast<size_t>(spec->source().tensors_size()));
    EXPECT_EQ(dst->tensors.size(), static_cast<size_t>(spec->destination().tensors_size()));
  }
}

}  // namespace
}  // namespace wsync::catalog
