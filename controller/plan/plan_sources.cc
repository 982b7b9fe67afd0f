// Stages 3-5: who sends each cell to each destination.
//  * A destination worker that holds the cell itself copies locally.
//  * Otherwise the least-loaded replica (cost = the later of the sender's
//    egress and the receiver's ingress on the link class they share, so
//    same-node holders win) sends it; cells go largest first (LPT), so every
//    replica sends and no rank funnels.
//  * Fan-out relays: when the best holder would push past the ingress bound
//    (more destinations than holders can feed at balance), a destination that
//    already has the cell forwards it in a later round. Only members of one
//    DstGroup relay to each other, so the dtype always matches.
//  * Cells held only as partial groups are reduced at the receiver: every
//    member's contribution travels in the source dtype.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "controller/plan/plan_source_loads.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

constexpr int kMaxRelayGen = 8;
// Relays may chain by cost up to this generation; deeper, the shallowest holder
// within budget forwards instead.
constexpr int kShallowFromGen = 1;

class Chooser : private SourceLoads {
 public:
  explicit Chooser(Work* w)
      : SourceLoads(w),
        batch_of_(w->worker_ids.size(), -1),
        batch_bytes_(w->worker_ids.size(), 0) {}

  absl::Status Run() {
    const double target = IngressTarget();
    const std::vector<int32_t> order = LptOrder();
    // One transfer per cell and destination member, more only for partial
    // sums: reserved so that the largest array of the plan is not regrown.
    size_t expected = 0;
    for (const Cell& c : w_->cells) expected += w_->dst_groups[c.dst_group].frag_count;
    w_->xfers.reserve(expected);
    // Quantized regions are forwarded once their root has all the parts.
    for (int32_t c : order) {
      if (w_->cells[c].quant != kQuantGroup) Assign(c, target);
    }
    for (int32_t c : order) {
      if (w_->cells[c].quant == kQuantGroup) AssignGroupRelays(c);
    }
    return absl::OkStatus();
  }

 private:
  struct Served {
    int32_t worker;
    int32_t dst_frag;
    int32_t xfer;
    uint8_t gen;
  };

  // The receiver-side quantization `x` feeds (QuantRec id, created on first use).
  int32_t QuantOf(const Cell& c, int32_t dst_frag, int32_t receiver) {
    const QuantGroup& q = w_->qgroups[c.qgroup];
    const DstGroup& g = w_->dst_groups[c.dst_group];
    int32_t& id = w_->qgroup_recs[q.rec_begin + (dst_frag - g.frag_begin)];
    if (id == 0) {
      QuantRec r;
      r.qgroup = c.qgroup;
      r.dst_frag = dst_frag;
      r.receiver = receiver;
      // Parts arrive in source dtypes of at most 4 bytes.
      const int64_t bytes = w_->boxes.elems(q.box) * 4;
      if (batch_bytes_[receiver] > 0 && batch_bytes_[receiver] + bytes > w_->opt.pack_bytes) {
        batch_of_[receiver] = -1;
      }
      if (batch_of_[receiver] < 0) {
        batch_of_[receiver] = num_batches_++;
        batch_bytes_[receiver] = 0;
      }
      r.batch = batch_of_[receiver];
      batch_bytes_[receiver] += bytes;
      w_->quants.push_back(r);
      id = static_cast<int32_t>(w_->quants.size());
    }
    return id;
  }

  int32_t AddXfer(const Cell& c, int32_t cell, int32_t dst_frag, int32_t src_frag, int32_t sender,
                  int32_t receiver, v1::DType wire, int32_t reduce) {
    Xfer x;
    x.cell = cell;
    x.dst_frag = dst_frag;
    x.src_frag = src_frag;
    x.sender = sender;
    x.receiver = receiver;
    x.wire = wire;
    x.reduce = reduce;
    x.bytes = CellWireBytes(*w_, c, wire);
    if (c.quant == kQuantReceiver) x.quantize = QuantOf(c, dst_frag, receiver);
    if (x.quantize != 0 && w_->quants[x.quantize - 1].first_xfer < 0) {
      w_->quants[x.quantize - 1].first_xfer = static_cast<int32_t>(w_->xfers.size());
    }
    const LinkClass l = w_->Link(sender, receiver);
    const double t = Seconds(l, x.bytes);
    L(sender, OutDir(l)) += t;
    if (l != LinkClass::kLocal) L(receiver, InDir(l)) += t;
    w_->xfers.push_back(x);
    return static_cast<int32_t>(w_->xfers.size()) - 1;
  }

