// WorkerAgent buffer lists: what the controller holds for a worker follows
// the owner's registrations (a real controller server, in-process, and a
// real agent with the host backend).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/server/server.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/agent/agent.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

constexpr int kThreads = 8;
constexpr int kPerThread = 8;
constexpr int64_t kTensorBytes = 16;

// A POSIX shm object holding every tensor, unlinked at the end.
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes) : name_(absl::StrCat("/wsync-agent-buffers-", getpid())) {
    const int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    close(fd);
  }
  ~ShmObject() { shm_unlink(name_.c_str()); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// The buffer names the controller lists for the one worker of group "g".
std::set<std::string> ControllerBuffers(v1::TrainerService::Stub& trainer) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ListWorkersRequest req;
  req.set_group("g");
  v1::ListWorkersResponse resp;
  EXPECT_TRUE(trainer.ListWorkers(&ctx, req, &resp).ok());
  std::set<std::string> names;
  for (const v1::RegisteredWorker& w : resp.workers()) {
    if (!w.alive()) continue;
    for (const v1::BufferInfo& b : w.buffers()) names.insert(b.name());
  }
  return names;
}

// Concurrent RegisterTensors calls each push a list; whichever lands last,
// the controller ends with the newest (every tensor registered). Also guards
// the version check that lets a push whose list is already sent return
// early: a skipped push that was needed leaves a tensor out.
TEST(AgentBuffersTest, ConcurrentRegistrationsLeaveTheControllerWithTheNewestList) {
  controller::ServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.metrics_address = "";
  so.auth.insecure = true;  // security is not the subject
  so.config.instance = "agent-buffers-test";
  auto server = controller::ControllerServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  host::HostBackend backend{plane::BackendConfig()};
  AgentOptions o;
  o.controller = address;
  v1::Membership m;
  m.set_group("g");
  m.set_rank(0);
  m.set_group_size(1);
  o.memberships = {m};
  o.instance_id = "agent-buffers-test";
  o.backend = &backend;
  WorkerAgent agent(o, nullptr);
  agent.Start();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!agent.Status().registered() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(agent.Status().registered());

  ShmObject shm(kThreads * kPerThread * kTensorBytes);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int n = t * kPerThread + i;
        v1::RegisterTensorsRequest req;
        req.set_group("g");
        v1::TensorRegistration* reg = req.add_tensors();
        reg->set_name(absl::StrCat("w", n));
        reg->set_dtype(v1::FP32);
        reg->add_shape(kTensorBytes / 4);
        reg->mutable_shm()->set_name(shm.name());
        reg->mutable_shm()->set_offset(n * kTensorBytes);
        reg->mutable_shm()->set_size(kTensorBytes);
        EXPECT_TRUE(agent.RegisterTensors(req).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto trainer = v1::TrainerService::NewStub(channel);
  EXPECT_EQ(ControllerBuffers(*trainer).size(), static_cast<size_t>(kThreads * kPerThread))
      << "an older list arrived last";
  agent.Stop();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace wsync::agent
