// Seeded random block-fp8 layouts: random source meshes (Shard, Replicate,
// FSDP-over-TP _StridedShard) over 2-D and stacked 3-D tensors, small random
// blocks, block-aligned destination shards with replicas, colocation, caps
// and relay settings. Every plan must replay to the reference quantization
// of every block (VerifyPlan) and respect every cap.
#include <random>
#include <string>
#include <vector>

#include "controller/plan/planner.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"

namespace wsync::plan {
namespace {

using namespace planner_testing;  // NOLINT

TEST(BlockFp8PropertyTest, RandomLayoutsReplayToTheReferenceQuantization) {
  int planned = 0, refused = 0, receiver_side = 0, sender_side = 0, relays = 0;
  for (int seed = 0; seed < 120; ++seed) {
    SCOPED_TRACE(seed);
    Gen g{std::mt19937_64(seed)};
    const int64_t br = std::vector<int64_t>{2, 4, 8}[g.Int(0, 2)];
    const int64_t bc = std::vector<int64_t>{2, 4, 8}[g.Int(0, 2)];
    const bool stacked = g.Coin(0.3);
    const int tp = g.Int(1, 3), replicas = g.Int(1, 3);
    // Destination rows: whole blocks per TP rank, the last one maybe partial.
    const int64_t rows =
        br * g.Int(1, 3) * tp - (g.Coin(0.3) ? g.Int(0, static_cast<int>(br) - 1) : 0);
    const int64_t cols = bc * g.Int(1, 4) - (g.Coin(0.5) ? g.Int(0, static_cast<int>(bc) - 1) : 0);
    if (rows <= br * (tp - 1) || cols <= 0) continue;
    std::vector<int64_t> shape = {rows, cols};
    if (stacked) shape.insert(shape.begin(), g.Int(1, 3));
    const int r = static_cast<int>(shape.size());

    const int src_n = g.Int(1, 6);
    const int per_node = g.Int(0, 3);
    v1::Side src = Side("trainer", Range(0, src_n), per_node);
    std::vector<v1::Placement> sp;
    std::vector<int64_t> smesh = {src_n};
    const int kind = g.Int(0, 3);
    if (kind == 0) {
      sp = {Sh(g.Int(0, r - 1))};
    } else if (kind == 1) {
      sp = {Rep()};
    } else if (kind == 2 && src_n % 2 == 0 && src_n > 2) {
      smesh = {src_n / 2, 2};
      const int d = g.Int(0, r - 1);
      sp = {Strided(d, 2), Sh(d)};
    } else {
      sp = {Sh(r - 2 + g.Int(0, 1))};
    }
    const v1::DType sdt = std::vector<v1::DType>{v1::BF16, v1::FP32, v1::FP16}[g.Int(0, 2)];
    Mesh(&src, "w", shape, smesh, sp, sdt);

    const int dst_n = tp * replicas;
    const int first = g.Coin(0.3) ? 0 : src_n;  // colocated or not
    v1::Side dst = Side("infer", Range(first, dst_n), per_node);
    v1::TensorLayout* w = Mesh(&dst, "w", shape, {replicas, tp}, {Rep(), Sh(r - 2)}, v1::FP8_E4M3);
    w->mutable_block_quantization()->set_scale_tensor("w_scale");
    w->mutable_block_quantization()->add_block(br);
    w->mutable_block_quantization()->add_block(bc);
    std::vector<int64_t> sshape = shape;
    sshape[r - 2] = (rows + br - 1) / br;
    sshape[r - 1] = (cols + bc - 1) / bc;
    Mesh(&dst, "w_scale", sshape, {replicas, tp}, {Rep(), Sh(r - 2)}, v1::FP32);
    v1::TransferSpec spec = Spec(src, dst);
    const int64_t elems = rows * cols * (stacked ? shape[0] : 1);
    spec.mutable_options()->set_bucket_bytes(std::max<int64_t>(64, elems * g.Int(1, 4) / 4));
    spec.mutable_options()->set_staging_cap_bytes(std::max<int64_t>(256, elems * 4 * g.Int(1, 3)));
    spec.mutable_options()->set_disable_relay(g.Coin(0.2));
    absl::StatusOr<v1::Plan> plan = BuildPlan(spec);
    if (!plan.ok()) {
      // torch.chunk of rows that are not whole blocks per rank: refused,
      // naming the tensor, rank and box.
      ++refused;
      EXPECT_NE(plan.status().message().find("tensor \"w\" rank"), std::string::npos)
          << plan.status();
      EXPECT_NE(plan.status().message().find("not aligned to the quantization block"),
                std::string::npos)
          << plan.status();
      continue;
    }
    ++planned;
    absl::Status st = VerifyPlan(spec, *plan);
    EXPECT_TRUE(st.ok()) << st;
    ExpectInvariants(spec, *plan);
    receiver_side += plan->quantizes_size() > 0;
    ForEachPlanPiece(*plan, [&](const v1::Bucket&, const v1::Piece& p) {
      sender_side += p.quant_block_size() > 0;
      relays += p.relay();
    });
  }
  EXPECT_GT(planned, 60);
  EXPECT_LT(refused, 40);
  EXPECT_GT(receiver_side, 10);
  EXPECT_GT(sender_side, 10);
  EXPECT_GT(relays, 10);
}

}  // namespace
}  // namespace wsync::plan
