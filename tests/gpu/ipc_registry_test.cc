// CUDA IPC between two processes: a child (forked before this process touches
// CUDA) owns and exports tensors; the test process maps them.
#include "worker/backends/cuda/ipc_registry.h"

#include <cuda.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backends/cuda/driver_api.h"

namespace wsync::cuda {
namespace {

constexpr size_t kBlock = 8 << 20;
constexpr size_t kOddBlock = (1 << 20) + 256;
uint8_t Pattern(size_t i) { return static_cast<uint8_t>(i * 7 % 251); }

// Child: one cudaMalloc block, three tensors inside it, and one tensor in an
// allocation of an odd size; prints one handle a line, then waits until the
// parent closes its end.
[[noreturn]] void ChildMain(int out_fd, int in_fd) {
  std::string text;
  void* block = nullptr;
  if (cudaMalloc(&block, kBlock) != cudaSuccess) {
    text = "ERR cudaMalloc\n";
  } else {
    std::vector<uint8_t> host(kBlock);
    for (size_t i = 0; i < kBlock; ++i) host[i] = Pattern(i);
    cudaMemcpy(block, host.data(), kBlock, cudaMemcpyHostToDevice);
    const size_t offsets[] = {0, 4096, 1 << 20};
    for (size_t off : offsets) {
      auto h = ExportTensor(static_cast<char*>(block) + off, 65536, "t");
      text += h.ok() ? h->Serialize() + "\n" : "ERR " + std::string(h.status().message()) + "\n";
    }
    // Line 4: an allocation 256 bytes past a multiple of 64 KiB.
    void* odd = nullptr;
    if (cudaMalloc(&odd, kOddBlock) != cudaSuccess) {
      text += "ERR cudaMalloc odd\n";
    } else {
      auto h = ExportTensor(odd, 4096, "odd");
      text += h.ok() ? h->Serialize() + "\n" : "ERR " + std::string(h.status().message()) + "\n";
    }
  }
  (void)!write(out_fd, text.data(), text.size());
  close(out_fd);
  char c;
  while (read(in_fd, &c, 1) > 0) {
  }
  _exit(0);
}

class IpcRegistryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int to_parent[2], to_child[2];
    if (pipe(to_parent) != 0 || pipe(to_child) != 0) return;
    child_ = fork();
    if (child_ == 0) {
      close(to_parent[0]);
      close(to_child[1]);
      ChildMain(to_parent[1], to_child[0]);
    }
    close(to_parent[1]);
    close(to_child[0]);
    release_fd_ = to_child[1];
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = read(to_parent[0], buf, sizeof(buf))) > 0) text.append(buf, n);
    close(to_parent[0]);
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      lines_->push_back(std::string(line));
    }
  }
  static void TearDownTestSuite() {
    if (release_fd_ >= 0) close(release_fd_);
    if (child_ > 0) waitpid(child_, nullptr, 0);
  }
  void SetUp() override {
    WSYNC_REQUIRE_GPUS(1);
    ASSERT_EQ(lines_->size(), 4u);
    for (const auto& l : *lines_) ASSERT_NE(l.rfind("ERR", 0), 0u) << l;
  }
  static inline pid_t child_ = -1;
  static inline int release_fd_ = -1;
  static inline std::vector<std::string>* lines_ = new std::vector<std::string>();
};

TEST_F(IpcRegistryTest, OpensEachAllocationOnceAndReadsTheOwnersBytes) {
  auto reg = IpcRegistry::Create(0);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const size_t offsets[] = {0, 4096, 1 << 20};
  for (int i = 0; i < 3; ++i) {
    auto h = IpcTensorHandle::Parse((*lines_)[i]);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->offset, offsets[i]);
    EXPECT_GE(h->base_bytes, kBlock);
    auto p = (*reg)->Open(*h, "t" + std::to_string(i));
    ASSERT_TRUE(p.ok()) << p.status();
    std::vector<uint8_t> got(65536);
    ASSERT_EQ(cudaMemcpy(got.data(), *p, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t k = 0; k < got.size(); k += 997) ASSERT_EQ(got[k], Pattern(offsets[i] + k));
  }
  EXPECT_EQ((*reg)->num_mappings(), 1u) << "three tensors of one allocation: one mapping";
}

// Every Open holds the mapping; the last Release unmaps it. A claimed
// allocation size other than the real one is refused (it decides which
// ranges pass).
TEST_F(IpcRegistryTest, LastReleaseUnmapsAndAWrongAllocationSizeIsRefused) {
  auto reg = IpcRegistry::Create(0);
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto h0 = IpcTensorHandle::Parse((*lines_)[0]);
  auto h1 = IpcTensorHandle::Parse((*lines_)[1]);
  ASSERT_TRUE(h0.ok() && h1.ok());
  ASSERT_TRUE((*reg)->Open(*h0, "a").ok());
  ASSERT_TRUE((*reg)->Open(*h1, "b").ok());
  EXPECT_EQ((*reg)->num_mappings(), 1u);
  (*reg)->Release(*h0);
  EXPECT_EQ((*reg)->num_mappings(), 1u) << "b still holds it";
  (*reg)->Release(*h1);
  EXPECT_EQ((*reg)->num_mappings(), 0u);
  // Opened again after the unmap: a fresh mapping of the same bytes.
  auto p = (*reg)->Open(*h1, "b again");
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<uint8_t> got(4096);
  ASSERT_EQ(cudaMemcpy(got.data(), *p, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t k = 0; k < got.size(); k += 97) ASSERT_EQ(got[k], Pattern(4096 + k));
  (*reg)->Release(*h1);
  IpcTensorHandle lie = *h0;
  lie.base_bytes *= 2;
  auto refused = (*reg)->Open(lie, "lying");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("lying"), std::string::npos) << refused.status();
  EXPECT_EQ((*reg)->num_mappings(), 0u);
}

