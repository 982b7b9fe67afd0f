#include "worker/backends/host/host_data_ops.h"

#include <vector>

#include "common/cast.h"
#include "gtest/gtest.h"

namespace wsync::exec {
namespace {

StridedView V(void* data, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  auto v = MakeStridedView(data, dtype, shape, strides);
  EXPECT_TRUE(v.ok()) << v.status();
  return *v;
}

TEST(HostDataOpsTest, PackUnpackStridedWithCastAcrossChunks) {
  HostDataOps ops;
  // A [300, 500] fp32 matrix; pack columns 7..406 of every second row.
  std::vector<float> m(300 * 500);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i) * 0.01f;
  const StridedView src = V(m.data() + 7, v1::FP32, {150, 400}, {1000, 1});
  auto staging = ops.AllocateStaging(16 + 150 * 400 * 2);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(ops.Pack({PackItem{src, 16, v1::BF16}}, staging->data()).ok());
  const uint16_t* packed =
      reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(staging->data()) + 16);
  for (int r = 0; r < 150; ++r) {
    for (int c = 0; c < 400; c += 37) {
      ASSERT_EQ(packed[r * 400 + c], FloatToBf16(m[2 * r * 500 + 7 + c])) << r << "," << c;
    }
  }
  // Unpack transposed into fp32: out[c][r].
  std::vector<float> out(400 * 150, -1.0f);
  const StridedView dst = V(out.data(), v1::FP32, {150, 400}, {1, 150});
  ASSERT_TRUE(ops.Unpack(staging->data(), {UnpackItem{16, v1::BF16, dst}}).ok());
  for (int r = 0; r < 150; r += 7) {
    for (int c = 0; c < 400; c += 13) {
      ASSERT_EQ(out[c * 150 + r], Bf16ToFloat(FloatToBf16(m[2 * r * 500 + 7 + c])));
    }
  }
}

TEST(HostDataOpsTest, CopySameDtypeStridedBothSides) {
  HostDataOps ops;
  std::vector<int32_t> a(64), b(64, -1);
  for (int i = 0; i < 64; ++i) a[i] = i;
  // Every other element of a -> every 4th of b... as [4,4] views.
  ASSERT_TRUE(ops.Copy({CopyItem{V(a.data(), v1::INT32, {4, 4}, {16, 2}),
                                 V(b.data(), v1::INT32, {4, 4}, {1, 4})}})
                  .ok());
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(b[i + 4 * j], 16 * i + 2 * j);
  }
  // Integer -> float is refused, not reinterpreted; the error names the item
  // in its message and, for the interpreter, in a payload.
  std::vector<float> f(16);
  const CopyItem good{V(a.data(), v1::INT32, {16}, {1}), V(b.data(), v1::INT32, {16}, {1})};
  const absl::Status s = ops.Copy(
      {good, CopyItem{V(a.data(), v1::INT32, {16}, {1}), V(f.data(), v1::FP32, {16}, {1})}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("copy item 1: "), absl::string_view::npos) << s;
  EXPECT_EQ(ErrorItemIndex(s), 1);
  EXPECT_EQ(ErrorItemIndex(absl::InternalError("no item")), -1);
  EXPECT_EQ(ErrorItemIndex(TagItem(absl::InternalError("tagged"), 7)), 7);
  EXPECT_TRUE(TagItem(absl::OkStatus(), 7).ok());
}

TEST(HostDataOpsTest, ReduceMixesStagedAndStridedInputs) {
  HostDataOps ops;
  constexpr int kN = 100000;  // > one chunk
  std::vector<float> staged(kN), local(2 * kN);
  for (int i = 0; i < kN; ++i) {
    staged[i] = i * 0.5f;
    local[2 * i] = 1.0f;
  }
  std::vector<uint16_t> dst(kN);
  ReduceInput in0;
  in0.view.dtype = v1::FP32;
  in0.view.ndim = 1;
  in0.view.shape[0] = kN;
  in0.view.strides[0] = 1;
  in0.staging_offset = 0;
  ReduceInput in1;
  in1.view = V(local.data(), v1::FP32, {kN}, {2});
  ReduceItem item;
  item.op = v1::REDUCE_SUM;
  item.accumulate_dtype = v1::FP32;
  item.dst = V(dst.data(), v1::FP16, {kN}, {1});
  item.input_begin = 0;
  item.num_inputs = 2;
  ASSERT_TRUE(ops.Reduce({in0, in1}, {item}, staged.data()).ok());
  for (int i = 0; i < kN; i += 999) ASSERT_EQ(dst[i], FloatToFp16(i * 0.5f + 1.0f)) << i;
  item.num_inputs = 3;
  EXPECT_FALSE(ops.Reduce({in0, in1}, {item}, staged.data()).ok());
}

}  // namespace
}  // namespace wsync::exec
