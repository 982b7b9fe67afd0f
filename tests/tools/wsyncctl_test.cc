// Runs the real wsyncctl binary on small specs and checks output and exit codes.
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/tools/run_ctl.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::tools {
namespace {

using Result = tools_testing::CtlResult;

Result Ctl(const std::string& args) { return tools_testing::RunCtl(args); }
Result CtlStdout(const std::string& args) { return tools_testing::RunCtl(args, false); }
Result CtlStderr(const std::string& args) {
  return tools_testing::RunShell(absl::StrCat(WSYNCCTL_PATH, " ", args, " 2>&1 >/dev/null"));
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/wsyncctl_test_", name);
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

constexpr char kTinyCase[] =
    "--model tiny-llama --source fsdp:2 --destination vllm-tp:2x2 --gpus-per-node 2 "
    "--trainer-dtype fp32";

TEST(WsyncctlTest, UsageAndUnknownCommand) {
  Result r = Ctl("");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("commands:"), std::string::npos) << r.out;
  r = Ctl("frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown command 'frobnicate'"), std::string::npos) << r.out;
  EXPECT_EQ(Ctl("--help").code, 0);
  EXPECT_EQ(Ctl("plan --help").code, 0);
}

TEST(WsyncctlTest, ReplicasUsageAndUnreachableController) {
  Result r = Ctl("replicas --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--controller HOST:PORT"), std::string::npos) << r.out;
  r = Ctl("replicas --group inference");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--controller HOST:PORT is required"), std::string::npos) << r.out;
  r = Ctl("replicas --controller 127.0.0.1:1 --version x");
  EXPECT_EQ(r.code, 2);
  // Nothing listens on port 1: the error names the group and the controller.
  r = Ctl("replicas --controller 127.0.0.1:1 --group serve --timeout_ms 300");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("replicas of group 'serve' from controller 127.0.0.1:1"), std::string::npos)
      << r.out;
}

TEST(WsyncctlTest, HealthUsageAndUnreachableController) {
  Result r = Ctl("health --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("grpc.health.v1.Health/Check"), std::string::npos) << r.out;
  r = Ctl("health");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--controller HOST:PORT is required"), std::string::npos) << r.out;
  r = Ctl("health --controller 127.0.0.1:1 --tls_server_name x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--tls_server_name needs --controller_ca"), std::string::npos) << r.out;
  // Nothing listens on port 1: unhealthy (1), naming the controller.
  r = Ctl("health --controller 127.0.0.1:1 --timeout_ms 300");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("health of controller 127.0.0.1:1"), std::string::npos) << r.out;
}

TEST(WsyncctlTest, CatalogThenPlanAndVerify) {
  const std::string spec = TempPath("tiny.json");
  Result r = Ctl(absl::StrCat("catalog ", kTinyCase, " --out ", spec));
  ASSERT_EQ(r.code, 0) << r.out;
  r = Ctl(absl::StrCat("plan ", spec, " --verify --top 3"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("'tiny-llama fsdp:2 to vllm-tp:2x2'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rounds"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lower bound"), std::string::npos) << r.out;
  // Both bounds, and the simulator's makespan against each.
  EXPECT_NE(r.out.find("routing bound"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x the routing bound"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top 3 of 6 workers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verify: OK"), std::string::npos) << r.out;
  r = Ctl(absl::StrCat("plan ", spec, " --rounds"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("round    0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("critical worker"), std::string::npos) << r.out;
  // The same case straight from flags.
  r = Ctl(absl::StrCat("plan ", kTinyCase, " --verify"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("verify: OK"), std::string::npos) << r.out;
}

TEST(WsyncctlTest, JsonIsTheCompletePlan) {
  Result r = CtlStdout(absl::StrCat("plan --json ", kTinyCase));
  ASSERT_EQ(r.code, 0);
  v1::Plan plan;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &plan).ok()) << r.out;
  EXPECT_FALSE(plan.key().empty());
  EXPECT_GT(plan.buckets_size(), 0);
  EXPECT_EQ(plan.buckets_size(), plan.summary().num_buckets());
  EXPECT_EQ(plan.num_rounds(), plan.summary().num_rounds());
  EXPECT_NE(r.out.find("\"bucketOffset\""), std::string::npos);  // proto3 JSON names
}

TEST(WsyncctlTest, BadInputsAreClearErrors) {
  Result r = Ctl("plan /nonexistent/spec.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cannot read spec '/nonexistent/spec.json'"), std::string::npos) << r.out;

  const std::string bad = TempPath("bad.json");
  Write(bad, "{\"source\": [1, 2");
  r = Ctl("plan " + bad);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("not a valid TransferSpec JSON"), std::string::npos) << r.out;

  const std::string empty = TempPath("empty.json");
  Write(empty, "  \n");
  r = Ctl("plan " + empty);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("is empty"), std::string::npos) << r.out;

  r = Ctl(absl::StrCat("plan ", kTinyCase, " --bogus"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown flag --bogus"), std::string::npos) << r.out;

  r = Ctl("catalog --model tiny-llama --source fsdp:zero --destination vllm-tp:2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--source: bad fsdp shard count 'zero'"), std::string::npos) << r.out;

  r = Ctl("catalog --model nosuch --source fsdp:2 --destination vllm-tp:2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown model 'nosuch'"), std::string::npos) << r.out;

  r = Ctl("catalog --model tiny-llama --source fsdp:2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--destination is required"), std::string::npos) << r.out;

  r = Ctl(absl::StrCat("plan x.json ", kTinyCase));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("exactly one of"), std::string::npos) << r.out;
}