// Peer mappings of allocations that copy engines write slowly are counted
// (and logged); the tensor's own worker maps them without a word.
TEST_F(IpcRegistryTest, PeerAllocationsNotAMultipleOf64KiBAreCounted) {
  EXPECT_FALSE(SlowForPeerWrites(kBlock));
  EXPECT_FALSE(SlowForPeerWrites(uint64_t{1152} << 20));
  EXPECT_TRUE(SlowForPeerWrites(kOddBlock));
  EXPECT_TRUE(SlowForPeerWrites((uint64_t{2} << 20) + 4096));
  auto h0 = IpcTensorHandle::Parse((*lines_)[0]);
  auto odd = IpcTensorHandle::Parse((*lines_)[3]);
  ASSERT_TRUE(h0.ok() && odd.ok());
  EXPECT_EQ(odd->base_bytes, kOddBlock) << "cudaMalloc keeps the requested size";
  auto peer = IpcRegistry::Create(0);
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_TRUE((*peer)->Open(*h0, "aligned", /*peer=*/true).ok());
  EXPECT_EQ((*peer)->slow_peer_mappings(), 0);
  ASSERT_TRUE((*peer)->Open(*odd, "odd", /*peer=*/true).ok());
  ASSERT_TRUE((*peer)->Open(*odd, "odd again", /*peer=*/true).ok());
  EXPECT_EQ((*peer)->slow_peer_mappings(), 1) << "once per allocation";
  (*peer)->Release(*h0);
  (*peer)->Release(*odd);
  (*peer)->Release(*odd);
  auto own = IpcRegistry::Create(0);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE((*own)->Open(*odd, "odd").ok());
  EXPECT_EQ((*own)->slow_peer_mappings(), 0);
  (*own)->Release(*odd);
}

TEST_F(IpcRegistryTest, RangesPastTheAllocationAreRefused) {
  auto reg = IpcRegistry::Create(0);
  ASSERT_TRUE(reg.ok());
  auto h = IpcTensorHandle::Parse((*lines_)[1]);
  ASSERT_TRUE(h.ok());
  h->bytes = h->base_bytes;  // offset 4096 + whole block
  auto p = (*reg)->Open(*h, "too_long");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_NE(p.status().message().find("too_long"), std::string::npos);
  EXPECT_EQ((*reg)->num_mappings(), 0u);
}

TEST_F(IpcRegistryTest, HandlesFromAnotherGpuAreRefusedByUuid) {
  WSYNC_REQUIRE_GPUS(2);
  auto reg = IpcRegistry::Create(1);
  ASSERT_TRUE(reg.ok());
  auto h = IpcTensorHandle::Parse((*lines_)[0]);
  ASSERT_TRUE(h.ok());
  auto p = (*reg)->Open(*h, "w");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_NE(p.status().message().find(h->gpu_uuid), std::string::npos) << p.status();
}

TEST_F(IpcRegistryTest, CuMemAllocationsAreRefusedNamingTheSetting) {
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // primary context
  auto api_or = GetDriverApi();
  ASSERT_TRUE(api_or.ok()) << api_or.status();
  const DriverApi& api = **api_or;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  ASSERT_EQ(api.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  CUmemGenericAllocationHandle handle;
  ASSERT_EQ(api.cuMemCreate(&handle, gran, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr ptr = 0;
  ASSERT_EQ(api.cuMemAddressReserve(&ptr, gran, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(api.cuMemMap(ptr, gran, 0, handle, 0), CUDA_SUCCESS);
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(api.cuMemSetAccess(ptr, gran, &access, 1), CUDA_SUCCESS);

  auto h = ExportTensor(reinterpret_cast<void*>(ptr), 1024, "model.embed_tokens.weight");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition) << h.status();
  EXPECT_NE(h.status().message().find("expandable_segments"), std::string::npos) << h.status();
  EXPECT_NE(h.status().message().find("sleep mode"), std::string::npos) << h.status();

  api.cuMemUnmap(ptr, gran);
  api.cuMemAddressFree(ptr, gran);
  api.cuMemRelease(handle);
}

TEST_F(IpcRegistryTest, HostMemoryIsNotExportable) {
  static char host[64];
  auto h = ExportTensor(host, 64, "h");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << h.status();
}

}  // namespace
}  // namespace wsync::cuda
