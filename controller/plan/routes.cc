#include "controller/plan/routes.h"

#include <algorithm>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wsync::plan {

bool IsPlainPiece(const v1::Piece& piece) {
  // The writer converts src -> dst in one step (worker/exec/bound_plan.cc
  // BindPut), which is the plan's src -> wire -> dst only when the wire dtype
  // is one of the two.
  const bool one_conversion =
      piece.wire_dtype() == piece.src().dtype() || piece.wire_dtype() == piece.dst().dtype();
  return piece.reduce_id() == 0 && piece.quantize_id() == 0 && !piece.relay() &&
         piece.quant_block_size() == 0 && piece.scales_of() == 0 && one_conversion;
}

std::vector<WorkerPair> PeerWriteEligiblePairs(const v1::Plan& plan) {
  absl::flat_hash_map<WorkerPair, bool> plain;  // pair -> all its pieces so far are plain
  absl::flat_hash_set<int32_t> relayers;        // workers that send a relay piece
  for (const v1::Bucket& b : plan.buckets()) {
    bool all_plain = true;
    bool relays = false;
    for (const v1::Piece& p : b.pieces()) {
      all_plain = all_plain && IsPlainPiece(p);
      relays = relays || p.relay();
    }
    for (const v1::PieceRun& r : b.runs()) {  // members differ in names and offsets only
      all_plain = all_plain && IsPlainPiece(r.first());
      relays = relays || r.first().relay();
    }
    // Relays are counted in every bucket, local ones included: any relay
    // reads the sender's destinations.
    if (relays) relayers.insert(b.sender());
    if (b.transport() != v1::TRANSPORT_NETWORK || b.sender() == b.receiver()) continue;
    auto [it, inserted] = plain.try_emplace(WorkerPair(b.sender(), b.receiver()), all_plain);
    if (!inserted) it->second = it->second && all_plain;
  }
  std::vector<WorkerPair> pairs;
  for (const auto& [pair, ok] : plain) {
    if (ok && !relayers.contains(pair.second)) pairs.push_back(pair);
  }
  std::sort(pairs.begin(), pairs.end());
  return pairs;
}

bool CanPeerWrite(const RouteEndpoint& sender, const RouteEndpoint& receiver,
                  v1::TransportKind transport) {
  if (sender.unavailable || receiver.unmappable_buffers) return false;
  if (sender.domain.empty() || sender.domain != receiver.domain) return false;
  if (sender.node != receiver.node) return false;
  if (transport == v1::TRANSPORT_NCCL) {
    // The sender's device writes the receiver's GPU memory over peer access.
    const std::string& gpu = receiver.device_uuid;
    if (gpu.empty() || !absl::c_linear_search(sender.peer_gpus, gpu)) return false;
  }
  return true;
}

std::vector<WorkerPair> ChoosePeerWrites(const std::vector<WorkerPair>& eligible,
                                         const std::vector<RouteEndpoint>& endpoints,
                                         v1::TransportKind transport) {
  const int32_t n = static_cast<int32_t>(endpoints.size());
  auto known = [n](int32_t w) { return w >= 0 && w < n; };
  std::vector<WorkerPair> chosen;
  for (const WorkerPair& pair : eligible) {
    if (!known(pair.first) || !known(pair.second)) continue;
    if (CanPeerWrite(endpoints[pair.first], endpoints[pair.second], transport)) {
      chosen.push_back(pair);
    }
  }
  return chosen;
}

std::string WorkerRoutes::Signature() const {
  if (empty()) return "";
  return absl::StrCat("pw:to=", absl::StrJoin(write_to, ","),
                      ";by=", absl::StrJoin(written_by, ","));
}

WorkerRoutes RoutesOf(const std::vector<WorkerPair>& pairs, int32_t worker) {
  WorkerRoutes r;
  // `pairs` is sorted by (sender, receiver): write_to comes out sorted.
  for (const WorkerPair& pair : pairs) {
    if (pair.first == worker) r.write_to.push_back(pair.second);
    if (pair.second == worker) r.written_by.push_back(pair.first);
  }
  std::sort(r.written_by.begin(), r.written_by.end());
  return r;
}

void MarkPeerWrites(const std::vector<WorkerPair>& pairs, v1::Plan* plan,
                    absl::Span<const int32_t> phase_of_bucket) {
  for (v1::Bucket& b : *plan->mutable_buckets()) {
    const bool peer_write =
        b.transport() == v1::TRANSPORT_NETWORK &&
        std::binary_search(pairs.begin(), pairs.end(), WorkerPair(b.sender(), b.receiver()));
    b.set_route(peer_write ? v1::ROUTE_PEER_WRITE : v1::ROUTE_TRANSPORT);
    const bool known = b.id() >= 0 && static_cast<size_t>(b.id()) < phase_of_bucket.size();
    b.set_put_phase(peer_write && known ? phase_of_bucket[static_cast<size_t>(b.id())] : 0);
  }
}

std::shared_ptr<const v1::Plan> RoutePart(const std::shared_ptr<const v1::Plan>& part,
                                          int32_t worker, const WorkerRoutes& routes,
                                          absl::Span<const int32_t> phase_of_bucket) {
  if (routes.empty()) return part;
  std::vector<WorkerPair> pairs;
  for (int32_t peer : routes.write_to) pairs.emplace_back(worker, peer);
  for (int32_t peer : routes.written_by) pairs.emplace_back(peer, worker);
  std::sort(pairs.begin(), pairs.end());
  auto routed = std::make_shared<v1::Plan>(*part);
  MarkPeerWrites(pairs, routed.get(), phase_of_bucket);
  return routed;
}

}  // namespace wsync::plan
