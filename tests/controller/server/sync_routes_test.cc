// SyncCoordinator routes: which worker pairs of a sync write directly, how
// their parts are marked and what their assignments say. The real planner; workers simulated by
// calls. Transfer "t": src (2 ranks, sharded) -> dst (1 rank, replicated), so worker ids are src/0
// = 0, src/1 = 1, dst/0 = 2 and the plan's network pairs are (0, 2) and (1, 2), both plain copies.
#include <algorithm>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/peer_lists.h"
#include "controller/server/controller.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"

namespace wsync::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct WorkerSpec {
  std::string group;
  int rank = 0;
  int size = 1;
  int64_t bytes = 0;
  std::string domain;
  bool gpu = false;
  std::string device_uuid;
  std::vector<std::string> peers;
  bool peer_lists_once = true;  // registers kPeerListsOnceCapability
};

WorkerSpec Host(const std::string& group, int rank, int size, int64_t bytes,
                const std::string& domain) {
  WorkerSpec s;
  s.group = group;
  s.rank = rank;
  s.size = size;
  s.bytes = bytes;
  s.domain = domain;
  return s;
}

WorkerSpec Gpu(const std::string& group, int rank, int size, int64_t bytes,
               const std::string& domain, const std::string& device_uuid,
               std::vector<std::string> peers) {
  WorkerSpec s = Host(group, rank, size, bytes, domain);
  s.gpu = true;
  s.device_uuid = device_uuid;
  s.peers = std::move(peers);
  return s;
}

v1::BufferInfo ShmBuffer(const std::string& group, const std::string& shm, int64_t bytes) {
  v1::BufferInfo b;
  b.set_group(group);
  b.set_name("w");
  b.set_dtype(v1::FP32);
  b.set_bytes(bytes);
  b.mutable_shm()->set_name(shm);
  b.mutable_shm()->set_offset(64);
  b.mutable_shm()->set_size(bytes);
  return b;
}

