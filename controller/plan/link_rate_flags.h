// The link-rate flags of the tools that hand a spec to the planner and the
// simulator (wsyncctl plan's --nvlink-gbps / --nic-gbps / --copy-gbps /
// --round-latency-us / --step-latency-us, wsync-demo's --nvlink_gbps / --nic_gbps / --copy_gbps):
// one check and one conversion into the spec's options.link_model.
#ifndef WSYNC_CONTROLLER_PLAN_LINK_RATE_FLAGS_H_
#define WSYNC_CONTROLLER_PLAN_LINK_RATE_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::plan {

enum class LinkField {
  kNvlink,        // GB/s (1e9 B/s) between two GPUs of a node
  kNic,           // GB/s across nodes
  kCopy,          // GB/s of a local copy within a worker
  kRoundLatency,  // microseconds, the fixed cost of each round barrier
  kStepLatency,   // microseconds, the fixed cost of one more step in a round
};

// The largest value a link flag takes (GB/s or microseconds).
inline constexpr double kMaxLinkFlagValue = 1e12;  // the errors say "1e12"

struct LinkRateFlag {
  LinkField field;
  std::string flag;  // as the user names it ("--nic-gbps"), for errors
  double value = 0;
};

// Sets the link_model field of each flag in `spec` (GB/s to B/s,
// microseconds to seconds); fields without a flag keep their value. A rate
// must be > 0 and a latency >= 0, each at most kMaxLinkFlagValue (NaN is
// refused): the error names the flag and its value, and `spec` is left
// unchanged.
absl::Status ApplyLinkRateFlags(absl::Span<const LinkRateFlag> flags, v1::TransferSpec* spec);
// The same on the options alone (a spec's options.link_model).
absl::Status ApplyLinkRateFlags(absl::Span<const LinkRateFlag> flags, v1::PlanOptions* options);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_LINK_RATE_FLAGS_H_
