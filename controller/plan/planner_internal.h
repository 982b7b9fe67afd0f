// Working state shared by the planner stages. Everything is flat vectors of
// small PODs indexed by int32 ids (no per-piece allocations, no strings), so a
// 1T-parameter plan with millions of pieces stays within time and memory.
#ifndef WSYNC_CONTROLLER_PLAN_PLANNER_INTERNAL_H_
#define WSYNC_CONTROLLER_PLAN_PLANNER_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/huge_page_allocator.h"
#include "controller/plan/plan_cost.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan::planner_detail {

inline constexpr int kMaxDims = 8;

// An element box of up to kMaxDims dims, by value (no allocation).
struct ElemBox {
  int rank = 0;
  int64_t off[kMaxDims];
  int64_t len[kMaxDims];
  int64_t Elems() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= len[d];
    return n;
  }
  bool Empty() const {
    for (int d = 0; d < rank; ++d) {
      if (len[d] <= 0) return true;
    }
    return false;
  }
};

// The common part of `a` and the box (off, len) of a's rank into *out; false
// when they share no element.
inline bool IntersectElemBox(const ElemBox& a, const int64_t* off, const int64_t* len,
                             ElemBox* out) {
  out->rank = a.rank;
  for (int d = 0; d < a.rank; ++d) {
    const int64_t lo = std::max(a.off[d], off[d]);
    const int64_t hi = std::min(a.off[d] + a.len[d], off[d] + len[d]);
    if (hi <= lo) return false;
    out->off[d] = lo;
    out->len[d] = hi - lo;
  }
  return true;
}

// Splits `b` into boxes of at most `max_elems` elements along the outermost
// dim with extent > 1 (recursing inward when one slice is still too big).
void SplitElemBox(const ElemBox& b, int64_t max_elems, std::vector<ElemBox>* out);

// Boxes live in one int64 arena: [rank, offset..., length...].
class BoxArena {
 public:
  int32_t Add(int rank, const int64_t* offset, const int64_t* length) {
    const int32_t id = static_cast<int32_t>(data_.size());
    data_.push_back(rank);
    data_.insert(data_.end(), offset, offset + rank);
    data_.insert(data_.end(), length, length + rank);
    return id;
  }
  int rank(int32_t id) const { return static_cast<int>(data_[id]); }
  const int64_t* offset(int32_t id) const { return &data_[id + 1]; }
  const int64_t* length(int32_t id) const { return &data_[id + 1 + data_[id]]; }
  int64_t elems(int32_t id) const {
    int64_t n = 1;
    for (int d = 0; d < rank(id); ++d) n *= length(id)[d];
    return n;
  }
  // The arena's end: the id the next Add returns.
  int32_t end() const { return static_cast<int32_t>(data_.size()); }
  BoxNd ToBox(int32_t id) const {
    BoxNd b;
    b.offset.assign(offset(id), offset(id) + rank(id));
    b.length.assign(length(id), length(id) + rank(id));
    return b;
  }

 private:
  BigVector<int64_t> data_;
};

// One mapping entry: destination region fed by a source box. Ranks may
// differ by leading unit dims (stacked experts): the trailing min(rank) dims
// translate, the extra leading dims are fixed coordinates of length 1.
struct MapEntry {
  int32_t src_tensor = 0;
  int32_t dst_tensor = 0;
  int src_rank = 0;
  int dst_rank = 0;
  std::vector<int64_t> src_offset, src_length;  // src_rank
  std::vector<int64_t> dst_offset;              // dst_rank
  std::vector<int64_t> dst_length;              // region length in dst coords
};

// Unique box of a source tensor with every fragment holding it.
struct HolderGroup {
  int32_t box = 0;         // arena id
  int32_t full_begin = 0;  // into Work::holder_frags
  int32_t full_count = 0;
  int32_t part_begin = 0;  // into Work::holder_parts (PartialGroup ids)
  int32_t part_count = 0;
};

