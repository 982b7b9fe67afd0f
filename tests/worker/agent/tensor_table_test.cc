// TensorTable: registrations are validated before anything is mapped.
#include "worker/agent/tensor_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

v1::RegisterTensorsRequest OneTensor(const std::string& name,
                                     std::initializer_list<int64_t> shape) {
  v1::RegisterTensorsRequest req;
  req.set_group("g");
  v1::TensorRegistration* t = req.add_tensors();
  t->set_name(name);
  t->set_dtype(v1::FP32);
  for (int64_t d : shape) t->add_shape(d);
  t->mutable_shm()->set_name("/wsync-tensor-table-test-absent");
  t->mutable_shm()->set_size(16);
  return req;
}

TEST(TensorTableTest, AShapeWhoseSizeOverflowsIsRefusedNamingTheTensor) {
  host::HostBackend backend{plane::BackendConfig()};
  TensorTable table({"g"}, &backend);
  // 2^32 * 2^32 elements: the element count overflows (and wraps to 0).
  auto elements = table.Register(OneTensor("huge", {int64_t{1} << 32, int64_t{1} << 32}));
  ASSERT_EQ(elements.status().code(), absl::StatusCode::kInvalidArgument) << elements.status();
  EXPECT_NE(elements.status().message().find("tensor 'huge' of group 'g'"), std::string::npos)
      << elements.status();
  EXPECT_NE(elements.status().message().find("overflows"), std::string::npos) << elements.status();
  // 2^62 fp32 elements: the count fits, its bytes do not.
  auto bytes = table.Register(OneTensor("wide", {int64_t{1} << 62}));
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument) << bytes.status();
  EXPECT_NE(bytes.status().message().find("tensor 'wide'"), std::string::npos) << bytes.status();
  EXPECT_NE(bytes.status().message().find("overflows"), std::string::npos) << bytes.status();
  EXPECT_EQ(table.version(), 0u) << "nothing registered";
}

// A POSIX shm object of `bytes` bytes, unlinked when the test ends.
struct ShmObject {
  explicit ShmObject(int64_t bytes) : name(absl::StrCat("/wsync-tt-bounds-", getpid())) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    close(fd);
  }
  ~ShmObject() { shm_unlink(name.c_str()); }
  std::string name;
};

// Issue 18: on a 1 MiB object, offset 2^62 + size 2^62 wraps negative in a
// naive `offset + size > object` check; the registration must be refused
// (accepted, the next sync read or wrote far outside the mapping).
TEST(TensorTableTest, AnShmRangeOutsideTheObjectIsRefusedWithoutOverflow) {
  host::HostBackend backend{plane::BackendConfig()};
  TensorTable table({"g"}, &backend);
  ShmObject shm(1 << 20);
  const int64_t k62 = int64_t{1} << 62;
  for (auto [offset, size] : {std::pair<int64_t, int64_t>{k62, k62},
                              {std::numeric_limits<int64_t>::max() - 8, 16},
                              {(1 << 20) - 8, 16},
                              {-16, 16}}) {
    v1::RegisterTensorsRequest req = OneTensor("w", {4});
    req.mutable_tensors(0)->mutable_shm()->set_name(shm.name);
    req.mutable_tensors(0)->mutable_shm()->set_offset(offset);
    req.mutable_tensors(0)->mutable_shm()->set_size(size);
    auto r = table.Register(req);
    ASSERT_FALSE(r.ok()) << "offset " << offset << " size " << size;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("tensor 'w' of group 'g'"), std::string::npos)
        << r.status();
  }
  EXPECT_EQ(table.version(), 0u) << "nothing registered";
  EXPECT_TRUE(table.Snapshot().tensors.empty());
  // The last 16 bytes of the object are fine.
  v1::RegisterTensorsRequest last = OneTensor("w", {4});
  last.mutable_tensors(0)->mutable_shm()->set_name(shm.name);
  last.mutable_tensors(0)->mutable_shm()->set_offset((1 << 20) - 16);
  auto ok = table.Register(last);
  ASSERT_TRUE(ok.ok()) << ok.status();
}

// Review finding: every registration of a new object added a mapping-cache
// key that was never removed (CUDA virtual memory keys carry a one-time token).
TEST(TensorTableTest, MappingsOfReplacedRegistrationsAreForgotten) {
  host::HostBackend backend{plane::BackendConfig()};
  TensorTable table({"g"}, &backend);
  for (int i = 0; i < 5; ++i) {
    const std::string name = absl::StrCat("/wsync-tt-test-", getpid(), "-", i);
    const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 64), 0);
    close(fd);
    v1::RegisterTensorsRequest req = OneTensor("w", {4});
    req.set_replace(true);
    req.mutable_tensors(0)->mutable_shm()->set_name(name);
    auto r = table.Register(req);
    shm_unlink(name.c_str());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(table.mapping_count(), 1u) << "registration " << i;
  }
}

// Issue 18: a second local client (replace=true) swapped a destination
// buffer and the next sync wrote the attacker's values. Only the registering
// process (or an admin, or a successor once it exited) may replace.
TEST(TensorTableTest, OnlyTheRegisteringProcessMayReplace) {
  host::HostBackend backend{plane::BackendConfig()};
  TensorTable table({"g"}, &backend);
  const std::string name = absl::StrCat("/wsync-tt-owner-", getpid());
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  close(fd);
  // The owner: a live process other than this one.
  const pid_t owner = fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    pause();
    _exit(0);
  }
  v1::RegisterTensorsRequest req = OneTensor("w", {4});
  req.mutable_tensors(0)->mutable_shm()->set_name(name);
  ASSERT_TRUE(table.Register(req, {}, Registrant{owner, false}).ok());
  // Another process: neither replace=true nor a re-registration of the name.
  v1::RegisterTensorsRequest attack = req;
  attack.set_replace(true);
  auto refused = table.Register(attack, {}, Registrant{getpid(), false});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_NE(refused.status().message().find(absl::StrCat("process ", owner)), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--local_admin_uids"), std::string::npos);
  EXPECT_EQ(table.Register(req, {}, Registrant{getpid(), false}).status().code(),
            absl::StatusCode::kPermissionDenied);
  // The owner itself and an admin may.
  EXPECT_TRUE(table.Register(attack, {}, Registrant{owner, false}).ok());
  EXPECT_TRUE(table.Register(attack, {}, Registrant{getpid() + 0, true}).ok());
  // Once the admin's registration stands, the old owner is no longer its owner.
  EXPECT_EQ(table.Register(attack, {}, Registrant{owner, false}).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A process whose owner exited takes over (an owner restarted).
  ASSERT_TRUE(table.Register(attack, {}, Registrant{owner, true}).ok());
  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  EXPECT_TRUE(table.Register(attack, {}, Registrant{getpid(), false}).ok());
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace wsync::agent
