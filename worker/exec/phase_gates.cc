#include "worker/exec/phase_gates.h"

#include <algorithm>

#include "common/status_macros.h"
#include "worker/exec/executor_internal.h"

namespace wsync::exec {
namespace {

using internal::kPhase;
using internal::kSlotsPerPeer;

uint64_t SeqOf(const std::map<int32_t, uint64_t>& seq, int32_t peer) {
  auto it = seq.find(peer);
  return it == seq.end() ? 0 : it->second;
}

}  // namespace

void PhaseGates::Prepare(const BoundPlan& plan, PeerWriter* writer) {
  ranges_.clear();
  std::map<int32_t, std::pair<size_t, size_t>> span;  // phase -> [begin, end), puts
  std::map<int32_t, size_t> count;
  for (const DirectBucket& d : plan.direct_buckets) {
    if (!d.sent || d.num_puts == 0) continue;
    const size_t first = static_cast<size_t>(d.first_put);
    const size_t end = first + static_cast<size_t>(d.num_puts);
    if (d.first_put < 0 || d.num_puts < 0 || end > plan.puts.size() || d.put_phase < 0 ||
        d.put_phase >= static_cast<int32_t>(kAllPhases)) {
      return;
    }
    auto [it, fresh] = span.try_emplace(d.put_phase, first, end);
    if (!fresh) it->second = {std::min(it->second.first, first), std::max(it->second.second, end)};
    count[d.put_phase] += static_cast<size_t>(d.num_puts);
  }
  size_t next = 0;
  for (const auto& [phase, be] : span) {
    // One range per phase, back to back: the buckets' puts tile it.
    if (be.first != next || be.second - be.first != count[phase]) {
      ranges_.clear();
      return;
    }
    next = be.second;
    ranges_.push_back(Range{static_cast<uint32_t>(phase), be.first, be.second - be.first, {}});
  }
  if (next != plan.puts.size()) {
    ranges_.clear();
    return;
  }
  if (writer == nullptr) return;
  for (Range& r : ranges_) {
    r.handle = writer->Prepare(absl::MakeConstSpan(plan.puts).subspan(r.first, r.count));
  }
}

std::vector<PeerWriter::GatePost> PhaseGates::Posts(int32_t me,
                                                    const std::map<int32_t, uint64_t>& seq,
                                                    absl::Span<const int32_t> peers,
                                                    uint32_t phase) {
  std::vector<PeerWriter::GatePost> posts;
  posts.reserve(peers.size());
  for (int32_t p : peers) {
    posts.push_back({p, kSlotsPerPeer * me + kPhase, Value(SeqOf(seq, p), phase)});
  }
  return posts;
}

absl::Status PhaseGates::PostAllPhases(PeerWriter& writer, int32_t me,
                                       const std::map<int32_t, uint64_t>& seq,
                                       absl::Span<const int32_t> peers) {
  for (const PeerWriter::GatePost& p : Posts(me, seq, peers, kAllPhases)) {
    RETURN_IF_ERROR(writer.Post(p.peer, p.slot, p.value));
  }
  return absl::OkStatus();
}

absl::Status PhaseGates::Issue(const BoundPlan& plan, PeerWriter& writer,
                               const std::map<int32_t, uint64_t>& seq,
                               absl::Span<const int32_t> peers, bool alone, absl::Duration timeout,
                               int32_t* gates) const {
  const int32_t me = plan.worker;
  *gates = 0;
  if (ranges_.empty()) {
    if (!plan.puts.empty()) {
      return absl::InternalError(absl::StrCat("worker ", me, ": ", plan.puts.size(),
                                              " puts that form no phase ranges, issued through "
                                              "phase gates (the caller checks num_ranges)"));
    }
    return PostAllPhases(writer, me, seq, peers);
  }
  if (ranges_.front().phase > 0) {
    RETURN_IF_ERROR(writer.SignalAfterPuts(Posts(me, seq, peers, ranges_.front().phase)));
  }
  std::vector<PeerWriter::GateWait> waits(peers.size());
  for (size_t k = 0; k < ranges_.size(); ++k) {
    const Range& r = ranges_[k];
    if (r.phase > 0 && !peers.empty()) {
      for (size_t i = 0; i < peers.size(); ++i) {
        waits[i] = {kSlotsPerPeer * peers[i] + kPhase, Value(SeqOf(seq, peers[i]), r.phase)};
      }
      RETURN_IF_ERROR(writer.GatePuts(waits, timeout));
      ++*gates;
    }
    const absl::Status put =
        writer.Put(absl::MakeConstSpan(plan.puts).subspan(r.first, r.count), r.handle, alone);
    if (!put.ok()) {
      const int64_t item = ErrorItemIndex(put);
      return item >= 0 ? TagItem(put, r.first + static_cast<size_t>(item)) : put;
    }
    const uint32_t next = k + 1 < ranges_.size() ? ranges_[k + 1].phase : kAllPhases;
    RETURN_IF_ERROR(writer.SignalAfterPuts(Posts(me, seq, peers, next)));
  }
  return absl::OkStatus();
}

}  // namespace wsync::exec
