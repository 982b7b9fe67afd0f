// The controller and the workers agree on this to send each direct-write
// peer's buffer list once (SyncAssignment.peer_buffers, PeerBuffers.unchanged).
#ifndef WSYNC_COMMON_PEER_LISTS_H_
#define WSYNC_COMMON_PEER_LISTS_H_

namespace wsync {

// A worker that registers with this capability understands PeerBuffers
// entries marked `unchanged`; others always get whole lists.
inline constexpr char kPeerListsOnceCapability[] = "peer_lists_once";

// A worker keeps the peer mappings of this many transfers (the ones whose
// latest assignments listed peers, most recent first) and unmaps older ones,
// so a transfer that is never synced again does not hold its peers' memory;
// the controller keeps its record of sent lists the same way.
inline constexpr int kPeerListTransfers = 4;

}  // namespace wsync

#endif  // WSYNC_COMMON_PEER_LISTS_H_
