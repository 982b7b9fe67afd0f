// CudaDataOps against HostDataOps (the reference, common/cast.h rounding):
// every result compared bit for bit over whole buffers, so writes outside a
// view are caught too.
#include "worker/backends/cuda/cuda_data_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "common/cast.h"
#include "tests/gpu/cuda_data_ops_fixture.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/host/host_data_ops.h"

namespace wsync::cuda {
namespace {

using exec::StridedView;
using testing::FirstDiff;
using testing::TwinBuffer;
using testing::View;

using testing_ops::CudaDataOpsTest;
using testing_ops::kFloats;
using testing_ops::RandomView;
using testing_ops::ViewSpec;

TEST_F(CudaDataOpsTest, PackThousandsOfPiecesInOneLaunchMatchesHost) {
  std::mt19937 rng(7);
  TwinBuffer src(0, 8 << 20, 1), staging(0, 16 << 20, 2);
  std::vector<ViewSpec> views;
  std::vector<DType> wires;
  std::vector<int64_t> offsets;
  int64_t pos = 0;
  const DType dtypes[] = {v1::FP32, v1::BF16, v1::FP16, v1::FP8_E4M3, v1::INT32, v1::INT64};
  for (int i = 0; i < 3000; ++i) {
    const DType sd = dtypes[rng() % 6];
    DType wd = sd;
    if (IsFloatingPoint(sd) && rng() % 2) wd = kFloats[rng() % 5];
    ViewSpec v = RandomView(rng, sd, 512);
    const int64_t es = DTypeSize(sd);
    v.offset = (static_cast<int64_t>(rng() % (src.size() - v.Extent() - 64)) / es) * es;
    if (rng() % 2) v.offset &= ~int64_t{15};  // half of them 16-byte aligned
    const int64_t ws = DTypeSize(wd);
    pos = (pos + ws - 1) / ws * ws + (rng() % 3 == 0 ? ws : 0);
    views.push_back(v);
    wires.push_back(wd);
    offsets.push_back(pos);
    pos += v.Elements() * ws;
  }
  ASSERT_LT(pos, static_cast<int64_t>(staging.size()));
  auto items = [&](void* base) {
    std::vector<exec::PackItem> out;
    for (size_t i = 0; i < views.size(); ++i) {
      out.push_back(exec::PackItem{views[i].On(base), offsets[i], wires[i]});
    }
    return out;
  };
  ASSERT_TRUE(host_.Pack(items(src.host()), staging.host()).ok());
  const int64_t launches = ops_->launches();
  ASSERT_TRUE(ops_->Pack(items(src.dev()), staging.dev()).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(ops_->launches() - launches, 1) << "3000 pieces must be one kernel launch";
  EXPECT_EQ(FirstDiff(staging.Download(), staging.host_bytes()), -1);

  // Replaying the same items reuses the resident table.
  staging.Upload();  // device staging back to the expected bytes before the replay
  const int64_t hits = ops_->table_cache_hits();
  ASSERT_TRUE(ops_->Pack(items(src.dev()), staging.dev()).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(ops_->table_cache_hits() - hits, 1);
  EXPECT_EQ(FirstDiff(staging.Download(), staging.host_bytes()), -1);
}

TEST_F(CudaDataOpsTest, UnpackIntoDisjointStridedViewsMatchesHost) {
  std::mt19937 rng(11);
  TwinBuffer staging(0, 8 << 20, 3), dst(0, 16 << 20, 4);
  std::vector<exec::UnpackItem> proto;
  std::vector<ViewSpec> views;
  int64_t spos = 0, dpos = 0;
  for (int i = 0; i < 2000; ++i) {
    const DType dd = kFloats[rng() % 3];
    const DType wd = rng() % 2 ? dd : kFloats[rng() % 5];
    ViewSpec v = RandomView(rng, dd, 700);
    const int64_t es = DTypeSize(dd);
    dpos = (dpos + 15) / 16 * 16 + (rng() % 2) * es;
    v.offset = dpos;
    dpos += v.Extent();
    const int64_t ws = DTypeSize(wd);
    spos = (spos + ws - 1) / ws * ws;
    proto.push_back(exec::UnpackItem{spos, wd, {}});
    views.push_back(v);
    spos += v.Elements() * ws;
  }
  ASSERT_LT(dpos, static_cast<int64_t>(dst.size()));
  ASSERT_LT(spos, static_cast<int64_t>(staging.size()));
  auto items = [&](void* base) {
    std::vector<exec::UnpackItem> out = proto;
    for (size_t i = 0; i < out.size(); ++i) out[i].dst = views[i].On(base);
    return out;
  };
  ASSERT_TRUE(host_.Unpack(staging.host(), items(dst.host())).ok());
  ASSERT_TRUE(ops_->Unpack(staging.dev(), items(dst.dev())).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

TEST_F(CudaDataOpsTest, FusedQkvGateUpAndRowShardCopiesMatchHost) {
  // Colocated TP=2 rank 0: q/k/v/gate/up rows [0, n/2) into fused buffers,
  // o_proj columns [0, H/2) (strided source), plus a fp32 -> bf16 cast.
  const int64_t H = 256, Q = 256, KV = 64, I = 512;
  TwinBuffer src(0, 8 << 20, 5), dst(0, 8 << 20, 6);
  auto items = [&](void* s, void* d) {
    std::vector<exec::CopyItem> out;
    int64_t so = 0, dof = 0;
    auto add_rows = [&](int64_t rows, DType sdt, DType ddt) {
      const int64_t half = rows / 2;
      out.push_back({View(s, so, sdt, {half, H}, {H, 1}), View(d, dof, ddt, {half, H}, {H, 1})});
      so += rows * H * DTypeSize(sdt);
      dof += half * H * DTypeSize(ddt);
    };
    add_rows(Q, v1::BF16, v1::BF16);   // q
    add_rows(KV, v1::BF16, v1::BF16);  // k
    add_rows(KV, v1::BF16, v1::BF16);  // v
    add_rows(I, v1::FP32, v1::BF16);   // gate (fp32 trainer)
    add_rows(I, v1::FP32, v1::BF16);   // up
    // o_proj [H, Q]: this rank's columns [0, Q/2): strided source rows.
    out.push_back({View(s, so, v1::BF16, {H, Q / 2}, {Q, 1}),
                   View(d, dof, v1::BF16, {H, Q / 2}, {Q / 2, 1})});
    so += H * Q * 2;
    dof += H * (Q / 2) * 2;
    // Differing shapes: [24] -> [2,3,4] (refinable), [6,4] -> [4,6] strided (scratch).
    out.push_back(
        {View(s, so, v1::FP16, {24}, {1}), View(d, dof, v1::BF16, {2, 3, 4}, {12, 4, 1})});
    dof += 64;
    out.push_back({View(s, so, v1::FP16, {6, 4}, {8, 1}), View(d, dof, v1::FP32, {4, 6}, {6, 1})});
    return out;
  };
  ASSERT_TRUE(host_.Copy(items(src.host(), dst.host())).ok());
  const int64_t launches = ops_->launches();
  ASSERT_TRUE(ops_->Copy(items(src.dev(), dst.dev())).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_LE(ops_->launches() - launches, 2);
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
  // A call without scratch items stays resident; its replay (the resident
  // table) on fresh memory writes what the first run wrote.
  TwinBuffer again(0, 8 << 20, 6);
  auto cached = [&](void* s, void* d) {
    std::vector<exec::CopyItem> out = items(s, d);
    out.pop_back();  // the scratch item (no common refinement) is never cached
    return out;
  };
  ASSERT_TRUE(ops_->Copy(cached(src.dev(), again.dev())).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  again.Upload();  // back to the initial bytes
  const int64_t hits = ops_->table_cache_hits();
  ASSERT_TRUE(ops_->Copy(cached(src.dev(), again.dev())).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(ops_->table_cache_hits(), hits + 1);
  ASSERT_TRUE(host_.Copy(cached(src.host(), again.host())).ok());
  EXPECT_EQ(FirstDiff(again.Download(), again.host_bytes()), -1);
}

// Every 16-bit code of bf16 and fp16 to every float dtype, and fp32 patterns
// around every exponent (ties, NaN payloads, subnormals) to every narrow one.
TEST_F(CudaDataOpsTest, ConversionsMatchHostExhaustively) {
  const int64_t n16 = 65536;
  std::vector<uint32_t> f32;
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t m : {0u, 1u, 0x7FFFu, 0x8000u, 0x8001u, 0x18000u, 0xFFFFu, 0x10000u, 0x3FFFFFu,
                         0x400000u, 0x7FFFFFu, 0x0FFFFFu, 0x100000u, 0x080000u, 0x0FF000u}) {
        f32.push_back((sign << 31) | (e << 23) | m);
      }
    }
  }
  const int64_t nf = static_cast<int64_t>(f32.size());
  const size_t bytes = n16 * 2 * 2 + nf * 4 + (1 << 20) * 4;
  TwinBuffer src(0, bytes, 8), dst(0, n16 * 4 * 10 + nf * 4 * 4 + 4096, 9);
  for (int64_t i = 0; i < n16; ++i) {
    const uint16_t c = static_cast<uint16_t>(i);
    std::memcpy(src.host() + 2 * i, &c, 2);
    std::memcpy(src.host() + 2 * n16 + 2 * i, &c, 2);
  }
  std::memcpy(src.host() + 4 * n16, f32.data(), nf * 4);
  src.Upload();
  auto items = [&](void* s, void* d) {
    std::vector<exec::CopyItem> out;
    int64_t dof = 0;
    for (DType to : kFloats) {
      for (auto [from, off] : {std::pair{v1::BF16, int64_t{0}}, std::pair{v1::FP16, 2 * n16}}) {
        out.push_back({View(s, off, from, {n16}, {1}), View(d, dof, to, {n16}, {1})});
        dof += n16 * DTypeSize(to);
      }
      out.push_back({View(s, 4 * n16, v1::FP32, {nf}, {1}), View(d, dof, to, {nf}, {1})});
      dof += nf * DTypeSize(to);
    }
    return out;
  };
  ASSERT_TRUE(host_.Copy(items(src.host(), dst.host())).ok());
  ASSERT_TRUE(ops_->Copy(items(src.dev(), dst.dev())).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

TEST_F(CudaDataOpsTest, PartialReduceMatchesHost) {
  // Finite values only: NaN propagation through an fp32 add is not specified
  // bit for bit across CPUs and GPUs.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> val(-8.f, 8.f);
  const int64_t n = 1 << 16;
  TwinBuffer in(0, n * 4 * 8, 10), staging(0, n * 4 * 4, 11), dst(0, n * 4 * 4, 12);
  auto fill = [&](TwinBuffer& b, int64_t off, DType dt, int64_t count) {
    std::vector<float> f(count);
    for (auto& x : f) x = val(rng);
    ASSERT_TRUE(ConvertElements(f.data(), v1::FP32, b.host() + off, dt, count).ok());
  };
  fill(in, 0, v1::FP32, 2 * n);
  fill(in, 8 * n, v1::BF16, 2 * n);
  fill(staging, 0, v1::BF16, n);
  fill(staging, 2 * n, v1::FP32, n);
  {
    std::vector<int32_t> ints(n);
    for (auto& x : ints) x = static_cast<int32_t>(rng());
    std::memcpy(in.host() + 12 * n, ints.data(), n * 4);
    std::memcpy(in.host() + 16 * n, ints.data(), n * 4);
  }
  in.Upload();
  staging.Upload();
  const int64_t rows = 128, cols = n / 128;
  auto build = [&](void* ib, void* db, std::vector<exec::ReduceInput>& inputs) {
    std::vector<exec::ReduceItem> items;
    // 1) SUM in bf16 of: staged bf16, strided fp32 (transposed), contiguous bf16 -> fp16 dst.
    inputs.push_back({View(nullptr, 0, v1::BF16, {n}, {1}), 0});
    inputs.push_back({View(ib, 0, v1::FP32, {rows, cols}, {1, rows}), -1});
    inputs.push_back({View(ib, 8 * n, v1::BF16, {rows, cols}, {cols, 1}), -1});
    items.push_back(
        {v1::REDUCE_SUM, v1::BF16, View(db, 0, v1::FP16, {rows, cols}, {cols, 1}), 0, 3});
    // 2) AVG in fp32 of staged fp32 + fp32 view into a strided bf16 dst.
    inputs.push_back({View(nullptr, 0, v1::FP32, {n}, {1}), 2 * n});
    inputs.push_back({View(ib, 4 * n, v1::FP32, {n}, {1}), -1});
    items.push_back(
        {v1::REDUCE_AVG, v1::FP32, View(db, 2 * n, v1::BF16, {rows, cols / 2}, {cols, 1}), 3, 2});
    // 3) int32 SUM wraps.
    inputs.push_back({View(ib, 12 * n, v1::INT32, {n}, {1}), -1});
    inputs.push_back({View(ib, 16 * n, v1::INT32, {n}, {1}), -1});
    items.push_back({v1::REDUCE_SUM, v1::INT32, View(db, 8 * n, v1::INT32, {n}, {1}), 5, 2});
    return items;
  };
  // Item 2's dst takes half the elements: give it matching inputs.
  std::vector<exec::ReduceInput> hin, din;
  auto hitems = build(in.host(), dst.host(), hin);
  auto ditems = build(in.dev(), dst.dev(), din);
  for (auto* v : {&hin, &din}) {
    (*v)[3].view.shape[0] = n / 2;
    (*v)[4].view.shape[0] = n / 2;
  }
  ASSERT_TRUE(host_.Reduce(hin, hitems, staging.host()).ok());
  ASSERT_TRUE(ops_->Reduce(din, ditems, staging.dev()).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

// Block fp8 (common/block_fp8.h is the reference): a quantized pack of a
// strided 3-D bf16 view next to a plain pack item, scales at an unaligned
// staging offset; and a receiver-side Quantize whose region (strided fp8,
// strided scales) is tiled by a staged bf16 part and a strided fp32 part.
// Finite inputs of mixed magnitudes (NaN payloads are not specified bit for
// bit across CPUs and GPUs).
TEST_F(CudaDataOpsTest, BlockFp8QuantizeMatchesHost) {
  std::mt19937 rng(21);
  std::normal_distribution<float> val(0.f, 1.f);
  TwinBuffer src(0, 1 << 20, 30), staging(0, 1 << 20, 31), dst(0, 1 << 20, 32);
  auto fill = [&](TwinBuffer& b, int64_t off, DType dt, int64_t count) {
    std::vector<float> f(count);
    for (int64_t k = 0; k < count; ++k) {
      f[k] = val(rng) * std::ldexp(1.0f, static_cast<int>(k / 4096 % 9) - 6);
    }
    f[5] = 0.0f;
    ASSERT_TRUE(ConvertElements(f.data(), v1::FP32, b.host() + off, dt, count).ok());
  };
  fill(src, 0, v1::BF16, 2 * 140 * 210);                  // parent of the quantized pack view
  fill(src, 2 * 2 * 140 * 210, v1::FP32, 3 * 160 * 200);  // strided fp32 quantize part
  fill(staging, 200000, v1::BF16, 3 * 100 * 192);         // staged bf16 quantize part
  std::memset(src.host() + 700000, 0, 256 * 128 * 2);     // an all-zero area
  src.Upload();
  staging.Upload();
  auto pack_items = [&](void* sb) {
    std::vector<exec::PackItem> out;
    exec::PackItem q{View(sb, 2 * (3 * 210 + 5), v1::BF16, {2, 130, 200}, {140 * 210, 210, 1}), 16,
                     v1::FP8_E4M3};
    q.quant_outer = 2;
    q.quant_rows = 130;
    q.quant_cols = 200;
    q.quant_block_rows = 128;
    q.quant_block_cols = 128;
    q.scale_offset = 16 + 2 * 130 * 200 + 1;  // 2 x 2 x 2 scales, unaligned
    out.push_back(q);
    out.push_back(exec::PackItem{View(sb, 700000, v1::BF16, {64, 100}, {128, 1}), 60000, v1::BF16});
    return out;
  };
  ASSERT_TRUE(host_.Pack(pack_items(src.host()), staging.host()).ok());
  ASSERT_TRUE(ops_->Pack(pack_items(src.dev()), staging.dev()).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(staging.Download(), staging.host_bytes()), -1);

  auto quant = [&](void* sb, void* db, std::vector<exec::QuantizeInput>& inputs) {
    exec::QuantizeInput a;  // staged bf16, region rows [0, 100)
    a.view = View(nullptr, 0, v1::BF16, {3 * 100 * 192}, {1});
    a.staging_offset = 200000;
    a.shape = {3, 100, 192};
    exec::QuantizeInput b;  // strided fp32, rows [100, 256)
    b.view = View(sb, 2 * 2 * 140 * 210, v1::FP32, {3, 156, 192}, {160 * 200, 200, 1});
    b.offset = {0, 100, 0};
    b.shape = {3, 156, 192};
    inputs = {a, b};
    exec::QuantizeItem it;
    it.dst = View(db, 1000, v1::FP8_E4M3, {3, 256, 192}, {260 * 200, 200, 1});
    it.scale_dst = View(db, 200000, v1::FP32, {3, 2, 2}, {8, 4, 1});
    it.block_rows = 128;
    it.block_cols = 128;
    it.input_begin = 0;
    it.num_inputs = 2;
    return std::vector<exec::QuantizeItem>{it};
  };
  std::vector<exec::QuantizeInput> hin, din;
  auto hitems = quant(src.host(), dst.host(), hin);
  auto ditems = quant(src.dev(), dst.dev(), din);
  ASSERT_TRUE(host_.Quantize(hin, hitems, staging.host()).ok());
  ASSERT_TRUE(ops_->Quantize(din, ditems, staging.dev()).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
  // The same calls again (stream-ordered reuse of scratch and region table).
  ASSERT_TRUE(ops_->Pack(pack_items(src.dev()), staging.dev()).ok());
  ASSERT_TRUE(ops_->Quantize(din, ditems, staging.dev()).ok());
  ASSERT_TRUE(ops_->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
  EXPECT_EQ(FirstDiff(staging.Download(), staging.host_bytes()), -1);
}

}  // namespace
}  // namespace wsync::cuda
