#include "worker/agent/peer_buffers.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/dtype.h"
#include "common/peer_lists.h"
#include "worker/agent/tensor_table.h"

namespace wsync::agent {
namespace {

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

// "<st_dev>:<st_ino>" of `path`, or empty.
std::string FileIdentity(const char* path) {
  struct stat st;
  if (stat(path, &st) != 0) return "";
  return absl::StrCat(st.st_dev, ":", st.st_ino);
}

}  // namespace

std::string HostMemoryDomain() {
  const std::string boot = BootId(), shm = FileIdentity("/dev/shm");
  if (boot.empty() || shm.empty()) return "";
  return absl::StrCat("shm:", boot, ":", shm);
}

std::string GpuMemoryDomain() {
  const std::string boot = BootId(), pid_ns = FileIdentity("/proc/self/ns/pid");
  if (boot.empty() || pid_ns.empty()) return "";
  return absl::StrCat("cuda:", boot, ":", pid_ns);
}

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
  std::map<std::string, std::shared_ptr<ShmMapping>> objects;
  std::vector<const v1::BufferInfo*> infos;
  std::vector<std::string> identities;
  for (const v1::BufferInfo& b : list.buffers()) {
    infos.push_back(&b);
    identities.emplace_back();
    const std::string name = absl::StrCat(b.group(), "/", b.name());
    const std::string what =
        absl::StrCat("direct writes: buffer '", name, "' of worker ", list.worker());
    exec::RegisteredBuffer r;
    r.dtype = b.dtype();
    r.bytes = b.bytes();
    if (b.has_cuda_ipc()) {
      if (gpu_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": device memory, but this worker moves host memory"));
      }
      if (b.bytes() < 0 || b.bytes() > b.cuda_ipc().size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", b.bytes(), " bytes in a CUDA IPC range of ", b.cuda_ipc().size()));
      }
      auto data = gpu_->OpenPeer(b.cuda_ipc(), what);
      if (!data.ok()) return data.status();
      r.data = data->get();
      r.space = transport::MemorySpace::kCuda;
      peer.holds.push_back(*std::move(data));
    } else if (b.has_shm()) {
      if (gpu_ != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": host memory, but this worker moves device memory"));
      }
      const v1::HostShm& shm = b.shm();
      std::shared_ptr<ShmMapping>& mapping = objects[shm.name()];
      if (mapping == nullptr) {
        auto m = ShmMapping::Open(shm.name());
        if (!m.ok()) {
          return absl::Status(m.status().code(), absl::StrCat(what, ": ", m.status().message()));
        }
        mapping = *std::move(m);
      }
      if (shm.offset() < 0 || shm.size() < 0 || b.bytes() < 0 || b.bytes() > shm.size() ||
          shm.offset() > mapping->size() - shm.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": ", b.bytes(), " bytes at [", shm.offset(), ", +", shm.size(),
                         ") of shm '", shm.name(), "' (", mapping->size(), " bytes)"));
      }
      r.data = mapping->data() + shm.offset();
      r.space = transport::MemorySpace::kHost;
      identities.back() = mapping->identity();
      peer.holds.push_back(mapping);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": no location (the peer's worker predates direct writes or did not report it)"));
    }
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
  if (maps == nullptr) maps = std::make_unique<PeerBufferMaps>(gpu_);
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
