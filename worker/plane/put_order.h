// Ordering of the puts one writer issues to several peers in one call.
//
// A writer's engines (copy-engine streams, a kernel's blocks claiming tasks
// front to back) work on a window of neighbouring entries of its list. A
// list grouped by peer (as plans emit buckets) sends to one peer at a time,
// and writers that all start with the same peer meet at its ingress while
// the other peers' links idle. `InterleaveByPeer` orders the entries so that,
// read front to back, every peer's share advances at the same rate, and
// rotates ties by `first_peer` so that writers of different ranks start on
// different peers. `SplitForInterleave` cuts large entries first, so that
// the window mixes peers at a finer grain than whole tensors.
#ifndef WSYNC_WORKER_PLANE_PUT_ORDER_H_
#define WSYNC_WORKER_PLANE_PUT_ORDER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace wsync::plane {

// One entry of a put list: the peer it writes to (any int; equal ints are
// one peer) and its bytes (>= 0).
struct PutShare {
  int peer = 0;
  int64_t bytes = 0;
};

// A permutation of [0, shares.size()): entries ordered by the midpoint of
// their byte range within their peer's total (an entry of peer p covering
// bytes [c, c + b) of T_p sorts at (c + b/2) / T_p, compared exactly); ties
// by the peer's distance above `first_peer` in the cyclic order of the peers
// present, then by index. Entries of one peer keep their relative order.
// With one peer (or none) it is the identity.
std::vector<size_t> InterleaveByPeer(absl::Span<const PutShare> shares, int first_peer);

// The number of parts of at most `max_part_bytes` (> 0) that `bytes` is cut
// into, at least 1, and a part's size in units of `unit` (> 0; rows, or
// bytes of a 1-D copy): parts are whole units, each at most max(unit,
// max_part_bytes) rounded down to a unit, the last one the remainder.
struct PartCut {
  int64_t parts = 1;
  int64_t units_per_part = 0;  // of `units` in all
};
PartCut CutIntoParts(int64_t units, int64_t unit_bytes, int64_t max_part_bytes);

}  // namespace wsync::plane

#endif  // WSYNC_WORKER_PLANE_PUT_ORDER_H_
