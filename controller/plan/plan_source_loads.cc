// Source choice's link bookkeeping (plan_source_loads.h).
#include "controller/plan/plan_source_loads.h"

#include <algorithm>

namespace wsync::plan::planner_detail {

// Cells by size, largest first; counting sort on log2 size keeps it O(n).
std::vector<int32_t> SourceLoads::LptOrder() const {
  std::vector<int32_t> count(65, 0);
  std::vector<uint8_t> cls(w_->cells.size());
  for (size_t i = 0; i < w_->cells.size(); ++i) {
    const int64_t e = std::max<int64_t>(1, w_->cells[i].elems);
    cls[i] = static_cast<uint8_t>(64 - __builtin_clzll(static_cast<uint64_t>(e)));
    ++count[cls[i]];
  }
  std::vector<int32_t> start(65, 0);
  int32_t acc = 0;
  for (int k = 64; k >= 0; --k) {
    start[k] = acc;
    acc += count[k];
  }
  std::vector<int32_t> order(w_->cells.size());
  for (size_t i = 0; i < w_->cells.size(); ++i) order[start[cls[i]]++] = static_cast<int32_t>(i);
  return order;
}

double SourceLoads::IngressTarget() {
  std::vector<double> in(w_->worker_ids.size(), 0.0);
  std::vector<int64_t> in_bytes(w_->worker_ids.size(), 0);
  for (const Cell& c : w_->cells) {
    if (c.quant == kQuantGroup) continue;  // relays among members
    GatherHolders(c);
    const CompiledTensor& st = w_->src->tensors[w_->SrcTensorOf(c)];
    const CompiledTensor& dt = w_->dst->tensors[w_->DstTensorOf(c)];
    const int64_t bytes = CellWireBytes(*w_, c, CellWire(c, st, dt));
    const DstGroup& g = w_->dst_groups[c.dst_group];
    const bool rooted = c.quant == kQuantReceiver && w_->qgroups[c.qgroup].rooted;
    const int32_t members = rooted ? 1 : g.frag_count;
    // Receiver-quantized parts are never relayed: each member takes them.
    const bool shared = w_->opt.relay && c.quant != kQuantReceiver;
    far_.clear();
    for (int32_t m = 0; m < members; ++m) {
      const int32_t wd = w_->dst_rank_worker[dt.fragment(g.frag_begin + m).rank];
      LinkClass best = LinkClass::kNic;
      for (int32_t f : full_) {
        const LinkClass l = w_->Link(w_->src_rank_worker[st.fragment(f).rank], wd);
        if (l == LinkClass::kLocal) best = l;
        if (l == LinkClass::kNvlink && best == LinkClass::kNic) best = l;
      }
      if (best == LinkClass::kLocal) continue;
      if (best == LinkClass::kNic && shared) {
        far_.push_back({w_->worker_node[wd], wd});
      } else {
        in[wd] += Seconds(best, bytes);
        in_bytes[wd] += bytes;
      }
    }
    // Members with no holder on their node: the cell needs to enter each
    // such node only once, so each of its k members there takes 1/k of it
    // over its NIC. What node-mates then forward over NVLink is not counted:
    // the target is compared with a holder's NIC egress.
    std::sort(far_.begin(), far_.end());
    for (size_t i = 0; i < far_.size();) {
      size_t e = i;
      while (e < far_.size() && far_[e].first == far_[i].first) ++e;
      const double k = static_cast<double>(e - i);
      for (size_t j = i; j < e; ++j) {
        in[far_[j].second] += Seconds(LinkClass::kNic, bytes) / k;
        in_bytes[far_[j].second] += bytes;
      }
      i = e;
    }
    Reserve(c, +1);
  }
  double t = 0;
  for (double x : in) t = std::max(t, x);
  for (int64_t b : in_bytes) max_in_bytes_ = std::max(max_in_bytes_, b);
  return t;
}

// Every cell must leave its holders at least once (split over its full
// replicas): that egress is reserved up front so that early cells do not
// spend a holder's budget on fan-out that relays could carry.
void SourceLoads::Reserve(const Cell& c, int sign) {
  if (full_.empty()) return;
  const CompiledTensor& st = w_->src->tensors[w_->SrcTensorOf(c)];
  const CompiledTensor& dt = w_->dst->tensors[w_->DstTensorOf(c)];
  const DstGroup& g = w_->dst_groups[c.dst_group];
  const int32_t wd = w_->dst_rank_worker[dt.fragment(g.frag_begin).rank];
  const int64_t bytes = CellWireBytes(*w_, c, CellWire(c, st, dt));
  for (int32_t f : full_) {
    const int32_t hw = w_->src_rank_worker[st.fragment(f).rank];
    const LinkClass l = w_->Link(hw, wd);
    if (l == LinkClass::kLocal) continue;
    reserve_[static_cast<size_t>(hw) * kNumLinkDirs + OutDir(l)] +=
        sign * Seconds(l, bytes) / static_cast<double>(full_.size());
  }
}

}  // namespace wsync::plan::planner_detail