// The routes of the buckets of `a`'s part, as "sender->receiver:T|P" sorted.
std::vector<std::string> Routes(const v1::SyncAssignment& a) {
  std::vector<std::string> out;
  for (const v1::Bucket& b : a.plan().buckets()) {
    out.push_back(absl::StrCat(b.sender(), "->", b.receiver(), ":",
                               b.route() == v1::ROUTE_PEER_WRITE ? "P" : "T"));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

class SyncRoutesTest : public ::testing::Test {
 protected:
  SyncRoutesTest() { Restart(/*direct_writes=*/true); }

  void Restart(bool direct_writes) {
    ControllerConfig config;
    config.lease_ttl = absl::Seconds(30);
    config.sync_deadline = absl::Seconds(30);
    config.instance = "test";
    config.direct_writes = direct_writes;
    controller_ = std::make_unique<Controller>(config, &metrics_, &plans_);
  }

  std::string Register(const WorkerSpec& spec) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(absl::StrCat(spec.group, spec.rank));
    auto* m = req.add_memberships();
    m->set_group(spec.group);
    m->set_rank(spec.rank);
    m->set_group_size(spec.size);
    req.set_direct_write_domain(spec.domain);
    for (const std::string& p : spec.peers) req.add_peer_gpu_uuids(p);
    req.set_device_uuid(spec.device_uuid);
    if (spec.peer_lists_once) req.add_capabilities(kPeerListsOnceCapability);
    if (spec.gpu) {
      req.add_transports(v1::TRANSPORT_NCCL);
      req.add_capabilities("cuda_ipc");
      v1::BufferInfo* b = req.add_buffers();
      b->set_group(spec.group);
      b->set_name("w");
      b->set_dtype(v1::FP32);
      b->set_bytes(spec.bytes);
      b->mutable_cuda_ipc()->set_handle(std::string(64, static_cast<char>('a' + spec.rank)));
      b->mutable_cuda_ipc()->set_gpu_uuid(spec.device_uuid);
      b->mutable_cuda_ipc()->set_size(spec.bytes);
      b->mutable_cuda_ipc()->set_base_size(1 << 20);
    } else {
      req.add_transports(v1::TRANSPORT_GLOO);
      *req.add_buffers() =
          ShmBuffer(spec.group, absl::StrCat("/wsync-", spec.group, spec.rank), spec.bytes);
    }
    auto resp = controller_->workers().RegisterWorker(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok()) return "";
    auto token = controller_->workers().OpenStream(resp->lease_id());
    EXPECT_TRUE(token.ok()) << token.status();
    tokens_[resp->lease_id()] = token.ok() ? *token : 0;
    return resp->lease_id();
  }

  // src/0, src/1, dst/0 (host workers) with the given domains.
  std::vector<std::string> RegisterHosts(const std::string& d_src0, const std::string& d_src1,
                                         const std::string& d_dst) {
    return {Register(Host("src", 0, 2, 16, d_src0)), Register(Host("src", 1, 2, 16, d_src1)),
            Register(Host("dst", 0, 1, 32, d_dst))};
  }

  void Define() {
    auto resp = controller_->syncs().DefineTransfer(controller_testing::SimpleTransfer());
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->num_workers(), 3);
  }

  // Starts a sync and returns every worker's assignment (in lease order);
  // *sync_id is the sync's id ("" if it did not start).
  std::vector<v1::SyncAssignment> Start(const std::vector<std::string>& leases, int64_t version,
                                        std::string* sync_id, const std::string& transfer = "t") {
    v1::SyncRequest req;
    req.set_transfer(transfer);
    req.set_version(version);
    auto started = controller_->syncs().StartSync(req);
    EXPECT_TRUE(started.ok()) << started.status();
    sync_id->clear();
    if (!started.ok()) return {};
    *sync_id = started->sync_id();
    std::vector<v1::SyncAssignment> out;
    for (const std::string& l : leases) {
      auto a = controller_->workers().NextAssignment(l, tokens_[l], absl::Seconds(1));
      EXPECT_TRUE(a.ok() && a->has_value() && (*a)->has_sync());
      out.push_back(a.ok() && a->has_value() ? (**a).sync() : v1::SyncAssignment());
      EXPECT_TRUE(out.back().has_transport()) << "the plan moves bytes over the network";
    }
    return out;
  }

  // Start(), then every worker reports success; *direct_pairs is the sync's.
  std::vector<v1::SyncAssignment> Sync(const std::vector<std::string>& leases, int64_t version,
                                       int32_t* direct_pairs = nullptr,
                                       const std::string& transfer = "t") {
    std::string id;
    std::vector<v1::SyncAssignment> out = Start(leases, version, &id, transfer);
    if (id.empty()) return out;
    auto st = controller_->syncs().WaitSync(id, absl::Milliseconds(1));
    EXPECT_TRUE(st.ok());
    if (direct_pairs != nullptr) *direct_pairs = st.ok() ? st->direct_pairs() : -1;
    for (const std::string& l : leases) {
      v1::ReportResultRequest r;
      r.set_lease_id(l);
      r.set_sync_id(id);
      EXPECT_TRUE(controller_->syncs().ReportResult(r).ok());
    }
    return out;
  }

  static void ExpectNoDirectWrites(const std::vector<v1::SyncAssignment>& as) {
    for (const v1::SyncAssignment& a : as) {
      EXPECT_THAT(a.direct_write_to(), IsEmpty()) << "worker " << a.worker();
      EXPECT_THAT(a.direct_written_by(), IsEmpty()) << "worker " << a.worker();
      EXPECT_THAT(a.peer_buffers(), IsEmpty()) << "worker " << a.worker();
    }
  }

  ControllerMetrics metrics_;
  PlanSource plans_;
  std::unique_ptr<Controller> controller_;
  std::map<std::string, uint64_t> tokens_;
};

