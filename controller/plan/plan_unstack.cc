// UnstackPlan (plan_stacking.h): the pieces over stacked tensors written as
// their members.
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/plan_pieces.h"
#include "common/status_macros.h"
#include "controller/plan/plan_stacking.h"
#include "controller/plan/plan_views.h"

namespace wsync::plan {
namespace {

using planner_detail::FieldsOf;
using planner_detail::FillView;
using planner_detail::ViewFields;
using planner_detail::ViewTable;

// One side of a piece over a stacked tensor.
struct StackedView {
  const VirtualBuffer* buffer = nullptr;
  int64_t first = 0;  // first member the view covers
  int64_t inner = 0;  // byte offset of the view inside each member
};

class Unstacker {
 public:
  Unstacker(const StackedSides& s, const CompiledSide& src, const CompiledSide& dst,
            v1::Plan* plan)
      : s_(s), src_(src), dst_(dst), plan_(plan), views_(plan->GetArena()) {}

  absl::Status Run();

 private:
  void AppendNames();
  // The stacked buffer a view names, or nullptr.
  const VirtualBuffer* Virtual(const v1::TensorView& v) const;
  absl::StatusOr<StackedView> Locate(const v1::TensorView& v, const char* what) const;
  bool IsStacked(const v1::Piece& p) const {
    return Virtual(p.src()) != nullptr || Virtual(p.dst()) != nullptr;
  }
  absl::Status Expand(const v1::Piece& p, v1::Bucket* b);
  void SetView(const v1::TensorView& v, const StackedView& sv, int64_t member, int32_t name,
               v1::TensorView* (v1::Piece::*mutable_view)(), v1::Piece* out);
  absl::Status RewriteBucket(v1::Bucket* b);
  void FollowMovedPieces();
  void Recount();

