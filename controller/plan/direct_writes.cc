#include "controller/plan/direct_writes.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace wsync::plan {

bool IsPlainPiece(const v1::Piece& piece) {
  // The writer converts src -> dst in one step (worker/exec/bound_plan.cc
  // BindPut), which is the plan's src -> wire -> dst only when the wire dtype
  // is one of the two.
  const bool one_conversion = piece.wire_dtype() == piece.src().dtype() ||
                              piece.wire_dtype() == piece.dst().dtype();
  return piece.reduce_id() == 0 && piece.quantize_id() == 0 && !piece.relay() &&
         piece.quant_block_size() == 0 && piece.scales_of() == 0 && one_conversion;
}

std::vector<WorkerPair> DirectWriteEligiblePairs(const v1::Plan& plan) {
  absl::flat_hash_map<WorkerPair, bool> plain;  // pair -> all its pieces so far are plain
  absl::flat_hash_set<int32_t> relayers;        // workers that send a relay piece
  for (const v1::Bucket& b : plan.buckets()) {
    bool all_plain = true;
    bool relays = false;
    for (const v1::Piece& p : b.pieces()) {
      all_plain = all_plain && IsPlainPiece(p);
      relays = relays || p.relay();
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

}  // namespace wsync::plan
