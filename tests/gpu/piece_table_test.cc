// Host-only checks of the kernel table builder (runs without a GPU).
#include "worker/backends/cuda/piece_table.h"

#include <gtest/gtest.h>

namespace wsync::cuda {
namespace {

TEST(NormalizeDimsTest, MergesContiguousDimsAndDropsUnitDims) {
  int64_t shape[] = {2, 1, 3, 4};
  int64_t a[] = {12, 99, 4, 1};
  int64_t b[] = {24, 99, 8, 1};  // rows padded to 8: only the outer pair merges
  int64_t* s[] = {a, b};
  const int n = NormalizeDims(shape, 4, s, 2);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(shape[0], 6);
  EXPECT_EQ(shape[1], 4);
  EXPECT_EQ(a[0], 4);
  EXPECT_EQ(b[0], 8);
}

TEST(NormalizeDimsTest, EmptyAndScalar) {
  int64_t shape[] = {3, 0};
  int64_t a[] = {1, 1};
  int64_t* s[] = {a};
  EXPECT_EQ(NormalizeDims(shape, 2, s, 1), 0);
  int64_t one[] = {1, 1};
  int64_t st[] = {5, 7};
  int64_t* s2[] = {st};
  EXPECT_EQ(NormalizeDims(one, 2, s2, 1), 1);
  EXPECT_EQ(one[0], 1);
}

TEST(PieceTableTest, AlignedContiguousCopyUsesVectorPathAndBoundedTasks) {
  alignas(16) static char src[1 << 20], dst[1 << 20];
  PieceTable t;
  const int64_t shape[] = {512, 1024};
  const int64_t st[] = {1024, 1};
  ASSERT_TRUE(t.AddCopy({src, v1::BF16, st}, {dst, v1::BF16, st}, shape, 2, "x").ok());
  ASSERT_EQ(t.pieces().size(), 1u);
  EXPECT_EQ(t.pieces()[0].mode, kModeVecCopy);
  EXPECT_EQ(t.pieces()[0].shape[3], 512 * 1024);  // merged to one row
  int64_t covered = 0;
  for (const TaskDesc& task : t.tasks()) {
    EXPECT_LE(task.nrows * task.ncols, PieceTable::kTaskElements);
    covered += task.nrows * task.ncols;
  }
  EXPECT_EQ(covered, 512 * 1024);
}

TEST(PieceTableTest, MisalignedOrCastingPiecesUseScalarPaths) {
  alignas(16) static char src[4096], dst[4096];
  PieceTable t;
  const int64_t shape[] = {100};
  const int64_t st[] = {1};
  ASSERT_TRUE(t.AddCopy({src + 2, v1::BF16, st}, {dst, v1::BF16, st}, shape, 1, "a").ok());
  ASSERT_TRUE(t.AddCopy({src, v1::FP32, st}, {dst, v1::BF16, st}, shape, 1, "b").ok());
  EXPECT_EQ(t.pieces()[0].mode, kModeRawCopy);
  EXPECT_EQ(t.pieces()[1].mode, kModeCastCopy);
  EXPECT_EQ(t.bytes_written(), 400);
}

TEST(PieceTableTest, CopyOnlyUntilACastOrReduceIsAdded) {
  // copy_only picks the lean kernel, which has no cast or reduce path.
  alignas(16) static char src[4096], dst[4096];
  PieceTable t;
  EXPECT_TRUE(t.copy_only());
  const int64_t shape[] = {100};
  const int64_t st[] = {1};
  ASSERT_TRUE(t.AddCopy({src, v1::BF16, st}, {dst, v1::BF16, st}, shape, 1, "vec").ok());
  ASSERT_TRUE(t.AddCopy({src + 2, v1::BF16, st}, {dst, v1::BF16, st}, shape, 1, "raw").ok());
  EXPECT_TRUE(t.copy_only());
  ASSERT_TRUE(t.AddCopy({src, v1::FP32, st}, {dst, v1::BF16, st}, shape, 1, "cast").ok());
  EXPECT_FALSE(t.copy_only());
  t.Clear();
  EXPECT_TRUE(t.copy_only());
  const void* inputs[] = {src, src + 1024};
  ASSERT_TRUE(t.AddReduce(inputs, 2, v1::FP32, v1::FP32, v1::REDUCE_SUM, {dst, v1::FP32, st}, shape,
                          1, "sum")
                  .ok());
  EXPECT_FALSE(t.copy_only());
}

TEST(PieceTableTest, ManyDimsArePeeled) {
  alignas(16) static char src[1 << 16], dst[1 << 16];
  PieceTable t;
  // 6 dims, none mergeable (every dim padded by one): peeled to <= 4 dims.
  const int64_t shape[] = {2, 2, 2, 2, 2, 3};
  const int64_t ss[] = {243, 81, 27, 9, 3, 1};
  const int64_t ds[] = {256, 64, 16, 4, 2, 1};  // dst rows padded differently
  ASSERT_TRUE(t.AddCopy({src, v1::INT8, ss}, {dst, v1::INT8, ds}, shape, 6, "p").ok());
  EXPECT_EQ(t.bytes_written(), 2 * 2 * 2 * 2 * 2 * 3);
  for (const PieceDesc& p : t.pieces()) EXPECT_GE(p.shape[0], 1);
}

TEST(PieceTableTest, UnsupportedConversionsAreErrors) {
  static char buf[64];
  PieceTable t;
  const int64_t shape[] = {4};
  const int64_t st[] = {1};
  EXPECT_EQ(t.AddCopy({buf, v1::INT32, st}, {buf + 32, v1::FP32, st}, shape, 1, "i").code(),
            absl::StatusCode::kInvalidArgument);
  const void* in[] = {buf};
  EXPECT_EQ(t.AddReduce(in, 1, v1::INT32, v1::INT32, v1::REDUCE_AVG, {buf + 32, v1::INT32, st},
                        shape, 1, "r")
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace wsync::cuda
