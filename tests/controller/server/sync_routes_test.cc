// SyncCoordinator routes: which worker pairs of a sync write directly, how
// their parts are marked and what their assignments say (routes_fixture.h).
#include <atomic>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/plan/put_phases.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/routes_fixture.h"

namespace wsync::controller {
namespace {

using routes_testing::Gpu;
using routes_testing::Host;
using routes_testing::Routes;
using routes_testing::ShmBuffer;
using routes_testing::SyncRoutesTest;
using routes_testing::WorkerSpec;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::StartsWith;

TEST_F(SyncRoutesTest, HostWorkersOfOneDomainWriteDirectlyWithShmLocations) {
  const auto [leases, as, pairs] = SyncHosts("host-a", "host-a", "host-a");
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
  // Put phases: 0 and 1 both write 2, so they take turns; a part's key
  // names its own buckets' phases (none for the writer in phase 0).
  EXPECT_THAT(as[0].part_key(), StartsWith(absl::StrCat(as[0].plan_key(), "/0/pw:to=2;by=")));
  EXPECT_THAT(as[2].part_key(), StartsWith(absl::StrCat(as[2].plan_key(), "/2/pw:to=;by=0,1/ph")));
  EXPECT_EQ(as[2].part_key().size(),
            absl::StrCat(as[2].plan_key(), "/2/pw:to=;by=0,1").size() + 19);
  std::set<int32_t> phase_of_writer[2];
  for (const v1::Bucket& b : as[2].plan().buckets()) {
    if (b.route() == v1::ROUTE_PEER_WRITE) phase_of_writer[b.sender()].insert(b.put_phase());
  }
  EXPECT_EQ(phase_of_writer[0].size(), 1u);
  EXPECT_EQ(phase_of_writer[1].size(), 1u);
  EXPECT_NE(*phase_of_writer[0].begin(), *phase_of_writer[1].begin());
}

TEST_F(SyncRoutesTest, WithoutPutPhasesPartsCarryNoPhaseAndKeysNoSuffix) {
  Restart(/*direct_writes=*/true, /*put_phases=*/false);
  const auto [leases, as, pairs] = SyncHosts("host-a", "host-a", "host-a");
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(pairs, 2);
  EXPECT_EQ(as[2].part_key(), absl::StrCat(as[2].plan_key(), "/2/pw:to=;by=0,1"));
  for (const v1::Bucket& b : as[2].plan().buckets()) EXPECT_EQ(b.put_phase(), 0);
}

// CUDA virtual memory registered from the owner's descriptors reports no
// location: nobody writes that worker directly until its buffers are
// mappable again.
TEST_F(SyncRoutesTest, AReceiverWithABufferWithoutLocationIsNotWrittenDirectly) {
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  v1::UpdateBuffersRequest update;
  update.set_lease_id(leases[2]);
  v1::BufferInfo* b = update.add_buffers();
  *b = ShmBuffer("dst", "/wsync-dst0", 32);
  b->clear_shm();
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  int32_t pairs = -1;
  auto as = Sync(leases, 1, &pairs);
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(pairs, 0);
  EXPECT_THAT(Routes(as[2]), ElementsAre("0->2:T", "1->2:T"));
  *update.mutable_buffers(0) = ShmBuffer("dst", "/wsync-dst0", 32);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  as = Sync(leases, 2, &pairs);
  EXPECT_EQ(pairs, 2);
}

TEST_F(SyncRoutesTest, WithoutPeerWritesThePartsAreTheUnroutedOnes) {
  const auto as = SyncHosts("host-a", "host-b", "host-c").as;
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

// Bucket id -> put phase of the peer-write buckets of `a`'s part.
std::map<int32_t, int32_t> PhasesOf(const v1::SyncAssignment& a) {
  std::map<int32_t, int32_t> out;
  for (const v1::Bucket& b : a.plan().buckets()) {
    if (b.route() == v1::ROUTE_PEER_WRITE) out[b.id()] = b.put_phase();
  }
  return out;
}

// Put phases are planned once per plan and pair set (PartCache::PutPhases),
// not at every sync that routes its parts again.
TEST_F(SyncRoutesTest, PutPhasesArePlannedOncePerPlanAndPairSet) {
  std::vector<std::string> leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  int32_t pairs = -1;
  const auto first = Sync(leases, 1, &pairs);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(pairs, 2);
  EXPECT_EQ(controller_->syncs().put_phase_plans(), 1);
  const std::map<int32_t, int32_t> phases = PhasesOf(first[2]);
  ASSERT_EQ(phases.size(), 2u);
  // A registry change prepares the next sync anew (binding, routes): the
  // plan and the pairs are the same, so are the phases, planned no more.
  v1::UpdateBuffersRequest update;
  update.set_lease_id(leases[2]);
  *update.add_buffers() = ShmBuffer("dst", "/wsync-dst0-moved", 32);
  ASSERT_TRUE(controller_->workers().UpdateBuffers(update).ok());
  const auto second = Sync(leases, 2, &pairs);
  ASSERT_EQ(second.size(), 3u);
  EXPECT_EQ(pairs, 2);
  EXPECT_EQ(controller_->syncs().put_phase_plans(), 1) << "the same plan and pairs";
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(second[w].part_key(), first[w].part_key()) << "worker " << w;
    EXPECT_FALSE(second[w].has_plan()) << "worker " << w << " holds this part";
  }
  // src/0 moves to another host: another pair set, its phases planned.
  leases[0] = Register(Host("src", 0, 2, 16, "host-b"));
  const auto third = Sync(leases, 3, &pairs);
  ASSERT_EQ(third.size(), 3u);
  EXPECT_EQ(pairs, 1);
  EXPECT_EQ(controller_->syncs().put_phase_plans(), 2);
  EXPECT_EQ(third[2].part_key(), absl::StrCat(third[2].plan_key(), "/2/pw:to=;by=1"))
      << "one writer: everything in phase 0";
  // Back on host-a: the first pair set's phases, still cached, reach the
  // parts unchanged.
  leases[0] = Register(Host("src", 0, 2, 16, "host-a"));
  const auto fourth = Sync(leases, 4, &pairs);
  ASSERT_EQ(fourth.size(), 3u);
  EXPECT_EQ(pairs, 2);
  EXPECT_EQ(controller_->syncs().put_phase_plans(), 2) << "this pair set was planned before";
  for (int w = 0; w < 3; ++w) EXPECT_EQ(fourth[w].part_key(), first[w].part_key());
  ASSERT_TRUE(fourth[0].has_plan()) << "src/0's new lease holds no part";
  EXPECT_EQ(PhasesOf(fourth[0]), PhasesOf(first[0]));
  EXPECT_EQ(PhasesOf(fourth[0]).size(), 1u);
}

TEST_F(SyncRoutesTest, OnlyPairsOfOneNonEmptyDomainWriteDirectly) {
  // src/0 shares dst/0's domain; src/1 is on another host.
  const auto [leases, as, pairs] = SyncHosts("host-a", "host-b", "host-a");
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(pairs, 1);
  EXPECT_THAT(as[0].direct_write_to(), ElementsAre(2));
  EXPECT_THAT(as[1].direct_write_to(), IsEmpty());
  EXPECT_THAT(as[1].peer_buffers(), IsEmpty());
  EXPECT_THAT(as[2].direct_written_by(), ElementsAre(0));
}

// Two "nodes" emulated on one host: one memory domain, but src/0 and dst/0
// on n0, src/1 on n1. Only the pair inside n0 writes directly.
TEST_F(SyncRoutesTest, DirectWritesStayInsideANodeEvenWithOneDomain) {
  WorkerSpec src0 = Host("src", 0, 2, 16, "shm:one-host"),
             src1 = Host("src", 1, 2, 16, src0.domain);
  WorkerSpec dst0 = Host("dst", 0, 1, 32, src0.domain);
  src0.node = dst0.node = "n0";
  src1.node = "n1";
  const std::vector<std::string> leases = {Register(src0), Register(src1), Register(dst0)};
  Define();
  int32_t pairs = -1;
  const auto as = Sync(leases, 1, &pairs);
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(pairs, 1);
  EXPECT_THAT(as[0].direct_write_to(), ElementsAre(2));
  EXPECT_THAT(as[1].direct_write_to(), IsEmpty());
  EXPECT_THAT(as[2].direct_written_by(), ElementsAre(0));
  EXPECT_THAT(Routes(as[1]), ElementsAre("1->2:T"));
}

TEST_F(SyncRoutesTest, EmptyDomainsNeverWriteDirectly) {
  const HostSync h = SyncHosts("", "", "");
  ExpectNoDirectWrites(h.as);
  EXPECT_EQ(h.pairs, 0);
}

TEST_F(SyncRoutesTest, FlagOffMeansNoDirectWrites) {
  Restart(/*direct_writes=*/false);
  const HostSync h = SyncHosts("host-a", "host-a", "host-a");
  ExpectNoDirectWrites(h.as);
  EXPECT_EQ(h.pairs, 0);
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
  ASSERT_TRUE(Report(leases[2], id, 13, "receiver round failed").ok());

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
  ASSERT_TRUE(Report(leases[0], id).ok());
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
  // Routes only: with put phases, worker 1 (phase 1 while 0 also wrote 2)
  // would be in phase 0 alone, another part, sent again (PutPhasesKey).
  Restart(/*direct_writes=*/true, /*put_phases=*/false);
  const auto leases = RegisterHosts("host-a", "host-a", "host-a");
  Define();
  std::string id;
  Start(leases, 1, &id);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(Report(leases[0], id, 5, "direct writes: shm_open: permission denied",
                     /*direct_writes_unavailable=*/true)
                  .ok());
  for (int w = 1; w < 3; ++w) ASSERT_TRUE(Report(leases[w], id).ok());
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

// A report of direct_writes_unavailable that the coordinator takes while a
// sync is being planned still counts for that sync: any sync whose locked
// start came after the report has the reporter write no peer directly.
TEST_F(SyncRoutesTest, UnavailableReportedWhilePlanningCountsForThatSync) {
  int trials = 0;
  const absl::Time until = absl::Now() + absl::Seconds(1);
  while (absl::Now() < until) {
    ++trials;
    Restart(/*direct_writes=*/true);
    const auto leases = RegisterHosts("h", "h", "h");
    Define();
    v1::DefineTransferRequest u = controller_testing::SimpleTransfer();
    u.set_name("u");
    ASSERT_TRUE(controller_->syncs().DefineTransfer(u).ok());
    v1::SyncRequest ureq;
    ureq.set_transfer("u");
    ureq.set_version(1);
    auto usync = controller_->syncs().StartSync(ureq);
    ASSERT_TRUE(usync.ok()) << usync.status();
    // The report (under the coordinator's lock), then where the syncs of "t"
    // stood: the last finished one, and whether one was in flight.
    std::atomic<bool> reported{false};
    std::string last;
    bool in_flight = false;
    std::thread reporter([&] {
      absl::SleepFor(absl::Microseconds(trials % 7 * 50));
      // src/0: it writes dst/0 no more.
      EXPECT_TRUE(
          Report(leases[0], usync->sync_id(), 0, "", /*direct_writes_unavailable=*/true).ok());
      const v1::GetStatusResponse status = controller_->syncs().GetStatus();
      for (const v1::TransferStatus& t : status.transfers()) {
        if (t.name() != "t") continue;
        last = t.last_sync().sync_id();
        in_flight = t.in_flight_version() != 0;
      }
      reported.store(true);
    });
    std::vector<std::pair<std::string, int32_t>> started;  // id, direct pairs
    for (int after = 0; after < 3;) {
      if (reported.load()) ++after;
      v1::SyncRequest req;
      req.set_transfer("t");
      req.set_version(1);
      auto sync = controller_->syncs().StartSync(req);
      ASSERT_TRUE(sync.ok()) << sync.status();
      auto st = controller_->syncs().Cancel(sync->sync_id(), "test");
      ASSERT_TRUE(st.ok()) << st.status();
      started.emplace_back(sync->sync_id(), st->direct_pairs());
    }
    reporter.join();
    // The syncs of "t" run one at a time, in this order: those after `last`
    // (and after the one in flight then) took their lock after the report.
    size_t first_after = 0;
    while (first_after < started.size() && started[first_after].first != last) ++first_after;
    first_after = last.empty() ? 0 : first_after + 1;
    if (in_flight) ++first_after;
    ASSERT_LE(first_after, started.size());
    for (size_t i = first_after; i < started.size(); ++i) {
      EXPECT_EQ(started[i].second, 1) << "sync " << started[i].first << " started after the report";
    }
    if (HasFailure()) break;
  }
  std::cerr << trials << " trials\n";
}

}  // namespace
}  // namespace wsync::controller
