// 4,000 concurrent waiters (WaitSync and WatchSync on a running sync, KvGet
// on a key of the sync's scope that nobody sets) keep
// the controller's thread count bounded (issue 18: each held an OS thread,
// 4,000 -> 4,021 threads), and all of them are answered from the
// controller's own notification once the sync ends.
#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/integration/harness.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::integration {
namespace {

// Threads of process `pid` (/proc/<pid>/status), -1 if unreadable.
int Threads(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "Threads:")) continue;
    int n = -1;
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n) ? n : -1;
  }
  return -1;
}

struct Pending {
  grpc::ClientContext ctx;
  grpc::Status status;
  v1::SyncStatus unary;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::SyncStatus>> wait;
  std::unique_ptr<grpc::ClientAsyncReader<v1::SyncStatus>> watch;
  v1::KvGetResponse kv;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::KvGetResponse>> kv_get;
  v1::SyncStatus last;  // the watch's latest message
  bool finishing = false;
};

TEST(WaitersIntegration, FourThousandWaitersHoldNoThreadEach) {
  demo::ClusterOptions options = DefaultClusterOptions();
  options.lease_ttl = absl::Seconds(60);
  options.sync_deadline = absl::Seconds(60);
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_TRUE(run.Define("t").ok());
  run.Fill(1);
  // A stopped destination worker keeps the sync running.
  const pid_t stopped = run.cluster->worker(run.dst_worker[0]).child.pid();
  ASSERT_TRUE(Freeze(stopped));
  v1::SyncRequest sreq;
  sreq.set_transfer("t");
  sreq.set_version(1);
  v1::SyncResponse started;
  ASSERT_TRUE(::wsync::integration::Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().Sync(c, sreq, &started);
              }).ok());
  const pid_t controller = run.cluster->controller_pid();
  const int threads_before = Threads(controller);
  ASSERT_GT(threads_before, 0);

  // A worker of the transfer (source rank 0, running) waits on a key of the
  // transfer's rendezvous scope that nobody sets: only the scope's workers
  // may read it (docs/security.md), so its lease comes from its local API.
  v1::LocalStatusResponse lease;
  ASSERT_TRUE(::wsync::integration::Call([&](grpc::ClientContext* c) {
                return run.src_owner[0]->stub().Status(c, v1::LocalStatusRequest(), &lease);
              }).ok());
  ASSERT_FALSE(lease.lease_id().empty());
  v1::GetStatusResponse status;
  ASSERT_TRUE(::wsync::integration::Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().GetStatus(c, v1::GetStatusRequest(), &status);
              }).ok());
  ASSERT_EQ(status.transfers_size(), 1);
  const std::string missing_key = absl::StrCat("t/", status.transfers(0).generation(), "/never");

  // Eight channels (distinct arguments: distinct connections): WaitSync,
  // WatchSync and KvGet calls, 4,000 in all.
  std::vector<std::unique_ptr<v1::TrainerService::Stub>> stubs;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> worker_stubs;
  for (int i = 0; i < 8; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("wsync.test.channel", i);
    auto channel = grpc::CreateCustomChannel(run.cluster->controller_address(),
                                             grpc::InsecureChannelCredentials(), args);
    stubs.push_back(v1::TrainerService::NewStub(channel));
    worker_stubs.push_back(v1::WorkerService::NewStub(channel));
  }
  constexpr int kEach = 2000;
  constexpr int kKvGets = 1000;  // of the 4,000
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Pending>> calls;
  const auto deadline = absl::ToChronoTime(absl::Now() + absl::Seconds(120));
  for (int i = 0; i < 2 * kEach; ++i) {
    auto call = std::make_unique<Pending>();
    call->ctx.set_deadline(deadline);
    v1::TrainerService::Stub& stub = *stubs[i % stubs.size()];
    if (i < kKvGets) {
      v1::KvGetRequest get;
      get.set_lease_id(lease.lease_id());
      get.add_keys(missing_key);
      get.set_timeout_ms(12'000);
      call->kv_get = worker_stubs[i % stubs.size()]->AsyncKvGet(&call->ctx, get, &cq);
      call->kv_get->Finish(&call->kv, &call->status, call.get());
    } else if (i % 2 == 0) {
      v1::WaitSyncRequest w;
      w.set_sync_id(started.sync_id());
      call->wait = stub.AsyncWaitSync(&call->ctx, w, &cq);
      call->wait->Finish(&call->unary, &call->status, call.get());
    } else {
      v1::WatchSyncRequest w;
      w.set_sync_id(started.sync_id());
      call->watch = stub.AsyncWatchSync(&call->ctx, w, &cq, call.get());
    }
    calls.push_back(std::move(call));
  }
  // Drives the watches: read until the stream ends, then finish.
  int answered = 0;
  auto pump = [&](absl::Duration for_how_long) {
    const absl::Time until = absl::Now() + for_how_long;
    void* tag = nullptr;
    bool ok = false;
    while (answered < 2 * kEach) {
      const auto got = cq.AsyncNext(&tag, &ok, absl::ToChronoTime(until));
      if (got != grpc::CompletionQueue::NextStatus::GOT_EVENT) return;
      Pending* c = static_cast<Pending*>(tag);
      if (c->wait != nullptr || c->kv_get != nullptr || c->finishing) {
        ++answered;
      } else if (ok) {
        c->watch->Read(&c->last, c);
      } else {
        c->finishing = true;
        c->watch->Finish(&c->status, c);
      }
    }
  };
  // Every call reaches the controller and waits there.
  pump(absl::Seconds(5));
  EXPECT_EQ(answered, 0);
  const int threads_waiting = Threads(controller);
  std::cerr << "controller threads: " << threads_before << " before, " << threads_waiting
            << " with " << 2 * kEach << " waiters\n";
  EXPECT_LT(threads_waiting, threads_before + 64);

  ASSERT_EQ(kill(stopped, SIGCONT), 0);
  pump(absl::Seconds(60));
  ASSERT_EQ(answered, 2 * kEach);
  int succeeded = 0;
  int timed_out = 0;
  for (const auto& c : calls) {
    if (c->kv_get != nullptr) {
      // Answered at its timeout, by the controller, naming the key.
      if (c->status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
          c->status.error_message().find("never") != std::string::npos) {
        ++timed_out;
      }
      continue;
    }
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
    const v1::SyncStatus& s = c->wait != nullptr ? c->unary : c->last;
    if (s.phase() == v1::SYNC_SUCCEEDED) ++succeeded;
  }
  EXPECT_EQ(succeeded, 2 * kEach - kKvGets);
  EXPECT_EQ(timed_out, kKvGets);
  std::string first;
  EXPECT_EQ(run.Verify(1, &first), 0) << first;
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

// Each worker's assignment stream was a handler thread (issue 18): 500
// workers held 500 controller threads. They are callback reactors now; a
// stream the worker drops still ends its lease at once.
TEST(WaitersIntegration, FiveHundredAssignmentStreamsHoldNoThreadEach) {
  auto cluster_or = demo::Cluster::Start(DefaultClusterOptions());
  ASSERT_TRUE(cluster_or.ok()) << cluster_or.status();
  demo::Cluster& cluster = **cluster_or;
  const pid_t controller = cluster.controller_pid();
  const int threads_before = Threads(controller);
  ASSERT_GT(threads_before, 0);
  constexpr int kWorkers = 500;
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReader<v1::Assignment>> reader;
    bool started = false;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int r = 0; r < kWorkers; ++r) {
    v1::RegisterWorkerRequest req;
    req.set_instance_id(absl::StrCat("streams-", r));
    v1::Membership* m = req.add_memberships();
    m->set_group("many");
    m->set_rank(r);
    m->set_group_size(kWorkers);
    req.set_node("test");
    req.set_pid(1);
    v1::RegisterWorkerResponse resp;
    ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                  return cluster.worker_api().RegisterWorker(c, req, &resp);
                }).ok());
    auto s = std::make_unique<Stream>();
    v1::AssignmentsRequest open;
    open.set_lease_id(resp.lease_id());
    s->reader = cluster.worker_api().AsyncAssignments(&s->ctx, open, &cq, s.get());
    streams.push_back(std::move(s));
  }
  // Every stream is open: its call started, and the controller's handler
  // sent the headers (it runs for every stream at once).
  int opened = 0;
  void* tag = nullptr;
  bool ok = false;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (opened < kWorkers &&
         cq.AsyncNext(&tag, &ok, absl::ToChronoTime(until)) ==
             grpc::CompletionQueue::NextStatus::GOT_EVENT) {
    auto* s = static_cast<Stream*>(tag);
    if (!ok) continue;
    if (!s->started) {
      s->started = true;
      s->reader->ReadInitialMetadata(s);
    } else {
      ++opened;
    }
  }
  ASSERT_EQ(opened, kWorkers);
  const int threads_streaming = Threads(controller);
  std::cerr << "controller threads: " << threads_before << " before, " << threads_streaming
            << " with " << kWorkers << " assignment streams\n";
  EXPECT_LT(threads_streaming, threads_before + 64);

  // Half the workers go away: their leases end, the others stay alive.
  for (int r = 0; r < kWorkers; r += 2) streams[r]->ctx.TryCancel();
  int alive = kWorkers;
  for (int i = 0; i < 100 && alive != kWorkers / 2; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    alive = 0;
    v1::ListWorkersRequest list;
    list.set_group("many");
    do {  // every page
      v1::ListWorkersResponse listed;
      ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                    return cluster.trainer().ListWorkers(c, list, &listed);
                  }).ok());
      for (const v1::RegisteredWorker& w : listed.workers()) alive += w.alive() ? 1 : 0;
      list.set_page_token(listed.next_page_token());
    } while (!list.page_token().empty());
  }
  EXPECT_EQ(alive, kWorkers / 2);
  for (auto& s : streams) s->ctx.TryCancel();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace wsync::integration
