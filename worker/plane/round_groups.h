// How a transport that issues a round as several groups (NCCL) cuts it:
// the round's requests by step (Transport::RunRound "Steps"), each step's
// (peer, direction) lists cut into landing parts (RoundHooks), the groups in
// (step, part) order. Both sides of a pair give each request the same
// (step, landing-part index) (the absolute group index differs from rank to
// rank): a pair's list in a step holds the same requests on both sides, so
// both cut it alike, and a rank without steps cuts as it always did.
#ifndef WSYNC_WORKER_PLANE_ROUND_GROUPS_H_
#define WSYNC_WORKER_PLANE_ROUND_GROUPS_H_

#include <vector>

#include "worker/plane/transport.h"

namespace wsync::transport {

// One group of a round: what one ncclGroupStart/End posts.
struct RoundGroup {
  std::vector<const SendRequest*> sends;
  std::vector<const RecvRequest*> recvs;
};

// `sends` and `recvs` each in (peer, tag) order, steps within
// [0, kMaxBucketSteps) (ValidateRoundRequests); the pointers stay theirs.
// Steps without requests make no group.
std::vector<RoundGroup> CutRoundIntoGroups(const std::vector<const SendRequest*>& sends,
                                           const std::vector<const RecvRequest*>& recvs,
                                           const RoundHooks& hooks);

}  // namespace wsync::transport

#endif  // WSYNC_WORKER_PLANE_ROUND_GROUPS_H_
