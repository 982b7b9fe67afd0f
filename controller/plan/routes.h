// Routes: how each network bucket of a plan travels in one sync, decided
// once, here. A bucket goes ROUTE_TRANSPORT (pack -> send -> unpack) unless
// its sender may write the receiver's destinations itself (mapped shm / CUDA
// IPC): then ROUTE_PEER_WRITE. Three inputs decide it:
//  - the plan: which (sender, receiver) pairs are eligible at all
//    (PeerWriteEligiblePairs, a property of the plan, computed once per key);
//  - the workers: which pairs can connect by memory (CanPeerWrite: the same
//    non-empty memory domain and, over NCCL, the receiver's GPU among the
//    sender's peer GPUs), as NCCL decides P2P from topology;
//  - the controller's switch and each worker's "unavailable" report.
// RoutePart then marks one worker's part of the plan; the worker binds what
// its part says.
#ifndef WSYNC_CONTROLLER_PLAN_ROUTES_H_
#define WSYNC_CONTROLLER_PLAN_ROUTES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan {

// (sender, receiver) worker ids.
using WorkerPair = std::pair<int32_t, int32_t>;

// True when the piece is a plain copy src -> dst: no partial sum (reduce_id),
// no receiver- or sender-side quantization (quantize_id, quant_block,
// scales_of), not a relay, and a wire dtype equal to src's or dst's (one
// conversion; the worker's binder refuses anything else).
bool IsPlainPiece(const v1::Piece& piece);

// The pairs, sorted, with sender != receiver and at least one
// TRANSPORT_NETWORK bucket sender -> receiver, such that
//  - every piece of every bucket sender -> receiver is plain, and
//  - the receiver sends no relay piece anywhere in the plan: a relay reads
//    the receiver's destinations, and a direct write fills them with no
//    ordering against the receiver's rounds.
// One pass over the buckets; meant to be computed once per plan and cached.
std::vector<WorkerPair> PeerWriteEligiblePairs(const v1::Plan& plan);

// What the route stage knows of one worker of a sync.
struct RouteEndpoint {
  std::string domain;  // RegisterWorkerRequest.direct_write_domain
  // RegisterWorkerRequest.node (its --node). Direct writes stay inside one
  // node: two "nodes" emulated on one host share a memory domain, but their
  // traffic must take the network path a real pair of nodes would.
  std::string node;
  std::string device_uuid;             // its GPU (NCCL only)
  std::vector<std::string> peer_gpus;  // GPUs its device can write (NCCL only)
  bool unavailable = false;            // it reported it cannot map its peers
  // Some of its buffers report no location a peer could map (CUDA virtual
  // memory, registered from the owner's descriptors): it is never written
  // directly.
  bool unmappable_buffers = false;
};

// Whether `sender` can write `receiver`'s memory over `transport`: both on
// one node (equal names) and in one non-empty domain, the sender able to map
// peers, the receiver's buffers all mappable, and over NCCL the receiver's
// GPU among the sender's peer GPUs.
bool CanPeerWrite(const RouteEndpoint& sender, const RouteEndpoint& receiver,
                  v1::TransportKind transport);

// The pairs of `eligible` (sorted) whose endpoints (indexed by worker id)
// can peer-write; the result stays sorted. Pairs naming a worker outside
// `endpoints` are dropped.
std::vector<WorkerPair> ChoosePeerWrites(const std::vector<WorkerPair>& eligible,
                                         const std::vector<RouteEndpoint>& endpoints,
                                         v1::TransportKind transport);

// One worker's routes in a sync: the peers it writes and is written by
// (sorted worker ids), from the sync's peer-write pairs.
struct WorkerRoutes {
  std::vector<int32_t> write_to;
  std::vector<int32_t> written_by;
  bool empty() const { return write_to.empty() && written_by.empty(); }
  // "" when empty, else e.g. "pw:to=2,3;by=1": tells routed parts apart.
  std::string Signature() const;
};
WorkerRoutes RoutesOf(const std::vector<WorkerPair>& pairs, int32_t worker);

// Marks ROUTE_PEER_WRITE every network bucket of `plan` whose (sender,
// receiver) is in `pairs` (sorted) and ROUTE_TRANSPORT every other one. A
// peer-write bucket gets its put phase from `phase_of_bucket` (indexed by
// bucket id, put_phases.h; 0 where it is empty or short), any other 0.
void MarkPeerWrites(const std::vector<WorkerPair>& pairs, v1::Plan* plan,
                    absl::Span<const int32_t> phase_of_bucket = {});

// `part` (worker `worker`'s part of a plan) with its routes and put phases
// marked: `part` itself when `routes` is empty, else a marked copy.
std::shared_ptr<const v1::Plan> RoutePart(const std::shared_ptr<const v1::Plan>& part,
                                          int32_t worker, const WorkerRoutes& routes,
                                          absl::Span<const int32_t> phase_of_bucket = {});

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_ROUTES_H_
