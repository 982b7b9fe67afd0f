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

// A row of members written back: members [m, m + n) of the stacked tensor,
// at bucket position k of the piece, their byte offsets stepping regularly.
struct MemberRow {
  int64_t m = 0, k = 0, n = 0;
  int64_t src_offset = 0, dst_offset = 0;  // of member m
  int64_t src_step = 0, dst_step = 0;      // between members (0 when n == 1)
};

// Rows of equal shape whose starts step regularly, written as one PieceRun
// (rows x members), a one-row run or a plain piece.
struct RowBlock {
  MemberRow first;
  int64_t rows = 1;
  int64_t m_step = 0, k_step = 0, src_step = 0, dst_step = 0;  // between rows

  bool Extends(const MemberRow& r) const {
    if (r.n != first.n || r.src_step != first.src_step || r.dst_step != first.dst_step) {
      return false;
    }
    const int64_t dm = r.m - first.m, dk = r.k - first.k;
    const int64_t ds = r.src_offset - first.src_offset, dd = r.dst_offset - first.dst_offset;
    if (rows == 1) return true;
    return dm == rows * m_step && dk == rows * k_step && ds == rows * src_step &&
           dd == rows * dst_step;
  }
  void Add(const MemberRow& r) {
    if (rows == 1) {
      m_step = r.m - first.m;
      k_step = r.k - first.k;
      src_step = r.src_offset - first.src_offset;
      dst_step = r.dst_offset - first.dst_offset;
    }
    ++rows;
  }
};

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
    return (p.has_src() && Virtual(p.src()) != nullptr) ||
           (p.has_dst() && Virtual(p.dst()) != nullptr);
  }
  // A run is stacked if its members are (INTERNAL if only some are).
  absl::StatusOr<bool> IsStackedRun(const v1::PieceRun& r, int64_t bucket) const;
  // Plan.names indices of a stacked piece's member 0: tensor, buffers.
  struct Names {
    int32_t tensor = 0, src = 0, dst = 0;
  };
  absl::Status Expand(const v1::Piece& p, v1::Bucket* b);
  void Emit(const v1::Piece& p, const StackedView& src, const StackedView& dst,
            const Names& names, int64_t wire, const RowBlock& block, v1::Bucket* b);
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
// regularly (rows of runs where the rows do too), plain pieces elsewhere.
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
  const Names names{block_base_[tb->second], block_base_[src.buffer->names],
                    block_base_[dst.buffer->names]};
  RowBlock block;
  bool open = false;
  for (int64_t k = 0; k < count;) {
    MemberRow row;
    row.m = src.first + k;
    row.k = k;
    row.src_offset = src.buffer->MemberOffset(row.m);
    row.dst_offset = dst.buffer->MemberOffset(row.m);
    row.n = 1;  // a row of one member only at the piece's end
    if (k + 1 < count) {
      row.src_step = src.buffer->MemberOffset(row.m + 1) - row.src_offset;
      row.dst_step = dst.buffer->MemberOffset(row.m + 1) - row.dst_offset;
      while (k + row.n < count &&
             src.buffer->MemberOffset(row.m + row.n) - row.src_offset == row.n * row.src_step &&
             dst.buffer->MemberOffset(row.m + row.n) - row.dst_offset == row.n * row.dst_step) {
        ++row.n;
      }
    }
    k += row.n;
    if (open && block.Extends(row)) {
      block.Add(row);
      continue;
    }
    if (open) Emit(p, src, dst, names, wire, block, b);
    block = RowBlock{row};
    open = true;
  }
  if (open) Emit(p, src, dst, names, wire, block, b);
  return absl::OkStatus();
}

