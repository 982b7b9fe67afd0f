#include "bench/gpu/staged_run.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/gpu/bench_util.h"
#include "common/shadow_extents.h"
#include "common/status_macros.h"

namespace wsync::bench {

absl::StatusOr<v1::StagingMode> ParseStagingMode(const std::string& name) {
  if (name == "in_place") return v1::STAGING_IN_PLACE;
  if (name == "host_shadow") return v1::STAGING_HOST_SHADOW;
  if (name == "device_shadow") return v1::STAGING_DEVICE_SHADOW;
  return absl::InvalidArgumentError(
      absl::StrCat("--staging '", name, "': expected in_place, host_shadow or device_shadow"));
}

const char* StagingModeName(v1::StagingMode mode) {
  switch (mode) {
    case v1::STAGING_HOST_SHADOW:
      return "host_shadow";
    case v1::STAGING_DEVICE_SHADOW:
      return "device_shadow";
    default:
      return "in_place";
  }
}

absl::StatusOr<StagedPart> PrepareStaging(v1::StagingMode mode, const v1::Plan& rank_plan,
                                          int worker, plane::Backend* backend,
                                          const exec::BufferRegistry& live,
                                          agent::WeightArenas* arenas) {
  StagedPart part;
  part.registry = &live;
  if (mode == v1::STAGING_IN_PLACE) return part;
  ASSIGN_OR_RETURN(auto writes, ShadowWrites(rank_plan, worker));
  std::map<std::string, int64_t> extents;
  for (const auto& [name, w] : writes) extents[name] = w.extent;
  if (!StagesShadow(extents)) return part;
  part.shadows = std::make_unique<agent::ShadowSet>(backend, /*budget_bytes=*/0, arenas);
  RETURN_IF_ERROR(part.shadows->Prepare(writes, mode, live, absl::StrCat("bench worker ", worker)));
  part.registry = &part.shadows->registry();
  return part;
}

absl::Status MakeArenaSlab(const std::map<std::string, BufferNeed>& need, plane::Backend& backend,
                           agent::WeightArenas& arenas, Slab& slab) {
  int64_t total = 0;
  for (const auto& [name, n] : need) total += (n.bytes + 255) / 256 * 256;
  slab.bytes = total;
  if (total == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(agent::WeightArenas::Entry e,
                   arenas.Create(total, "bench destination slab", backend.Name()));
  slab.arena = e.arena;
  slab.base = e.arena->base();
  slab.buffers = CarveSlab(need, slab.base);
  return absl::OkStatus();
}

absl::Status MakeFlipSlab(const std::map<std::string, BufferNeed>& need, plane::Backend& backend,
                          agent::WeightArenas& arenas, Slab& slab) {
  int64_t total = 0;
  for (const auto& [name, n] : need) total += (n.bytes + 255) / 256 * 256;
  slab.bytes = total;
  if (total == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto pair, arenas.CreatePair(total, "bench destination pair", backend.Name()));
  slab.arena = pair.first.arena;
  slab.base = slab.arena->base();
  slab.buffers = CarveSlab(need, slab.base);
  return absl::OkStatus();
}

absl::Status FollowFlip(const agent::ShadowSet& set, agent::WeightArenas& arenas, const Slab& slab,
                        exec::BufferRegistry& live, std::vector<void*>& owner,
                        double* owner_switch_s) {
  const agent::ShadowSet::Flip& flip = set.flipped();
  if (flip.to == nullptr) return absl::InternalError("--commit flip: the commit did not flip");
  auto* to = static_cast<uint8_t*>(flip.to->base());
  auto* from = static_cast<uint8_t*>(flip.from->base());
  for (const auto& [name, carved] : slab.buffers) {
    exec::RegisteredBuffer b = carved;
    b.data = to + (static_cast<uint8_t*>(carved.data) - static_cast<uint8_t*>(slab.base));
    RETURN_IF_ERROR(live.Unregister(exec::BufferSide::kDestination, name));
    RETURN_IF_ERROR(live.Register(exec::BufferSide::kDestination, name, b));
  }
  arenas.Flipped(flip.to.get(), "bench");
  const int64_t handle = arenas.HandleOf(flip.to.get());
  const absl::Time t0 = absl::Now();
  for (void*& p : owner) p = to + (static_cast<uint8_t*>(p) - from);
  absl::Status acked = arenas.Ack(handle);
  *owner_switch_s = absl::ToDoubleSeconds(absl::Now() - t0);
  return acked;
}

void ReportFlip(const std::string& model, const std::string& mode, int worker,
                const std::vector<double>& owner_switch_s, const std::vector<double>& commit_s,
                size_t pointers) {
  if (owner_switch_s.empty()) return;
  Result(absl::StrFormat(
      R"({"bench":"wsync_flip","model":"%s","mode":"%s","worker":%d,"owner_pointers":%d,"owner_switch_median_s":%.7f,"owner_switch_max_s":%.7f,"worker_commit_median_s":%.6f})",
      model, mode, worker, pointers, Median(owner_switch_s),
      *std::max_element(owner_switch_s.begin(), owner_switch_s.end()),
      commit_s.empty() ? 0.0 : Median(commit_s)));
}

absl::Status Restage(agent::ShadowSet& set, v1::StagingMode mode, const v1::Plan& rank_plan,
                     int worker, const exec::BufferRegistry& live) {
  ASSIGN_OR_RETURN(auto writes, ShadowWrites(rank_plan, worker));
  return set.Prepare(writes, mode, live, absl::StrCat("bench worker ", worker));
}

absl::Status PublishChecksums(transport::KvStore& store, const std::string& tag, int worker,
                              const std::vector<exec::BucketChecksum>& checksums) {
  std::string text;
  for (const exec::BucketChecksum& c : checksums) {
    absl::StrAppend(&text, c.bucket, ",", c.hash, ",", c.sent ? 1 : 0, ";");
  }
  return store.Set(absl::StrCat(tag, "bucket_sums/", worker), text);
}

namespace {

struct BucketHashes {
  std::vector<std::pair<int, uint64_t>> sent, received;  // (worker, hash)
};

absl::Status ReadChecksums(transport::KvStore& store, const std::string& tag, int worker,
                           std::map<int64_t, BucketHashes>& out) {
  ASSIGN_OR_RETURN(std::string text, store.Get(absl::StrCat(tag, "bucket_sums/", worker),
                                               absl::Now() + absl::Seconds(60)));
  for (absl::string_view entry : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(entry, ',');
    int64_t bucket = 0;
    uint64_t hash = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &bucket) || !absl::SimpleAtoi(f[1], &hash)) {
      return absl::InternalError(
          absl::StrCat("worker ", worker, " published a malformed checksum '", entry, "'"));
    }
    auto& side = f[2] == "1" ? out[bucket].sent : out[bucket].received;
    side.emplace_back(worker, hash);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> CompareChecksums(transport::KvStore& store, const std::string& tag, int workers,
                                     const v1::Plan& plan) {
  std::map<int64_t, BucketHashes> hashes;
  for (int w = 0; w < workers; ++w) RETURN_IF_ERROR(ReadChecksums(store, tag, w, hashes));
  int compared = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.sender() == b.receiver()) continue;
    const BucketHashes& h = hashes[b.id()];
    const std::string which = absl::StrCat("bucket ", b.id(), " (worker ", b.sender(),
                                           " -> worker ", b.receiver(), ", ", b.bytes(), " bytes)");
    if (h.sent.size() != 1 || h.received.size() != 1 || h.sent[0].first != b.sender() ||
        h.received[0].first != b.receiver()) {
      return absl::FailedPreconditionError(absl::StrCat(which, ": ", h.sent.size(), " sender and ",
                                                        h.received.size(),
                                                        " receiver checksums, expected one each"));
    }
    if (h.sent[0].second != h.received[0].second) {
      return absl::DataLossError(absl::StrCat(which, ": sent hash ", h.sent[0].second,
                                              ", received hash ", h.received[0].second));
    }
    ++compared;
  }
  return compared;
}

}  // namespace wsync::bench