TEST_F(SyncRoutesTest, HostWorkersOfOneDomainWriteDirectlyWithShmLocations) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  int32_t pairs = -1;
  const auto as = Sync(leases, 1, &pairs);
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(pairs, 2);
  for (int w = 0; w < 2; ++w) {
    SCOPED_TRACE(w);
    EXPECT_EQ(as[w].worker(), w);
    EXPECT_THAT(as[w].direct_write_to(), ElementsAre(2));
    EXPECT_THAT(as[w].direct_written_by(), IsEmpty());
    ASSERT_EQ(as[w].peer_buffers_size(), 1);
    const v1::PeerBuffers& peer = as[w].peer_buffers(0);
    EXPECT_EQ(peer.worker(), 2);
    ASSERT_EQ(peer.buffers_size(), 1);
    EXPECT_EQ(peer.buffers(0).group(), "dst");
    EXPECT_EQ(peer.buffers(0).name(), "w");
    EXPECT_EQ(peer.buffers(0).bytes(), 32);
    ASSERT_TRUE(peer.buffers(0).has_shm());
    EXPECT_EQ(peer.buffers(0).shm().name(), "/wsync-dst0");
    EXPECT_EQ(peer.buffers(0).shm().offset(), 64);
  }
  EXPECT_THAT(as[2].direct_write_to(), IsEmpty());
  EXPECT_THAT(as[2].direct_written_by(), ElementsAre(0, 1));
  EXPECT_THAT(as[2].peer_buffers(), IsEmpty());
  // The parts say the same: every bucket of a pair is routed PEER_WRITE, and
  // each part is keyed by its routes.
  EXPECT_THAT(Routes(as[0]), ElementsAre("0->2:P"));
  EXPECT_THAT(Routes(as[1]), ElementsAre("1->2:P"));
  EXPECT_THAT(Routes(as[2]), ElementsAre("0->2:P", "1->2:P"));
  EXPECT_EQ(as[0].part_key(), absl::StrCat(as[0].plan_key(), "/0/pw:to=2;by="));
  EXPECT_EQ(as[2].part_key(), absl::StrCat(as[2].plan_key(), "/2/pw:to=;by=0,1"));
}

TEST_F(SyncRoutesTest, WithoutPeerWritesThePartsAreTheUnroutedOnes) {
  const auto leases = RegisterHosts("host-a", "host-b", "host-c");
  Define();
  const auto as = Sync(leases, 1);
  ASSERT_EQ(as.size(), 3u);
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(as[w].part_key(), absl::StrCat(as[w].plan_key(), "/", w));
    for (const v1::Bucket& b : as[w].plan().buckets()) EXPECT_EQ(b.route(), v1::ROUTE_TRANSPORT);
  }
}

TEST_F(SyncRoutesTest, PeerBuffersAreTheReceiversCurrentRegistrationAndThePlanIsScannedOnce) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  Sync(leases, 1);
  v1::UpdateBuffersRequest update;
  update.set_lease_id(leases[2]);
  *update.add_buffers() = ShmBuffer("dst", "/wsync-dst0-moved", 32);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  const auto as = Sync(leases, 2);
  ASSERT_EQ(as.size(), 3u);
  ASSERT_EQ(as[0].peer_buffers_size(), 1);
  ASSERT_EQ(as[0].peer_buffers(0).buffers_size(), 1);
  EXPECT_EQ(as[0].peer_buffers(0).buffers(0).shm().name(), "/wsync-dst0-moved");
  EXPECT_EQ(plans_.peer_write_scans(), 1) << "eligibility is cached per plan key";
}