void Unstacker::Emit(const v1::Piece& p, const StackedView& src, const StackedView& dst,
                     const Names& names, int64_t wire, const RowBlock& block, v1::Bucket* b) {
  const MemberRow& r = block.first;
  v1::Piece* out;
  if (r.n == 1) {  // the piece's last member alone (a block of such rows has one)
    out = b->add_pieces();
  } else {
    v1::PieceRun* run = b->add_runs();
    run->set_count(static_cast<int32_t>(r.n));
    run->set_tensor_name_step(1);
    run->set_src_buffer_step(1);
    run->set_dst_buffer_step(1);
    run->set_src_byte_step(r.src_step);
    run->set_dst_byte_step(r.dst_step);
    run->set_bucket_step(wire);
    if (block.rows > 1) {
      const int32_t outer = static_cast<int32_t>(block.m_step);
      run->set_outer_count(static_cast<int32_t>(block.rows));
      run->set_outer_tensor_name_step(outer);
      run->set_outer_src_buffer_step(outer);
      run->set_outer_dst_buffer_step(outer);
      run->set_outer_src_byte_step(block.src_step);
      run->set_outer_dst_byte_step(block.dst_step);
      run->set_outer_bucket_step(block.k_step * wire);
    }
    out = run->mutable_first();
  }
  out->set_tensor_name(names.tensor + static_cast<int32_t>(r.m));
  SetView(p.src(), src, r.m, names.src + static_cast<int32_t>(r.m), &v1::Piece::mutable_src, out);
  SetView(p.dst(), dst, r.m, names.dst + static_cast<int32_t>(r.m), &v1::Piece::mutable_dst, out);
  out->set_bucket_offset(p.bucket_offset() + r.k * wire);
  out->set_wire_dtype(p.wire_dtype());
  out->set_relay(p.relay());
}

absl::StatusOr<bool> Unstacker::IsStackedRun(const v1::PieceRun& r, int64_t bucket) const {
  const v1::Piece& f = r.first();
  const auto& src_table = f.src().side() == v1::SOURCE_BUFFER ? src_virtual_ : dst_virtual_;
  const auto& dst_table = f.dst().side() == v1::SOURCE_BUFFER ? src_virtual_ : dst_virtual_;
  int64_t stacked = 0;
  for (int64_t j = 0; j < RunRows(r); ++j) {  // names in range: CheckPieceRuns
    for (int64_t k = 0; k < r.count(); ++k) {
      const int64_t src = f.src().buffer_name() + j * r.outer_src_buffer_step() +
                          k * r.src_buffer_step();
      const int64_t dst = f.dst().buffer_name() + j * r.outer_dst_buffer_step() +
                          k * r.dst_buffer_step();
      stacked += (f.has_src() && src_table.contains(static_cast<int32_t>(src))) ||
                 (f.has_dst() && dst_table.contains(static_cast<int32_t>(dst)));
    }
  }
  if (stacked != 0 && stacked != RunMembers(r)) {
    return absl::InternalError(absl::StrCat("unstack: bucket ", bucket,
                                            " has a run of stacked and other pieces"));
  }
  return stacked != 0;
}

absl::Status Unstacker::RewriteBucket(v1::Bucket* b) {
  auto* pieces = b->mutable_pieces();
  auto* runs = b->mutable_runs();
  bool any = false;
  for (const v1::Piece& p : *pieces) any = any || IsStacked(p);
  std::vector<bool> stacked_run(runs->size());
  for (int i = 0; i < runs->size(); ++i) {
    ASSIGN_OR_RETURN(const bool stacked, IsStackedRun(runs->Get(i), b->id()));
    stacked_run[i] = stacked;
    any = any || stacked;
  }
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
    if (stacked_run[i]) continue;
    if (kept_runs != i) {
      runs->SwapElements(i, kept_runs);
      stacked_run[kept_runs] = false;  // [kept_runs, i) were all stacked
      stacked_run[i] = true;
    }
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
  if (b->zero_copy() && (b->runs_size() > 0 || b->pieces_size() != 1)) {
    // A zero-copy piece is one contiguous member: a stacked view over two
    // members is never contiguous (plan_stacking.h).
    return absl::InternalError(absl::StrCat("unstack: zero-copy bucket ", b->id(),
                                            " wrote back to more than one piece"));
  }
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
      pieces += RunMembers(r);
      relays += r.first().relay() ? RunMembers(r) : 0;
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
