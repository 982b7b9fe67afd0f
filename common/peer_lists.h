// The controller and the workers agree on this to send each direct-write
// peer's buffer list once (SyncAssignment.peer_buffers, PeerBuffers.unchanged).
#ifndef WSYNC_COMMON_PEER_LISTS_H_
#define WSYNC_COMMON_PEER_LISTS_H_

#include <list>
#include <string>
#include <vector>

namespace wsync {

// A worker that registers with this capability understands PeerBuffers
// entries marked `unchanged`; others always get whole lists.
inline constexpr char kPeerListsOnceCapability[] = "peer_lists_once";

// A worker keeps the peer mappings of this many transfers (the ones whose
// latest assignments listed peers, most recent first) and unmaps older ones,
// so a transfer that is never synced again does not hold its peers' memory;
// the controller keeps its record of sent lists the same way.
inline constexpr int kPeerListTransfers = 4;

// Makes `transfer` the most recent of `order` (most recent first) and
// returns the transfers that fall beyond kPeerListTransfers, oldest last.
// Both sides call this, so they keep the same transfers.
inline std::vector<std::string> MakeMostRecent(std::list<std::string>& order,
                                               const std::string& transfer) {
  order.remove(transfer);
  order.push_front(transfer);
  std::vector<std::string> dropped;
  while (order.size() > static_cast<size_t>(kPeerListTransfers)) {
    dropped.push_back(std::move(order.back()));
    order.pop_back();
  }
  return dropped;
}

}  // namespace wsync

#endif  // WSYNC_COMMON_PEER_LISTS_H_