// A receiver's list is sent to each writer once per registration: later
// assignments mark it unchanged (a big model's list is thousands of entries),
// until the receiver registers again or the writer's sync fails.
TEST_F(SyncRoutesTest, PeerListsAreSentOncePerRegistrationAndAgainAfterAFailure) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  v1::UpdateBuffersRequest update;
  update.set_lease_id(leases[2]);
  for (int i = 0; i < 2000; ++i) {
    v1::BufferInfo b = ShmBuffer("dst", "/wsync-dst0", 32);  // "w", the plan's
    if (i > 0) b.set_name(absl::StrCat("layers.", i, ".weight"));
    *update.add_buffers() = b;
  }
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  auto peer_of = [](const v1::SyncAssignment& a) {
    EXPECT_EQ(a.peer_buffers_size(), 1);
    return a.peer_buffers_size() == 1 ? a.peer_buffers(0) : v1::PeerBuffers();
  };
  auto as = Sync(leases, 1);
  ASSERT_EQ(as.size(), 3u);
  const int64_t registration = peer_of(as[0]).registration();
  EXPECT_FALSE(peer_of(as[0]).unchanged());
  EXPECT_EQ(peer_of(as[0]).buffers_size(), 2000);
  const size_t full_bytes = as[0].ByteSizeLong();

  as = Sync(leases, 2);
  for (int w = 0; w < 2; ++w) {
    SCOPED_TRACE(w);
    EXPECT_TRUE(peer_of(as[w]).unchanged());
    EXPECT_EQ(peer_of(as[w]).buffers_size(), 0);
    EXPECT_EQ(peer_of(as[w]).registration(), registration);
    EXPECT_THAT(as[w].direct_write_to(), ElementsAre(2));
  }
  EXPECT_LT(as[0].ByteSizeLong() * 100, full_bytes)
      << as[0].ByteSizeLong() << " bytes against " << full_bytes;

  // The receiver registers again: the new list, under a new count.
  update.mutable_buffers()->DeleteSubrange(1000, 1000);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  as = Sync(leases, 3);
  EXPECT_FALSE(peer_of(as[0]).unchanged());
  EXPECT_EQ(peer_of(as[0]).buffers_size(), 1000);
  EXPECT_GT(peer_of(as[0]).registration(), registration);

  // Writer 0's sync fails: every writer of that sync gets its lists again
  // (the others may have dropped their mappings while unwinding).
  std::string id;
  Start(leases, 4, &id);
  ASSERT_FALSE(id.empty());
  for (int w = 0; w < 3; ++w) {
    v1::ReportResultRequest r;
    r.set_lease_id(leases[w]);
    r.set_sync_id(id);
    if (w == 0) {
      r.set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
      r.set_message("peer mapping lost");
    }
    EXPECT_TRUE(controller_->syncs().ReportResult(r).ok());
  }
  for (int w = 1; w < 3; ++w) {  // the failure aborted the others' sync
    auto a = controller_->workers().NextAssignment(leases[w], tokens_[leases[w]],
                                                   absl::Milliseconds(100));
    ASSERT_TRUE(a.ok() && a->has_value() && (*a)->has_abort()) << "worker " << w;
  }
  as = Sync(leases, 5);
  EXPECT_FALSE(peer_of(as[0]).unchanged());
  EXPECT_EQ(peer_of(as[0]).buffers_size(), 1000);
  EXPECT_FALSE(peer_of(as[1]).unchanged());
  EXPECT_EQ(peer_of(as[1]).buffers_size(), 1000);
  as = Sync(leases, 6);
  EXPECT_TRUE(peer_of(as[0]).unchanged());
  EXPECT_TRUE(peer_of(as[1]).unchanged());
}

// Two transfers over the same workers: each keeps its own record of the lists
// it sent (as each worker keeps its mappings per transfer), so alternating
// syncs do not resend them.
TEST_F(SyncRoutesTest, PeerListsAreKeptPerTransfer) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  v1::DefineTransferRequest second = controller_testing::SimpleTransfer();
  second.set_name("t2");
  ASSERT_TRUE(controller_->syncs().DefineTransfer(second).ok());
  for (int v = 1; v <= 3; ++v) {
    for (const std::string transfer : {"t", "t2"}) {
      SCOPED_TRACE(absl::StrCat(transfer, " v", v));
      const auto as = Sync(leases, v, nullptr, transfer);
      ASSERT_EQ(as.size(), 3u);
      ASSERT_EQ(as[0].peer_buffers_size(), 1);
      EXPECT_EQ(as[0].peer_buffers(0).unchanged(), v > 1);
      EXPECT_EQ(as[0].peer_buffers(0).buffers_size(), v > 1 ? 0 : 1);
    }
  }
}

// A sync that fails clears the record of every participant at once, before
// their reports arrive: a retry started right away carries every list (the
// writers may drop their mappings while they unwind, or never see their
// queued assignment).
TEST_F(SyncRoutesTest, AFailedSyncResendsEveryListEvenBeforeTheWritersReport) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  Sync(leases, 1);
  std::string id;
  Start(leases, 2, &id);
  ASSERT_FALSE(id.empty());
  v1::ReportResultRequest r;
  r.set_lease_id(leases[2]);  // the receiver fails; the writers never report
  r.set_sync_id(id);
  r.set_code(static_cast<int32_t>(absl::StatusCode::kInternal));
  r.set_message("receiver failed");
  ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  for (int w = 0; w < 2; ++w) {
    auto a = controller_->workers().NextAssignment(leases[w], tokens_[leases[w]],
                                                   absl::Milliseconds(100));
    ASSERT_TRUE(a.ok() && a->has_value() && (*a)->has_abort()) << "worker " << w;
  }
  std::string retry;
  const auto as = Start(leases, 3, &retry);
  ASSERT_EQ(as.size(), 3u);
  for (int w = 0; w < 2; ++w) {
    SCOPED_TRACE(w);
    ASSERT_EQ(as[w].peer_buffers_size(), 1);
    EXPECT_FALSE(as[w].peer_buffers(0).unchanged());
    EXPECT_EQ(as[w].peer_buffers(0).buffers_size(), 1);
  }
}

