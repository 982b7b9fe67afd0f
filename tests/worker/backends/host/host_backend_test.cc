// HostBackend: opening registered and peer buffers in POSIX shared memory,
// and what it advertises for direct writes.
#include "worker/backends/host/host_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/plane/memory_domain.h"

namespace wsync::host {
namespace {

// A POSIX shm object of `bytes`, unlinked at the end.
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes)
      : name_(absl::StrCat("/wsync-host-backend-test-", getpid(), "-", counter_++)) {
    const int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    close(fd);
  }
  ~ShmObject() { shm_unlink(name_.c_str()); }
  v1::HostShm Range(int64_t offset, int64_t size) const {
    v1::HostShm shm;
    shm.set_name(name_);
    shm.set_offset(offset);
    shm.set_size(size);
    return shm;
  }

 private:
  static inline std::atomic<int> counter_{0};
  const std::string name_;
};

plane::BufferLocation At(const v1::HostShm& shm) {
  plane::BufferLocation where;
  where.shm = &shm;
  return where;
}

TEST(HostBackendTest, BuffersOfOneObjectShareOneMappingPerCache) {
  HostBackend backend{plane::BackendConfig()};
  ShmObject obj(4096);
  const v1::HostShm a = obj.Range(0, 1024), b = obj.Range(1024, 2048);
  plane::MappingCache cache;
  auto oa = backend.OpenBuffer(At(a), 1024, /*peer=*/false, "tensor 'a'", &cache);
  auto ob = backend.OpenBuffer(At(b), 2048, /*peer=*/false, "tensor 'b'", &cache);
  ASSERT_TRUE(oa.ok()) << oa.status();
  ASSERT_TRUE(ob.ok()) << ob.status();
  EXPECT_EQ(static_cast<uint8_t*>(ob->data) - static_cast<uint8_t*>(oa->data), 1024);
  EXPECT_EQ(oa->hold, ob->hold);
  EXPECT_FALSE(oa->identity.empty());
  EXPECT_EQ(oa->identity, ob->identity);
  // The bytes are the object's: a write through one range shows in the other.
  static_cast<uint8_t*>(oa->data)[1024] = 0x5A;
  EXPECT_EQ(static_cast<uint8_t*>(ob->data)[0], 0x5A);
  // Without a cache each buffer maps on its own.
  auto oc = backend.OpenBuffer(At(a), 1024, /*peer=*/true, "peer buffer", nullptr);
  ASSERT_TRUE(oc.ok()) << oc.status();
  EXPECT_NE(oc->hold, oa->hold);
  EXPECT_EQ(oc->identity, oa->identity);
}

TEST(HostBackendTest, BadLocationsAreErrorsNamingTheBuffer) {
  HostBackend backend{plane::BackendConfig()};
  ShmObject obj(4096);
  const v1::HostShm small = obj.Range(0, 100);
  auto s = backend.OpenBuffer(At(small), 200, false, "tensor 'x'", nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tensor 'x'"), std::string::npos) << s.status();
  const v1::HostShm past = obj.Range(4000, 200);
  s = backend.OpenBuffer(At(past), 200, false, "tensor 'y'", nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("4096 bytes"), std::string::npos) << s.status();
  v1::HostShm missing = obj.Range(0, 8);
  missing.set_name("/wsync-host-backend-test-no-such-object");
  s = backend.OpenBuffer(At(missing), 8, false, "tensor 'z'", nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  s = backend.OpenBuffer(plane::BufferLocation(), 8, true, "peer buffer 'p'", nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("no location"), std::string::npos) << s.status();
}

TEST(HostBackendTest, DeviceMemoryIsRefusedNamingTheFlagThatMovesIt) {
  HostBackend backend{plane::BackendConfig()};
  v1::CudaIpc ipc;
  ipc.set_size(64);
  plane::BufferLocation where;
  where.cuda_ipc = &ipc;
  auto local = backend.OpenBuffer(where, 64, /*peer=*/false, "tensor 'w'", nullptr);
  EXPECT_EQ(local.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(local.status().message().find("--device"), std::string::npos) << local.status();
  auto peer = backend.OpenBuffer(where, 64, /*peer=*/true, "peer buffer 'w'", nullptr);
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(peer.status().message().find("device memory"), std::string::npos) << peer.status();
}

TEST(HostBackendTest, WritesPeersOfItsShmDomainOnly) {
  HostBackend backend{plane::BackendConfig()};
  const std::string domain = backend.MemoryDomain();
  ASSERT_EQ(domain, plane::HostMemoryDomain());
  EXPECT_TRUE(backend.WritableDevices().empty());
  EXPECT_TRUE(backend.CanWrite(domain, ""));
  EXPECT_FALSE(backend.CanWrite(domain + "x", ""));
  EXPECT_FALSE(backend.CanWrite(domain, "GPU-1234"));
  EXPECT_FALSE(backend.CanWrite("", ""));
}

}  // namespace
}  // namespace wsync::host