  const StackedSides& s_;
  const CompiledSide& src_;
  const CompiledSide& dst_;
  v1::Plan* plan_;
  ViewTable views_;
  std::vector<int32_t> block_base_;  // name block -> its first index in Plan.names
  // Plan.names index -> stacked buffer (per side) or stacked tensor's name block.
  absl::flat_hash_map<int32_t, const VirtualBuffer*> src_virtual_, dst_virtual_;
  absl::flat_hash_map<int32_t, int32_t> tensor_block_;
  // bucket id -> new index of each old plain piece (-1: a stacked one), for
  // buckets whose plain pieces moved.
  absl::flat_hash_map<int64_t, std::vector<int32_t>> moved_;
};

void Unstacker::AppendNames() {
  auto* names = plan_->mutable_names();
  for (int32_t i = 0; i < names->size(); ++i) {
    const std::string& n = names->Get(i);
    if (auto it = s_.src_buffers.find(n); it != s_.src_buffers.end()) src_virtual_[i] = &it->second;
    if (auto it = s_.dst_buffers.find(n); it != s_.dst_buffers.end()) dst_virtual_[i] = &it->second;
    if (auto it = s_.tensor_names.find(n); it != s_.tensor_names.end()) tensor_block_[i] = it->second;
  }
  for (const StackedSides::NameBlock& b : s_.name_blocks) {
    block_base_.push_back(names->size());
    const CompiledSide& side = b.side == v1::SOURCE_BUFFER ? src_ : dst_;
    for (int32_t i : b.index) {
      names->Add()->assign(b.tensors ? src_.tensors[i].name : side.buffer_names[i]);
    }
  }
}

const VirtualBuffer* Unstacker::Virtual(const v1::TensorView& v) const {
  const auto& table = v.side() == v1::SOURCE_BUFFER ? src_virtual_ : dst_virtual_;
  auto it = table.find(v.buffer_name());
  return it == table.end() ? nullptr : it->second;
}

absl::StatusOr<StackedView> Unstacker::Locate(const v1::TensorView& v, const char* what) const {
  StackedView sv;
  sv.buffer = Virtual(v);
  if (sv.buffer == nullptr || v.shape_size() < 1 || v.byte_offset() < 0) {
    return absl::InternalError(absl::StrCat("unstack: a piece's ", what,
                                            " view is not over a stacked tensor"));
  }
  sv.first = v.byte_offset() / sv.buffer->member_bytes;
  sv.inner = v.byte_offset() - sv.first * sv.buffer->member_bytes;
  return sv;
}

// Member `member`'s view: the stacked view without its member dim, in the
// member's own buffer (`name`) at its byte offset.
void Unstacker::SetView(const v1::TensorView& v, const StackedView& sv, int64_t member,
                        int32_t name, v1::TensorView* (v1::Piece::*mutable_view)(),
                        v1::Piece* out) {
  ViewFields f = FieldsOf(v);
  f.buffer_name = name;
  f.byte_offset = sv.buffer->MemberOffset(member) + sv.inner;
  f.rank -= 1;
  f.shape += 1;
  f.strides += 1;
  if (!views_.interning()) return FillView(f, (out->*mutable_view)());
  if (mutable_view == &v1::Piece::mutable_src) {
    out->unsafe_arena_set_allocated_src(views_.Get(f));
  } else {
    out->unsafe_arena_set_allocated_dst(views_.Get(f));
  }
}

// Appends piece p's members to b: runs where names and offsets step
// regularly, plain pieces elsewhere.
absl::Status Unstacker::Expand(const v1::Piece& p, v1::Bucket* b) {
  ASSIGN_OR_RETURN(const StackedView src, Locate(p.src(), "source"));
  ASSIGN_OR_RETURN(const StackedView dst, Locate(p.dst(), "destination"));
  auto tb = tensor_block_.find(p.tensor_name());
  if (src.first != dst.first || p.src().shape(0) != p.dst().shape(0) ||
      tb == tensor_block_.end()) {
    return absl::InternalError(absl::StrCat("unstack: piece of '", plan_->names(p.tensor_name()),
                                            "' in bucket ", b->id(),
                                            " has sides over different members"));
  }
  const int64_t count = p.dst().shape(0);
  int64_t inner_elems = 1;
  for (int d = 1; d < p.dst().shape_size(); ++d) inner_elems *= p.dst().shape(d);
  const int64_t wire = inner_elems * DTypeSize(p.wire_dtype());
  const int32_t tensor_base = block_base_[tb->second];
  const int32_t src_base = block_base_[src.buffer->names];
  const int32_t dst_base = block_base_[dst.buffer->names];
  auto offsets = [&](int64_t m) {
    return std::pair(src.buffer->MemberOffset(m), dst.buffer->MemberOffset(m));
  };
  for (int64_t k = 0; k < count;) {
    const int64_t m = src.first + k;
    int64_t n = 1;  // members in this run
    if (k + 1 < count) {
      const auto [s0, d0] = offsets(m);
      const auto [s1, d1] = offsets(m + 1);
      while (k + n < count) {
        const auto [sn, dn] = offsets(m + n);
        if (sn - s0 != n * (s1 - s0) || dn - d0 != n * (d1 - d0)) break;
        ++n;
      }
    }
    v1::Piece* out;
    if (n == 1) {
      out = b->add_pieces();
    } else {
      v1::PieceRun* run = b->add_runs();
      run->set_count(static_cast<int32_t>(n));
      run->set_tensor_name_step(1);
      run->set_src_buffer_step(1);
      run->set_dst_buffer_step(1);
      run->set_src_byte_step(offsets(m + 1).first - offsets(m).first);
      run->set_dst_byte_step(offsets(m + 1).second - offsets(m).second);
      run->set_bucket_step(wire);
      out = run->mutable_first();
    }
    out->set_tensor_name(tensor_base + static_cast<int32_t>(m));
    SetView(p.src(), src, m, src_base + static_cast<int32_t>(m), &v1::Piece::mutable_src, out);
    SetView(p.dst(), dst, m, dst_base + static_cast<int32_t>(m), &v1::Piece::mutable_dst, out);
    out->set_bucket_offset(p.bucket_offset() + k * wire);
    out->set_wire_dtype(p.wire_dtype());
    out->set_relay(p.relay());
    k += n;
  }
  return absl::OkStatus();
}

absl::Status Unstacker::RewriteBucket(v1::Bucket* b) {
  auto* pieces = b->mutable_pieces();
  auto* runs = b->mutable_runs();
  bool any = false;
  for (const v1::Piece& p : *pieces) any = any || IsStacked(p);
  for (const v1::PieceRun& r : *runs) any = any || IsStacked(r.first());
  if (!any) return absl::OkStatus();
  // Unstacked plain pieces first, in order; then the stacked ones' members.
  const int plain = pieces->size(), old_runs = runs->size();
  std::vector<int32_t> moved(plain, -1);
  int kept = 0;
  for (int i = 0; i < plain; ++i) {
    if (IsStacked(pieces->Get(i))) continue;
    if (kept != i) pieces->SwapElements(i, kept);
    moved[i] = kept++;
  }
  int kept_runs = 0;
  for (int i = 0; i < old_runs; ++i) {
    if (IsStacked(runs->Get(i).first())) continue;
    if (kept_runs != i) runs->SwapElements(i, kept_runs);
    ++kept_runs;
  }
  for (int i = kept; i < plain; ++i) RETURN_IF_ERROR(Expand(pieces->Get(i), b));
  for (int i = kept_runs; i < old_runs; ++i) {
    // A run of pieces over stacked tensors (the emitter's): each member.
    v1::Bucket one;
    *one.add_runs() = runs->Get(i);
    RETURN_IF_ERROR(ForEachPiece(one, [&](int64_t, const v1::Piece& p) { return Expand(p, b); }));
  }
  pieces->DeleteSubrange(kept, plain - kept);
  runs->DeleteSubrange(kept_runs, old_runs - kept_runs);
  if (b->runs_size() > 0 || b->pieces_size() > 1) b->set_zero_copy(false);
  bool shifted = false;
  for (int i = 0; i < plain; ++i) shifted = shifted || (moved[i] >= 0 && moved[i] != i);
  if (shifted) {
    for (v1::Piece& p : *pieces) {
      if (p.scales_of() > 0) p.set_scales_of(moved[p.scales_of() - 1] + 1);
    }
    moved_.emplace(b->id(), std::move(moved));
  }
  return absl::OkStatus();
}

void Unstacker::FollowMovedPieces() {
  if (moved_.empty()) return;
  auto follow = [&](int64_t bucket, int32_t* piece) {
    auto it = moved_.find(bucket);
    if (it != moved_.end() && *piece >= 0 && *piece < static_cast<int32_t>(it->second.size())) {
      *piece = it->second[*piece];
    }
  };
  for (v1::Reduce& r : *plan_->mutable_reduces()) {
    for (v1::ReduceInput& in : *r.mutable_inputs()) {
      int32_t p = in.piece();
      follow(in.bucket(), &p);
      in.set_piece(p);
    }
  }
  for (v1::Quantize& q : *plan_->mutable_quantizes()) {
    for (v1::QuantizeInput& in : *q.mutable_inputs()) {
      int32_t p = in.piece();
      follow(in.bucket(), &p);
      in.set_piece(p);
    }
  }
}

void Unstacker::Recount() {
  int64_t pieces = 0, relays = 0;
  for (const v1::Bucket& b : plan_->buckets()) {
    for (const v1::Piece& p : b.pieces()) relays += p.relay() ? 1 : 0;
    pieces += b.pieces_size();
    for (const v1::PieceRun& r : b.runs()) {
      pieces += r.count();
      relays += r.first().relay() ? r.count() : 0;
    }
  }
  plan_->mutable_summary()->set_num_pieces(pieces);
  plan_->mutable_summary()->set_num_relay_pieces(relays);
}

absl::Status Unstacker::Run() {
  AppendNames();
  for (v1::Bucket& b : *plan_->mutable_buckets()) RETURN_IF_ERROR(RewriteBucket(&b));
  FollowMovedPieces();
  Recount();
  return absl::OkStatus();
}

}  // namespace

absl::Status UnstackPlan(const StackedSides& stacked, const CompiledSide& source,
                         const CompiledSide& destination, v1::Plan* plan) {
  if (stacked.groups == 0) return absl::OkStatus();
  return Unstacker(stacked, source, destination, plan).Run();
}

}  // namespace wsync::plan
