// The shared transport conformance suite, instantiated for NCCL: one rank per
// visible GPU (NCCL allows one rank per device in a communicator), ranks
// connected concurrently through an in-memory KvStore.
#include <cuda_runtime_api.h>

#include <atomic>
#include <thread>

#include "tests/worker/plane/transport_conformance.h"
#include "tests/worker/plane/transport_steps_conformance.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/backends/cuda/nccl_transport.h"
#include "worker/plane/kv_store.h"

namespace wsync::transport {
namespace {

class NcclFactory : public conformance::TransportTestFactory {
 public:
  std::string Name() const override { return "Nccl"; }
  int max_group_size() const override {
    auto n = cuda::DeviceCount();
    return n.ok() ? *n : 0;
  }
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateGroup(int size) override {
    if (size > max_group_size()) {
      return absl::FailedPreconditionError(absl::StrCat("NCCL group of ", size, " needs ", size,
                                                        " GPUs; ", max_group_size(), " visible"));
    }
    static std::atomic<int> generation{0};
    const std::string prefix = absl::StrCat("nccl-conformance-", generation++);
    std::vector<std::unique_ptr<Transport>> out(size);
    std::vector<absl::Status> st(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        auto t = NcclTransport::Create(
            store_, prefix,
            {.device = r, .rank = r, .size = size, .init_timeout = absl::Seconds(60)});
        st[r] = t.status();
        if (t.ok()) out[r] = std::move(*t);
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& s : st) {
      if (!s.ok()) return s;
    }
    return out;
  }
  std::shared_ptr<uint8_t> Allocate(int rank, size_t bytes) override {
    cuda::DeviceGuard guard(rank);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) return nullptr;
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [rank](uint8_t* q) {
      cuda::DeviceGuard g(rank);
      cudaFree(q);
    });
  }
  void Write(int rank, void* dst, const void* host, size_t bytes) override {
    cuda::DeviceGuard guard(rank);
    cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice);
  }
  void Read(int rank, void* host, const void* src, size_t bytes) override {
    cuda::DeviceGuard guard(rank);
    cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost);
  }
  // The mark is the transport's event: a stream of our own waits for it.
  void ReadLanded(int rank, const LandingMark& mark, void* host, const void* src,
                  size_t bytes) override {
    cuda::DeviceGuard guard(rank);
    ASSERT_NE(mark.handle, nullptr) << "NCCL marks its landing parts with an event";
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    auto* event = static_cast<cudaEvent_t>(const_cast<void*>(mark.handle));
    EXPECT_EQ(cudaStreamWaitEvent(stream, event, 0), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);
  }

 private:
  InMemoryKvStore store_;
};

// Without two GPUs there is nothing to instantiate (the suite then reports
// no tests rather than failures on a machine without GPUs).
std::vector<std::shared_ptr<conformance::TransportTestFactory>> Factories() {
  auto factory = std::make_shared<NcclFactory>();
  if (factory->max_group_size() < 2) return {};
  return {factory};
}

using conformance::TransportConformanceTest;
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportConformanceTest);
INSTANTIATE_TEST_SUITE_P(Nccl, TransportConformanceTest, ::testing::ValuesIn(Factories()),
                         TransportConformanceTest::ParamName);

}  // namespace
}  // namespace wsync::transport