  // Destination `wd` (fragment df) gets the cell from `from`, a destination
  // that has it already, in its destination dtype; wd then serves it too.
  void AddRelay(const Cell& c, int32_t ci, int32_t df, int32_t wd, Served from, v1::DType dtype) {
    const int32_t x = AddXfer(c, ci, df, from.dst_frag, from.worker, wd, dtype, 0);
    w_->xfers[x].relay = true;
    w_->xfers[x].parent = from.xfer;
    w_->xfers[x].gen = static_cast<uint8_t>(from.gen + 1);
    served_.push_back({wd, df, x, static_cast<uint8_t>(from.gen + 1)});
  }

  // One cell as Assign sees it: its tensors, group, wire dtype and bytes.
  struct CellView {
    const Cell& c;
    int32_t ci;
    const CompiledTensor& st;
    const CompiledTensor& dt;
    const DstGroup& g;
    v1::DType wire;
    int64_t direct_bytes;
    int64_t relay_bytes;  // a relay forwards what the destination holds
  };

  // A candidate sender for one destination: its id (a holder fragment, or
  // an index into served_), cost (the later of the sender's egress and the
  // receiver's ingress after the transfer), the sender's egress and the link.
  struct Pick {
    int32_t id = -1;
    double cost = INFINITY;
    double out = INFINITY;
    LinkClass link = LinkClass::kNic;
  };

  // `bytes` from worker hw to wd, as a Pick with id `id`.
  Pick Offer(int32_t id, int32_t hw, int32_t wd, int64_t bytes) {
    const LinkClass l = w_->Link(hw, wd);
    const double t = Seconds(l, bytes);
    const double out = L(hw, OutDir(l)) + t + Reserved(hw, OutDir(l));
    return {id, std::max(out, L(wd, InDir(l)) + t), out, l};
  }

  void Assign(int32_t ci, double target) {
    const Cell& c = w_->cells[ci];
    GatherHolders(c);
    Reserve(c, -1);
    const CompiledTensor& st = w_->src->tensors[w_->SrcTensorOf(c)];
    const CompiledTensor& dt = w_->dst->tensors[w_->DstTensorOf(c)];
    const v1::DType wire = CellWire(c, st, dt);
    const CellView v{c,
                     ci,
                     st,
                     dt,
                     w_->dst_groups[c.dst_group],
                     wire,
                     CellWireBytes(*w_, c, wire),
                     CellWireBytes(*w_, c, dt.dtype)};
    served_.clear();
    pending_.clear();
    ServeLocally(v, QuantRoot(v));
    if (c.fan && served_.empty() && !full_.empty() && pending_.size() > 1) {
      FanOut(v);
      return;
    }
    OrderPendingByIngress(v);
    for (int32_t df : pending_) ServeRemotely(v, df, target);
  }