// Registration counts are unique in the controller: a receiver that comes
// back under a new lease is never taken for the one its writers mapped.
TEST_F(SyncRoutesTest, ARegisteredAgainReceiverGetsANewCountAndItsWholeList) {
  auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  const int64_t first = Sync(leases, 1)[0].peer_buffers(0).registration();
  EXPECT_TRUE(Sync(leases, 2)[0].peer_buffers(0).unchanged());
  leases[2] = Register(Host("dst", 0, 1, 32, "host-a"));  // replaces the old lease
  const auto as = Sync(leases, 3);
  ASSERT_EQ(as[0].peer_buffers_size(), 1);
  EXPECT_NE(as[0].peer_buffers(0).registration(), first);
  EXPECT_FALSE(as[0].peer_buffers(0).unchanged());
  EXPECT_EQ(as[0].peer_buffers(0).buffers_size(), 1);
}

// Only kPeerListTransfers transfers keep their record (as the worker keeps
// only their mappings): an older one gets its lists again.
TEST_F(SyncRoutesTest, OnlyTheMostRecentTransfersKeepTheirLists) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  std::vector<std::string> names = {"t"};
  for (int i = 1; i <= kPeerListTransfers; ++i) {
    v1::DefineTransferRequest d = controller_testing::SimpleTransfer();
    d.set_name(absl::StrCat("t", i));
    ASSERT_TRUE(controller_->syncs().DefineTransfer(d).ok());
    names.push_back(d.name());
  }
  for (const std::string& n : names) {
    EXPECT_FALSE(Sync(leases, 1, nullptr, n)[0].peer_buffers(0).unchanged()) << n;
  }
  // "t" is the oldest of kPeerListTransfers + 1: forgotten; the latest kept.
  EXPECT_FALSE(Sync(leases, 2, nullptr, "t")[0].peer_buffers(0).unchanged());
  EXPECT_TRUE(Sync(leases, 2, nullptr, names.back())[0].peer_buffers(0).unchanged());
}

// A worker that does not say it understands `unchanged` gets whole lists.
TEST_F(SyncRoutesTest, WorkersWithoutTheCapabilityAlwaysGetWholeLists) {
  WorkerSpec old = Host("src", 0, 2, 16, "host-a");
  old.peer_lists_once = false;
  const std::vector<std::string> leases = {Register(old), Register(Host("src", 1, 2, 16, "host-a")),
                                           Register(Host("dst", 0, 1, 32, "host-a"))};
  Define();
  Sync(leases, 1);
  const auto as = Sync(leases, 2);
  EXPECT_FALSE(as[0].peer_buffers(0).unchanged());
  EXPECT_EQ(as[0].peer_buffers(0).buffers_size(), 1);
  EXPECT_TRUE(as[1].peer_buffers(0).unchanged());
}

TEST_F(SyncRoutesTest, OnlyPairsOfOneNonEmptyDomainWriteDirectly) {
  // src/0 shares dst/0's domain; src/1 is on another host.
  const auto leases = RegisterHosts("host-a", "host-b", "host-a");
  Define();
  int32_t pairs = -1;
  const auto as = Sync(leases, 1, &pairs);
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(pairs, 1);
  EXPECT_THAT(as[0].direct_write_to(), ElementsAre(2));
  EXPECT_THAT(as[1].direct_write_to(), IsEmpty());
  EXPECT_THAT(as[1].peer_buffers(), IsEmpty());
  EXPECT_THAT(as[2].direct_written_by(), ElementsAre(0));
}

