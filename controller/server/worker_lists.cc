// WorkerRegistry: the lists it hands out: the peers' buffer lists a direct
// writer's assignment carries (sent once per registration with
// kPeerListsOnceCapability), and ListWorkers.
#include <algorithm>
#include <list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/time/clock.h"
#include "common/peer_lists.h"
#include "controller/server/worker_registry.h"

namespace wsync::controller {

void WorkerRegistry::ForgetPeerLists(const std::string& lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(lease_id);
  if (it == workers_.end()) return;
  it->second->peer_lists_sent.clear();
  it->second->peer_list_order.clear();
}

void WorkerRegistry::FillPeerBuffers(const std::string& lease_id, const std::string& transfer,
                                     const std::vector<std::pair<int32_t, std::string>>& write_to,
                                     v1::SyncAssignment* sa) {
  absl::MutexLock lock(&mu_);
  auto self_it = workers_.find(lease_id);
  if (self_it == workers_.end()) return;
  Worker& self = *self_it->second;
  const bool once = absl::c_linear_search(self.info->capabilities(), kPeerListsOnceCapability);
  const auto& record = self.peer_lists_sent[transfer];
  std::map<int32_t, std::pair<std::string, int64_t>> sent;
  for (const auto& [peer_id, peer_lease] : write_to) {
    auto pit = workers_.find(peer_lease);
    if (pit == workers_.end()) continue;
    const Worker& receiver = *pit->second;
    v1::PeerBuffers* peer = sa->add_peer_buffers();
    peer->set_worker(peer_id);
    peer->set_registration(receiver.registration);
    const std::pair<std::string, int64_t> list(receiver.lease_id, receiver.registration);
    auto it = record.find(peer_id);
    if (once && it != record.end() && it->second == list) {
      peer->set_unchanged(true);  // a big model's list is thousands of entries
    } else {
      *peer->mutable_buffers() = receiver.info->buffers();
    }
    sent.emplace(peer_id, list);
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

v1::ListWorkersResponse WorkerRegistry::ListWorkers(const std::string& group) {
  absl::MutexLock lock(&mu_);
  v1::ListWorkersResponse resp;
  const absl::Time now = absl::Now();
  for (const auto& [lease, w] : workers_) {
    const v1::RegisterWorkerRequest& in = *w->info;
    bool match = group.empty();
    for (const auto& m : in.memberships()) match = match || m.group() == group;
    if (!match) continue;
    v1::RegisteredWorker* info = resp.add_workers();
    info->set_instance_id(in.instance_id());
    info->set_identity(w->identity);
    *info->mutable_memberships() = in.memberships();
    info->set_node(in.node());
    info->set_device_uuid(in.device_uuid());
    *info->mutable_capabilities() = in.capabilities();
    info->set_data_address(in.data_address());
    info->set_alive(w->alive);
    info->set_ms_since_heartbeat(absl::ToInt64Milliseconds(now - w->last_heartbeat));
    *info->mutable_buffers() = in.buffers();
    info->set_pid(in.pid());
    info->set_streaming(w->stream_token != 0);
    info->set_direct_write_domain(in.direct_write_domain());
    *info->mutable_peer_gpu_uuids() = in.peer_gpu_uuids();
    info->set_staging_limit_bytes(in.staging_limit_bytes());
    info->set_staging_budget_bytes(in.staging_budget_bytes());
    *info->mutable_transports() = in.transports();
  }
  std::sort(resp.mutable_workers()->begin(), resp.mutable_workers()->end(),
            [](const v1::RegisteredWorker& a, const v1::RegisteredWorker& b) {
              return std::make_pair(a.memberships(0).group(), a.memberships(0).rank()) <
                     std::make_pair(b.memberships(0).group(), b.memberships(0).rank());
            });
  return resp;
}

}  // namespace wsync::controller
