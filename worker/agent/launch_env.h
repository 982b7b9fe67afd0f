// Where wsync-worker's memberships and device come from when a launcher
// starts it: pure functions over a map of environment variables, so a
// Kubernetes sidecar or a torchrun-launched process needs no per-pod flags.
//
// Contract (docs/flags-and-metrics.md, "wsync-worker from a launcher's environment"):
//  * Groups: --groups / WSYNC_GROUPS, else WSYNC_GROUP (both set: error).
//    Each comma-separated item is `group:rank:size` (explicit, nothing read
//    from the environment), `group:size` or `group` (rank, and size for the
//    last form, from the environment).
//  * Rank, first set of: RANK (torchrun, PyTorch's Kubernetes operator),
//    WSYNC_RANK, JOB_COMPLETION_INDEX (Kubernetes Indexed Job), the ordinal
//    ending POD_NAME, then HOSTNAME (StatefulSet pod `vllm-3`: rank 3). Two
//    of the first three set to different values is an error; the host-name
//    ordinal is read only when none of them is set.
//  * Size of a group without `:size`: WSYNC_GROUP_SIZE, else WORLD_SIZE (both
//    set and different: error).
//  * Device: --device / WSYNC_DEVICE when given; else LOCAL_RANK where the
//    build has the CUDA backend; else -1 (host memory).
// A value that is not an integer, a negative rank, a size < 1 or a rank
// outside its group is an error naming the variables read and their values;
// nothing defaults to rank 0.
#ifndef WSYNC_WORKER_AGENT_LAUNCH_ENV_H_
#define WSYNC_WORKER_AGENT_LAUNCH_ENV_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::agent {

using EnvMap = std::map<std::string, std::string>;

// The flags that may be completed from the environment.
struct LaunchFlags {
  std::string groups;         // --groups or WSYNC_GROUPS; "" when absent
  int32_t device = -1;        // --device or WSYNC_DEVICE
  bool device_given = false;  // --device on the command line or WSYNC_DEVICE set
  bool cuda_built = false;    // this build has the CUDA backend
};

struct LaunchSettings {
  std::vector<v1::Membership> memberships;
  int32_t device = -1;
  // One line per resolved value saying where it came from, for the startup
  // log ("group 'trainer': rank 3 from RANK=3, size 8 from WORLD_SIZE=8").
  std::vector<std::string> sources;
};

// Memberships and device from `flags`, completed from `env`.
// InvalidArgument names the flag or variables read and their values.
absl::StatusOr<LaunchSettings> ResolveLaunch(const LaunchFlags& flags, const EnvMap& env);

// The ordinal ending a Kubernetes pod or host name ("vllm-3" -> 3), or -1
// when the name does not end in "-<digits>".
int64_t NameOrdinal(const std::string& name);

// This process's environment.
EnvMap ProcessEnvironment();

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LAUNCH_ENV_H_
