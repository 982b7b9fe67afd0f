// The host backend through the DataOps and PeerWriter interface suites
// (tests/worker/plane): HostDataOps, and HostPeerWriter writing into a peer's
// POSIX shared memory mapped by HostBackend::OpenBuffer.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/plane/data_ops_conformance.h"
#include "tests/worker/plane/peer_writer_conformance.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::plane::conformance {
namespace {

class HostDataOpsFactory : public DataOpsTestFactory {
 public:
  std::string Name() const override { return "Host"; }
  absl::StatusOr<std::unique_ptr<exec::DataOps>> Create() override { return backend_.NewDataOps(); }

 private:
  host::HostBackend backend_{BackendConfig()};
};

class HostPeerWriterFactory : public PeerWriterTestFactory {
 public:
  std::string Name() const override { return "HostShm"; }
  bool MailboxLoopback() const override { return true; }
  absl::StatusOr<WriterUnderTest> Create() override {
    WriterUnderTest w;
    auto ops = backend_.NewDataOps();
    if (!ops.ok()) return ops.status();
    w.ops = *std::move(ops);
    auto writer = backend_.NewPeerWriter(*w.ops);
    if (!writer.ok()) return writer.status();
    w.writer = *std::move(writer);
    return w;
  }
  // A fresh shm object, mapped as the worker maps a peer's buffer, then
  // unlinked (the mapping stays).
  std::shared_ptr<uint8_t> AllocatePeer(size_t bytes) override {
    static std::atomic<int> counter{0};
    const std::string name = absl::StrCat("/wsync-plane-test-", getpid(), "-", counter++);
    const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    close(fd);
    v1::HostShm shm;
    shm.set_name(name);
    shm.set_offset(0);
    shm.set_size(static_cast<int64_t>(bytes));
    BufferLocation where;
    where.shm = &shm;
    auto opened = backend_.OpenBuffer(where, static_cast<int64_t>(bytes), /*peer=*/true,
                                      "test peer buffer", nullptr);
    shm_unlink(name.c_str());
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return nullptr;
    return std::shared_ptr<uint8_t>(opened->hold, static_cast<uint8_t*>(opened->data));
  }

 private:
  host::HostBackend backend_{BackendConfig()};
};

INSTANTIATE_TEST_SUITE_P(Host, DataOpsConformanceTest,
                         ::testing::Values(std::make_shared<HostDataOpsFactory>()),
                         DataOpsConformanceTest::ParamName);
INSTANTIATE_TEST_SUITE_P(Host, PeerWriterConformanceTest,
                         ::testing::Values(std::make_shared<HostPeerWriterFactory>()),
                         PeerWriterConformanceTest::ParamName);

}  // namespace
}  // namespace wsync::plane::conformance