TEST(WsyncctlTest, PlannerRejectionExitsOne) {
  // Valid JSON, but the mapping names a source tensor that does not exist.
  const std::string spec = TempPath("unmapped.json");
  Write(spec, R"({"source": {"ranks": [{"worker": 0, "node": "a"}],
    "tensors": [{"name": "w", "dtype": "BF16", "shape": [4],
                 "mesh": {"mesh_shape": [1], "ranks": [0], "placements": [{"replicate": {}}]}}]},
  "destination": {"ranks": [{"worker": 1, "node": "a"}],
    "tensors": [{"name": "v", "dtype": "BF16", "shape": [4],
                 "mesh": {"mesh_shape": [1], "ranks": [0], "placements": [{"replicate": {}}]}}]},
  "mappings": [{"dst": "v", "dst_offset": [0], "src": "missing", "src_box": {"offset": [0], "length": [4]}}]})");
  Result r = Ctl("plan " + spec);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("missing"), std::string::npos) << r.out;
}

// The controller's plan limits apply here too (defaults as wsync-controller's
// flags): Kimi-K2 from FSDP2 over 256 ranks (17.9 M source shards) used to be
// OOM-killed after 94 s on a 24 GiB machine; a spec over the limit by its
// source shards is refused before planning.
TEST(WsyncctlTest, PlanLimitsRefuseBeforePlanning) {
  Result r = Ctl(absl::StrCat("plan ", kTinyCase, " --max-pieces 3"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("counted from the spec"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("limit of 3 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--max-pieces"), std::string::npos) << r.out;
  r = Ctl(absl::StrCat("plan ", kTinyCase, " --max-buckets 1"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--max-buckets"), std::string::npos) << r.out;
  r = Ctl(absl::StrCat("plan ", kTinyCase, " --max-pieces -1"));
  EXPECT_EQ(r.code, 2) << r.out;
  r = Ctl(absl::StrCat("plan ", kTinyCase, " --max-pieces 0 --max-buckets 0"));
  EXPECT_EQ(r.code, 0) << r.out;
}

// --stages: one line per stage on stderr (stdout keeps the plan), the
// mapping stage saying how many tensors it copied from their class; a plan
// refused over a limit shows the stages it reached.
TEST(WsyncctlTest, StagesPrintEachStageAlsoWhenRefused) {
  Result r = CtlStderr(absl::StrCat("plan ", kTinyCase, " --json --stages"));
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* stage : {"catalog spec", "compile source", "compile destination", "sources",
                            "buckets", "rounds", "emit", "json", "total"}) {
    EXPECT_NE(r.out.find(absl::StrCat("  ", stage, " ")), std::string::npos) << stage << r.out;
  }
  // tiny-llama's two layers are alike: the second layer's tensors are copies.
  EXPECT_NE(r.out.find("cells ("), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("cells (0 of"), std::string::npos) << r.out;
  r = CtlStderr(absl::StrCat("plan ", kTinyCase, " --stages --max-buckets 1"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("  compile destination "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("  emit "), std::string::npos) << r.out;
  r = CtlStdout(absl::StrCat("plan ", kTinyCase, " --stages"));
  EXPECT_EQ(r.out.find("  emit "), std::string::npos) << "stages went to stdout: " << r.out;
}

TEST(WsyncctlTest, VerifyRefusesHugeModels) {
  Result r =
      Ctl("plan --model llama3-70b --source fsdp:8 --destination vllm-tp:8 --verify "
          "--verify-max-gib 1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("host memory"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace wsync::tools

namespace wsync::tools {
namespace {

// The number after "key": in the 'SIM {...}' line of `out` (-1 if absent).
double SimField(const std::string& out, const std::string& key) {
  const size_t line = out.find("SIM {");
  if (line == std::string::npos) return -1;
  const size_t at = out.find(absl::StrCat("\"", key, "\":"), line);
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(at + key.size() + 3));
}

std::string SimPairs(const std::string& out) {
  const size_t at = out.find("\"nvlink_pairs\":\"", out.find("SIM {"));
  if (at == std::string::npos) return "?";
  const size_t from = at + 16;
  return out.substr(from, out.find('"', from) - from);
}

// Link-rate flags feed the planner and the simulator; --nccl-net keeps only
// the same-node pairs direct writes may take on NVLink.
TEST(WsyncctlTest, LinkRateFlagsAndForcedNetworkSimulation) {
  // gpus-per-node 1: the trainer on node0, the inference rank on node1; one
  // destination, so no relay: every byte crosses the NIC, whatever its rate.
  const std::string across =
      "plan --model tiny-llama --source fsdp:1 --destination vllm-tp:1 --gpus-per-node 1 "
      "--nvlink-gbps 100 --round-latency-us 0 --sim-json";
  Result one = CtlStdout(across + " --nic-gbps 1");
  Result two = CtlStdout(across + " --nic-gbps 2");
  ASSERT_EQ(one.code, 0) << one.out;
  ASSERT_EQ(two.code, 0) << two.out;
  const double t1 = SimField(one.out, "makespan_s"), t2 = SimField(two.out, "makespan_s");
  ASSERT_GT(t2, 0) << two.out;
  EXPECT_NEAR(t1 / t2, 2.0, 1e-6) << one.out << two.out;
  EXPECT_NE(one.out.find("\"nccl_net\":false"), std::string::npos) << one.out;
  EXPECT_EQ(SimPairs(one.out), "");

  // One node: without --nccl-net every transfer is NVLink; with it, only the
  // plan's direct-write pairs are, so the simulated time cannot drop.
  const std::string one_node =
      "plan --model tiny-llama --source fsdp:1 --destination vllm-tp:1x2 --nvlink-gbps 100 "
      "--nic-gbps 1 --sim-json";
  Result nvlink = CtlStdout(one_node);
  Result forced = CtlStdout(one_node + " --nccl-net");
  ASSERT_EQ(forced.code, 0) << forced.out;
  EXPECT_NE(forced.out.find("\"nccl_net\":true"), std::string::npos) << forced.out;
  // The routing bound assumes NVLink within a node: not compared under --nccl-net.
  EXPECT_NE(forced.out.find("no routing bound under --nccl-net"), std::string::npos) << forced.out;
  EXPECT_EQ(forced.out.find("x the routing bound"), std::string::npos) << forced.out;
  EXPECT_GE(SimField(forced.out, "makespan_s"), SimField(nvlink.out, "makespan_s"));
  const std::string pairs = SimPairs(forced.out);
  EXPECT_NE(pairs, "?") << forced.out;
  if (pairs == "0->1,0->2") {
    EXPECT_DOUBLE_EQ(SimField(forced.out, "makespan_s"), SimField(nvlink.out, "makespan_s"));
  } else {
    EXPECT_GT(SimField(forced.out, "makespan_s"), SimField(nvlink.out, "makespan_s"));
  }

  // --sim-rates-only: the plan the spec's own rates give (same key), simulated
  // at the flags' rates.
  const std::string relays =
      "plan --model tiny-llama --source fsdp:2 --destination vllm-tp:2x2 --gpus-per-node 2 "
      "--sim-json";
  Result spec_rates = CtlStdout(relays);
  Result sim_only = CtlStdout(relays + " --nic-gbps 1 --sim-rates-only");
  ASSERT_EQ(sim_only.code, 0) << sim_only.out;
  auto key = [](const std::string& out) { return out.substr(0, out.find('\n')); };
  EXPECT_EQ(key(sim_only.out), key(spec_rates.out));
  EXPECT_GT(SimField(sim_only.out, "makespan_s"), 3 * SimField(spec_rates.out, "makespan_s"));
  EXPECT_NE(key(CtlStdout(relays + " --nic-gbps 1").out), key(spec_rates.out));

  for (const char* bad : {"--copy-gbps 0", "--copy-gbps x", "--round-latency-us -1",
                          "--step-latency-us -1", "--step-latency-us x"}) {
    Result r = Ctl(absl::StrCat(one_node, " ", bad));
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(std::string(bad).substr(0, std::string(bad).find(' '))), std::string::npos)
        << r.out;
  }
}

// --json keeps stdout for the plan and honours the simulator flags as the
// text output does: the same simulator lines (summary line, SIM, rounds),
// on stderr.
TEST(WsyncctlTest, JsonPlanHonoursTheSimulatorFlags) {
  const std::string relays =
      "plan --model tiny-llama --source fsdp:2 --destination vllm-tp:2x2 --gpus-per-node 2";
  const std::string sim_flags = " --nic-gbps 1 --sim-rates-only --nccl-net --sim-json --rounds";
  auto line = [](const std::string& out, const std::string& prefix) {
    const size_t at = out.find(prefix);
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  Result text = CtlStdout(relays + sim_flags);
  Result json = CtlStdout(relays + " --json" + sim_flags);
  Result json_sim = CtlStderr(relays + " --json" + sim_flags);
  ASSERT_EQ(text.code, 0) << text.out;
  ASSERT_EQ(json.code, 0) << json.out;
  ASSERT_EQ(json_sim.code, 0) << json_sim.out;
  // --sim-rates-only: the plan is the spec's own, whatever the rates (all
  // but its planning time).
  auto untimed = [](std::string out) {
    const size_t at = out.find("\"planSeconds\":");
    if (at != std::string::npos) out.erase(at, out.find(',', at) - at);
    return out;
  };
  EXPECT_TRUE(untimed(json.out) == untimed(CtlStdout(relays + " --json").out));
  EXPECT_EQ(json.out.find("SIM {"), std::string::npos) << "stdout is the plan alone";
  const std::string sim = line(text.out, "SIM {");
  ASSERT_FALSE(sim.empty()) << text.out;
  EXPECT_NE(sim.find("\"nccl_net\":true"), std::string::npos) << sim;
  EXPECT_EQ(line(json_sim.out, "SIM {"), sim) << json_sim.out;
  EXPECT_EQ(line(json_sim.out, "  simulator "), line(text.out, "  simulator ")) << json_sim.out;
  EXPECT_EQ(line(json_sim.out, "    round    0 "), line(text.out, "    round    0 "));
  EXPECT_FALSE(line(json_sim.out, "    round    0 ").empty()) << json_sim.out;
  // The rates reach the simulator: a slower NIC, a longer makespan.
  EXPECT_GT(SimField(json_sim.out, "makespan_s"),
            SimField(CtlStderr(relays + " --json --sim-json").out, "makespan_s"));
  // Without a simulator flag --json runs no simulation and says nothing of it.
  Result plain = CtlStderr(relays + " --json");
  EXPECT_EQ(plain.out.find("simulator"), std::string::npos) << plain.out;
}

}  // namespace
}  // namespace wsync::tools
