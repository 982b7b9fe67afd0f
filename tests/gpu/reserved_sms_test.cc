// The copy kernel's reserved SMs (CudaDataOps::Options::reserved_sms /
// put_reserved_sms; piece_kernel_impl.cuh): blocks placed on a reserved SM
// leave without work, all but the grid's last, so the work is done even
// when every block landed on a reserved SM. Reserving every SM forces that
// case: before the last block stayed, such a kernel copied nothing.
#include <gtest/gtest.h>

#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_peer_writer.h"
#include "worker/backends/host/host_data_ops.h"

namespace wsync::cuda {
namespace {

using testing::FirstDiff;
using testing::TwinBuffer;
using testing::View;

std::vector<exec::CopyItem> Items(void* s, void* d, int64_t rows, int64_t cols) {
  // Row blocks of a bf16 matrix into a fused buffer, and a strided column half.
  return {{View(s, 0, v1::BF16, {rows, cols}, {cols, 1}),
           View(d, 0, v1::BF16, {rows, cols}, {cols, 1})},
          {View(s, 0, v1::BF16, {rows, cols / 2}, {cols, 1}),
           View(d, rows * cols * 2, v1::BF16, {rows, cols / 2}, {cols / 2, 1})}};
}

TEST(ReservedSmsTest, EverySmReservedStillCopiesEverything) {
  WSYNC_REQUIRE_GPUS(1);
  CudaDataOps::Options options;
  options.device = 0;
  options.reserved_sms = 1 << 20;  // more than any device has
  auto ops = CudaDataOps::Create(options);
  ASSERT_TRUE(ops.ok()) << ops.status();
  exec::HostDataOps host;
  for (int64_t rows : {1, 8, 4096}) {  // a one-task grid, a few tasks, many blocks
    TwinBuffer src(0, 64 << 20, 3), dst(0, 64 << 20, 4);
    ASSERT_TRUE(host.Copy(Items(src.host(), dst.host(), rows, 1024)).ok());
    ASSERT_TRUE((*ops)->Copy(Items(src.dev(), dst.dev(), rows, 1024)).ok());
    ASSERT_TRUE((*ops)->Synchronize().ok());
    EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1) << rows << " rows";
  }
}

TEST(ReservedSmsTest, PutReservationStillCopiesEverything) {
  WSYNC_REQUIRE_GPUS(1);
  CudaDataOps::Options options;
  options.device = 0;
  auto ops = CudaDataOps::Create(options);
  ASSERT_TRUE(ops.ok()) << ops.status();
  (*ops)->ReserveSmsForPuts();  // as a peer writer that prepared puts does
  exec::HostDataOps host;
  for (int64_t rows : {1, 4096}) {
    TwinBuffer src(0, 64 << 20, 5), dst(0, 64 << 20, 6);
    ASSERT_TRUE(host.Copy(Items(src.host(), dst.host(), rows, 1024)).ok());
    ASSERT_TRUE((*ops)->Copy(Items(src.dev(), dst.dev(), rows, 1024)).ok());
    ASSERT_TRUE((*ops)->Synchronize().ok());
    EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1) << rows << " rows";
  }
}

// The put reservation is undone (results of session 17, open point): a
// writer whose next plan has no puts, or that goes away, gives the SMs back.
TEST(ReservedSmsTest, ThePutReservationIsGivenBackWithoutPutsAndWithTheWriter) {
  WSYNC_REQUIRE_GPUS(1);
  CudaDataOps::Options options;
  options.device = 0;
  options.reserved_sms = 2;
  options.put_reserved_sms = 8;
  auto ops = CudaDataOps::Create(options);
  ASSERT_TRUE(ops.ok()) << ops.status();
  TwinBuffer src(0, 1 << 20, 1), dst(0, 1 << 20, 2);
  const std::vector<exec::CopyItem> puts = Items(src.dev(), dst.dev(), 8, 1024);
  EXPECT_EQ((*ops)->reserved_sms(), 2);
  {
    auto writer = CudaPeerWriter::Create(ops->get());
    ASSERT_TRUE(writer.ok()) << writer.status();
    (*writer)->Prepare(puts);
    EXPECT_EQ((*ops)->reserved_sms(), 8) << "puts prepared";
    (*writer)->Prepare({});
    EXPECT_EQ((*ops)->reserved_sms(), 2) << "a plan without puts";
    (*writer)->Prepare(puts);
    EXPECT_EQ((*ops)->reserved_sms(), 8);
  }
  EXPECT_EQ((*ops)->reserved_sms(), 2) << "the writer went away";
  // The copies still run right after all that.
  exec::HostDataOps host;
  ASSERT_TRUE(host.Copy(Items(src.host(), dst.host(), 8, 1024)).ok());
  ASSERT_TRUE((*ops)->Copy(Items(src.dev(), dst.dev(), 8, 1024)).ok());
  ASSERT_TRUE((*ops)->Synchronize().ok());
  EXPECT_EQ(FirstDiff(dst.Download(), dst.host_bytes()), -1);
}

}  // namespace
}  // namespace wsync::cuda
