#include "controller/plan/rank_parts.h"

#include "absl/container/flat_hash_map.h"
#include "controller/plan/plan_arena.h"
#include "controller/plan/plan_views.h"
#include "google/protobuf/arena.h"

namespace wsync::plan {
namespace {

using planner_detail::FieldsOf;
using planner_detail::ViewTable;

// A piece's view in a part: the part's shared one (plan_views.h) where it
// is well formed (as many strides as dims), else a copy of its own.
template <typename SetShared, typename Mutable>
void CopyView(const v1::TensorView& v, ViewTable* views, SetShared set_shared,
              Mutable mutable_view) {
  if (v.shape_size() == v.strides_size()) {
    set_shared(views->Get(FieldsOf(v)));
  } else {
    *mutable_view() = v;
  }
}

// `b` appended to `part`, field by field so that its pieces' views are the
// part's shared ones: a worker's buckets repeat a few views many times
// (its replicas' and relays' pieces), and a deep copy gave every piece two
// views of its own. Every field of Bucket and Piece is copied here
// (RankPartsTest.CopiesEveryFieldOfBucketAndPiece lists them).
void CopyBucket(const v1::Bucket& b, ViewTable* views, v1::Plan* part) {
  v1::Bucket* out = part->add_buckets();
  out->set_id(b.id());
  out->set_sender(b.sender());
  out->set_receiver(b.receiver());
  out->set_round(b.round());
  out->set_bytes(b.bytes());
  out->set_transport(b.transport());
  out->set_zero_copy(b.zero_copy());
  out->set_seq(b.seq());
  out->set_route(b.route());
  out->set_put_phase(b.put_phase());
  out->set_step(b.step());
  // Piece runs (docs/plan-compact.md): whole, as the planner wrote them.
  if (b.runs_size() > 0) *out->mutable_runs() = b.runs();
  out->mutable_pieces()->Reserve(b.pieces_size());
  for (const v1::Piece& x : b.pieces()) {
    v1::Piece* y = out->add_pieces();
    y->set_tensor_name(x.tensor_name());
    if (x.has_src()) {
      CopyView(
          x.src(), views, [y](v1::TensorView* v) { y->unsafe_arena_set_allocated_src(v); },
          [y] { return y->mutable_src(); });
    }
    if (x.has_dst()) {
      CopyView(
          x.dst(), views, [y](v1::TensorView* v) { y->unsafe_arena_set_allocated_dst(v); },
          [y] { return y->mutable_dst(); });
    }
    y->set_bucket_offset(x.bucket_offset());
    y->set_wire_dtype(x.wire_dtype());
    y->set_reduce_id(x.reduce_id());
    y->set_relay(x.relay());
    if (x.quant_block_size() > 0) *y->mutable_quant_block() = x.quant_block();
    y->set_scales_of(x.scales_of());
    y->set_quantize_id(x.quantize_id());
  }
}

}  // namespace

std::vector<RankPart> SplitRankPlans(const v1::Plan& plan) {
  std::vector<RankPart> parts;
  std::vector<v1::Plan*> out;
  std::vector<std::unique_ptr<ViewTable>> views;  // per part, on its arena
  absl::flat_hash_map<int32_t, size_t> index;     // worker -> parts[i]
  for (const v1::RankPlan& rp : plan.ranks()) {
    auto [it, added] = index.try_emplace(rp.worker(), parts.size());
    if (added) {
      std::shared_ptr<google::protobuf::Arena> arena = NewPlanArena();
      v1::Plan* p = google::protobuf::Arena::CreateMessage<v1::Plan>(arena.get());
      p->set_key(plan.key());
      p->set_num_rounds(plan.num_rounds());
      views.push_back(std::make_unique<ViewTable>(arena.get()));
      parts.push_back({rp.worker(), std::shared_ptr<const v1::Plan>(arena, p)});
      out.push_back(p);
    }
    *out[it->second]->add_ranks() = rp;
  }
  auto part_of = [&](int32_t worker) -> int64_t {
    auto it = index.find(worker);
    return it == index.end() ? -1 : static_cast<int64_t>(it->second);
  };
  for (const v1::Bucket& b : plan.buckets()) {
    const int64_t s = part_of(b.sender());
    if (s >= 0) CopyBucket(b, views[s].get(), out[s]);
    const int64_t r = b.receiver() == b.sender() ? -1 : part_of(b.receiver());
    if (r >= 0) CopyBucket(b, views[r].get(), out[r]);
  }
  for (const v1::Reduce& red : plan.reduces()) {
    const int64_t p = part_of(red.worker());
    if (p >= 0) *out[p]->add_reduces() = red;
  }
  for (const v1::Quantize& q : plan.quantizes()) {
    const int64_t p = part_of(q.worker());
    if (p >= 0) *out[p]->add_quantizes() = q;
  }
  for (const v1::RankSummary& rs : plan.summary().ranks()) {
    const int64_t p = part_of(rs.worker());
    if (p >= 0) *out[p]->mutable_summary()->add_ranks() = rs;
  }
  for (v1::Plan* p : out) {
    *p->mutable_workers() = plan.workers();
    *p->mutable_names() = plan.names();
  }
  return parts;
}

}  // namespace wsync::plan
