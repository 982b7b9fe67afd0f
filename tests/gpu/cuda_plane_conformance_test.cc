// The CUDA backend through the DataOps and PeerWriter interface suites
// (tests/worker/plane): CudaDataOps on device 0, and CudaPeerWriter putting
// from device 0 into device 1's memory over peer access (into device 0's own
// memory on a machine with one GPU).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"
#include "tests/worker/plane/data_ops_conformance.h"
#include "tests/worker/plane/peer_writer_conformance.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_handles.h"

namespace wsync::plane::conformance {
namespace {

// Device memory of `device`, copied with cudaMemcpy (UVA tells the sides
// apart).
std::shared_ptr<uint8_t> DeviceAllocate(int device, size_t bytes) {
  auto b = cuda::DeviceBuffer::Allocate(device, static_cast<int64_t>(bytes == 0 ? 1 : bytes));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return nullptr;
  auto owner = std::make_shared<cuda::DeviceBuffer>(std::move(*b));
  return std::shared_ptr<uint8_t>(owner, static_cast<uint8_t*>(owner->data()));
}
// cudaMemcpy from pageable host memory may return before its DMA lands,
// and the backends' streams are non-blocking (no implicit order with the
// legacy stream): the write is waited for, so the calls under test read it.
void DeviceWrite(void* dst, const void* host, size_t bytes) {
  EXPECT_EQ(cudaMemcpy(dst, host, bytes, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}
void DeviceRead(void* host, const void* src, size_t bytes) {
  EXPECT_EQ(cudaMemcpy(host, src, bytes, cudaMemcpyDefault), cudaSuccess);
}
std::string NoGpu() {
  auto count = cuda::DeviceCount();
  if (!count.ok()) return std::string(count.status().message());
  return *count < 1 ? "needs a GPU" : "";
}

absl::StatusOr<std::unique_ptr<cuda::CudaBackend>> Device0() {
  return cuda::CudaBackend::Create(0);
}

class CudaDataOpsFactory : public DataOpsTestFactory {
 public:
  std::string Name() const override { return "Cuda"; }
  std::string Unavailable() override { return NoGpu(); }
  std::shared_ptr<uint8_t> Allocate(size_t bytes) override { return DeviceAllocate(0, bytes); }
  void Write(void* dst, const void* host, size_t bytes) override { DeviceWrite(dst, host, bytes); }
  void Read(void* host, const void* src, size_t bytes) override { DeviceRead(host, src, bytes); }
  absl::StatusOr<std::unique_ptr<exec::DataOps>> Create() override {
    if (backend_ == nullptr) {
      auto b = Device0();
      if (!b.ok()) return b.status();
      backend_ = std::move(*b);
    }
    return backend_->NewDataOps();
  }

 private:
  std::unique_ptr<cuda::CudaBackend> backend_;
};

class CudaPeerWriterFactory : public PeerWriterTestFactory {
 public:
  std::string Name() const override { return "CudaPeer"; }
  bool MailboxLoopback() const override { return true; }
  std::string Unavailable() override { return NoGpu(); }
  std::shared_ptr<uint8_t> Allocate(size_t bytes) override { return DeviceAllocate(0, bytes); }
  void Write(void* dst, const void* host, size_t bytes) override { DeviceWrite(dst, host, bytes); }
  void Read(void* host, const void* src, size_t bytes) override { DeviceRead(host, src, bytes); }
  absl::StatusOr<WriterUnderTest> Create() override {
    if (backend_ == nullptr) {
      auto b = Device0();
      if (!b.ok()) return b.status();
      backend_ = std::move(*b);
      peer_device_ = PeerDevice();
    }
    WriterUnderTest w;
    auto ops = backend_->NewDataOps();
    if (!ops.ok()) return ops.status();
    w.ops = *std::move(ops);
    auto writer = backend_->NewPeerWriter(*w.ops);
    if (!writer.ok()) return writer.status();
    w.writer = *std::move(writer);
    return w;
  }
  std::shared_ptr<uint8_t> AllocatePeer(size_t bytes) override {
    return DeviceAllocate(peer_device_, bytes);
  }

 private:
  // Device 1 with peer access from device 0 enabled (as CUDA IPC's lazy
  // peer access does for a real peer), else device 0.
  static int PeerDevice() {
    int count = 0, can = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) return 0;
    if (cudaDeviceCanAccessPeer(&can, 0, 1) != cudaSuccess || !can) return 0;
    cuda::DeviceGuard guard(0);
    const cudaError_t err = cudaDeviceEnablePeerAccess(1, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    return err == cudaSuccess || err == cudaErrorPeerAccessAlreadyEnabled ? 1 : 0;
  }
  std::unique_ptr<cuda::CudaBackend> backend_;
  int peer_device_ = 0;
};

INSTANTIATE_TEST_SUITE_P(Cuda, DataOpsConformanceTest,
                         ::testing::Values(std::make_shared<CudaDataOpsFactory>()),
                         DataOpsConformanceTest::ParamName);
INSTANTIATE_TEST_SUITE_P(Cuda, PeerWriterConformanceTest,
                         ::testing::Values(std::make_shared<CudaPeerWriterFactory>()),
                         PeerWriterConformanceTest::ParamName);

}  // namespace
}  // namespace wsync::plane::conformance