TEST_F(SyncRoutesTest, EmptyDomainsNeverWriteDirectly) {
  const auto leases = RegisterHosts("", "", "");
  Define();
  int32_t pairs = -1;
  ExpectNoDirectWrites(Sync(leases, 1, &pairs));
  EXPECT_EQ(pairs, 0);
}

TEST_F(SyncRoutesTest, FlagOffMeansNoDirectWrites) {
  Restart(/*direct_writes=*/false);
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  int32_t pairs = -1;
  ExpectNoDirectWrites(Sync(leases, 1, &pairs));
  EXPECT_EQ(pairs, 0);
  EXPECT_EQ(plans_.peer_write_scans(), 0) << "nothing to decide: the plan is not scanned";
}

TEST_F(SyncRoutesTest, NcclNeedsTheReceiversGpuAmongTheSendersPeers) {
  // src/0 can reach dst/0's GPU; src/1 lists only itself; all in one domain.
  const std::vector<std::string> leases = {
      Register(Gpu("src", 0, 2, 16, "node-1", "GPU-0", {"GPU-0", "GPU-2"})),
      Register(Gpu("src", 1, 2, 16, "node-1", "GPU-1", {"GPU-1"})),
      Register(Gpu("dst", 0, 1, 32, "node-1", "GPU-2", {"GPU-2"}))};
  Define();
  int32_t pairs = -1;
  const auto as = Sync(leases, 1, &pairs);
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(as[0].transport().kind(), v1::TRANSPORT_NCCL);
  EXPECT_EQ(pairs, 1);
  EXPECT_THAT(as[0].direct_write_to(), ElementsAre(2));
  ASSERT_EQ(as[0].peer_buffers_size(), 1);
  ASSERT_EQ(as[0].peer_buffers(0).buffers_size(), 1);
  ASSERT_TRUE(as[0].peer_buffers(0).buffers(0).has_cuda_ipc());
  EXPECT_EQ(as[0].peer_buffers(0).buffers(0).cuda_ipc().gpu_uuid(), "GPU-2");
  EXPECT_THAT(as[1].direct_write_to(), IsEmpty());
  EXPECT_THAT(as[2].direct_written_by(), ElementsAre(0));
}

TEST_F(SyncRoutesTest, NcclReceiverWithoutDeviceUuidIsNeverWritten) {
  // An empty receiver uuid must not match an empty entry in the peers list.
  const std::vector<std::string> leases = {
      Register(Gpu("src", 0, 2, 16, "node-1", "GPU-0", {"GPU-0", ""})),
      Register(Gpu("src", 1, 2, 16, "node-1", "GPU-1", {"GPU-1", ""})),
      Register(Gpu("dst", 0, 1, 32, "node-1", "", {}))};
  Define();
  int32_t pairs = -1;
  ExpectNoDirectWrites(Sync(leases, 1, &pairs));
  EXPECT_EQ(pairs, 0);
}

TEST_F(SyncRoutesTest, ListWorkersShowsDomainAndPeerGpusAndBufferLocations) {
  Register(Gpu("src", 0, 1, 16, "node-1", "GPU-0", {"GPU-0", "GPU-3"}));
  Register(Host("dst", 0, 1, 32, "host-b"));
  const v1::ListWorkersResponse src = controller_->workers().ListWorkers("src");
  ASSERT_EQ(src.workers_size(), 1);
  EXPECT_EQ(src.workers(0).direct_write_domain(), "node-1");
  EXPECT_THAT(src.workers(0).peer_gpu_uuids(), ElementsAre("GPU-0", "GPU-3"));
  ASSERT_EQ(src.workers(0).buffers_size(), 1);
  EXPECT_TRUE(src.workers(0).buffers(0).has_cuda_ipc());
  const v1::ListWorkersResponse dst = controller_->workers().ListWorkers("dst");
  ASSERT_EQ(dst.workers_size(), 1);
  EXPECT_EQ(dst.workers(0).direct_write_domain(), "host-b");
  EXPECT_THAT(dst.workers(0).peer_gpu_uuids(), IsEmpty());
  ASSERT_EQ(dst.workers(0).buffers_size(), 1);
  EXPECT_EQ(dst.workers(0).buffers(0).shm().name(), "/wsync-dst0");
}

