// ResolveLaunch: wsync-worker's memberships and device from a launcher's
// environment (torchrun, Kubernetes Indexed Jobs and StatefulSets), explicit
// flags first, and errors that name what was read.
#include "worker/agent/launch_env.h"

#include <string>

#include "gtest/gtest.h"

namespace wsync::agent {
namespace {

LaunchFlags Groups(const std::string& groups) {
  LaunchFlags f;
  f.groups = groups;
  return f;
}

std::string Memberships(const LaunchSettings& s) {
  std::string out;
  for (const auto& m : s.memberships) {
    out += m.group() + ":" + std::to_string(m.rank()) + ":" + std::to_string(m.group_size()) + ";";
  }
  return out;
}

// The error of ResolveLaunch, which must fail.
std::string Error(const LaunchFlags& flags, const EnvMap& env) {
  auto s = ResolveLaunch(flags, env);
  EXPECT_FALSE(s.ok()) << "resolved " << Memberships(*s);
  if (s.ok()) return "";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.status().message());
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LaunchEnvTest, ExplicitMembershipsNeedNoEnvironment) {
  auto s = ResolveLaunch(Groups("trainer:1:4,inference:1:2"), {{"HOSTNAME", "x-9"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Memberships(*s), "trainer:1:4;inference:1:2;");
  EXPECT_EQ(s->device, -1);
  EXPECT_TRUE(Has(s->sources[0], "rank 1 from --groups")) << s->sources[0];
}

TEST(LaunchEnvTest, TorchrunRankAndWorldSize) {
  auto s = ResolveLaunch(Groups("trainer"), {{"RANK", "3"}, {"WORLD_SIZE", "8"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Memberships(*s), "trainer:3:8;");
  EXPECT_EQ(s->sources[0], "group 'trainer': rank 3 from RANK=3, size 8 from WORLD_SIZE=8");
}

TEST(LaunchEnvTest, WsyncGroupWithColocatedSizes) {
  // WSYNC_GROUP names the groups; a ':size' suffix beats WORLD_SIZE.
  auto s = ResolveLaunch(
      LaunchFlags(), {{"WSYNC_GROUP", "trainer,inference:4"}, {"RANK", "2"}, {"WORLD_SIZE", "8"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Memberships(*s), "trainer:2:8;inference:2:4;");
  EXPECT_TRUE(Has(s->sources[1], "size 4 from WSYNC_GROUP")) << s->sources[1];
}

TEST(LaunchEnvTest, IndexedJobAndStatefulSetOrdinals) {
  auto job = ResolveLaunch(Groups("inference"),
                           {{"JOB_COMPLETION_INDEX", "1"}, {"WSYNC_GROUP_SIZE", "2"}});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(Memberships(*job), "inference:1:2;");
  const std::pair<const std::string, std::string> kPod = {"KUBERNETES_SERVICE_HOST", "10.0.0.1"};
  auto sts =
      ResolveLaunch(Groups("inference"), {{"HOSTNAME", "vllm-3"}, {"WSYNC_GROUP_SIZE", "4"}, kPod});
  ASSERT_TRUE(sts.ok()) << sts.status();
  EXPECT_EQ(Memberships(*sts), "inference:3:4;");
  EXPECT_TRUE(Has(sts->sources[0], "rank 3 from HOSTNAME=vllm-3")) << sts->sources[0];
  // POD_NAME (downward API) is read before HOSTNAME; RANK before both.
  auto pod =
      ResolveLaunch(Groups("inference:4"), {{"POD_NAME", "vllm-2"}, {"HOSTNAME", "vllm-3"}, kPod});
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(Memberships(*pod), "inference:2:4;");
  auto rank = ResolveLaunch(Groups("inference:4"), {{"RANK", "0"}, {"HOSTNAME", "vllm-3"}, kPod});
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(Memberships(*rank), "inference:0:4;");
  // Review finding: outside a pod, a host named "gpu-node-3" is no rank 3.
  const std::string e = Error(Groups("inference:4"), {{"HOSTNAME", "gpu-node-3"}});
  EXPECT_TRUE(Has(e, "HOSTNAME='gpu-node-3' (not in a Kubernetes pod)")) << e;
}

TEST(LaunchEnvTest, NameOrdinal) {
  EXPECT_EQ(NameOrdinal("vllm-3"), 3);
  EXPECT_EQ(NameOrdinal("my-set-12"), 12);
  EXPECT_EQ(NameOrdinal("vllm-"), -1);
  EXPECT_EQ(NameOrdinal("vllm3"), -1);
  EXPECT_EQ(NameOrdinal("vllm-7d9f8-x2k4p"), -1);
  EXPECT_EQ(NameOrdinal(""), -1);
  EXPECT_EQ(NameOrdinal("a-12345678901"), -1);  // not an ordinal: too long
}

TEST(LaunchEnvTest, DeviceFromLocalRankOnlyWithCuda) {
  LaunchFlags f = Groups("trainer:0:1");
  f.cuda_built = true;
  auto s = ResolveLaunch(f, {{"LOCAL_RANK", "1"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->device, 1);
  EXPECT_EQ(s->sources.back(), "device 1 from LOCAL_RANK=1");
  // An explicit --device (or WSYNC_DEVICE) wins, -1 included.
  f.device_given = true;
  f.device = -1;
  s = ResolveLaunch(f, {{"LOCAL_RANK", "1"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->device, -1);
  // A host-only build keeps host memory and says why.
  s = ResolveLaunch(Groups("trainer:0:1"), {{"LOCAL_RANK", "1"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->device, -1);
  EXPECT_TRUE(Has(s->sources.back(), "LOCAL_RANK=1 not used")) << s->sources.back();
  f.device_given = false;
  EXPECT_TRUE(Has(Error(f, {{"LOCAL_RANK", "-1"}}), "LOCAL_RANK=-1 is not a CUDA device"));
  EXPECT_TRUE(Has(Error(f, {{"LOCAL_RANK", "gpu0"}}), "LOCAL_RANK='gpu0' is not an integer"));
}

TEST(LaunchEnvTest, NoRankIsAnErrorNamingWhatWasRead) {
  const std::string e =
      Error(Groups("trainer"),
            {{"WORLD_SIZE", "2"}, {"HOSTNAME", "devbox"}, {"KUBERNETES_SERVICE_HOST", "10.0.0.1"}});
  EXPECT_TRUE(Has(e, "no rank for group 'trainer'")) << e;
  EXPECT_TRUE(Has(e, "RANK (unset)")) << e;
  EXPECT_TRUE(Has(e, "JOB_COMPLETION_INDEX (unset)")) << e;
  EXPECT_TRUE(Has(e, "HOSTNAME='devbox' (no '-<ordinal>' ending)")) << e;
}

TEST(LaunchEnvTest, NoSizeIsAnError) {
  const std::string e = Error(Groups("trainer"), {{"RANK", "0"}});
  EXPECT_TRUE(Has(e, "no size for group 'trainer'")) << e;
  EXPECT_TRUE(Has(e, "WSYNC_GROUP_SIZE (unset), WORLD_SIZE (unset)")) << e;
}

TEST(LaunchEnvTest, ConflictingEnvironmentIsAnError) {
  std::string e =
      Error(Groups("t"), {{"RANK", "3"}, {"JOB_COMPLETION_INDEX", "2"}, {"WORLD_SIZE", "8"}});
  EXPECT_TRUE(Has(e, "conflicting ranks in the environment: RANK=3 but JOB_COMPLETION_INDEX=2"))
      << e;
  e = Error(Groups("t"), {{"RANK", "1"}, {"WSYNC_GROUP_SIZE", "2"}, {"WORLD_SIZE", "8"}});
  EXPECT_TRUE(Has(e, "WSYNC_GROUP_SIZE=2 but WORLD_SIZE=8")) << e;
  e = Error(Groups("t"), {{"WSYNC_GROUPS", "t:0:1"}, {"WSYNC_GROUP", "t"}});
  EXPECT_TRUE(Has(e, "both WSYNC_GROUPS='t:0:1' and WSYNC_GROUP='t' are set")) << e;
  // Agreeing sources are fine.
  auto s = ResolveLaunch(Groups("t"),
                         {{"RANK", "2"}, {"JOB_COMPLETION_INDEX", "2"}, {"WORLD_SIZE", "4"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Memberships(*s), "t:2:4;");
}

TEST(LaunchEnvTest, CommandLineBeatsWsyncGroup) {
  auto s = ResolveLaunch(Groups("a:0:1"), {{"WSYNC_GROUP", "b"}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Memberships(*s), "a:0:1;");
  EXPECT_TRUE(Has(s->sources[0], "WSYNC_GROUP='b' not used")) << s->sources[0];
}

TEST(LaunchEnvTest, BadValuesAreErrors) {
  EXPECT_TRUE(Has(Error(LaunchFlags(), {}), "no groups"));
  EXPECT_TRUE(
      Has(Error(Groups("t"), {{"RANK", "x"}, {"WORLD_SIZE", "2"}}), "RANK='x' is not an integer"));
  EXPECT_TRUE(Has(Error(Groups("t"), {{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
                  "rank 2 (from RANK=2) is outside [0, 2) (size from WORLD_SIZE=2)"));
  EXPECT_TRUE(Has(Error(Groups("t"), {{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), "rank -1"));
  EXPECT_TRUE(Has(Error(Groups("t"), {{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "size 0"));
  EXPECT_TRUE(Has(Error(Groups("t:1:2:3"), {}), "bad membership 't:1:2:3' in --groups"));
  EXPECT_TRUE(Has(Error(Groups(":0:1"), {}), "bad membership"));
  EXPECT_TRUE(Has(Error(Groups("t:x:2"), {}), "bad membership 't:x:2'"));
  EXPECT_TRUE(Has(Error(Groups(","), {}), "names no group"));
}

}  // namespace
}  // namespace wsync::agent