struct PartialGroup {
  int32_t frag_begin = 0;  // into Work::holder_frags
  int32_t frag_count = 0;
  v1::ReduceOp op = v1::REDUCE_SUM;
};

// Per source tensor: holder groups sorted by offset along `key_dim`, with the
// running max of their end along it for binary search. Built on first use
// (SourceIndexOf): with tensor classes only the tensors a class's first
// member reads are searched.
struct SourceIndex {
  bool built = false;
  int key_dim = 0;
  std::vector<int32_t> groups;   // HolderGroup ids
  std::vector<int64_t> begin;    // offset along key_dim
  std::vector<int64_t> max_end;  // prefix max of end along key_dim
};

// Destination fragments of one tensor with an identical box.
struct DstGroup {
  int32_t dst_tensor = 0;
  int32_t frag_begin = 0;  // index range into the tensor's fragments
  int32_t frag_count = 0;
};

// A source-coordinate box every member of a DstGroup needs, with its holders.
struct Cell {
  int32_t map = 0;  // MapEntry id
  int32_t dst_group = 0;
  int32_t box = 0;       // arena id, source coordinates
  int32_t hg_begin = 0;  // into Work::cell_holders (HolderGroup ids)
  int32_t hg_count = 0;
  int64_t elems = 0;
  // Block fp8 destinations: kQuantSender = whole blocks, quantized by the
  // sender (fp8 + scales on the wire); kQuantReceiver = part of the blocks of
  // QuantGroup `qgroup`, shipped in the source dtype and quantized by the
  // receiver's Quantize once every part has arrived.
  uint8_t quant = 0;
  // A chunk of a fanned-out cell (plan_fanout.cc): source choice feeds one
  // member per chunk from a holder and the rest through relays, a star per
  // node, the entry members rotating from chunk to chunk.
  bool fan = false;
  int32_t qgroup = -1;
  int64_t scales = 0;  // kQuantSender / kQuantGroup: blocks (= scale values) it carries
};
inline constexpr uint8_t kQuantSender = 1;
inline constexpr uint8_t kQuantReceiver = 2;
// The whole region of QuantGroup `qgroup` once its root member quantized it:
// forwarded as fp8 + scales to the group's other members (relays only).
// Its `box` is in destination coordinates.
inline constexpr uint8_t kQuantGroup = 3;
inline bool CarriesScales(const Cell& c) {
  return c.quant == kQuantSender || c.quant == kQuantGroup;
}

// A block-aligned destination box (destination coordinates) of one DstGroup
// whose blocks no single holder has whole: each member of the group
// quantizes it after receiving its parts (QuantRec).
struct QuantGroup {
  int32_t dst_group = 0;
  int32_t box = 0;        // arena id, destination coordinates
  int32_t rec_begin = 0;  // into Work::qgroup_recs, one per DstGroup member (-1 until used)
  // With relays and several members: only member `root` receives the parts
  // and quantizes; the others get the result through a kQuantGroup cell.
  bool rooted = false;
  int32_t root = -1;  // member index, chosen with the first part
};

struct QuantRec {
  int32_t qgroup = 0;
  int32_t dst_frag = 0;
  int32_t receiver = 0;
  int32_t round = 0;
  int32_t first_xfer = -1;  // an input: the parent of relays of the result
  // Quantizations of one receiver are batched (inputs of one batch may share
  // buckets, so a batch shares a round); a batch stays within a working bucket.
  int32_t batch = 0;
};

// One delivery of a cell to one destination fragment (or one partial
// contribution to it).
struct Xfer {
  int32_t cell = 0;
  int32_t dst_frag = 0;  // receiver's fragment in the destination tensor
  int32_t src_frag = 0;  // sender's fragment: source tensor, or (relay) destination tensor
  int32_t sender = 0;    // dense worker index
  int32_t receiver = 0;
  int32_t reduce = 0;    // 1-based internal reduce id; 0 = direct write
  int32_t quantize = 0;  // 1-based internal QuantRec id: an input of that quantization
  int32_t parent = -1;   // relay: the xfer that brought the data to the sender
  int32_t bucket = -1;
  int64_t bytes = 0;  // wire bytes
  int64_t bucket_offset = 0;
  v1::DType wire = v1::DTYPE_UNSPECIFIED;
  bool relay = false;
  uint8_t gen = 0;  // relay generation (0 = from a source holder)
};

