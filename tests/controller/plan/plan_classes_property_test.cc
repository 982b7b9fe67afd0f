// Random specs whose tensors come from a few families (shape, dtype, both
// layouts), some members perturbed in one detail (a dim, a shard dim, the
// mesh, the dtype, the ranks): the plan with tensor classes is the plan
// without them, byte for byte, and replays exactly.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

struct Family {
  std::vector<int64_t> shape;
  v1::DType dtype = v1::FP32;
  int src_dim = 0;   // shard dim on the source (-1: replicated)
  int src_mesh = 1;  // source ranks per copy
  int tp = 1;        // destination TP (rows) per replica
  bool fp8 = false;  // block-quantized destination (blocks of 2 x 2)
};

void AddTensor(const std::string& name, const Family& f, int src_n, int replicas,
               int32_t rank_shift, v1::Side* src, v1::Side* dst) {
  std::vector<int32_t> ranks;
  for (int r = 0; r < f.src_mesh; ++r) ranks.push_back((r + rank_shift) % src_n);
  Mesh(src, name, f.shape, {f.src_mesh}, {f.src_dim < 0 ? Rep() : Sh(f.src_dim)}, f.dtype, ranks);
  const int r = static_cast<int>(f.shape.size());
  v1::TensorLayout* t = Mesh(dst, name, f.shape, {replicas, f.tp}, {Rep(), Sh(r - 2)},
                             f.fp8 ? v1::FP8_E4M3 : f.dtype);
  if (!f.fp8) return;
  t->mutable_block_quantization()->set_scale_tensor(name + "_scale");
  t->mutable_block_quantization()->add_block(2);
  t->mutable_block_quantization()->add_block(2);
  std::vector<int64_t> s = f.shape;
  s[r - 2] = (s[r - 2] + 1) / 2;
  s[r - 1] = (s[r - 1] + 1) / 2;
  Mesh(dst, name + "_scale", s, {replicas, f.tp}, {Rep(), Sh(r - 2)}, v1::FP32);
}

TEST(PlanClassesPropertyTest, FamiliesPlanAsIfEveryTensorWereComputed) {
  int planned = 0, copied_specs = 0;
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Gen g{std::mt19937_64(seed)};
    const int src_n = g.Int(1, 4), replicas = g.Int(1, 3);
    std::vector<Family> families(g.Int(1, 3));
    for (Family& f : families) {
      const int rank = g.Int(2, 3);
      for (int d = 0; d < rank; ++d) f.shape.push_back(2 * g.Int(1, 4));
      f.dtype = g.Coin() ? v1::FP32 : v1::BF16;
      f.src_dim = g.Int(-1, rank - 1);
      f.src_mesh = g.Int(1, src_n);
      f.tp = g.Coin() ? 1 : 2;
      f.fp8 = g.Coin(0.3);
    }
    v1::Side src = Side("trainer", Range(0, src_n), g.Int(0, 2));
    v1::Side dst = Side("infer", Range(g.Coin(0.3) ? 0 : src_n, replicas * 2), 2);
    const int tensors = g.Int(2, 10);
    for (int i = 0; i < tensors; ++i) {
      Family f = families[g.Int(0, static_cast<int>(families.size()) - 1)];
      int32_t shift = 0;
      switch (g.Int(0, 7)) {  // one perturbation, or none
        case 0:
          f.shape[g.Int(0, static_cast<int>(f.shape.size()) - 1)] += 2;
          break;
        case 1:
          f.src_dim = g.Int(-1, static_cast<int>(f.shape.size()) - 1);
          break;
        case 2:
          f.tp = 3 - f.tp;
          break;
        case 3:
          f.dtype = f.dtype == v1::FP32 ? v1::BF16 : v1::FP32;
          break;
        case 4:
          shift = g.Int(1, 3);
          break;
        default:
          break;
      }
      AddTensor("t" + std::to_string(i), f, src_n, replicas, shift, &src, &dst);
    }
    v1::TransferSpec spec = Spec(src, dst);
    AllowCast(&spec, v1::FP32, v1::BF16);
    AllowCast(&spec, v1::BF16, v1::FP32);
    spec.mutable_options()->set_bucket_bytes(int64_t{16} << g.Int(0, 5));
    spec.mutable_options()->set_staging_cap_bytes(int64_t{4096} << g.Int(0, 2));
    spec.mutable_options()->set_disable_relay(g.Coin(0.3));
    BuildOptions on, off;
    on.record_plan_seconds = off.record_plan_seconds = false;
    off.tensor_classes = false;
    absl::StatusOr<v1::Plan> a = BuildPlan(spec, on);
    absl::StatusOr<v1::Plan> b = BuildPlan(spec, off);
    ASSERT_EQ(a.ok(), b.ok()) << a.status() << " / " << b.status();
    if (!a.ok()) {
      EXPECT_EQ(a.status(), b.status());
      continue;
    }
    ASSERT_TRUE(DeterministicBytes(*a) == DeterministicBytes(*b))
        << "plans differ with tensor classes";
    absl::Status verified = VerifyPlan(spec, *a);
    ASSERT_TRUE(verified.ok()) << verified;
    ++planned;
    std::vector<plan::StageCost> stages;
    on.stages = &stages;
    ASSERT_TRUE(BuildPlan(spec, on).ok());
    for (const plan::StageCost& s : stages) {
      if (s.name.rfind("cells (", 0) == 0 && s.name.find("(0 of") == std::string::npos) {
        ++copied_specs;
      }
    }
  }
  EXPECT_GT(planned, 80);
  EXPECT_GT(copied_specs, 40) << "too few specs had tensors copied: the test tests little";
}

}  // namespace
}  // namespace wsync::plan
