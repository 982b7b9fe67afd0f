// WorkerAgent serving reports: what the owner set reaches the controller at
// once, and again at once after the controller restarted (a real controller
// server in-process, a real agent with the host backend). The controller's
// heartbeat interval is made long, so only the immediate sends can pass.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/server/server.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/agent/agent.h"
#include "worker/backends/host/host_backend.h"

namespace wsync::agent {
namespace {

constexpr absl::Duration kLeaseTtl = absl::Seconds(40);  // heartbeats every 10 s

absl::StatusOr<std::unique_ptr<controller::ControllerServer>> StartController(int port) {
  controller::ServerOptions so;
  so.listen_address = absl::StrCat("127.0.0.1:", port);
  so.metrics_address = "";
  so.auth.insecure = true;  // security is not the subject
  so.config.instance = absl::StrCat("agent-serving-test-", port);
  so.config.lease_ttl = kLeaseTtl;
  return controller::ControllerServer::Start(so);
}

// The first replica of group "inf" as the controller at `address` shows it.
v1::ReplicaServing Replica(const std::string& address) {
  auto trainer =
      v1::TrainerService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::ReplicasRequest req;
  req.set_group("inf");
  v1::ReplicasResponse resp;
  if (!trainer->Replicas(&ctx, req, &resp).ok() || resp.replicas_size() == 0) return {};
  return resp.replicas(0);
}

// Waits up to `wait` for replica "r" to serve `version`.
bool ServesWithin(const std::string& address, int64_t version, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  while (absl::Now() < until) {
    const v1::ReplicaServing r = Replica(address);
    if (r.replica() == "r" && r.state() == v1::REPLICA_SERVING && r.version() == version) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST(AgentServingTest, ReportsReachTheControllerAtOnceAndSurviveItsRestart) {
  auto server = StartController(0);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  host::HostBackend backend{plane::BackendConfig()};
  AgentOptions o;
  o.controller = address;
  v1::Membership m;
  m.set_group("inf");
  m.set_rank(0);
  m.set_group_size(1);
  o.memberships = {m};
  o.instance_id = "agent-serving-test";
  o.backend = &backend;
  WorkerAgent agent(o, nullptr);
  agent.Start();
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (!agent.Status().registered() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(agent.Status().registered());

  v1::SetServingRequest req;
  req.set_group("inf");
  req.set_version(5);
  req.set_state(v1::SERVING_STATE_SERVING);
  req.set_replica("r");
  ASSERT_TRUE(agent.SetServing(req).ok());
  EXPECT_TRUE(ServesWithin(address, 5, absl::Seconds(5)));
  req.set_group("nope");
  EXPECT_EQ(agent.SetServing(req).code(), absl::StatusCode::kInvalidArgument);

  // The controller restarts on the same port: the agent registers again and
  // the new controller hears what the owner serves without a new SetServing.
  (*server)->Shutdown();
  server->reset();
  auto again = StartController(port);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(ServesWithin(address, 5, absl::Seconds(5)));
  agent.Stop();
  (*again)->Shutdown();
}

}  // namespace
}  // namespace wsync::agent
