#include "worker/plane/round_groups.h"

#include <cstdint>
#include <utility>

namespace wsync::transport {
namespace {

// Cuts each (peer, direction) list of `reqs` (in (peer, tag) order) into its
// landing parts and appends part k to parts[k].
template <typename Req>
void CutIntoParts(const std::vector<const Req*>& reqs, const RoundHooks& hooks,
                  std::vector<RoundGroup>& parts, std::vector<const Req*> RoundGroup::*side) {
  for (size_t b = 0; b < reqs.size();) {
    size_t e = b;
    int64_t total = 0;
    for (; e < reqs.size() && reqs[e]->peer == reqs[b]->peer; ++e) {
      total += static_cast<int64_t>(reqs[e]->bytes);
    }
    const int32_t count =
        LandingPartCount(total, hooks.max_landing_parts, hooks.min_landing_part_bytes);
    if (parts.size() < static_cast<size_t>(count)) parts.resize(count);
    int64_t offset = 0;
    for (size_t i = b; i < e; ++i) {
      (parts[LandingPartOf(offset, total, count)].*side).push_back(reqs[i]);
      offset += static_cast<int64_t>(reqs[i]->bytes);
    }
    b = e;
  }
}

// by_step[s]: step s's requests, each side in the given order.
std::vector<RoundGroup> SplitBySteps(const std::vector<const SendRequest*>& sends,
                                     const std::vector<const RecvRequest*>& recvs) {
  std::vector<RoundGroup> by_step;
  auto slot = [&by_step](int32_t step) -> RoundGroup& {
    if (by_step.size() <= static_cast<size_t>(step)) by_step.resize(step + 1);
    return by_step[step];
  };
  for (const SendRequest* x : sends) slot(x->step).sends.push_back(x);
  for (const RecvRequest* x : recvs) slot(x->step).recvs.push_back(x);
  return by_step;
}

}  // namespace

std::vector<RoundGroup> CutRoundIntoGroups(const std::vector<const SendRequest*>& sends,
                                           const std::vector<const RecvRequest*>& recvs,
                                           const RoundHooks& hooks) {
  std::vector<RoundGroup> groups;
  for (const RoundGroup& step : SplitBySteps(sends, recvs)) {
    std::vector<RoundGroup> parts;
    CutIntoParts(step.sends, hooks, parts, &RoundGroup::sends);
    CutIntoParts(step.recvs, hooks, parts, &RoundGroup::recvs);
    for (RoundGroup& part : parts) groups.push_back(std::move(part));
  }
  return groups;
}

}  // namespace wsync::transport
