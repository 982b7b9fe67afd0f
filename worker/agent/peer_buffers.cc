#include "worker/agent/peer_buffers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/peer_lists.h"
#include "common/status_macros.h"
#include "worker/agent/location_bounds.h"

namespace wsync::agent {
absl::Status PeerBufferMaps::Update(
    const google::protobuf::RepeatedPtrField<v1::PeerBuffers>& peers) {
  // Built aside and swapped in only when every peer mapped: a failure leaves
  // the other peers' mappings as they were.
  std::map<int32_t, std::shared_ptr<Peer>> next;
  for (const v1::PeerBuffers& list : peers) {
    if (next.count(list.worker())) {
      return absl::InvalidArgumentError(
          absl::StrCat("direct writes: buffers of worker ", list.worker(), " listed twice"));
    }
    auto old = peers_.find(list.worker());
    if (list.unchanged()) {
      if (!Holds(list.worker(), list.registration())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "direct writes: the buffers of worker ", list.worker(), " (registration ",
            list.registration(), ") were sent earlier, but this worker holds no mapping of them"));
      }
      next[list.worker()] = old->second;
      continue;
    }
    std::string serialized = list.SerializeAsString();
    if (old != peers_.end() && old->second->serialized == serialized) {
      next[list.worker()] = old->second;
      continue;
    }
    auto peer = std::make_shared<Peer>();
    peer->serialized = std::move(serialized);
    peer->registration = list.registration();
    absl::Status s = Map(list, *peer);
    if (!s.ok()) {
      peers_.erase(list.worker());
      return s;
    }
    next[list.worker()] = std::move(peer);
  }
  peers_ = std::move(next);
  return absl::OkStatus();
}

bool PeerBufferMaps::Holds(int32_t worker, int64_t registration) const {
  auto it = peers_.find(worker);
  return it != peers_.end() && it->second->registration == registration;
}

absl::Status PeerBufferMaps::Map(const v1::PeerBuffers& list, Peer& peer) {
  plane::MappingCache objects;  // this list's: a peer is mapped afresh
  std::vector<const v1::BufferInfo*> infos;
  std::vector<std::string> identities;
  for (const v1::BufferInfo& b : list.buffers()) {
    infos.push_back(&b);
    const std::string name = absl::StrCat(b.group(), "/", b.name());
    const std::string what =
        absl::StrCat("direct writes: buffer '", name, "' of worker ", list.worker());
    plane::BufferLocation where;
    if (b.has_shm()) where.shm = &b.shm();
    if (b.has_cuda_ipc()) where.cuda_ipc = &b.cuda_ipc();
    RETURN_IF_ERROR(CheckLocationRange(where, b.bytes(), what));
    auto opened = backend_->OpenBuffer(where, b.bytes(), /*peer=*/true, what, &objects);
    if (!opened.ok()) return opened.status();
    exec::RegisteredBuffer r;
    r.dtype = b.dtype();
    r.bytes = b.bytes();
    r.data = opened->data;
    r.space = backend_->memory_space();
    identities.push_back(opened->identity);
    peer.holds.push_back(std::move(opened->hold));
    absl::Status s = peer.registry.Register(exec::BufferSide::kDestination, name, r);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  peer.fingerprint = BufferListFingerprint(infos, identities);
  return absl::OkStatus();
}

uint64_t BufferListFingerprint(const std::vector<const v1::BufferInfo*>& buffers,
                               const std::vector<std::string>& objects) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const v1::BufferInfo* b = buffers[i];
    std::string p = absl::StrCat(b->group(), "\x1f", b->name(), "\x1f", b->dtype(), "\x1f",
                                 b->bytes(), "\x1f", i < objects.size() ? objects[i] : "");
    if (b->has_shm()) {
      absl::StrAppend(&p, "\x1fshm\x1f", b->shm().name(), "\x1f", b->shm().offset(), "\x1f",
                      b->shm().size());
    }
    if (b->has_cuda_ipc()) {
      absl::StrAppend(&p, "\x1fipc\x1f", b->cuda_ipc().handle(), "\x1f", b->cuda_ipc().offset(),
                      "\x1f", b->cuda_ipc().size(), "\x1f", b->cuda_ipc().gpu_uuid());
    }
    parts.push_back(std::move(p));
  }
  std::sort(parts.begin(), parts.end());
  // FNV-1a: the same on every host and build (absl::Hash is seeded per process).
  uint64_t h = 0xcbf29ce484222325ull;
  for (const std::string& p : parts) {
    for (const char ch : p + "\x1e") {
      h ^= static_cast<uint8_t>(ch);
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

uint64_t PeerBufferMaps::Fingerprint(int32_t worker) const {
  auto it = peers_.find(worker);
  return it == peers_.end() ? 0 : it->second->fingerprint;
}

const exec::BufferRegistry* PeerBufferMaps::Find(int32_t worker) const {
  auto it = peers_.find(worker);
  return it == peers_.end() ? nullptr : &it->second->registry;
}

std::string PeerBufferMaps::Signature() const {
  std::string s;
  for (const auto& [worker, peer] : peers_) {
    absl::StrAppend(&s, worker, "@", peer->registry.generation(), ";");
  }
  return s;
}

absl::Status PeerMapsByTransfer::Update(
    const std::string& transfer, const google::protobuf::RepeatedPtrField<v1::PeerBuffers>& peers) {
  if (peers.empty()) {
    // An owner's freed memory stays allocated while anyone maps it.
    Clear(transfer);
    return absl::OkStatus();
  }
  for (const std::string& old : MakeMostRecent(order_, transfer)) maps_.erase(old);
  std::unique_ptr<PeerBufferMaps>& maps = maps_[transfer];
  if (maps == nullptr) maps = std::make_unique<PeerBufferMaps>(backend_);
  return maps->Update(peers);
}

const PeerBufferMaps* PeerMapsByTransfer::Find(const std::string& transfer) const {
  auto it = maps_.find(transfer);
  return it == maps_.end() ? nullptr : it->second.get();
}

void PeerMapsByTransfer::Clear(const std::string& transfer) {
  maps_.erase(transfer);
  order_.remove(transfer);
}

void PeerMapsByTransfer::ClearAll() {
  maps_.clear();
  order_.clear();
}

}  // namespace wsync::agent