struct ReduceRec {
  int32_t cell = 0;
  int32_t dst_frag = 0;
  int32_t receiver = 0;
  v1::ReduceOp op = v1::REDUCE_SUM;
  int32_t members = 0;  // contributions
  int32_t round = 0;
};

struct BucketRec {
  int32_t sender = 0;
  int32_t receiver = 0;
  int32_t xfer_begin = 0;  // into Work::bucket_xfers
  int32_t xfer_count = 0;
  int64_t bytes = 0;
  int32_t round = 0;
  int32_t step = 0;  // within its round (AssignSteps); 0 for a local bucket
  bool local = false;
  bool zero_copy = false;
};

// Resolved options.
struct Options {
  int64_t bucket_bytes = 0;
  // Working bucket size (<= bucket_bytes): small enough that every worker
  // has many buckets per round, which is what lets rounds balance.
  int64_t pack_bytes = 0;
  int64_t staging_cap = 0;
  int64_t zero_copy_min = 0;
  bool relay = true;
  v1::LinkModel link;
};

struct Work {
  const v1::TransferSpec* spec = nullptr;
  const CompiledSide* src = nullptr;
  const CompiledSide* dst = nullptr;
  Options opt;

  // Dense workers (sorted global ids) and their nodes.
  std::vector<int32_t> worker_ids;
  std::vector<int32_t> worker_node;  // node index; unique per worker if unnamed
  std::vector<std::string> node_names;
  std::vector<int32_t> src_rank_worker;  // source rank -> dense worker
  std::vector<int32_t> dst_rank_worker;

  BoxArena boxes;
  std::vector<MapEntry> maps;
  std::vector<std::vector<int32_t>> maps_of_dst;  // dst tensor -> MapEntry ids
  std::vector<HolderGroup> holder_groups;
  BigVector<int32_t> holder_frags;    // source fragment ids (within the tensor)
  std::vector<int32_t> holder_parts;  // PartialGroup ids
  std::vector<PartialGroup> partial_groups;
  // Per source tensor: its holder groups, [src_hg_begin, + src_hg_count) of
  // holder_groups, and their index (SourceIndexOf).
  std::vector<int32_t> src_hg_begin, src_hg_count;
  std::vector<SourceIndex> source_index;
  std::vector<DstGroup> dst_groups;
  BigVector<Cell> cells;
  BigVector<int32_t> cell_holders;

  BigVector<Xfer> xfers;
  std::vector<ReduceRec> reduces;  // reduces[i] has internal id i + 1
  std::vector<QuantGroup> qgroups;
  std::vector<int32_t> qgroup_recs;  // QuantRec id (1-based) per (qgroup, member); 0 = none
  std::vector<QuantRec> quants;      // quants[i] has internal id i + 1
  BigVector<BucketRec> buckets;
  BigVector<int32_t> bucket_xfers;
  int32_t num_rounds = 0;
  // After AssignSteps merged rounds into steps: round r's steps are the
  // rounds [round_first_slot[r], round_first_slot[r + 1]) of the search
  // (its "slots"; bucket of round r, step s: slot round_first_slot[r] + s).
  // Empty: one step per round.
  std::vector<int32_t> round_first_slot;
  // What the round search and the bucket limit charge a relay hop (set by
  // ScheduleBuckets before PackBuckets): the round latency, or, for a
  // schedule searched for steps, the step latency (fanned-out chunks then go
  // zero-copy at any size).
  double hop_latency = 0;
  // The routing-independent bound (plan_bound.h), computed from the cells.
  double routing_bound_seconds = 0;
  std::string routing_bound_term;