  // A chunk of a fanned-out cell (Cell::fan), no member holding it: one
  // entry member per node, rotating with the group's chunks; the root (the
  // entry with the least NIC egress so far) gets the chunk from the
  // least-loaded holder, every other entry from a holder on its node or else
  // from the root, and each entry relays it to its node-mates. Over the
  // chunks every member is entry as often and the roots' egress balances, so
  // ingress and egress balance, and no chunk is more than two relays deep:
  // the rounds pipeline.
  void FanOut(const CellView& v) {
    if (fan_turn_.empty()) fan_turn_.assign(w_->dst_groups.size(), 0);
    fan_node_of_.clear();
    for (int32_t df : pending_) fan_node_of_.push_back(w_->worker_node[Member(v, df)]);
    PlanFanRoute(pending_, fan_node_of_, fan_turn_[v.c.dst_group]++, &fan_);
    fan_.root = LeastEgressRoot(v, fan_.root);
    auto direct = [&](int32_t df) {
      const int32_t wd = Member(v, df);
      const Pick p = BestDirect(v, wd);
      const int32_t x = AddXfer(v.c, v.ci, df, p.id, w_->src_rank_worker[v.st.fragment(p.id).rank],
                                wd, v.wire, 0);
      served_.push_back({wd, df, x, 0});
      return static_cast<int32_t>(served_.size()) - 1;
    };
    const int32_t root = direct(fan_.entry[fan_.root]);
    for (size_t n = 0; n < fan_.nodes.size(); ++n) {
      int32_t entry = root;
      const int32_t df = fan_.entry[n];
      if (static_cast<int32_t>(n) != fan_.root) {
        if (HolderNear(v, Member(v, df))) {
          entry = direct(df);
        } else {
          AddRelay(v.c, v.ci, df, Member(v, df), served_[root], v.dt.dtype);
          entry = static_cast<int32_t>(served_.size()) - 1;
        }
      }
      for (int32_t m : fan_.nodes[n]) {
        if (m != df) AddRelay(v.c, v.ci, m, Member(v, m), served_[entry], v.dt.dtype);
      }
    }
  }

  // The root sends the chunk on to every other node's entry: the entry with
  // the least NIC egress so far (reserved egress included) roots it; among
  // entries that tie, the turn's root if it is one of them, else the first.
  // Rotating roots by chunk count ignored their sizes: where a group's
  // chunks alternate large and small, the large ones all had the same roots
  // (DeepSeek-V3 stacked from FSDP2 over 256 ranks: half the replicas sent
  // 1.7 x what the other half did).
  int32_t LeastEgressRoot(const CellView& v, int32_t turn_root) {
    auto egress = [&](int32_t n) {
      const int32_t wd = Member(v, fan_.entry[n]);
      return L(wd, kNicOut) + Reserved(wd, kNicOut);
    };
    int32_t best = turn_root;
    double best_out = egress(turn_root);
    for (int32_t n = 0; n < static_cast<int32_t>(fan_.entry.size()); ++n) {
      const double out = egress(n);
      if (out < best_out * (1 - 1e-12)) {
        best = n;
        best_out = out;
      }
    }
    return best;
  }

  int32_t Member(const CellView& v, int32_t df) const {
    return w_->dst_rank_worker[v.dt.fragment(df).rank];
  }

  // Whether a full holder of the cell shares wd's node.
  bool HolderNear(const CellView& v, int32_t wd) const {
    for (int32_t f : full_) {
      if (w_->Link(w_->src_rank_worker[v.st.fragment(f).rank], wd) != LinkClass::kNic) return true;
    }
    return false;
  }

  // A rooted quantized region: only its root receives the parts; the root
  // (chosen on first use) is the least-loaded member, preferring one with a
  // local holder. -1: every member receives.
  int32_t QuantRoot(const CellView& v) {
    if (v.c.quant != kQuantReceiver || !w_->qgroups[v.c.qgroup].rooted) return -1;
    QuantGroup& q = w_->qgroups[v.c.qgroup];
    if (q.root >= 0) return q.root;
    double least = INFINITY;
    for (int32_t m = 0; m < v.g.frag_count; ++m) {
      const int32_t wd = w_->dst_rank_worker[v.dt.fragment(v.g.frag_begin + m).rank];
      bool local = false;
      for (int32_t f : full_) local = local || w_->src_rank_worker[v.st.fragment(f).rank] == wd;
      const double in = local ? -1.0 : L(wd, kNicIn) + L(wd, kNvlIn);
      if (in < least) {
        least = in;
        q.root = m;
      }
    }
    return q.root;
  }

