// PeerBufferMaps (direct writes): mapping a peer worker's registered shm
// buffers from the list the controller relays, and the fingerprint a
// receiver's ready token carries.
#include "worker/agent/peer_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/peer_lists.h"
#include "gtest/gtest.h"
#include "worker/backends/host/host_backend.h"
#include "worker/plane/memory_domain.h"

namespace wsync::agent {
namespace {

using plane::GpuMemoryDomain;
using plane::HostMemoryDomain;

// The backend that maps the peers' buffers.
host::HostBackend kHost{plane::BackendConfig()};

// A POSIX shm object of `bytes`, unlinked at the end.
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes)
      : name_(absl::StrCat("/wsync-peer-test-", getpid(), "-", counter_++)) {
    const int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    data_ = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    bytes_ = bytes;
    close(fd);
  }
  ~ShmObject() {
    munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }

 private:
  static inline int counter_ = 0;
  std::string name_;
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
};

v1::BufferInfo Info(const std::string& group, const std::string& name, const ShmObject& shm,
                    int64_t offset, int64_t size) {
  v1::BufferInfo b;
  b.set_group(group);
  b.set_name(name);
  b.set_dtype(v1::BF16);
  b.set_bytes(size);
  b.mutable_shm()->set_name(shm.name());
  b.mutable_shm()->set_offset(offset);
  b.mutable_shm()->set_size(size);
  return b;
}

google::protobuf::RepeatedPtrField<v1::PeerBuffers> Peers(int32_t worker,
                                                          std::vector<v1::BufferInfo> infos) {
  google::protobuf::RepeatedPtrField<v1::PeerBuffers> out;
  v1::PeerBuffers* p = out.Add();
  p->set_worker(worker);
  for (auto& b : infos) *p->add_buffers() = std::move(b);
  return out;
}