// After a failed sync, a worker written directly waits for its writers: each
// must report (late reports count) or lose its lease.
TEST_F(SyncRoutesTest, AwaitWritersEndsWhenEachWriterReportedOrIsLost) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  std::string id;
  const auto as = Start(leases, 1, &id);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(as.size(), 3u);
  EXPECT_THAT(as[2].direct_written_by(), ElementsAre(0, 1));
  v1::ReportResultRequest fail;
  fail.set_lease_id(leases[2]);
  fail.set_sync_id(id);
  fail.set_code(13);
  fail.set_message("receiver round failed");
  ASSERT_TRUE(controller_->syncs().ReportResult(fail).ok());

  v1::AwaitWritersRequest await;
  await.set_lease_id(leases[2]);
  await.set_sync_id(id);
  await.add_workers(0);
  await.add_workers(1);
  await.set_timeout_ms(50);
  auto r = controller_->syncs().AwaitWriters(await);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->pending(), ElementsAre(0, 1));

  // Writer 0 reports after the sync ended: it wrote its last byte.
  v1::ReportResultRequest late;
  late.set_lease_id(leases[0]);
  late.set_sync_id(id);
  ASSERT_TRUE(controller_->syncs().ReportResult(late).ok());
  r = controller_->syncs().AwaitWriters(await);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->pending(), ElementsAre(1));
  auto st = controller_->syncs().WaitSync(id, absl::Milliseconds(1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), v1::SYNC_FAILED) << "a late report changes no outcome";

  // Writer 1's process goes away: a waiter wakes up without its timeout.
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    controller_->workers().CloseStream(leases[1], tokens_[leases[1]], "killed");
  });
  await.set_timeout_ms(10000);
  const absl::Time t0 = absl::Now();
  r = controller_->syncs().AwaitWriters(await);
  closer.join();
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->pending(), IsEmpty());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));

  await.add_workers(7);
  EXPECT_EQ(controller_->syncs().AwaitWriters(await).status().code(),
            absl::StatusCode::kInvalidArgument);
  await.set_sync_id("t@9#999");
  r = controller_->syncs().AwaitWriters(await);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->pending(), IsEmpty()) << "a sync no longer recorded is long over";
}

// A writer that reports it cannot map its peers' buffers writes no more:
// its later syncs send those buckets through the transport.
TEST_F(SyncRoutesTest, AWriterThatCannotMapItsPeersIsPairedNoMore) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  std::string id;
  Start(leases, 1, &id);
  ASSERT_FALSE(id.empty());
  v1::ReportResultRequest fail;
  fail.set_lease_id(leases[0]);
  fail.set_sync_id(id);
  fail.set_code(5);
  fail.set_message("direct writes: shm_open: permission denied");
  fail.set_direct_writes_unavailable(true);
  ASSERT_TRUE(controller_->syncs().ReportResult(fail).ok());
  for (int w = 1; w < 3; ++w) {
    v1::ReportResultRequest r;
    r.set_lease_id(leases[w]);
    r.set_sync_id(id);
    ASSERT_TRUE(controller_->syncs().ReportResult(r).ok());
  }
  for (const std::string& l : leases) {  // the failed sync's aborts
    while (true) {
      auto a = controller_->workers().NextAssignment(l, tokens_[l], absl::Milliseconds(10));
      ASSERT_TRUE(a.ok());
      if (!a->has_value()) break;
      EXPECT_TRUE((**a).has_abort());
    }
  }
  int32_t pairs = -1;
  const auto as = Sync(leases, 2, &pairs);
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(pairs, 1);
  EXPECT_THAT(as[0].direct_write_to(), IsEmpty());
  EXPECT_THAT(as[1].direct_write_to(), ElementsAre(2));
  EXPECT_THAT(as[2].direct_written_by(), ElementsAre(1));
  // Changed routes are other parts, sent anew; unchanged ones are not resent.
  EXPECT_TRUE(as[0].has_plan());
  EXPECT_THAT(Routes(as[0]), ElementsAre("0->2:T"));
  EXPECT_FALSE(as[1].has_plan()) << "worker 1 holds the part of these routes";
  EXPECT_TRUE(as[2].has_plan());
  EXPECT_THAT(Routes(as[2]), ElementsAre("0->2:T", "1->2:P"));
}

}  // namespace
}  // namespace wsync::controller