  int32_t SrcTensorOf(const Cell& c) const { return maps[c.map].src_tensor; }
  int32_t DstTensorOf(const Cell& c) const { return maps[c.map].dst_tensor; }
  int32_t SlotOf(const BucketRec& b) const {
    return round_first_slot.empty() ? b.round : round_first_slot[b.round] + b.step;
  }
  int32_t NumSlots() const {
    return round_first_slot.empty() ? num_rounds : round_first_slot.back();
  }
  LinkClass Link(int32_t sender, int32_t receiver) const {
    if (sender == receiver) return LinkClass::kLocal;
    return worker_node[sender] == worker_node[receiver] ? LinkClass::kNvlink : LinkClass::kNic;
  }
};

// Stage entry points, in pipeline order.
absl::Status ResolveOptions(const v1::PlanOptions& in, Options* out);
absl::Status IndexWorkers(Work* w);
absl::Status ValidateAndMap(Work* w);  // plan_validate.cc: casts, mappings
// plan_class_cells.cc: holder groups, DstGroups, then the cells of every
// DstGroup, one tensor of each class (plan_classes.h) computed and the
// others' copied from it with their ids translated (`classes` false: all
// computed). `*copied` (optional): the destination tensors whose cells were
// copied.
absl::Status BuildCells(Work* w, bool classes = true, int32_t* copied = nullptr);
// The parts of BuildCells: every source tensor's holder groups
// (plan_holders.cc); the DstGroups; the cells of DstGroups [begin, end)
// (plan_mapping.cc).
absl::Status BuildHolderGroups(Work* w);
// Source tensor `t`'s SourceIndex, built now if it was not (plan_holders.cc).
const SourceIndex& SourceIndexOf(Work* w, int32_t t);
void BuildDstGroups(Work* w);
absl::Status BuildGroupCells(Work* w, int32_t group_begin, int32_t group_end);
// plan_fanout.cc: cells cut into shares / pipelined chunks, relays off when
// one round is the better bound (the data_seconds / one_round_seconds of the
// routing-independent bound, plan_bound.h).
void SplitCellsForRouting(Work* w, double data_seconds, double one_round_seconds);
// The route of one fanned-out chunk (plan_fanout.cc): its receivers (`frags`,
// destination fragments, node of each in `frag_node`) grouped by node in
// order of first appearance, one entry per node and the root node, rotating
// with `turn` (the chunk's number in its DstGroup) so that over the chunks
// every receiver is entry, and every node root, as often.
struct FanRoute {
  std::vector<std::vector<int32_t>> nodes;  // fragments per node
  std::vector<int32_t> entry;               // per node: the fragment that takes the chunk
  int32_t root = 0;                         // the node whose entry gets it from a holder
};
void PlanFanRoute(const std::vector<int32_t>& frags, const std::vector<int32_t>& frag_node,
                  int32_t turn, FanRoute* out);
absl::Status ChooseSources(Work* w);  // plan_sources.cc
// plan_buckets.cc: w->buckets anew, for w->hop_latency.
absl::Status PackBuckets(Work* w);
// What a relay hop behind its data may cost in w's plan: a step where steps
// pay and some relay and the transfer feeding it can go zero-copy (a
// fanned-out chunk: AssignSteps can merge the rounds of its pipeline into
// steps), else a round.
double RelayHopLatency(const Work& w);
absl::Status AssignRounds(Work* w);   // plan_rounds.cc
// plan_steps.cc: consecutive rounds merged into the steps of one round where
// the link model makes that pay (StepsPay) and no barrier is needed.
absl::Status AssignSteps(Work* w);
// plan_steps.cc: buckets, rounds and steps (PackBuckets, AssignRounds,
// AssignSteps). The search charges a relay hop a round; where the relays
// could step (RelayHopLatency below the round latency) it is run again
// charging a step, and the schedule the link model prices lower is kept.
// `check` runs on each packing before its rounds are searched (the plan's
// limits); its error ends the stage.
absl::Status ScheduleBuckets(Work* w, const std::function<absl::Status(const Work&)>& check);
// The link model's makespan of w's schedule (the summary's predicted time).
double ModeledSeconds(const Work& w);
// What the routing bound and the relays-off decision charge a relay hop
// (plan_steps.cc): the step latency where steps pay and some mapping moves
// its bytes uncast (only those can relay zero-copy, hence within a round),
// else the round latency.
double BoundHopLatency(const Work& w);
// plan_emit.cc; `piece_runs`: write regularly stepping plain pieces of a
// bucket as PieceRuns (BuildOptions::emit_piece_runs).
absl::Status Emit(const Work& w, bool summary_only, bool piece_runs, v1::Plan* plan);
// The ids the emitted plan gives buckets (and their seq), reduces and
// quantizes, by index in Work.
struct EmittedIds {
  const std::vector<int32_t>& bucket_id;
  const std::vector<int32_t>& seq;
  const std::vector<int32_t>& reduce_id;
  const std::vector<int32_t>& quant_id;
};
// Every worker's RankPlan (unless summary_only), plan.workers, num_rounds and
// the summary; `pieces` / `relay_pieces` count the emitted buckets' pieces
// (plan_summary.cc).
void EmitRanksAndSummary(const Work& w, const EmittedIds& ids, int64_t pieces, int64_t relay_pieces,
                         bool summary_only, v1::Plan* plan);

