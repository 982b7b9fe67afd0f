// VmmMapping: CUDA virtual memory exported as POSIX descriptors maps back to
// back and reads as the owner's range does; bad chunk lists are refused by
// name. The owner is this process (importing one's own export is allowed);
// the two-process path runs in tests/python/gpu (expandable segments).
#include "worker/backends/cuda/vmm_import.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/cuda/driver_api.h"

namespace wsync::cuda {
namespace {

// `n` chunks of one granule each, mapped contiguously, chunk i filled with i+1.
class Owner {
 public:
  explicit Owner(int n) {
    api_ = *GetDriverApi();
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = 0;
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    EXPECT_EQ(api_->cuMemGetAllocationGranularity(&gran_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_SUCCESS);
    EXPECT_EQ(api_->cuMemAddressReserve(&base_, gran_ * n, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < n; ++i) {
      CUmemGenericAllocationHandle h;
      EXPECT_EQ(api_->cuMemCreate(&h, gran_, &prop_, 0), CUDA_SUCCESS);
      EXPECT_EQ(api_->cuMemMap(base_ + i * gran_, gran_, 0, h, 0), CUDA_SUCCESS);
      int fd = -1;
      EXPECT_EQ(
          api_->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          CUDA_SUCCESS);
      fds_.push_back(fd);
      handles_.push_back(h);
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_EQ(api_->cuMemSetAccess(base_, gran_ * n, &access, 1), CUDA_SUCCESS);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(cudaMemset(reinterpret_cast<char*>(base_) + i * gran_, i + 1, gran_), cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~Owner() {
    for (size_t i = 0; i < handles_.size(); ++i) {
      api_->cuMemUnmap(base_ + i * gran_, gran_);
      api_->cuMemRelease(handles_[i]);
    }
    api_->cuMemAddressFree(base_, gran_ * handles_.size());
  }
  // A batch owning duplicates of the descriptors (the inbox's copies).
  std::unique_ptr<plane::FdBatch> Batch() const {
    std::vector<int> dups;
    for (int fd : fds_) dups.push_back(dup(fd));
    return std::make_unique<plane::FdBatch>("t0k3n", dups);
  }
  v1::CudaVmm Vmm(int64_t offset, int64_t size) const {
    v1::CudaVmm vmm;
    vmm.set_fd_token("t0k3n");
    for (size_t i = 0; i < fds_.size(); ++i) {
      auto* c = vmm.add_chunks();
      c->set_fd_index(static_cast<int32_t>(i));
      c->set_bytes(static_cast<int64_t>(gran_));
    }
    vmm.set_offset(offset);
    vmm.set_size(size);
    return vmm;
  }
  size_t gran() const { return gran_; }
  char* base() const { return reinterpret_cast<char*>(base_); }

 private:
  const DriverApi* api_ = nullptr;
  CUmemAllocationProp prop_{};
  size_t gran_ = 0;
  CUdeviceptr base_ = 0;
  std::vector<int> fds_;
  std::vector<CUmemGenericAllocationHandle> handles_;
};

class VmmImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) GTEST_SKIP() << "no GPU";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  }
};

TEST_F(VmmImportTest, ChunksMapBackToBackAndShareTheOwnersMemory) {
  Owner owner(3);
  auto batch = owner.Batch();
  const int64_t g = static_cast<int64_t>(owner.gran());
  auto m = VmmMapping::Map(0, owner.Vmm(g / 2, 2 * g), *batch, "tensor 'w'");
  ASSERT_TRUE(m.ok()) << m.status();
  batch.reset();  // the mapping keeps the memory; the descriptors may go
  ASSERT_EQ((*m)->bytes(), static_cast<uint64_t>(3 * g));
  std::vector<char> host(3 * g);
  ASSERT_EQ(cudaMemcpy(host.data(), (*m)->base(), host.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(host[i * g], i + 1);
    EXPECT_EQ(host[i * g + g - 1], i + 1);
  }
  // A write through the import is seen by the owner.
  ASSERT_EQ(cudaMemset(static_cast<char*>((*m)->base()) + g, 9, 16), cudaSuccess);
  char seen = 0;
  ASSERT_EQ(cudaMemcpy(&seen, owner.base() + g + 15, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(seen, 9);
}

TEST_F(VmmImportTest, RefusesBadChunkListsNamingTheTensor) {
  Owner owner(2);
  auto batch = owner.Batch();
  const int64_t g = static_cast<int64_t>(owner.gran());
  auto expect = [&](const v1::CudaVmm& vmm, absl::StatusCode code, const std::string& text) {
    auto m = VmmMapping::Map(0, vmm, *batch, "tensor 'layers.0.w'");
    ASSERT_EQ(m.status().code(), code) << m.status();
    EXPECT_NE(m.status().message().find("tensor 'layers.0.w'"), std::string::npos);
    EXPECT_NE(m.status().message().find(text), std::string::npos) << m.status();
  };
  v1::CudaVmm vmm = owner.Vmm(0, g);
  vmm.mutable_chunks(1)->set_fd_index(7);
  expect(vmm, absl::StatusCode::kInvalidArgument, "names descriptor 7");
  vmm = owner.Vmm(0, g);
  vmm.mutable_chunks(0)->set_bytes(g - 1);
  expect(vmm, absl::StatusCode::kInvalidArgument, "granularity");
  expect(owner.Vmm(g, 2 * g), absl::StatusCode::kInvalidArgument, "outside its 2 chunks");
  expect(owner.Vmm(-1, 4), absl::StatusCode::kInvalidArgument, "outside");
  vmm = owner.Vmm(0, g);
  vmm.mutable_chunks(0)->set_bytes(INT64_MAX - g + 1);
  vmm.mutable_chunks(1)->set_bytes(INT64_MAX - g + 1);
  expect(vmm, absl::StatusCode::kInvalidArgument, "");
  vmm.clear_chunks();
  expect(vmm, absl::StatusCode::kInvalidArgument, "without chunks");
}

TEST_F(VmmImportTest, ADescriptorThatIsNoCudaAllocationIsRefused) {
  Owner owner(1);
  const int memfd = memfd_create("not-cuda", 0);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, static_cast<off_t>(owner.gran())), 0);
  plane::FdBatch batch("t0k3n", {memfd});
  auto m = VmmMapping::Map(0, owner.Vmm(0, 16), batch, "tensor 'x'");
  EXPECT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("cuMemImportFromShareableHandle"), std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace wsync::cuda