TEST(PeerBufferMapsTest, MapsThePeersShmBuffersAsDestinations) {
  ShmObject shm(1 << 16);
  PeerBufferMaps maps(&kHost);
  ASSERT_TRUE(maps.Update(Peers(3, {Info("inference", "w", shm, 4096, 1024),
                                    Info("inference", "b", shm, 0, 64)}))
                  .ok());
  const exec::BufferRegistry* r = maps.Find(3);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(maps.Find(2), nullptr);
  const exec::RegisteredBuffer* w = r->Find(exec::BufferSide::kDestination, "inference/w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->bytes, 1024);
  EXPECT_EQ(w->dtype, v1::BF16);
  // The same memory as the owner's mapping: a write shows up there.
  static_cast<uint8_t*>(w->data)[5] = 0xAB;
  EXPECT_EQ(shm.data()[4096 + 5], 0xAB);
  // Only destinations: a peer's buffers are never read.
  EXPECT_EQ(r->Find(exec::BufferSide::kSource, "inference/w"), nullptr);
}

// Issue 18: offset 2^62 + size 2^62 wraps negative in a naive bounds check;
// a peer list naming such a range is refused before anything is mapped.
TEST(PeerBufferMapsTest, ARangeWhoseEndOverflowsIsRefused) {
  ShmObject shm(1 << 20);
  PeerBufferMaps maps(&kHost);
  const int64_t k62 = int64_t{1} << 62;
  for (auto [offset, size] : {std::pair<int64_t, int64_t>{k62, k62},
                              {std::numeric_limits<int64_t>::max(), 64},
                              {(1 << 20) - 32, 64}}) {
    absl::Status s = maps.Update(Peers(2, {Info("g", "w", shm, offset, size)}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << offset << " +" << size << ": " << s;
    EXPECT_NE(s.message().find("buffer 'g/w' of worker 2"), std::string::npos) << s;
    EXPECT_EQ(maps.Find(2), nullptr);
  }
  // The last 64 bytes of the object are fine.
  EXPECT_TRUE(maps.Update(Peers(2, {Info("g", "w", shm, (1 << 20) - 64, 64)})).ok());
}

TEST(PeerBufferMapsTest, KeepsUnchangedPeersAndRemapsChangedOnes) {
  ShmObject shm(1 << 16);
  PeerBufferMaps maps(&kHost);
  ASSERT_TRUE(maps.Update(Peers(1, {Info("g", "w", shm, 0, 256)})).ok());
  const std::string first = maps.Signature();
  const uint64_t fp = maps.Fingerprint(1);
  ASSERT_TRUE(maps.Update(Peers(1, {Info("g", "w", shm, 0, 256)})).ok());
  EXPECT_EQ(maps.Signature(), first);
  EXPECT_EQ(maps.Fingerprint(1), fp);
  ASSERT_TRUE(maps.Update(Peers(1, {Info("g", "w", shm, 256, 256)})).ok());
  EXPECT_NE(maps.Signature(), first);
  EXPECT_NE(maps.Fingerprint(1), fp);
  // A peer no longer listed is dropped.
  ASSERT_TRUE(maps.Update({}).ok());
  EXPECT_EQ(maps.Find(1), nullptr);
}

// The controller sends a peer's list once per registration; later
// assignments say `unchanged` and carry no buffers.
TEST(PeerBufferMapsTest, UnchangedEntriesKeepTheMappingOfTheirRegistrationOnly) {
  ShmObject shm(1 << 16);
  PeerBufferMaps maps(&kHost);
  auto full = Peers(1, {Info("g", "w", shm, 0, 256)});
  full[0].set_registration(7);
  ASSERT_TRUE(maps.Update(full).ok());
  EXPECT_TRUE(maps.Holds(1, 7));
  EXPECT_FALSE(maps.Holds(1, 8));
  EXPECT_FALSE(maps.Holds(2, 7));
  const std::string signature = maps.Signature();
  const exec::RegisteredBuffer* w = maps.Find(1)->Find(exec::BufferSide::kDestination, "g/w");
  ASSERT_NE(w, nullptr);

  google::protobuf::RepeatedPtrField<v1::PeerBuffers> same;
  v1::PeerBuffers* p = same.Add();
  p->set_worker(1);
  p->set_registration(7);
  p->set_unchanged(true);
  ASSERT_TRUE(maps.Update(same).ok());
  EXPECT_EQ(maps.Signature(), signature) << "nothing remapped: bound plans stay bound";
  EXPECT_EQ(maps.Find(1)->Find(exec::BufferSide::kDestination, "g/w")->data, w->data);

  // Unchanged, but from a registration this worker never mapped: an error
  // naming the peer, and the mappings stay as they were.
  p->set_registration(8);
  absl::Status s = maps.Update(same);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("worker 1"), std::string::npos) << s;
  EXPECT_TRUE(maps.Holds(1, 7));
  // Once dropped (not listed), even the same registration is gone.
  ASSERT_TRUE(maps.Update({}).ok());
  p->set_registration(7);
  EXPECT_FALSE(maps.Update(same).ok());
}

// Per transfer: another transfer's assignment neither unmaps nor replaces
// this one's peers; only the kPeerListTransfers most recent keep theirs.
TEST(PeerMapsByTransferTest, TransfersKeepTheirOwnPeersAndOnlyTheMostRecentKeepThem) {
  ShmObject shm(1 << 16);
  PeerMapsByTransfer maps(&kHost);
  ASSERT_TRUE(maps.Update("a", Peers(1, {Info("g", "w", shm, 0, 256)})).ok());
  ASSERT_TRUE(maps.Update("b", Peers(2, {Info("g", "w", shm, 256, 256)})).ok());
  ASSERT_NE(maps.Find("a"), nullptr);
  EXPECT_NE(maps.Find("a")->Find(1), nullptr) << "b's assignment kept a's peer";
  EXPECT_EQ(maps.Find("a")->Find(2), nullptr);
  EXPECT_NE(maps.Find("b")->Find(2), nullptr);
  const std::string a_signature = maps.Find("a")->Signature();
  ASSERT_TRUE(maps.Update("a", Peers(1, {Info("g", "w", shm, 0, 256)})).ok());
  EXPECT_EQ(maps.Find("a")->Signature(), a_signature) << "the same list is not remapped";

  // A transfer whose assignment lists no peers releases its mappings.
  ASSERT_TRUE(maps.Update("b", {}).ok());
  EXPECT_EQ(maps.Find("b"), nullptr);

  // "a" is the most recent; kPeerListTransfers newer ones push it out.
  for (int i = 0; i < kPeerListTransfers; ++i) {
    ASSERT_TRUE(maps.Update(absl::StrCat("t", i), Peers(1, {Info("g", "w", shm, 0, 256)})).ok());
    EXPECT_EQ(maps.Find("a") != nullptr, i + 1 < kPeerListTransfers) << i;
  }
  EXPECT_NE(maps.Find("t0"), nullptr);
  maps.Clear("t0");
  EXPECT_EQ(maps.Find("t0"), nullptr);
  maps.ClearAll();
  EXPECT_EQ(maps.Find(absl::StrCat("t", kPeerListTransfers - 1)), nullptr);
}

TEST(PeerBufferMapsTest, BadListsAreErrorsNamingWorkerAndBuffer) {
  ShmObject shm(4096);
  PeerBufferMaps maps(&kHost);
  absl::Status s = maps.Update(Peers(2, {Info("g", "big", shm, 2048, 4096)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("buffer 'g/big' of worker 2"), std::string::npos) << s;
  EXPECT_EQ(maps.Find(2), nullptr);

  v1::BufferInfo no_location = Info("g", "w", shm, 0, 64);
  no_location.clear_shm();
  s = maps.Update(Peers(2, {no_location}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("no location"), std::string::npos) << s;

  v1::BufferInfo missing = Info("g", "w", shm, 0, 64);
  missing.mutable_shm()->set_name("/wsync-no-such-object");
  s = maps.Update(Peers(2, {missing}));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;

  v1::BufferInfo device = Info("g", "w", shm, 0, 64);
  device.mutable_cuda_ipc()->set_size(64);  // replaces the shm location
  s = maps.Update(Peers(2, {device}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  auto twice = Peers(2, {Info("g", "w", shm, 0, 64)});
  *twice.Add() = twice.Get(0);
  s = maps.Update(twice);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// A failed update keeps the other peers mapped, and a name created again
// as a new object changes the fingerprint even though the list is the same.
TEST(PeerBufferMapsTest, FailureKeepsOthersAndRecreatedObjectsDiffer) {
  auto shm = std::make_unique<ShmObject>(4096);
  PeerBufferMaps maps(&kHost);
  google::protobuf::RepeatedPtrField<v1::PeerBuffers> two = Peers(1, {Info("g", "w", *shm, 0, 64)});
  *two.Add() = Peers(2, {Info("g", "w", *shm, 0, 64)}).Get(0);
  ASSERT_TRUE(maps.Update(two).ok());
  const uint64_t fp = maps.Fingerprint(1);
  auto bad = two;
  bad.Mutable(1)->mutable_buffers(0)->mutable_shm()->set_size(1 << 20);
  EXPECT_FALSE(maps.Update(bad).ok());
  ASSERT_NE(maps.Find(1), nullptr);
  EXPECT_NE(maps.Find(1)->Find(exec::BufferSide::kDestination, "g/w"), nullptr);
  EXPECT_EQ(maps.Find(2), nullptr);
  // The owner of worker 1 unlinks its object and creates one of the same name.
  const std::string name = shm->name();
  shm.reset();
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  maps.Clear();
  ASSERT_TRUE(maps.Update(two).ok());
  EXPECT_NE(maps.Fingerprint(1), fp);
  shm_unlink(name.c_str());
}

TEST(BufferListFingerprintTest, OrderIndependentAndSensitiveToEveryField) {
  ShmObject shm(4096);
  const v1::BufferInfo a = Info("g", "a", shm, 0, 64), b = Info("g", "b", shm, 64, 64);
  EXPECT_EQ(BufferListFingerprint({&a, &b}, {"1:2", "1:3"}),
            BufferListFingerprint({&b, &a}, {"1:3", "1:2"}));
  EXPECT_NE(BufferListFingerprint({&a, &b}, {}), BufferListFingerprint({&a}, {}));
  // The same names and offsets in another object (unlinked and created again).
  EXPECT_NE(BufferListFingerprint({&a, &b}, {"1:2", "1:3"}),
            BufferListFingerprint({&a, &b}, {"1:2", "1:4"}));
  for (int field = 0; field < 5; ++field) {
    v1::BufferInfo c = b;
    if (field == 0) c.mutable_shm()->set_offset(128);
    if (field == 1) c.mutable_shm()->set_name("/other");
    if (field == 2) c.set_bytes(32);
    if (field == 3) c.set_dtype(v1::FP32);
    if (field == 4) c.set_name("c");
    EXPECT_NE(BufferListFingerprint({&a, &b}, {}), BufferListFingerprint({&a, &c}, {})) << field;
  }
}

TEST(MemoryDomainTest, HostDomainIsStableAndNamesShm) {
  const std::string d = HostMemoryDomain();
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d.rfind("shm:", 0), 0u) << d;
  EXPECT_EQ(d, HostMemoryDomain());
  EXPECT_NE(GpuMemoryDomain(), d);
}

}  // namespace
}  // namespace wsync::agent
