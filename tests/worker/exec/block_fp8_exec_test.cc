// Block fp8 end to end on host memory: plans from the real planner, every
// worker runs its part over Gloo loopback with HostDataOps, and every fp8
// byte and scale of every destination shard must equal the reference
// quantizer (common/block_fp8.h) applied to the global source tensor.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/block_fp8.h"
#include "common/cast.h"
#include "controller/plan/planner.h"
#include "gtest/gtest.h"
#include "tests/controller/plan/planner_test_util.h"
#include "tests/worker/exec/cluster.h"
#include "tests/worker/exec/spec_helpers.h"

namespace wsync::exec {
namespace {

using plan::planner_testing::Rep;
using plan::planner_testing::Sh;
using testing::Box2d;
using testing::Cluster;
using testing::MakeSide;
using testing::RankBox;

struct Tensor2d {
  std::string name;
  int64_t rows = 0, cols = 0;
  v1::DType dtype = v1::BF16;
  v1::Placement placement;
  std::vector<int32_t> workers;
  // Rank r's box.
  void Box(int r, int64_t* r0, int64_t* c0, int64_t* nr, int64_t* nc) const {
    const Box2d b = RankBox(rows, cols, placement, static_cast<int>(workers.size()), r);
    *r0 = b.r0, *c0 = b.c0, *nr = b.rows, *nc = b.cols;
  }
};

v1::TensorLayout* AddMesh(v1::Side* side, const Tensor2d& t) {
  v1::TensorLayout* l = side->add_tensors();
  l->set_name(t.name);
  l->set_dtype(t.dtype);
  l->add_shape(t.rows);
  l->add_shape(t.cols);
  v1::MeshLayout* m = l->mutable_mesh();
  m->add_mesh_shape(static_cast<int64_t>(t.workers.size()));
  for (size_t i = 0; i < t.workers.size(); ++i) m->add_ranks(static_cast<int32_t>(i));
  *m->add_placements() = t.placement;
  return l;
}

// Values with a different magnitude per block row, inexact in fp8, exact in bf16.
std::vector<float> GlobalValues(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    const float mag = std::ldexp(1.0f, static_cast<int>(i / 128 % 7) - 8);
    for (int64_t j = 0; j < cols; ++j) v[i * cols + j] = Bf16ToFloat(FloatToBf16(dist(rng) * mag));
  }
  v[0] = 0.0f;
  return v;
}

// Source `src` (bf16) -> quantized destination `dst_w` + scales `dst_s` on
// their own workers; runs the plan and checks every byte.
// receiver_side: whether the plan must quantize at receivers (else only at senders).
void RunAndCheck(const Tensor2d& src, const Tensor2d& dst_w, int workers, int64_t bucket_bytes,
                 bool pipeline, bool receiver_side) {
  Tensor2d dst_s = dst_w;
  dst_s.name = dst_w.name + "_scale";
  dst_s.rows = (dst_w.rows + 127) / 128;
  dst_s.cols = (dst_w.cols + 127) / 128;
  dst_s.dtype = v1::FP32;
  v1::TransferSpec spec;
  *spec.mutable_source() = MakeSide("trainer", src.workers);
  *spec.mutable_destination() = MakeSide("inference", dst_w.workers);
  AddMesh(spec.mutable_source(), src);
  AddMesh(spec.mutable_destination(), dst_w)
      ->mutable_block_quantization()
      ->set_scale_tensor(dst_s.name);
  AddMesh(spec.mutable_destination(), dst_s);
  if (bucket_bytes > 0) {
    spec.mutable_options()->set_bucket_bytes(bucket_bytes);
    spec.mutable_options()->set_staging_cap_bytes(4 * bucket_bytes);
  }
  auto plan = plan::BuildPlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int sender_quantized = 0;
  for (const v1::Bucket& b : plan->buckets()) {
    for (const v1::Piece& p : b.pieces()) sender_quantized += p.quant_block_size() > 0;
  }
  EXPECT_EQ(plan->quantizes_size() > 0, receiver_side);
  if (!receiver_side) EXPECT_GT(sender_quantized, 0);

  const std::vector<float> global = GlobalValues(src.rows, src.cols, 17);
  Cluster c(workers);
  for (size_t r = 0; r < src.workers.size(); ++r) {
    int64_t r0, c0, nr, nc;
    src.Box(static_cast<int>(r), &r0, &c0, &nr, &nc);
    c.Add(src.workers[r], BufferSide::kSource, src.name, src.dtype, nr * nc);
    auto* data = c.Data<uint16_t>(src.workers[r], BufferSide::kSource, src.name);
    for (int64_t i = 0; i < nr; ++i) {
      for (int64_t j = 0; j < nc; ++j) {
        data[i * nc + j] = FloatToBf16(global[(r0 + i) * src.cols + c0 + j]);
      }
    }
  }
  for (const Tensor2d* t : {&dst_w, static_cast<const Tensor2d*>(&dst_s)}) {
    for (size_t r = 0; r < t->workers.size(); ++r) {
      int64_t r0, c0, nr, nc;
      t->Box(static_cast<int>(r), &r0, &c0, &nr, &nc);
      c.Add(t->workers[r], BufferSide::kDestination, t->name, t->dtype, nr * nc);
    }
  }
  // What the controller sends each worker (its part of the plan) binds too.
  for (int w = 0; w < workers; ++w) {
    auto part = plan::ExtractRankPlan(*plan, w);
    if (!part.ok()) continue;  // no part in the plan
    auto bound = BindPlan(*part, w, c.registry(w), MemorySpace::kHost);
    EXPECT_TRUE(bound.ok()) << "worker " << w << ": " << bound.status();
  }
  ExecutorOptions options;
  options.pipeline = pipeline;
  ASSERT_TRUE(c.Connect(options).ok());
  auto results = c.Run(*plan, absl::Seconds(60));
  for (int w = 0; w < workers; ++w)
    ASSERT_TRUE(results[w].ok()) << w << ": " << results[w].status();

  BlockGrid g;
  g.rows = dst_w.rows;
  g.cols = dst_w.cols;
  std::vector<uint8_t> want_q(g.num_elements());
  std::vector<float> want_s(g.num_blocks());
  ASSERT_TRUE(QuantizeBlocksFp8E4M3(global.data(), g, want_q.data(), want_s.data()).ok());
  for (size_t r = 0; r < dst_w.workers.size(); ++r) {
    int64_t r0, c0, nr, nc;
    dst_w.Box(static_cast<int>(r), &r0, &c0, &nr, &nc);
    const uint8_t* q = c.Data<uint8_t>(dst_w.workers[r], BufferSide::kDestination, dst_w.name);
    for (int64_t i = 0; i < nr; ++i) {
      for (int64_t j = 0; j < nc; ++j) {
        ASSERT_EQ(q[i * nc + j], want_q[(r0 + i) * g.cols + c0 + j])
            << "worker " << dst_w.workers[r] << " element (" << r0 + i << "," << c0 + j << ")";
      }
    }
    dst_s.Box(static_cast<int>(r), &r0, &c0, &nr, &nc);
    const float* s = c.Data<float>(dst_s.workers[r], BufferSide::kDestination, dst_s.name);
    for (int64_t i = 0; i < nr; ++i) {
      for (int64_t j = 0; j < nc; ++j) {
        ASSERT_EQ(s[i * nc + j], want_s[(r0 + i) * g.col_blocks() + c0 + j])
            << "worker " << dst_s.workers[r] << " block (" << r0 + i << "," << c0 + j << ")";
      }
    }
  }
}

TEST(BlockFp8ExecTest, SenderSideQuantizationFromWholeBlocks) {
  // fsdp:4 rows of 128 -> TP 2 (256 rows each); cols 200: partial edge blocks.
  Tensor2d src{"w", 512, 200, v1::BF16, Sh(0), {0, 1, 2, 3}};
  Tensor2d dst{"w", 512, 200, v1::FP8_E4M3, Sh(0), {4, 5}};
  auto plan_check = [&](bool pipeline) { RunAndCheck(src, dst, 6, 0, pipeline, false); };
  plan_check(true);
  plan_check(false);
}

TEST(BlockFp8ExecTest, ReceiverSideQuantizationWhereShardsCutBlocks) {
  // fsdp:3 cuts rows at 171 / 342; tiny buckets force several rounds.
  Tensor2d src{"w", 512, 256, v1::BF16, Sh(0), {0, 1, 2}};
  Tensor2d dst{"w", 512, 256, v1::FP8_E4M3, Sh(0), {3, 4}};
  RunAndCheck(src, dst, 5, 65536, true, true);
  RunAndCheck(src, dst, 5, 65536, false, true);
}

TEST(BlockFp8ExecTest, ColumnShardsAndReplicatedDestinationWithRelays) {
  Tensor2d src{"w", 256, 384, v1::BF16, Sh(1), {0, 1, 2, 3}};  // 96-col shards
  Tensor2d dst{"w", 256, 384, v1::FP8_E4M3, Rep(), {4, 5, 6}};
  RunAndCheck(src, dst, 7, 0, true, true);
}

TEST(BlockFp8ExecTest, ColocatedLocalQuantization) {
  // Same workers on both sides: whole blocks quantized by a local copy, cut
  // blocks by a Quantize reading the local source.
  Tensor2d src{"w", 384, 256, v1::BF16, Sh(0), {0, 1, 2, 3, 4}};  // 77-row shards
  Tensor2d dst{"w", 384, 256, v1::FP8_E4M3, Sh(0), {0, 1, 2}};
  RunAndCheck(src, dst, 5, 0, true, true);
}

}  // namespace
}  // namespace wsync::exec
