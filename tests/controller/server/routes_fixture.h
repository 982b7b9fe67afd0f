// The fixture of the SyncCoordinator route and peer-list tests
// (sync_routes_test.cc, sync_peer_lists_test.cc): a Controller with the real
// planner, workers simulated by calls. Transfer "t": src (2 ranks, sharded)
// -> dst (1 rank, replicated), so worker ids are src/0 = 0, src/1 = 1,
// dst/0 = 2 and the plan's network pairs are (0, 2) and (1, 2), both plain
// copies.
#ifndef WSYNC_TESTS_CONTROLLER_SERVER_ROUTES_FIXTURE_H_
#define WSYNC_TESTS_CONTROLLER_SERVER_ROUTES_FIXTURE_H_

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/peer_lists.h"
#include "controller/server/controller.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/server/controller_test_util.h"

namespace wsync::controller::routes_testing {

struct WorkerSpec {
  std::string group;
  int rank = 0;
  int size = 1;
  int64_t bytes = 0;
  std::string domain;
  std::string node;  // RegisterWorkerRequest.node (empty: none)
  bool gpu = false;
  std::string device_uuid;
  std::vector<std::string> peers;
  bool peer_lists_once = true;  // registers kPeerListsOnceCapability
};

inline WorkerSpec Host(const std::string& group, int rank, int size, int64_t bytes,
                       const std::string& domain) {
  WorkerSpec s;
  s.group = group;
  s.rank = rank;
  s.size = size;
  s.bytes = bytes;
  s.domain = domain;
  return s;
}

inline WorkerSpec Gpu(const std::string& group, int rank, int size, int64_t bytes,
                      const std::string& domain, const std::string& device_uuid,
                      std::vector<std::string> peers) {
  WorkerSpec s = Host(group, rank, size, bytes, domain);
  s.gpu = true;
  s.device_uuid = device_uuid;
  s.peers = std::move(peers);
  return s;
}

inline v1::BufferInfo ShmBuffer(const std::string& group, const std::string& shm, int64_t bytes) {
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
inline std::vector<std::string> Routes(const v1::SyncAssignment& a) {
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

  void Restart(bool direct_writes, bool put_phases = true) {
    ControllerConfig config;
    config.put_phases = put_phases;
    config.lease_ttl = absl::Seconds(30);
    config.sync_deadline = absl::Seconds(30);
    config.instance = "test";
    config.direct_writes = direct_writes;
    // A reported failure ends its sync at once (the blame grace has its own
    // tests, sync_blame_test.cc).
    config.failure_grace = absl::ZeroDuration();
    controller_ = std::make_unique<Controller>(config, &metrics_, &plans_);
    last_lease_.clear();
  }

  std::string Register(const WorkerSpec& spec) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(absl::StrCat(spec.group, spec.rank));
    auto* m = req.add_memberships();
    m->set_group(spec.group);
    m->set_rank(spec.rank);
    m->set_group_size(spec.size);
    req.set_direct_write_domain(spec.domain);
    req.set_node(spec.node);
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
    // The same instance again replaces its lease, naming it (as the agent).
    std::string& previous = last_lease_[req.instance_id()];
    auto resp = controller_->workers().RegisterWorker(req, "", previous);
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok()) return "";
    previous = resp->lease_id();
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
    for (const std::string& l : leases) EXPECT_TRUE(Report(l, id).ok());
    return out;
  }

  // RegisterHosts(d_src0, d_src1, d_dst), Define(), then Sync() of version
  // 1: the workers' leases and assignments and the sync's direct pairs.
  struct HostSync {
    std::vector<std::string> leases;
    std::vector<v1::SyncAssignment> as;
    int32_t pairs = -1;
  };
  HostSync SyncHosts(const std::string& d_src0, const std::string& d_src1,
                     const std::string& d_dst) {
    HostSync h;
    h.leases = RegisterHosts(d_src0, d_src1, d_dst);
    Define();
    h.as = Sync(h.leases, 1, &h.pairs);
    return h;
  }

  // The report of worker `lease` for sync `sync_id` (code 0: it succeeded).
  absl::Status Report(const std::string& lease, const std::string& sync_id, int32_t code = 0,
                      const std::string& message = "", bool direct_writes_unavailable = false) {
    v1::ReportResultRequest r;
    r.set_lease_id(lease);
    r.set_sync_id(sync_id);
    r.set_code(code);
    r.set_message(message);
    r.set_direct_writes_unavailable(direct_writes_unavailable);
    return controller_->syncs().ReportResult(r);
  }

  static void ExpectNoDirectWrites(const std::vector<v1::SyncAssignment>& as) {
    for (const v1::SyncAssignment& a : as) {
      EXPECT_THAT(a.direct_write_to(), ::testing::IsEmpty()) << "worker " << a.worker();
      EXPECT_THAT(a.direct_written_by(), ::testing::IsEmpty()) << "worker " << a.worker();
      EXPECT_THAT(a.peer_buffers(), ::testing::IsEmpty()) << "worker " << a.worker();
    }
  }

  ControllerMetrics metrics_;
  PlanSource plans_;
  std::unique_ptr<Controller> controller_;
  std::map<std::string, uint64_t> tokens_;
  std::map<std::string, std::string> last_lease_;  // instance -> its last lease
};

}  // namespace wsync::controller::routes_testing

#endif  // WSYNC_TESTS_CONTROLLER_SERVER_ROUTES_FIXTURE_H_
