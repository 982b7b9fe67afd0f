// Invalid requests get the right status code, a message naming the problem,
// and change nothing.
#include <sys/wait.h>

#include <fstream>
#include <iterator>

#include "common/wire_text.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::integration {
namespace {

v1::GetStatusResponse Status(CaseRun& run) {
  v1::GetStatusRequest req;
  v1::GetStatusResponse resp;
  EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().GetStatus(c, req, &resp);
              }).ok());
  return resp;
}

grpc::Status Define(CaseRun& run, const std::string& name, const std::string& src_group,
                    const v1::TransferSpec& spec) {
  v1::DefineTransferRequest req;
  req.set_name(name);
  req.set_source_group(src_group);
  req.set_destination_group("inference");
  *req.mutable_spec() = spec;
  v1::DefineTransferResponse resp;
  return Call(
      [&](grpc::ClientContext* c) { return run.cluster->trainer().DefineTransfer(c, req, &resp); });
}

#define EXPECT_CODE_MENTIONS(status, code, text)                                       \
  do {                                                                                 \
    const grpc::Status s_ = (status);                                                  \
    EXPECT_EQ(s_.error_code(), grpc::StatusCode::code) << s_.error_message();          \
    EXPECT_NE(s_.error_message().find(text), std::string::npos) << s_.error_message(); \
  } while (0)

// A plan no worker can stage (a limit under 256 bytes) is refused when the
// transfer is defined, naming the worker and its limit: never after dispatch.
TEST(InvalidRequests, AStagingLimitThePlanCannotMeetIsRefusedAtDefine) {
  demo::ClusterOptions options = DefaultClusterOptions();
  options.worker_flags.push_back("--staging_limit_bytes=100");
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  const grpc::Status refused = Define(run, "t", "trainer", run.spec);
  EXPECT_CODE_MENTIONS(refused, INVALID_ARGUMENT, "--staging_limit_bytes 100");
  EXPECT_NE(refused.error_message().find("worker trainer/0"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Status(run).transfers_size(), 0);
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().ListWorkers(c, req, &workers);
              }).ok());
  ASSERT_GT(workers.workers_size(), 0);
  for (const v1::RegisteredWorker& w : workers.workers()) {
    EXPECT_EQ(w.staging_limit_bytes(), 100);
    ASSERT_EQ(w.transports_size(), 1);
    EXPECT_EQ(w.transports(0), v1::TRANSPORT_GLOO);
  }
}

