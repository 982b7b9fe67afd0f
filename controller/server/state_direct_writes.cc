// ControllerState: which worker pairs of a sync write destinations directly.
#include "absl/algorithm/container.h"
#include "common/peer_lists.h"
#include "controller/server/state.h"

namespace wsync::controller {

std::vector<plan::WorkerPair> ControllerState::DirectPairsLocked(
    const std::vector<plan::WorkerPair>& eligible, const std::vector<std::string>& leases,
    const std::string& transport_kind) {
  const int32_t n = static_cast<int32_t>(leases.size());
  auto find = [&](int32_t w) -> const Worker* {
    if (w < 0 || w >= n) return nullptr;
    return FindAliveLocked(leases[w]);
  };
  std::vector<plan::WorkerPair> direct;
  for (const plan::WorkerPair& pair : eligible) {
    const Worker* sender = find(pair.first);
    const Worker* receiver = find(pair.second);
    if (sender == nullptr || receiver == nullptr || sender->direct_writes_unavailable) continue;
    const std::string& domain = sender->info.direct_write_domain();
    if (domain.empty() || domain != receiver->info.direct_write_domain()) continue;
    if (transport_kind == "nccl") {
      // The sender's device writes the receiver's GPU memory over peer access.
      const std::string& gpu = receiver->info.device_uuid();
      if (gpu.empty() || !absl::c_linear_search(sender->info.peer_gpu_uuids(), gpu)) continue;
    }
    direct.push_back(pair);
  }
  return direct;
}

void ControllerState::FillDirectWritesLocked(const std::string& transfer,
                                             const std::vector<plan::WorkerPair>& direct, int32_t w,
                                             const std::vector<std::string>& leases,
                                             v1::SyncAssignment* sa) {
  Worker& self = *workers_.at(leases[w]);
  const bool once = absl::c_linear_search(self.info.capabilities(), kPeerListsOnceCapability);
  const auto& record = self.peer_lists_sent[transfer];
  std::map<int32_t, std::pair<std::string, int64_t>> sent;
  // `direct` is sorted by (sender, receiver), so both lists come out sorted.
  for (const plan::WorkerPair& pair : direct) {
    if (pair.first == w) {
      sa->add_direct_write_to(pair.second);
      const Worker& receiver = *workers_.at(leases[pair.second]);
      v1::PeerBuffers* peer = sa->add_peer_buffers();
      peer->set_worker(pair.second);
      peer->set_registration(receiver.registration);
      const std::pair<std::string, int64_t> list(receiver.lease_id, receiver.registration);
      auto it = record.find(pair.second);
      if (once && it != record.end() && it->second == list) {
        peer->set_unchanged(true);  // a big model's list is thousands of entries
      } else {
        *peer->mutable_buffers() = receiver.info.buffers();
      }
      sent.emplace(pair.second, list);
    }
    if (pair.second == w) sa->add_direct_written_by(pair.first);
  }
  // As the worker does with its mappings: a transfer that lists no peers
  // keeps none, the latest one that does goes first, and the oldest beyond
  // kPeerListTransfers is forgotten.
  if (sent.empty() || !once) {
    self.peer_list_order.remove(transfer);
    self.peer_lists_sent.erase(transfer);
    return;
  }
  self.peer_lists_sent[transfer] = std::move(sent);
  for (const std::string& old : MakeMostRecent(self.peer_list_order, transfer)) {
    self.peer_lists_sent.erase(old);
  }
}

}  // namespace wsync::controller
