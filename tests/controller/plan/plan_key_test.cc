// PlanKey hashes each part of the spec as it serializes (through a 64 KiB
// buffer), never holding a side's bytes as one string: the key must stay the
// one its definition gives (FNV-1a over "<size>:" and the deterministic
// serialization of source, destination, each mapping, then "|" and the
// options), which plan caches and controller state compare across builds.
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/plan/planner.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

// The key by its definition, from whole strings.
std::string KeyByDefinition(const v1::TransferSpec& spec) {
  uint64_t h = 14695981039346656037ull;
  auto fnv = [&h](const std::string& bytes) {
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 1099511628211ull;
    }
  };
  auto part = [&](const google::protobuf::Message& m) {
    const std::string bytes = DeterministicBytes(m);
    fnv(absl::StrCat(bytes.size(), ":"));
    fnv(bytes);
  };
  part(spec.source());
  part(spec.destination());
  for (const v1::TensorMapping& m : spec.mappings()) part(m);
  fnv("|");
  part(spec.options());
  return absl::StrFormat("%016x", h);
}

// A spec of `tensors` explicit tensors per side, random shapes and buffer
// names: sides from a few bytes to several 64 KiB buffers.
v1::TransferSpec RandomSpec(std::mt19937* rng, int tensors) {
  v1::Side src = Side("trainer", Range(0, 4));
  v1::Side dst = Side("infer", Range(4, 2));
  std::uniform_int_distribution<int64_t> dim(1, 1 << 20);
  std::uniform_int_distribution<int> len(0, 40);
  for (int i = 0; i < tensors; ++i) {
    const std::string name = absl::StrCat("layers.", i, ".w");
    for (v1::Side* side : {&src, &dst}) {
      const int64_t rows = dim(*rng), cols = dim(*rng);
      v1::TensorLayout* t = Explicit(side, name, {rows, cols});
      Frag(t, i % 2, {0, 0}, {rows, cols}, std::string(len(*rng), 'b'), dim(*rng));
    }
  }
  v1::TransferSpec spec = Spec(src, dst);
  for (int i = 0; i < tensors % 7; ++i) {
    Map(&spec, absl::StrCat("layers.", i, ".w"), {0, 0}, absl::StrCat("layers.", i, ".w"), {0, 0},
        {1, 1});
  }
  spec.mutable_options()->set_bucket_bytes(dim(*rng));
  return spec;
}

TEST(PlanKeyTest, StreamedHashIsTheDefinedKey) {
  std::mt19937 rng(19);
  for (int tensors : {0, 1, 3, 100, 1000, 1500, 4000}) {
    const v1::TransferSpec spec = RandomSpec(&rng, tensors);
    SCOPED_TRACE(absl::StrCat(tensors, " tensors, source ", spec.source().ByteSizeLong(), " B"));
    EXPECT_EQ(PlanKey(spec), KeyByDefinition(spec));
  }
}

}  // namespace
}  // namespace wsync::plan