TEST(InvalidRequests, BadSpecsAreRefusedAndChangeNothing) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  // Unknown source tensor in a mapping.
  v1::TransferSpec spec = run.spec;
  v1::TensorMapping* m = spec.add_mappings();
  *m = run.spec.mappings(0);
  m->set_src("no.such.tensor");
  EXPECT_CODE_MENTIONS(Define(run, "t", "trainer", spec), INVALID_ARGUMENT, "no.such.tensor");
  // Dtype mismatch between the sides with no cast allowed.
  spec = run.spec;
  for (auto& t : *spec.mutable_destination()->mutable_tensors()) {
    if (t.name() == "model.norm.weight") t.set_dtype(v1::FP16);
  }
  EXPECT_EQ(Define(run, "t", "trainer", spec).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Shape mismatch: a destination tensor fed whole by a source of another shape.
  spec = run.spec;
  for (auto& t : *spec.mutable_source()->mutable_tensors()) {
    if (t.name() == "model.norm.weight") t.set_shape(0, t.shape(0) * 2);
  }
  EXPECT_EQ(Define(run, "t", "trainer", spec).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Unknown group, bad name, unknown transfer.
  EXPECT_CODE_MENTIONS(Define(run, "t", "ghost", run.spec), FAILED_PRECONDITION, "ghost");
  EXPECT_CODE_MENTIONS(Define(run, "", "trainer", run.spec), INVALID_ARGUMENT, "name");
  v1::SyncRequest sync;
  sync.set_transfer("t");
  sync.set_version(1);
  v1::SyncResponse resp;
  EXPECT_CODE_MENTIONS(
      Call([&](grpc::ClientContext* c) { return run.cluster->trainer().Sync(c, sync, &resp); }),
      NOT_FOUND, "'t'");
  EXPECT_EQ(Status(run).transfers_size(), 0) << "nothing was defined";
  // The valid spec still works afterwards.
  ASSERT_TRUE(run.Define("t").ok());
  EXPECT_EQ(Status(run).transfers_size(), 1);
}

TEST(InvalidRequests, BuffersThatDoNotMatchTheLayout) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  demo::OwnerRank& owner = *run.dst_owner[0];
  const demo::BufferSpec& b = owner.buffers()[0];
  ASSERT_EQ(b.dtype, v1::BF16);
  ASSERT_TRUE(run.Define("t").ok());
  v1::RegisterTensorsResponse resp;
  auto send = [&](const v1::RegisterTensorsRequest& req) {
    return Call(
        [&](grpc::ClientContext* c) { return owner.stub().RegisterTensors(c, req, &resp); });
  };
  // The worker refuses a shape that does not fit the registered bytes ...
  v1::RegisterTensorsRequest req = owner.Request();
  req.mutable_tensors(0)->set_dtype(v1::FP32);
  EXPECT_CODE_MENTIONS(send(req), INVALID_ARGUMENT, b.name);
  // ... a group it is not in, and a missing shm object.
  req = owner.Request();
  req.set_group("trainer");
  EXPECT_CODE_MENTIONS(send(req), INVALID_ARGUMENT, "trainer");
  req = owner.Request();
  req.mutable_tensors(0)->mutable_shm()->set_name("/wsync-no-such-object");
  EXPECT_CODE_MENTIONS(send(req), NOT_FOUND, "/wsync-no-such-object");
  // Device memory on a worker that moves host memory: refused, naming the
  // flag that starts the GPU data plane.
  req = owner.Request();
  req.mutable_tensors(0)->mutable_cuda_ipc()->set_size(b.bytes);
  EXPECT_CODE_MENTIONS(send(req), FAILED_PRECONDITION, "--device");
  // A dtype other than the layout's passes the worker but not the controller:
  // the sync is refused before any byte moves, naming the buffer.
  req = owner.Request();
  req.mutable_tensors(0)->set_dtype(v1::FP32);
  req.mutable_tensors(0)->set_shape(0, b.bytes / 4);
  ASSERT_TRUE(send(req).ok());
  run.Fill(1);
  v1::SyncStatus st;
  EXPECT_CODE_MENTIONS(run.SyncAndWait("t", 1, &st), INVALID_ARGUMENT, b.name);
  EXPECT_CODE_MENTIONS(run.Define("t"), INVALID_ARGUMENT, "fp32");
  // A buffer smaller than the layout needs.
  req = owner.Request();
  req.mutable_tensors(0)->set_shape(0, b.bytes / 2 - 1);
  req.mutable_tensors(0)->mutable_shm()->set_size(b.bytes - 2);
  ASSERT_TRUE(send(req).ok());
  EXPECT_CODE_MENTIONS(run.SyncAndWait("t", 1, &st), INVALID_ARGUMENT, "bytes");
  // Nothing changed: version 1 is still new, and goes through once fixed.
  ASSERT_TRUE(owner.Register().ok());
  ASSERT_TRUE(run.SyncAndWait("t", 1, &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run.Verify(1, &first), 0) << first;
}

#ifndef WSYNC_WITH_CUDA
TEST(InvalidRequests, GpuDataPlaneOnAHostOnlyBuildIsRefusedAtStart) {
  char dir[] = "/tmp/wsync-device-flag-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string log = absl::StrCat(dir, "/worker.log");
  auto child = demo::Child::Spawn(
      {WSYNC_WORKER_BIN, "--groups=trainer:0:1", "--device=0", "--controller=127.0.0.1:1",
       "--insecure", absl::StrCat("--local_socket=", dir, "/w.sock"), "--metrics_port=-1"},
      log);
  ASSERT_TRUE(child.ok()) << child.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (child->running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_FALSE(child->running()) << "wsync-worker --device kept running on a host-only build";
  EXPECT_TRUE(WIFEXITED(child->exit_status()));
  EXPECT_EQ(WEXITSTATUS(child->exit_status()), 2);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("WSYNC_WITH_CUDA"), std::string::npos) << text;
}
#endif

TEST(InvalidRequests, DuplicateRanksOldVersionsAndOversizedMessages) {
  demo::ClusterOptions options = DefaultClusterOptions();
  options.controller_flags.push_back("--max_message_bytes=262144");
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  // Another process claiming trainer rank 0.
  v1::RegisterWorkerRequest reg;
  reg.set_instance_id("intruder");
  v1::Membership* m = reg.add_memberships();
  m->set_group("trainer");
  m->set_rank(0);
  m->set_group_size(2);
  v1::RegisterWorkerResponse reg_resp;
  EXPECT_CODE_MENTIONS(Call([&](grpc::ClientContext* c) {
                         return run.cluster->worker_api().RegisterWorker(c, reg, &reg_resp);
                       }),
                       ALREADY_EXISTS, "rank 0");
  m->set_rank(2);
  m->set_group_size(3);
  EXPECT_CODE_MENTIONS(Call([&](grpc::ClientContext* c) {
                         return run.cluster->worker_api().RegisterWorker(c, reg, &reg_resp);
                       }),
                       INVALID_ARGUMENT, "size");
  v1::ListWorkersRequest lw;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().ListWorkers(c, lw, &workers);
              }).ok());
  EXPECT_EQ(workers.workers_size(), 4) << "no lease was added";
  // Versions only move forward.
  ASSERT_TRUE(run.Define("t").ok());
  run.Fill(2);
  v1::SyncStatus st;
  ASSERT_TRUE(run.SyncAndWait("t", 2, &st).ok());
  ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  for (int64_t v : {1, 2}) {
    v1::SyncRequest sync;
    sync.set_transfer("t");
    sync.set_version(v);
    v1::SyncResponse resp;
    EXPECT_CODE_MENTIONS(
        Call([&](grpc::ClientContext* c) { return run.cluster->trainer().Sync(c, sync, &resp); }),
        FAILED_PRECONDITION, "not newer");
  }
  // A request over --max_message_bytes.
  v1::DefineTransferRequest big;
  big.set_name("big");
  big.set_source_group("trainer");
  big.set_destination_group("inference");
  *big.mutable_spec() = run.spec;
  big.mutable_spec()->set_name(std::string(300000, 'x'));
  v1::DefineTransferResponse big_resp;
  EXPECT_EQ(Call([&](grpc::ClientContext* c) {
              return run.cluster->trainer().DefineTransfer(c, big, &big_resp);
            }).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  v1::GetStatusRequest sr;
  v1::GetStatusResponse status;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().GetStatus(c, sr, &status);
              }).ok());
  ASSERT_EQ(status.transfers_size(), 1);
  EXPECT_EQ(status.transfers(0).last_success_version(), 2);
  EXPECT_EQ(status.transfers(0).in_flight_version(), 0);
  // And the next version still goes through.
  run.Fill(3);
  ASSERT_TRUE(run.SyncAndWait("t", 3, &st).ok());
  EXPECT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
  std::string first;
  EXPECT_EQ(run.Verify(3, &first), 0) << first;
}

