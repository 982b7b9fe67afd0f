// Block fp8 destinations: sender-side quantization where a holder has whole
// blocks, receiver-side where a source boundary cuts a block; every plan is
// replayed (VerifyPlan checks every fp8 byte and scale against a reference
// quantization of the source values).
#include <string>
#include <vector>

#include "controller/plan/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_test_util.h"

namespace wsync::plan {
namespace {

using planner_testing::BuildAndVerify;
using planner_testing::Explicit;
using planner_testing::ForEachPlanPiece;
using planner_testing::Frag;
using planner_testing::Map;
using planner_testing::Mesh;
using planner_testing::Part;
using planner_testing::Range;
using planner_testing::Rep;
using planner_testing::Sh;
using planner_testing::Side;
using planner_testing::Spec;
using ::testing::HasSubstr;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Quantized destination `name` [rows, cols] (or [e, rows, cols]) sharded with
// `placements` over `mesh`, plus its scale tensor "<name>_scale" with the
// same placements over the block grid.
void QuantMesh(v1::Side* dst, const std::string& name, std::vector<int64_t> shape,
               std::vector<int64_t> mesh, std::vector<v1::Placement> placements,
               std::vector<int64_t> block = {}) {
  v1::TensorLayout* t = Mesh(dst, name, shape, mesh, placements, v1::FP8_E4M3);
  t->mutable_block_quantization()->set_scale_tensor(name + "_scale");
  for (int64_t b : block) t->mutable_block_quantization()->add_block(b);
  const int64_t br = block.empty() ? 128 : block[0], bc = block.empty() ? 128 : block[1];
  std::vector<int64_t> sshape = shape;
  sshape[sshape.size() - 2] = CeilDiv(sshape[sshape.size() - 2], br);
  sshape.back() = CeilDiv(sshape.back(), bc);
  Mesh(dst, name + "_scale", sshape, mesh, placements, v1::FP32);
}

struct Counts {
  int64_t quant_pieces = 0, scale_pieces = 0, quantize_inputs = 0, other = 0;
};
Counts Count(const v1::Plan& plan) {
  Counts c;
  ForEachPlanPiece(plan, [&](const v1::Bucket&, const v1::Piece& p) {  // run members too
    if (p.quant_block_size() > 0) {
      ++c.quant_pieces;
    } else if (p.scales_of() != 0 || (p.relay() && p.wire_dtype() == v1::FP32)) {
      ++c.scale_pieces;
    } else if (p.quantize_id() != 0) {
      ++c.quantize_inputs;
    } else {
      ++c.other;
    }
  });
  return c;
}

TEST(BlockFp8PlanTest, SenderQuantizesWholeBlocksAndWireCarriesFp8PlusScales) {
  // FSDP rows of 128 (one block row each) -> 2 TP ranks; cols 300: a partial
  // edge block column that still counts as whole.
  v1::Side src = Side("trainer", Range(0, 4));
  Mesh(&src, "w", {512, 300}, {4}, {Sh(0)}, v1::BF16);
  v1::Side dst = Side("infer", Range(4, 2));
  QuantMesh(&dst, "w", {512, 300}, {2}, {Sh(0)});
  v1::TransferSpec spec = Spec(src, dst);
  v1::Plan plan = BuildAndVerify(spec);
  const Counts c = Count(plan);
  EXPECT_EQ(plan.quantizes_size(), 0);
  EXPECT_EQ(c.quant_pieces, 4);
  EXPECT_EQ(c.scale_pieces, 4);
  EXPECT_EQ(c.quantize_inputs, 0);
  EXPECT_EQ(c.other, 0);
  // fp8 bytes + one fp32 scale per block (4 block rows x 3 block cols).
  EXPECT_EQ(plan.summary().network_bytes(), 512 * 300 + 4 * 3 * 4);
  EXPECT_EQ(plan.summary().destination_bytes(), 512 * 300 + 4 * 3 * 4);
  for (const v1::Bucket& b : plan.buckets()) {
    for (const v1::Piece& p : b.pieces()) {
      if (p.quant_block_size() > 0) {
        EXPECT_EQ(p.wire_dtype(), v1::FP8_E4M3);
        EXPECT_EQ(p.src().dtype(), v1::BF16);
        EXPECT_THAT(p.quant_block(), ::testing::ElementsAre(128, 128));
      }
    }
  }
  absl::StatusOr<WorkerNodes> nodes = WorkerNodesFromSpec(spec);
  ASSERT_TRUE(nodes.ok());
  absl::StatusOr<SimulationResult> sim = SimulatePlan(plan, *nodes, spec.options().link_model());
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_NEAR(plan.summary().predicted_seconds(), sim->makespan_seconds, 1e-12);
  // The simulator sees the wire bytes: half of what the bf16 plan moves.
  v1::TransferSpec bf16 = spec;
  v1::Side plain = Side("infer", Range(4, 2));
  Mesh(&plain, "w", {512, 300}, {2}, {Sh(0)}, v1::BF16);
  *bf16.mutable_destination() = plain;
  v1::Plan bf16_plan = BuildAndVerify(bf16);
  EXPECT_EQ(bf16_plan.summary().network_bytes(), 512 * 300 * 2);
  EXPECT_LT(plan.summary().lower_bound_seconds(), 0.51 * bf16_plan.summary().lower_bound_seconds());
}

TEST(BlockFp8PlanTest, ReceiverQuantizesBlocksCutByAShardBoundary) {
  // fsdp:3 chunks rows at 171 and 342: block rows 1 and 2 are cut, rows 0 and
  // 3 are whole on one trainer rank.
  v1::Side src = Side("trainer", Range(0, 3));
  Mesh(&src, "w", {512, 256}, {3}, {Sh(0)}, v1::BF16);
  v1::Side dst = Side("infer", Range(3, 2));
  QuantMesh(&dst, "w", {512, 256}, {2}, {Sh(0)});
  v1::Plan plan = BuildAndVerify(v1::TransferSpec(Spec(src, dst)));
  const Counts c = Count(plan);
  EXPECT_EQ(plan.quantizes_size(), 2);  // one cut block row on each TP rank
  EXPECT_EQ(plan.summary().num_quantizes(), 2);
  EXPECT_EQ(c.quant_pieces, 2);
  EXPECT_EQ(c.quantize_inputs, 4);  // each cut row: a part from two trainer ranks
  // Whole block rows: fp8 + 2 scales each; cut rows: bf16.
  EXPECT_EQ(plan.summary().network_bytes(), 2 * (128 * 256 + 2 * 4) + 2 * 128 * 256 * 2);
  for (const v1::Quantize& q : plan.quantizes()) {
    EXPECT_THAT(q.dst().shape(), ::testing::ElementsAre(128, 256));
    EXPECT_THAT(q.scale_dst().shape(), ::testing::ElementsAre(1, 2));
    EXPECT_EQ(q.inputs_size(), 2);
    for (const v1::QuantizeInput& in : q.inputs()) {
      const v1::Piece& p = plan.buckets(in.bucket()).pieces(in.piece());
      EXPECT_EQ(p.wire_dtype(), v1::BF16);
      EXPECT_EQ(plan.buckets(in.bucket()).round(), q.round());
    }
  }
}

TEST(BlockFp8PlanTest, ColumnShardsThroughBlocksReplicasAndRelays) {
  // Megatron-like column shards of 96 (cut blocks along cols), 2 replicas of
  // TP 2 on one node each: relays forward fp8 + scales; small buckets force
  // several rounds.
  v1::Side src = Side("trainer", Range(0, 4), 4);
  Mesh(&src, "w", {512, 384}, {4}, {Sh(1)}, v1::BF16);
  Mesh(&src, "n", {384}, {4}, {Rep()}, v1::BF16);
  v1::Side dst = Side("infer", Range(8, 8), 4);
  QuantMesh(&dst, "w", {512, 384}, {2, 4}, {Rep(), Sh(0)});
  Mesh(&dst, "n", {384}, {8}, {Rep()}, v1::BF16);
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_bucket_bytes(32768);
  spec.mutable_options()->set_staging_cap_bytes(131072);
  v1::Plan plan = BuildAndVerify(spec);
  EXPECT_GT(plan.quantizes_size(), 0);
  EXPECT_GT(plan.num_rounds(), 1);
  // One replica quantizes each cut region and forwards fp8 + scales to the
  // other: half the Quantize ops of a plan without relays, and fewer bytes.
  v1::TransferSpec no_relay = spec;
  no_relay.mutable_options()->set_disable_relay(true);
  v1::Plan direct = BuildAndVerify(no_relay);
  EXPECT_EQ(2 * plan.quantizes_size(), direct.quantizes_size());
  EXPECT_LT(plan.summary().network_bytes(), direct.summary().network_bytes());
  int64_t forwarded = 0;
  ForEachPlanPiece(plan, [&](const v1::Bucket&, const v1::Piece& p) {
    if (p.relay() && p.wire_dtype() == v1::FP8_E4M3 && p.quant_block_size() == 0) ++forwarded;
  });
  EXPECT_GT(forwarded, 0);
}

TEST(BlockFp8PlanTest, SenderSideRelaysForwardScales) {
  // Whole blocks on every trainer rank, 4 replicas on one node: the network
  // receiver relays fp8 + scales over NVLink to the others.
  v1::Side src = Side("trainer", Range(0, 2), 2);
  Mesh(&src, "w", {256, 256}, {2}, {Sh(0)}, v1::FP32);
  v1::Side dst = Side("infer", Range(8, 4), 8);
  QuantMesh(&dst, "w", {256, 256}, {4}, {Rep()});
  v1::Plan plan = BuildAndVerify(v1::TransferSpec(Spec(src, dst)));
  int64_t relayed_scales = 0;
  ForEachPlanPiece(plan, [&](const v1::Bucket&, const v1::Piece& p) {
    if (p.relay() && p.wire_dtype() == v1::FP32) ++relayed_scales;
  });
  EXPECT_GT(plan.summary().num_relay_pieces(), 0);
  EXPECT_GT(relayed_scales, 0);
  EXPECT_EQ(plan.quantizes_size(), 0);
}

TEST(BlockFp8PlanTest, ColocatedLocalCopiesQuantizeBothWays) {
  // Same workers on both sides: whole blocks are quantized by a COPY, cut
  // blocks by a Quantize reading the local source.
  v1::Side src = Side("trainer", Range(0, 3));
  Mesh(&src, "w", {384, 200}, {3}, {Sh(0)}, v1::BF16);
  Mesh(&src, "v", {300, 256}, {3}, {Sh(0)}, v1::FP16);
  v1::Side dst = Side("infer", Range(0, 3));
  QuantMesh(&dst, "w", {384, 200}, {3}, {Sh(0)});
  QuantMesh(&dst, "v", {300, 256}, {3}, {Rep()});
  v1::Plan plan = BuildAndVerify(v1::TransferSpec(Spec(src, dst)));
  EXPECT_GT(plan.summary().local_bytes(), 0);
  EXPECT_GT(plan.quantizes_size(), 0);
}

TEST(BlockFp8PlanTest, StackedExpertsAndFusedPartsCuttingABlock) {
  // w13 [E, 2I, H] fed from separate gate / up [E, I, H] with I = 96: the
  // gate/up boundary cuts block row 0 of every expert (receiver side); per
  // expert tensors [I, H] feed a 3-D destination through mappings.
  const int64_t e = 4, inter = 96, hidden = 256;
  v1::Side src = Side("trainer", Range(0, 2));
  Mesh(&src, "gate", {e, inter, hidden}, {2}, {Sh(0)}, v1::BF16);
  Mesh(&src, "up", {e, inter, hidden}, {2}, {Sh(0)}, v1::BF16);
  for (int k = 0; k < 2; ++k) {
    Mesh(&src, "down" + std::to_string(k), {hidden, 128}, {2}, {Sh(0)}, v1::BF16);
  }
  v1::Side dst = Side("infer", Range(2, 2));
  QuantMesh(&dst, "w13", {e, 2 * inter, hidden}, {2}, {Sh(0)});
  QuantMesh(&dst, "w2", {2, hidden, 128}, {2}, {Sh(1)}, {64, 64});
  v1::TransferSpec spec = Spec(src, dst);
  Map(&spec, "w13", {0, 0, 0}, "gate", {0, 0, 0}, {e, inter, hidden});
  Map(&spec, "w13", {0, inter, 0}, "up", {0, 0, 0}, {e, inter, hidden});
  for (int k = 0; k < 2; ++k) {
    Map(&spec, "w2", {k, 0, 0}, "down" + std::to_string(k), {0, 0}, {hidden, 128});
  }
  v1::Plan plan = BuildAndVerify(spec);
  EXPECT_GT(plan.quantizes_size(), 0);
  EXPECT_GT(Count(plan).quant_pieces, 0);
}

TEST(BlockFp8PlanTest, DeterministicAndKeyed) {
  v1::Side src = Side("trainer", Range(0, 3));
  Mesh(&src, "w", {512, 256}, {3}, {Sh(0)}, v1::BF16);
  v1::Side dst = Side("infer", Range(3, 2));
  QuantMesh(&dst, "w", {512, 256}, {2}, {Sh(0)});
  v1::TransferSpec spec = Spec(src, dst);
  BuildOptions opt;
  opt.record_plan_seconds = false;
  absl::StatusOr<v1::Plan> a = BuildPlan(spec, opt), b = BuildPlan(spec, opt);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
  v1::TransferSpec other = spec;
  other.mutable_destination()->mutable_tensors(0)->mutable_block_quantization()->add_block(64);
  other.mutable_destination()->mutable_tensors(0)->mutable_block_quantization()->add_block(64);
  EXPECT_NE(PlanKey(spec), PlanKey(other));
}

absl::Status PlanError(const v1::TransferSpec& spec) { return BuildPlan(spec).status(); }

TEST(BlockFp8PlanTest, BadDeclarationsAreClearErrors) {
  v1::Side src = Side("trainer", Range(0, 2));
  Mesh(&src, "w", {384, 256}, {2}, {Sh(0)}, v1::BF16);
  {
    // TP shards of 192 rows: a destination fragment holding half a block.
    v1::Side dst = Side("infer", Range(2, 2));
    QuantMesh(&dst, "w", {384, 256}, {2}, {Sh(0)});
    absl::Status st = PlanError(Spec(src, dst));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("tensor \"w\" rank 0 box"));
    EXPECT_THAT(st.message(), HasSubstr("not aligned to the quantization block"));
  }
  {
    v1::Side s8 = Side("trainer", Range(0, 2));
    Mesh(&s8, "w", {256, 256}, {2}, {Sh(0)}, v1::FP8_E5M2);
    v1::Side dst = Side("infer", Range(2, 1));
    QuantMesh(&dst, "w", {256, 256}, {1}, {Rep()});
    absl::Status st = PlanError(Spec(s8, dst));
    EXPECT_THAT(st.message(), HasSubstr("block-fp8 quantized, source tensor 'w' is fp8_e5m2"));
  }
  {
    v1::Side dst = Side("infer", Range(2, 1));
    v1::TensorLayout* t = Mesh(&dst, "w", {384, 256}, {1}, {Rep()}, v1::FP8_E4M3);
    t->mutable_block_quantization()->set_scale_tensor("w_scale");
    Mesh(&dst, "w_scale", {3, 3}, {1}, {Rep()}, v1::FP32);
    EXPECT_THAT(PlanError(Spec(src, dst)).message(),
                HasSubstr("must be FP32 of shape [3, 2] (one scale per 128x128 block)"));
  }
  {
    v1::Side dst = Side("infer", Range(2, 1));
    v1::TensorLayout* t = Mesh(&dst, "w", {384, 256}, {1}, {Rep()}, v1::FP8_E4M3);
    t->mutable_block_quantization()->set_scale_tensor("nope");
    EXPECT_THAT(PlanError(Spec(src, dst)).message(), HasSubstr("scale tensor 'nope' is not"));
  }
  {
    v1::Side dst = Side("infer", Range(2, 1));
    v1::TensorLayout* t = Mesh(&dst, "w", {384, 256}, {1}, {Rep()}, v1::BF16);
    t->mutable_block_quantization()->set_scale_tensor("w_scale");
    Mesh(&dst, "w_scale", {3, 2}, {1}, {Rep()}, v1::FP32);
    EXPECT_THAT(PlanError(Spec(src, dst)).message(), HasSubstr("needs dtype FP8_E4M3"));
  }
  {
    // Scales of rank 0's blocks placed on rank 1.
    v1::Side dst = Side("infer", Range(2, 2));
    v1::TensorLayout* t = Mesh(&dst, "w", {384, 256}, {1}, {Rep()}, v1::FP8_E4M3, {0});
    t->mutable_block_quantization()->set_scale_tensor("w_scale");
    Mesh(&dst, "w_scale", {3, 2}, {1}, {Rep()}, v1::FP32, {1});
    EXPECT_THAT(PlanError(Spec(src, dst)).message(),
                HasSubstr("no fragment of scale tensor 'w_scale' on that rank"));
  }
  {
    // Partial source: reduce-then-quantize is refused.
    v1::Side ps = Side("trainer", Range(0, 2));
    Mesh(&ps, "w", {256, 256}, {2}, {Part()}, v1::BF16);
    v1::Side dst = Side("infer", Range(2, 1));
    QuantMesh(&dst, "w", {256, 256}, {1}, {Rep()});
    EXPECT_THAT(PlanError(Spec(ps, dst)).message(), HasSubstr("only as Partial values"));
  }
  {
    // A mapping into the scale tensor.
    v1::Side dst = Side("infer", Range(2, 1));
    QuantMesh(&dst, "w", {384, 256}, {1}, {Rep()});
    v1::TransferSpec spec = Spec(src, dst);
    Map(&spec, "w_scale", {0, 0}, "w", {0, 0}, {3, 2});
    EXPECT_THAT(PlanError(spec).message(), HasSubstr("quantization writes it"));
  }
  {
    // Declared on the source side.
    v1::Side qs = src;
    qs.mutable_tensors(0)->mutable_block_quantization()->set_scale_tensor("w");
    v1::Side dst = Side("infer", Range(2, 1));
    Mesh(&dst, "w", {384, 256}, {1}, {Rep()}, v1::BF16);
    EXPECT_THAT(PlanError(Spec(qs, dst)).message(), HasSubstr("is a destination declaration"));
  }
}

TEST(BlockFp8PlanTest, VerifyCatchesAWrongScale) {
  // The oracle can fail: corrupt one scale piece's offset and replay.
  v1::Side src = Side("trainer", Range(0, 2));
  Mesh(&src, "w", {256, 256}, {2}, {Sh(0)}, v1::BF16);
  v1::Side dst = Side("infer", Range(2, 1));
  QuantMesh(&dst, "w", {256, 256}, {1}, {Rep()});
  v1::TransferSpec spec = Spec(src, dst);
  v1::Plan plan = BuildAndVerify(spec);
  bool changed = false;
  for (v1::Bucket& b : *plan.mutable_buckets()) {
    for (v1::Piece& p : *b.mutable_pieces()) {
      if (p.scales_of() != 0 && !changed) {
        // Scales land in the wrong block row.
        p.mutable_dst()->set_byte_offset(p.dst().byte_offset() == 0 ? 8 : 0);
        changed = true;
      }
    }
  }
  ASSERT_TRUE(changed);
  EXPECT_FALSE(VerifyPlan(spec, plan).ok());
}

}  // namespace
}  // namespace wsync::plan
