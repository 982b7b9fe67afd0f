#include "worker/exec/pipeline_schedule.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace wsync::exec {
namespace {

// Half-open byte ranges [first, second).
using Range = std::pair<uintptr_t, uintptr_t>;

void AddView(const StridedView& v, std::vector<Range>& out) {
  const int64_t n = v.num_elements();
  if (n <= 0 || v.data == nullptr) return;
  const int64_t esz = DTypeSize(v.dtype);
  int64_t last = 0;
  for (int d = 0; d < v.ndim; ++d) last += (v.shape[d] - 1) * v.strides[d];
  const uintptr_t lo = reinterpret_cast<uintptr_t>(v.data);
  out.emplace_back(lo, lo + static_cast<uintptr_t>((last + 1) * esz));
}

void AddRaw(const void* p, int64_t bytes, std::vector<Range>& out) {
  if (p == nullptr || bytes <= 0) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  out.emplace_back(lo, lo + static_cast<uintptr_t>(bytes));
}

// Sorted, merged copy of `r`.
std::vector<Range> Merge(std::vector<Range> r) {
  std::sort(r.begin(), r.end());
  std::vector<Range> out;
  for (const Range& x : r) {
    if (!out.empty() && x.first < out.back().second) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

// `merged` from Merge().
bool Overlaps(const std::vector<Range>& merged, const std::vector<Range>& probe) {
  for (const Range& x : probe) {
    // The first merged range ending after x starts.
    auto it = std::upper_bound(merged.begin(), merged.end(), x.first,
                               [](uintptr_t v, const Range& m) { return v < m.second; });
    if (it != merged.end() && it->first < x.second) return true;
  }
  return false;
}

bool AllUnstaged(const BoundRound& round, const ReduceItem& item) {
  for (int32_t k = item.input_begin; k < item.input_begin + item.num_inputs; ++k) {
    if (round.reduce_inputs[k].staging_offset >= 0) return false;
  }
  return true;
}

int64_t Align256(int64_t v) { return (v + 255) / 256 * 256; }

}  // namespace

absl::StatusOr<PipelineSchedule> BuildPipelineSchedule(const BoundPlan& plan,
                                                       int64_t staging_limit) {
  PipelineSchedule s;
  int64_t max_even = 0, max_odd = 0;
  for (size_t i = 0; i < plan.rounds.size(); ++i) {
    int64_t& m = i % 2 == 0 ? max_even : max_odd;
    m = std::max(m, Align256(plan.rounds[i].staging_bytes));
  }
  s.staging_bytes = max_even + max_odd;
  if (staging_limit > 0) {
    s.staging_bytes = std::min(s.staging_bytes, staging_limit / 256 * 256);
    if (Align256(plan.max_staging_bytes) > s.staging_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", plan.worker, ": a round of plan '", plan.key, "' stages ",
                       plan.max_staging_bytes, " bytes, over the staging limit of ", staging_limit,
                       " bytes; plan with a smaller staging cap or raise the limit"));
    }
  }
  // Neighbours i-1, i may be live together.
  auto fit = [&](size_t i) {
    return Align256(plan.rounds[i - 1].staging_bytes) + Align256(plan.rounds[i].staging_bytes) <=
           s.staging_bytes;
  };
  s.rounds.resize(plan.rounds.size());
  // Memory each round writes from its transfer's start on (for the next
  // round's pack-ahead decision).
  std::vector<Range> prev_late_writes;
  // What the previous round reads and writes after its transfer returned
  // (for its finish_async decision, made once this round's transfer is known).
  std::vector<Range> prev_after_writes, prev_after_rw;
  for (size_t i = 0; i < plan.rounds.size(); ++i) {
    const BoundRound& round = plan.rounds[i];
    RoundSchedule& rs = s.rounds[i];
    if (i % 2 == 1 && round.staging_bytes > 0) {
      rs.staging_offset = s.staging_bytes - Align256(round.staging_bytes);
    }

    std::vector<Range> local_reads, local_writes, net_writes, zc_send_reads;
    for (const ReduceItem& item : round.reduces) {
      if (AllUnstaged(round, item)) {
        rs.local_reduces.push_back(item);
        AddView(item.dst, local_writes);
        for (int32_t k = item.input_begin; k < item.input_begin + item.num_inputs; ++k) {
          AddView(round.reduce_inputs[k].view, local_reads);
        }
      } else {
        rs.staged_reduces.push_back(item);
      }
    }
    for (const CopyItem& c : round.copies) {
      AddView(c.src, local_reads);
      AddView(c.dst, local_writes);
    }
    for (const UnpackItem& u : round.unpack) AddView(u.dst, net_writes);
    for (const BoundTransfer& t : round.recvs) {
      if (t.zero_copy) AddRaw(t.direct, t.bytes, net_writes);
    }
    for (const BoundTransfer& t : round.sends) {
      if (t.zero_copy) AddRaw(t.direct, t.bytes, zc_send_reads);
    }
    const std::vector<Range> net_w = Merge(net_writes);
    const bool has_local = !round.copies.empty() || !rs.local_reduces.empty();
    rs.local_early = has_local && !Overlaps(net_w, local_reads) && !Overlaps(net_w, local_writes) &&
                     !Overlaps(Merge(zc_send_reads), local_writes);

    std::vector<Range> pack_reads;
    for (const PackItem& p : round.pack) AddView(p.src, pack_reads);
    if (i > 0) {
      rs.pack_ahead = !pack_reads.empty() && fit(i) && !Overlaps(prev_late_writes, pack_reads);
    }

    std::vector<Range> zc_recv_writes;
    for (const BoundTransfer& t : round.recvs) {
      if (t.zero_copy) AddRaw(t.direct, t.bytes, zc_recv_writes);
    }
    if (i > 0) {
      // This round's own pack is issued before the deferred work.
      s.rounds[i - 1].finish_async = fit(i) && !Overlaps(prev_after_writes, zc_send_reads) &&
                                     !Overlaps(prev_after_rw, zc_recv_writes) &&
                                     !Overlaps(prev_after_writes, pack_reads);
    }

    std::vector<Range> after_writes, after_reads;
    for (const UnpackItem& u : round.unpack) AddView(u.dst, after_writes);
    // Bucket checksums (when on) read what arrived zero-copy after the transfer.
    for (const BoundTransfer& t : round.recvs) {
      if (t.zero_copy) AddRaw(t.direct, t.bytes, after_reads);
    }
    for (const ReduceItem& item : rs.staged_reduces) {
      AddView(item.dst, after_writes);
      for (int32_t k = item.input_begin; k < item.input_begin + item.num_inputs; ++k) {
        if (round.reduce_inputs[k].staging_offset < 0) {
          AddView(round.reduce_inputs[k].view, after_reads);
        }
      }
    }
    // Block fp8 quantizations run after the staged reduces.
    for (const QuantizeItem& q : round.quantizes) {
      AddView(q.dst, after_writes);
      AddView(q.scale_dst, after_writes);
      for (int32_t k = q.input_begin; k < q.input_begin + q.num_inputs; ++k) {
        if (round.quantize_inputs[k].staging_offset < 0) {
          AddView(round.quantize_inputs[k].view, after_reads);
        }
      }
    }
    if (!rs.local_early) {
      after_writes.insert(after_writes.end(), local_writes.begin(), local_writes.end());
      after_reads.insert(after_reads.end(), local_reads.begin(), local_reads.end());
    }
    std::vector<Range> after_rw = after_writes;
    after_rw.insert(after_rw.end(), after_reads.begin(), after_reads.end());
    prev_after_writes = Merge(after_writes);
    prev_after_rw = Merge(std::move(after_rw));

    std::vector<Range> late = std::move(net_writes);
    for (const ReduceItem& item : rs.staged_reduces) AddView(item.dst, late);
    for (const QuantizeItem& q : round.quantizes) {
      AddView(q.dst, late);
      AddView(q.scale_dst, late);
    }
    if (!rs.local_early) late.insert(late.end(), local_writes.begin(), local_writes.end());
    prev_late_writes = Merge(std::move(late));
  }
  return s;
}

}  // namespace wsync::exec