  // Local copies first: a colocated holder never uses the network. The
  // members (only `only` when >= 0) without one go to pending_.
  void ServeLocally(const CellView& v, int32_t only) {
    for (int32_t m = 0; m < v.g.frag_count; ++m) {
      if (only >= 0 && m != only) continue;
      const int32_t df = v.g.frag_begin + m;
      const int32_t wd = w_->dst_rank_worker[v.dt.fragment(df).rank];
      int32_t local = -1;
      for (int32_t f : full_) {
        if (w_->src_rank_worker[v.st.fragment(f).rank] == wd) {
          local = f;
          break;
        }
      }
      if (local >= 0) {
        const int32_t x = AddXfer(v.c, v.ci, df, local, wd, wd, v.wire, 0);
        served_.push_back({wd, df, x, 0});
      } else {
        pending_.push_back(df);
      }
    }
  }

  // Least NIC ingress first (then NVLink ingress): in every node the member
  // that takes the cell over the network (its node-mates relay it over
  // NVLink) is the one whose NIC has the most room, so that a node's
  // replicated tensors spread over all its NICs instead of funnelling into
  // its first rank.
  void OrderPendingByIngress(const CellView& v) {
    if (pending_.size() <= 1) return;
    order_key_.clear();
    for (int32_t df : pending_) {
      const int32_t wd = w_->dst_rank_worker[v.dt.fragment(df).rank];
      order_key_.push_back({L(wd, kNicIn), L(wd, kNvlIn), df});
    }
    std::stable_sort(order_key_.begin(), order_key_.end(),
                     [](const PendingKey& a, const PendingKey& b) {
                       return a.nic_in != b.nic_in ? a.nic_in < b.nic_in : a.nvl_in < b.nvl_in;
                     });
    for (size_t i = 0; i < pending_.size(); ++i) pending_[i] = order_key_[i].dst_frag;
  }

  // Member df (worker wd) without a local holder: from the best full
  // holder, a relay, or (no full holder) a partial group reduced at wd.
  void ServeRemotely(const CellView& v, int32_t df, double target) {
    const int32_t wd = w_->dst_rank_worker[v.dt.fragment(df).rank];
    Pick direct = BestDirect(v, wd);
    // Best partial group (only when no full holder exists).
    int32_t best_p = -1;
    if (full_.empty()) best_p = BestPartial(v, wd, &direct.cost);
    // Receiver-quantized parts are consumed by the receiver's Quantize, never
    // forwarded.
    Pick relay;
    if (w_->opt.relay && v.c.quant != kQuantReceiver) relay = BestRelay(v, wd, target);
    const bool partial = direct.id < 0;
    if (UseRelay(direct, relay, partial, target)) {
      AddRelay(v.c, v.ci, df, wd, served_[relay.id], v.dt.dtype);
    } else if (!partial) {
      const int32_t x = AddXfer(v.c, v.ci, df, direct.id,
                                w_->src_rank_worker[v.st.fragment(direct.id).rank], wd, v.wire, 0);
      served_.push_back({wd, df, x, 0});
    } else {
      ReduceAt(v, df, wd, best_p);
    }
  }

  // Best direct holder. Primary: the later of sender egress and receiver
  // ingress after the transfer; secondary: the sender's egress alone, so
  // that replicas tie on the receiver's ingress spread the load instead of
  // funnelling.
  Pick BestDirect(const CellView& v, int32_t wd) {
    Pick best;
    for (int32_t f : full_) {
      const Pick p = Offer(f, w_->src_rank_worker[v.st.fragment(f).rank], wd, v.direct_bytes);
      if (Better(p.cost, p.out, best.cost, best.out)) best = p;
    }
    return best;
  }