// A request field the error message echoes (an unknown transfer's name) may
// be as large as the controller accepts: the answer still arrives at once,
// its message clipped under the client's metadata limit (common/wire_text.h),
// and the controller keeps answering. Before the clip, an 8 KiB name came
// back as "received initial metadata size exceeds limit" and a 15 MiB one
// stalled the call past its deadline.
TEST(InvalidRequests, AHugeUnknownTransferNameIsAnsweredAtOnceWithAClippedMessage) {
  auto run_or = CaseRun::Start(Case("fsdp:2", "vllm-tp:2"), DefaultClusterOptions());
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  for (size_t bytes : {size_t{8} << 10, size_t{15} << 20}) {
    v1::SyncRequest sync;
    sync.set_transfer(std::string(bytes, 'n'));
    sync.set_version(1);
    v1::SyncResponse resp;
    const absl::Time start = absl::Now();
    const grpc::Status s =
        Call([&](grpc::ClientContext* c) { return run.cluster->trainer().Sync(c, sync, &resp); },
             absl::Seconds(20));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << bytes << " bytes";
    EXPECT_CODE_MENTIONS(s, NOT_FOUND, "unknown transfer");
    EXPECT_LE(s.error_message().size(), kMaxWireMessageBytes) << bytes << " bytes";
    EXPECT_NE(s.error_message().find("bytes cut]"), std::string::npos) << s.error_message();
  }
  v1::GetStatusRequest sr;
  v1::GetStatusResponse status;
  EXPECT_TRUE(Call([&](grpc::ClientContext* c) {
                return run.cluster->trainer().GetStatus(c, sr, &status);
              }).ok());
}

}  // namespace
}  // namespace wsync::integration
