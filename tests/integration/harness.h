// Integration-test harness: a real wsync-controller and real wsync-worker
// processes (binaries from this build), owner ranks with shared-memory
// tensors in the test process, and a catalog case between two groups.
#ifndef WSYNC_TESTS_INTEGRATION_HARNESS_H_
#define WSYNC_TESTS_INTEGRATION_HARNESS_H_

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catalog/case.h"
#include "controller/plan/compiled_layout.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tools/demo/cluster.h"
#include "tools/demo/layout_data.h"
#include "tools/demo/owner.h"
#include "tools/demo/sync_steps.h"

namespace wsync::integration {

inline std::string UniqueName(const std::string& what) {
  static std::atomic<int> counter{0};
  return absl::StrCat(what, "-", getpid(), "-", counter++);
}

inline demo::ClusterOptions DefaultClusterOptions() {
  demo::ClusterOptions o;
  o.controller_bin = WSYNC_CONTROLLER_BIN;
  o.worker_bin = WSYNC_WORKER_BIN;
  // A fresh directory: a name built from the pid alone is reused once pids
  // wrap, and a stale port file in it sent a test to a dead controller.
  std::string dir = absl::StrCat(::testing::TempDir(), "/wsync-it-XXXXXX");
  o.work_dir = mkdtemp(dir.data()) != nullptr
                   ? dir
                   : absl::StrCat(::testing::TempDir(), "/", UniqueName("wsync-it"));
  o.lease_ttl = absl::Seconds(2);
  o.sync_deadline = absl::Seconds(20);
  return o;
}

// SIGSTOPs `pid` and returns once the kernel shows it stopped (state 'T' in
// /proc/<pid>/stat); false if it did not stop within 5 s.
inline bool Freeze(pid_t pid) {
  if (kill(pid, SIGSTOP) != 0) return false;
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T') {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

template <typename Fn>
grpc::Status Call(Fn fn, absl::Duration timeout = absl::Seconds(30)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return fn(&ctx);
}

// A catalog case running on a cluster: groups "trainer" and "inference".
class CaseRun {
 public:
  static absl::StatusOr<std::unique_ptr<CaseRun>> Start(const catalog::CaseOptions& co,
                                                        demo::ClusterOptions options) {
    std::unique_ptr<CaseRun> c(new CaseRun());
    auto spec = catalog::BuildCase(co);
    if (!spec.ok()) return spec.status();
    c->spec = *spec;
    auto s = plan::CompileSide(c->spec.source(), plan::SideRole::kSource);
    if (!s.ok()) return s.status();
    c->src = *std::move(s);
    auto d = plan::CompileSide(c->spec.destination(), plan::SideRole::kDestination);
    if (!d.ok()) return d.status();
    c->dst = *std::move(d);
    c->src_buffers = demo::BuffersPerRank(c->src);
    c->dst_buffers = demo::BuffersPerRank(c->dst);
    auto cluster = demo::Cluster::Start(std::move(options));
    if (!cluster.ok()) return cluster.status();
    c->cluster = *std::move(cluster);
    const int ns = static_cast<int>(c->src.workers.size());
    const int nd = static_cast<int>(c->dst.workers.size());
    c->src_worker.resize(ns);
    c->dst_worker.resize(nd);
    for (int r = 0; r < ns; ++r) {
      std::vector<std::string> groups = {absl::StrCat("trainer:", r, ":", ns)};
      if (co.colocated && r < nd) groups.push_back(absl::StrCat("inference:", r, ":", nd));
      auto w = c->cluster->AddWorker(groups);
      if (!w.ok()) return w.status();
      c->src_worker[r] = *w;
      if (co.colocated && r < nd) c->dst_worker[r] = *w;
    }
    for (int r = 0; r < nd && !co.colocated; ++r) {
      auto w = c->cluster->AddWorker({absl::StrCat("inference:", r, ":", nd)});
      if (!w.ok()) return w.status();
      c->dst_worker[r] = *w;
    }
    const std::string shm = UniqueName("/wsync-it");
    for (int r = 0; r < ns; ++r) {
      auto o = demo::OwnerRank::Create(c->cluster->worker(c->src_worker[r]).socket, "trainer",
                                       c->src_buffers[r], absl::StrCat(shm, "-t", r));
      if (!o.ok()) return o.status();
      c->src_owner.push_back(*std::move(o));
    }
    for (int r = 0; r < nd; ++r) {
      auto o = demo::OwnerRank::Create(c->cluster->worker(c->dst_worker[r]).socket, "inference",
                                       c->dst_buffers[r], absl::StrCat(shm, "-i", r));
      if (!o.ok()) return o.status();
      c->dst_owner.push_back(*std::move(o));
    }
    for (auto& o : c->src_owner) {
      absl::Status st = o->Register();
      if (!st.ok()) return st;
    }
    for (auto& o : c->dst_owner) {
      absl::Status st = o->Register();
      if (!st.ok()) return st;
    }
    absl::Status st = c->cluster->WaitForWorkers(c->cluster->num_workers(), absl::Seconds(20));
    if (!st.ok()) return st;
    return c;
  }

  grpc::Status Define(const std::string& name, v1::DefineTransferResponse* resp = nullptr) {
    v1::DefineTransferRequest req;
    req.set_name(name);
    req.set_source_group("trainer");
    req.set_destination_group("inference");
    *req.mutable_spec() = spec;
    v1::DefineTransferResponse ignored;
    grpc::Status s = Call([&](grpc::ClientContext* ctx) {
      return cluster->trainer().DefineTransfer(ctx, req, resp ? resp : &ignored);
    });
    if (!s.ok()) return s;
    // As a trainer's first step would: the transfer's warm-up (docs/warm-up.md)
    // ends before the test's first sync, which then runs right away (a sync
    // started earlier waits for it: warm_up_test.cc).
    static const std::atomic<bool> kNoStop{false};
    auto warm = demo::AwaitWarmUp(*cluster, name, absl::Seconds(30), kNoStop);
    if (!warm.ok())
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, warm.status().ToString());
    return grpc::Status::OK;
  }

  void Fill(int64_t version) {
    for (size_t r = 0; r < src_owner.size(); ++r) {
      ASSERT_TRUE(
          demo::FillSource(src, static_cast<int32_t>(r), version, src_owner[r]->memory()).ok());
    }
    for (size_t r = 0; r < dst_owner.size(); ++r) {
      demo::Poison(dst_buffers[r], dst_owner[r]->memory());
    }
  }

  // Starts a sync and waits for its end.
  grpc::Status SyncAndWait(const std::string& transfer, int64_t version, v1::SyncStatus* status,
                           int64_t deadline_ms = 0, v1::SyncResponse* started = nullptr) {
    v1::SyncRequest req;
    req.set_transfer(transfer);
    req.set_version(version);
    req.set_deadline_ms(deadline_ms);
    v1::SyncResponse resp;
    grpc::Status s =
        Call([&](grpc::ClientContext* ctx) { return cluster->trainer().Sync(ctx, req, &resp); });
    if (!s.ok()) return s;
    if (started != nullptr) *started = resp;
    return Wait(resp.sync_id(), status);
  }

  grpc::Status Wait(const std::string& sync_id, v1::SyncStatus* status) {
    v1::WaitSyncRequest w;
    w.set_sync_id(sync_id);
    return Call(
        [&](grpc::ClientContext* ctx) { return cluster->trainer().WaitSync(ctx, w, status); },
        absl::Seconds(60));
  }

  // Wrong elements over every destination rank (error text in *first).
  int64_t Verify(int64_t version, std::string* first) {
    int64_t wrong = 0;
    for (size_t r = 0; r < dst_owner.size(); ++r) {
      auto res = demo::VerifyDestination(spec, dst, src, static_cast<int32_t>(r), version,
                                         dst_owner[r]->memory());
      if (!res.ok()) {
        *first = res.status().ToString();
        return -1;
      }
      if (res->elements == 0) {
        *first = absl::StrCat("inference rank ", r, " has no elements");
        return -1;
      }
      if (res->wrong_elements > 0 && first->empty()) *first = res->first_error;
      wrong += res->wrong_elements;
    }
    return wrong;
  }

  v1::TransferSpec spec;
  plan::CompiledSide src;
  plan::CompiledSide dst;
  std::vector<std::vector<demo::BufferSpec>> src_buffers;
  std::vector<std::vector<demo::BufferSpec>> dst_buffers;
  std::unique_ptr<demo::Cluster> cluster;
  std::vector<int> src_worker;
  std::vector<int> dst_worker;
  std::vector<std::unique_ptr<demo::OwnerRank>> src_owner;
  std::vector<std::unique_ptr<demo::OwnerRank>> dst_owner;

 private:
  CaseRun() = default;
};

inline catalog::CaseOptions Case(const std::string& source, const std::string& destination,
                                 bool colocated = false) {
  catalog::CaseOptions co;
  co.model = "tiny-llama";
  co.source = *catalog::ParseSource(source);
  co.destination = *catalog::ParseDestination(destination);
  co.colocated = colocated;
  return co;
}

// Starts fsdp:2 -> vllm-tp:2 on `options` into *run, defines transfer "t"
// and syncs version 1 (checked). Call under ASSERT_NO_FATAL_FAILURE.
inline void StartSyncedOnce(demo::ClusterOptions options, std::unique_ptr<CaseRun>* run) {
  auto started = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), std::move(options));
  ASSERT_TRUE(started.ok()) << started.status();
  *run = *std::move(started);
  ASSERT_TRUE((*run)->Define("t").ok());
  (*run)->Fill(1);
  v1::SyncStatus st;
  ASSERT_TRUE((*run)->SyncAndWait("t", 1, &st).ok());
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
}

}  // namespace wsync::integration

#endif  // WSYNC_TESTS_INTEGRATION_HARNESS_H_