  // The partial group whose contributions (source dtype) arrive earliest at
  // wd if that beats *best (which it then lowers); -1 if none does.
  int32_t BestPartial(const CellView& v, int32_t wd, double* best) {
    int32_t best_p = -1;
    const int64_t pbytes = v.c.elems * DTypeSize(v.st.dtype);
    for (int32_t p : parts_) {
      const PartialGroup& pg = w_->partial_groups[p];
      double in_add[kNumLinkDirs] = {0, 0, 0, 0, 0};
      double cost = 0;
      for (int32_t k = 0; k < pg.frag_count; ++k) {
        const int32_t mw =
            w_->src_rank_worker[v.st.fragment(w_->holder_frags[pg.frag_begin + k]).rank];
        const LinkClass l = w_->Link(mw, wd);
        const double t = Seconds(l, pbytes);
        cost = std::max(cost, L(mw, OutDir(l)) + t);
        if (l != LinkClass::kLocal) in_add[InDir(l)] += t;
      }
      for (int d = 0; d < kNumLinkDirs; ++d) {
        if (in_add[d] > 0) cost = std::max(cost, L(wd, d) + in_add[d]);
      }
      if (cost < *best) {
        *best = cost;
        best_p = p;
      }
    }
    return best_p;
  }

  // Bytes worker hw sends over NVLink and the NIC so far.
  double SentBytes(int32_t hw) {
    const double gib = double{1 << 30};
    return L(hw, kNvlOut) * gib / Seconds(LinkClass::kNvlink, int64_t{1} << 30) +
           L(hw, kNicOut) * gib / Seconds(LinkClass::kNic, int64_t{1} << 30);
  }

  // Best relay from a destination that has the cell already (id: index
  // into served_), by cost, then the earlier generation. From generation
  // kShallowFromGen on, the shallowest NVLink holder that stays within the
  // ingress target (time) and whose egress stays within the largest ingress
  // (bytes) forwards instead: a star behind the network hop rather than a
  // chain, whose every extra hop is another round behind the last data.
  Pick BestRelay(const CellView& v, int32_t wd, double target) {
    // Scalars rather than Picks in this loop, the planner's hottest: it
    // keeps them in registers.
    const int64_t bytes = v.relay_bytes;
    int32_t best_r = -1, shallow = -1;
    double best_rc = INFINITY, best_rout = INFINITY;
    double shallow_rc = INFINITY, shallow_rout = INFINITY;
    LinkClass best_rl = LinkClass::kNic;
    for (size_t s = 0; s < served_.size(); ++s) {
      if (served_[s].gen >= kMaxRelayGen) continue;
      const int32_t hw = served_[s].worker;
      const LinkClass l = w_->Link(hw, wd);
      const double t = Seconds(l, bytes);
      const double out = L(hw, OutDir(l)) + t + Reserved(hw, OutDir(l));
      const double cost = std::max(out, L(wd, InDir(l)) + t);
      if (Better(cost, out, best_rc, best_rout) ||
          (!Better(best_rc, best_rout, cost, out) && served_[s].gen < served_[best_r].gen)) {
        best_rc = cost;
        best_rout = out;
        best_r = static_cast<int32_t>(s);
        best_rl = l;
      }
      if (l != LinkClass::kNvlink || cost > target * (1 + 1e-9)) continue;
      // Bytes the holder sends over either link, this relay included.
      const double out_bytes = SentBytes(hw) + static_cast<double>(bytes);
      if (out_bytes > static_cast<double>(max_in_bytes_)) continue;
      if (shallow < 0 || served_[s].gen < served_[shallow].gen ||
          (served_[s].gen == served_[shallow].gen && Better(cost, out, shallow_rc, shallow_rout))) {
        shallow = static_cast<int32_t>(s);
        shallow_rc = cost;
        shallow_rout = out;
      }
    }
    if (shallow >= 0 && served_[best_r].gen >= kShallowFromGen &&
        served_[shallow].gen < served_[best_r].gen) {
      return {shallow, shallow_rc, shallow_rout, LinkClass::kNvlink};
    }
    return {best_r, best_rc, best_rout, best_rl};
  }

