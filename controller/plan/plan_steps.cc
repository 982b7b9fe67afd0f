// Stage 8b: rounds -> steps. Where the link model prices one more step
// inside a round (step_latency_seconds) below a round barrier, consecutive
// rounds become the steps of one round when nothing in a later one needs
// the barrier: every relay whose data an earlier round of the group brought
// must travel zero-copy from a zero-copy network receive (the worker
// forwards it straight from the tensor, stream-ordered behind the step that
// wrote it, plan.proto Bucket.step); the group's staging stays under the
// cap, and a round has at most kMaxBucketSteps steps.
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "common/bucket_steps.h"
#include "common/status_macros.h"
#include "controller/plan/plan_cost.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

// Whether round r's buckets may follow rounds [group_begin, r) within one
// round: each relay that reads what the group brought is a zero-copy network
// bucket fed by a zero-copy network bucket (a reduce, quantize or unpack
// would write it only after the round).
bool CanFollowInGroup(const Work& w, const std::vector<int32_t>& round_buckets,
                      int32_t group_begin) {
  for (int32_t b : round_buckets) {
    const BucketRec& bk = w.buckets[b];
    for (int32_t k = 0; k < bk.xfer_count; ++k) {
      const Xfer& x = w.xfers[w.bucket_xfers[bk.xfer_begin + k]];
      if (!x.relay) continue;
      if (x.parent < 0) return false;  // its data's origin is unknown here
      const Xfer& p = w.xfers[x.parent];
      const BucketRec& pb = w.buckets[p.bucket];
      if (pb.round < group_begin) continue;  // behind a barrier already
      if (bk.local || !bk.zero_copy || pb.local || !pb.zero_copy || p.reduce != 0 ||
          p.quantize != 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

absl::Status AssignSteps(Work* w) {
  w->round_first_slot.clear();
  if (!StepsPay(w->opt.link) || w->num_rounds < 2) return absl::OkStatus();
  const int32_t rounds = w->num_rounds;
  const size_t nw = w->worker_ids.size();
  std::vector<std::vector<int32_t>> by_round(rounds);
  std::vector<int64_t> staged(static_cast<size_t>(rounds) * nw, 0);
  for (size_t b = 0; b < w->buckets.size(); ++b) {
    const BucketRec& bk = w->buckets[b];
    by_round[bk.round].push_back(static_cast<int32_t>(b));
    if (bk.local || bk.zero_copy) continue;
    staged[bk.round * nw + bk.sender] += bk.bytes;
    staged[bk.round * nw + bk.receiver] += bk.bytes;
  }
  // Groups of consecutive rounds, greedily as long as each may follow.
  std::vector<int32_t> group_of(rounds, 0), step_of(rounds, 0);
  std::vector<int64_t> group_staged(staged.begin(), staged.begin() + nw);
  int32_t group_begin = 0, groups = 1;
  for (int32_t r = 1; r < rounds; ++r) {
    bool join = r - group_begin < kMaxBucketSteps && CanFollowInGroup(*w, by_round[r], group_begin);
    for (size_t k = 0; join && k < nw; ++k) {
      join = staged[r * nw + k] <= w->opt.staging_cap - group_staged[k];
    }
    if (!join) {
      group_begin = r;
      ++groups;
      std::fill(group_staged.begin(), group_staged.end(), 0);
    }
    for (size_t k = 0; k < nw; ++k) group_staged[k] += staged[r * nw + k];
    group_of[r] = groups - 1;
    step_of[r] = r - group_begin;
  }
  if (groups == rounds) return absl::OkStatus();
  for (size_t b = 0; b < w->buckets.size(); ++b) {
    BucketRec& bk = w->buckets[b];
    if (!bk.local) bk.step = step_of[bk.round];
    bk.round = group_of[bk.round];
  }
  for (ReduceRec& r : w->reduces) r.round = group_of[r.round];
  for (QuantRec& q : w->quants) q.round = group_of[q.round];
  w->round_first_slot.assign(groups + 1, rounds);
  for (int32_t r = rounds - 1; r >= 0; --r) w->round_first_slot[group_of[r]] = r;
  w->num_rounds = groups;
  return absl::OkStatus();
}

namespace {

// What ScheduleBuckets keeps of one schedule while it tries another.
struct Schedule {
  BigVector<BucketRec> buckets;
  BigVector<int32_t> bucket_xfers;
  std::vector<std::pair<int32_t, int64_t>> xfer_slots;  // (bucket, bucket_offset) per transfer
  std::vector<int32_t> reduce_rounds, quant_rounds;
  int32_t num_rounds = 0;
  std::vector<int32_t> round_first_slot;
  double hop_latency = 0;
};

Schedule Take(Work* w) {
  Schedule s;
  s.buckets.swap(w->buckets);
  s.bucket_xfers.swap(w->bucket_xfers);
  s.xfer_slots.reserve(w->xfers.size());
  for (const Xfer& x : w->xfers) s.xfer_slots.emplace_back(x.bucket, x.bucket_offset);
  for (const ReduceRec& r : w->reduces) s.reduce_rounds.push_back(r.round);
  for (const QuantRec& q : w->quants) s.quant_rounds.push_back(q.round);
  s.num_rounds = w->num_rounds;
  s.round_first_slot.swap(w->round_first_slot);
  s.hop_latency = w->hop_latency;
  return s;
}

// Puts `s` (taken by Take) back into w; `s` is left empty.
void Restore(Schedule* s, Work* w) {
  w->buckets.swap(s->buckets);
  w->bucket_xfers.swap(s->bucket_xfers);
  for (size_t i = 0; i < w->xfers.size(); ++i) {
    w->xfers[i].bucket = s->xfer_slots[i].first;
    w->xfers[i].bucket_offset = s->xfer_slots[i].second;
  }
  for (size_t i = 0; i < w->reduces.size(); ++i) w->reduces[i].round = s->reduce_rounds[i];
  for (size_t i = 0; i < w->quants.size(); ++i) w->quants[i].round = s->quant_rounds[i];
  w->num_rounds = s->num_rounds;
  w->round_first_slot.swap(s->round_first_slot);
  w->hop_latency = s->hop_latency;
}

// `*checked` (optional): false when `check` refused the packing.
absl::Status Search(Work* w, double hop_latency,
                    const std::function<absl::Status(const Work&)>& check,
                    bool* checked = nullptr) {
  w->hop_latency = hop_latency;
  RETURN_IF_ERROR(PackBuckets(w));
  const absl::Status st = check(*w);
  if (checked != nullptr) *checked = st.ok();
  RETURN_IF_ERROR(st);
  RETURN_IF_ERROR(AssignRounds(w));
  return AssignSteps(w);
}

}  // namespace

double BoundHopLatency(const Work& w) {
  const v1::LinkModel& lm = w.opt.link;
  if (StepsPay(lm)) {
    for (const MapEntry& m : w.maps) {
      const CompiledTensor& d = w.dst->tensors[m.dst_tensor];
      if (!d.quantized() && w.src->tensors[m.src_tensor].dtype == d.dtype) {
        return lm.step_latency_seconds();
      }
    }
  }
  return lm.round_latency_seconds();
}

double ModeledSeconds(const Work& w) {
  CostModel cost(w.opt.link, static_cast<int32_t>(w.worker_ids.size()), std::max(1, w.NumSlots()));
  for (const BucketRec& bk : w.buckets) {
    cost.Add(w.SlotOf(bk), bk.sender, bk.receiver, w.Link(bk.sender, bk.receiver), bk.bytes);
  }
  return w.num_rounds == 0 ? 0 : cost.Report(w.round_first_slot).predicted_seconds;
}

absl::Status ScheduleBuckets(Work* w, const std::function<absl::Status(const Work&)>& check) {
  const double round = w->opt.link.round_latency_seconds();
  const double hop = RelayHopLatency(*w);
  RETURN_IF_ERROR(Search(w, round, check));
  if (!(hop < round)) return absl::OkStatus();
  // A search for many short rounds can place worse than one for barriers
  // (on large plans it tries fewer ways): keep whichever the model prices
  // lower.
  // A packing for steps over the plan's limits (its buckets are smaller)
  // leaves the barrier schedule; any other error is the plan's.
  const double barrier_seconds = ModeledSeconds(*w);
  Schedule barrier = Take(w);
  bool checked = true;
  const absl::Status st = Search(w, hop, check, &checked);
  if (!st.ok() && checked) return st;
  if (!st.ok() || ModeledSeconds(*w) > barrier_seconds) Restore(&barrier, w);
  return absl::OkStatus();
}

}  // namespace wsync::plan::planner_detail