// Helpers shared by stages.
// Block fp8 (plan_quant.cc): splits the candidate regions of one DstGroup of
// a quantized tensor (destination coordinates, with their map entry and
// holders) into sender-quantized cells of whole blocks and receiver-quantized
// cells of QuantGroups, and appends them to w->cells.
struct QuantCandidate {
  int32_t map = 0;
  int rank = 0;
  int64_t off[kMaxDims];  // destination coordinates
  int64_t len[kMaxDims];
  std::vector<int32_t> holders;
};
absl::Status EmitQuantCells(Work* w, int32_t dst_group, std::vector<QuantCandidate>* cands);
// Blocks of a destination box of quantized tensor `t` (scale coordinates).
void BlockBoxOf(const CompiledTensor& t, int rank, const int64_t* off, const int64_t* len,
                int64_t* boff, int64_t* blen);
// Wire bytes of one delivery of cell `c` in `wire` (fp8 + aligned scales for
// sender-quantized cells).
int64_t CellWireBytes(const Work& w, const Cell& c, v1::DType wire);
// Byte offset of the scales inside a sender-quantized delivery.
inline int64_t QuantScaleOffset(int64_t elems) { return (elems + 3) / 4 * 4; }

// The dtype that travels: the narrower of the two (cast once, at the side
// that makes the wire narrower); equal sizes travel as the destination dtype.
v1::DType WireDType(v1::DType src, v1::DType dst);
// Source box -> destination box through a mapping entry (out arrays of the
// destination rank).
void SrcToDst(const MapEntry& m, const int64_t* src_off, const int64_t* src_len, int64_t* dst_off,
              int64_t* dst_len);
// Byte offset of element `box_offset` inside fragment `f`.
int64_t ViewByteOffset(const CompiledFragment& f, const int64_t* box_offset, int64_t elem_size);
// Whether a view of `shape` with `strides` is one contiguous row-major run.
bool Contiguous(int rank, const int64_t* shape, const int64_t* strides);
// RESOURCE_EXHAUSTED naming `what`, `count`, `limit`, `flag` and `remedy`
// when a BuildOptions limit (> 0) is exceeded.
inline constexpr char kPiecesFlag[] =
    "wsync-controller --max_plan_pieces, wsyncctl plan --max-pieces";
inline constexpr char kBucketsFlag[] =
    "wsync-controller --max_plan_buckets, wsyncctl plan --max-buckets";
absl::Status CheckPlanLimit(const char* what, int64_t count, int64_t limit, const char* flag,
                            const char* remedy = "raise bucket_bytes or the limit");
// Whether `s` is CheckPlanLimit's refusal over the piece limit (kPiecesFlag).
bool IsPieceLimitRefusal(const absl::Status& s);

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLANNER_INTERNAL_H_