  // Whether `relay` serves instead of the direct holder (or, `partial`, the
  // partial group costing direct.cost).
  static bool UseRelay(const Pick& direct, const Pick& relay, bool partial, double target) {
    if (relay.id < 0) return false;
    // One relayed copy is cheaper than another full set of contributions.
    if (partial) return relay.cost <= direct.cost * (1 + 1e-9);
    // The holder would pass the ingress bound: fan out through relays.
    if (direct.out > target * (1 + 1e-9)) return relay.cost <= direct.cost * (1 + 1e-9);
    // Within budget: relay only to move a NIC hop onto NVLink.
    return relay.link == LinkClass::kNvlink && direct.link == LinkClass::kNic &&
           relay.cost < direct.cost;
  }

  // Every member of partial group `p` sends its contribution (source dtype)
  // to wd, which reduces them into member df.
  void ReduceAt(const CellView& v, int32_t df, int32_t wd, int32_t p) {
    const PartialGroup& pg = w_->partial_groups[p];
    ReduceRec r;
    r.cell = v.ci;
    r.dst_frag = df;
    r.receiver = wd;
    r.op = pg.op;
    r.members = pg.frag_count;
    w_->reduces.push_back(r);
    const int32_t id = static_cast<int32_t>(w_->reduces.size());
    int32_t first = -1;
    for (int32_t k = 0; k < pg.frag_count; ++k) {
      const int32_t f = w_->holder_frags[pg.frag_begin + k];
      const int32_t x =
          AddXfer(v.c, v.ci, df, f, w_->src_rank_worker[v.st.fragment(f).rank], wd, v.st.dtype, id);
      if (first < 0) first = x;
    }
    served_.push_back({wd, df, first, 0});
  }

  // A quantized region's root forwards fp8 + scales to the other members
  // (relay trees as for any cell; each hop after the previous one's round).
  void AssignGroupRelays(int32_t ci) {
    const Cell& c = w_->cells[ci];
    const QuantGroup& q = w_->qgroups[c.qgroup];
    const DstGroup& g = w_->dst_groups[c.dst_group];
    const CompiledTensor& dt = w_->dst->tensors[w_->DstTensorOf(c)];
    const int32_t rec = w_->qgroup_recs[q.rec_begin + q.root];
    served_.clear();
    served_.push_back({w_->dst_rank_worker[dt.fragment(g.frag_begin + q.root).rank],
                       g.frag_begin + q.root, w_->quants[rec - 1].first_xfer, 0});
    const int64_t bytes = CellWireBytes(*w_, c, dt.dtype);
    for (int32_t m = 0; m < g.frag_count; ++m) {
      if (m == q.root) continue;
      const int32_t df = g.frag_begin + m;
      const int32_t wd = w_->dst_rank_worker[dt.fragment(df).rank];
      Pick best;
      for (size_t s = 0; s < served_.size(); ++s) {
        if (served_[s].gen >= kMaxRelayGen) continue;
        const Pick p = Offer(static_cast<int32_t>(s), served_[s].worker, wd, bytes);
        if (Better(p.cost, p.out, best.cost, best.out)) best = p;
      }
      // Every server at the generation limit: the root.
      AddRelay(c, ci, df, wd, served_[std::max(best.id, 0)], dt.dtype);
    }
  }

  std::vector<int32_t> batch_of_;  // per receiver: its open quantization batch
  std::vector<int64_t> batch_bytes_;
  int32_t num_batches_ = 0;
  std::vector<int32_t> pending_;
  struct PendingKey {
    double nic_in;
    double nvl_in;
    int32_t dst_frag;
  };
  std::vector<PendingKey> order_key_;
  std::vector<Served> served_;
  std::vector<int32_t> fan_turn_;     // per DstGroup: fanned-out chunks assigned so far
  std::vector<int32_t> fan_node_of_;  // node of each pending member
  FanRoute fan_;
};

}  // namespace

absl::Status ChooseSources(Work* w) { return Chooser(w).Run(); }

}  // namespace wsync::plan::planner_detail
