#include "common/shadow_extents.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/plan_names.h"
#include "common/plan_pieces.h"

namespace wsync {
namespace {

constexpr int64_t kMaxExtent = int64_t{1} << 56;

// One past the last byte `v` reaches (0 for an empty view). Every product
// and sum is checked: a plan's view crosses a trust boundary.
absl::StatusOr<int64_t> ViewEnd(const v1::TensorView& v) {
  const int64_t elem = DTypeSize(v.dtype());
  if (elem <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("view of unknown dtype ", v.dtype()));
  }
  if (v.byte_offset() < 0 || v.byte_offset() > kMaxExtent) {
    return absl::InvalidArgumentError(absl::StrCat("view at byte offset ", v.byte_offset()));
  }
  int64_t last = 0;  // element offset of the last element
  for (int d = 0; d < v.shape_size(); ++d) {
    const int64_t n = v.shape(d);
    const int64_t stride = d < v.strides_size() ? v.strides(d) : 0;
    if (n < 0 || stride < 0 || n > kMaxExtent || stride > kMaxExtent) {
      return absl::InvalidArgumentError(
          absl::StrCat("view with dim ", d, " of size ", n, " and stride ", stride));
    }
    if (n == 0) return 0;
  }
  for (int d = 0; d < v.shape_size(); ++d) {
    const int64_t stride = d < v.strides_size() ? v.strides(d) : 0;
    int64_t step = 0;
    if (__builtin_mul_overflow(v.shape(d) - 1, stride, &step) ||
        __builtin_add_overflow(last, step, &last) || last > kMaxExtent) {
      return absl::InvalidArgumentError(absl::StrCat(
          "view extent overflows: dim ", d, " of size ", v.shape(d), " and stride ", stride,
          " reaches past element ", kMaxExtent, " (byte offset ", v.byte_offset(), ")"));
    }
  }
  int64_t end = 0;
  if (__builtin_add_overflow(last, 1, &end) || __builtin_mul_overflow(end, elem, &end) ||
      __builtin_add_overflow(end, v.byte_offset(), &end)) {
    return absl::InvalidArgumentError(absl::StrCat("view extent overflows: ", last + 1,
                                                   " elements of ", elem, " bytes at byte offset ",
                                                   v.byte_offset()));
  }
  return end;
}

using Writes = std::map<std::string, BufferWrites>;

// Adds `v` to `out` (with the view itself when `views`).
absl::Status Add(const v1::Plan& plan, const v1::TensorView& v, bool views, Writes& out) {
  if (v.side() != v1::DESTINATION_BUFFER) return absl::OkStatus();
  auto name = PlanName(plan, v.buffer_name(), "destination view buffer");
  if (!name.ok()) return name.status();
  auto end = ViewEnd(v);
  if (!end.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shadow extent of buffer '", **name, "': ", end.status().message()));
  }
  BufferWrites& w = out[**name];
  w.extent = std::max(w.extent, *end);
  if (views && *end > 0) w.views.push_back(v);
  return absl::OkStatus();
}

// Per receiver: the runs of the buckets it receives checked, and their
// members bounded by kMaxRunMembers per receiver (what that worker binds of
// its part), not per plan: a stacked plan's runs stand for ~100 M pieces in
// all, ~1-2 M per worker.
absl::Status CheckReceivedRuns(const v1::Plan& plan, const v1::Bucket& b,
                               absl::flat_hash_map<int32_t, int64_t>& members) {
  if (b.runs_size() == 0) return absl::OkStatus();
  if (absl::Status s = CheckPieceRuns(b, plan.names_size()); !s.ok()) return s;
  int64_t& m = members[b.receiver()];
  for (int i = 0; i < b.runs_size(); ++i) {
    const int64_t n = RunMembers(b.runs(i));
    if (n > kMaxRunMembers - m) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", b.id(), " run ", i, ": the runs worker ", b.receiver(),
          " receives stand for more than ", kMaxRunMembers, " pieces"));
    }
    m += n;
  }
  return absl::OkStatus();
}

// Extents by Plan.names index, resolved to names once (ExtentsByName).
using ExtentsByName = absl::flat_hash_map<int32_t, int64_t>;

// The destination extents of run `r`'s members (no views kept): members
// differ in names and offsets only, so one view extent serves them all.
absl::Status AddRunExtents(const v1::PieceRun& r, ExtentsByName& out) {
  const v1::TensorView& d = r.first().dst();
  if (d.side() != v1::DESTINATION_BUFFER) return absl::OkStatus();
  auto end = ViewEnd(d);
  if (!end.ok()) return end.status();
  const int64_t span = *end == 0 ? -1 : *end - d.byte_offset();  // -1: empty, extent 0
  for (int64_t j = 0; j < RunRows(r); ++j) {
    for (int64_t k = 0; k < r.count(); ++k) {  // in range: CheckPieceRuns
      const int32_t name = static_cast<int32_t>(d.buffer_name() + j * r.outer_dst_buffer_step() +
                                                k * r.dst_buffer_step());
      const int64_t offset =
          d.byte_offset() + j * r.outer_dst_byte_step() + k * r.dst_byte_step();
      if (offset > kMaxExtent) {
        return absl::InvalidArgumentError(absl::StrCat("view at byte offset ", offset));
      }
      int64_t& e = out[name];
      e = std::max(e, span < 0 ? 0 : offset + span);
    }
  }
  return absl::OkStatus();
}

// Writes by worker for every worker (`only` < 0) or worker `only`; the views
// themselves only with `views`.
absl::StatusOr<std::map<int32_t, Writes>> Collect(const v1::Plan& plan, int32_t only, bool views) {
  std::map<int32_t, Writes> out;
  std::map<int32_t, ExtentsByName> run_extents;  // !views: runs' extents by name index
  absl::flat_hash_map<int32_t, int64_t> members;
  auto wanted = [only](int32_t w) { return only < 0 || w == only; };
  for (const v1::Bucket& b : plan.buckets()) {
    if (!wanted(b.receiver())) continue;
    if (absl::Status s = CheckReceivedRuns(plan, b, members); !s.ok()) return s;
    Writes& writes = out[b.receiver()];
    for (const v1::Piece& p : b.pieces()) {
      if (p.reduce_id() != 0 || p.quantize_id() != 0 || !p.has_dst()) continue;
      if (absl::Status s = Add(plan, p.dst(), views, writes); !s.ok()) return s;
    }
    for (const v1::PieceRun& r : b.runs()) {  // no reduce or quantize inputs
      if (!views) {
        if (absl::Status s = AddRunExtents(r, run_extents[b.receiver()]); !s.ok()) return s;
        continue;
      }
      v1::Bucket one;
      *one.add_runs() = r;
      absl::Status s = ForEachPiece(
          one, [&](int64_t, const v1::Piece& p) { return Add(plan, p.dst(), views, writes); });
      if (!s.ok()) return s;
    }
  }
  for (const auto& [worker, extents] : run_extents) {
    for (const auto& [index, end] : extents) {
      auto name = PlanName(plan, index, "destination view buffer");
      if (!name.ok()) return name.status();
      BufferWrites& w = out[worker][**name];
      w.extent = std::max(w.extent, end);
    }
  }
  for (const v1::Reduce& r : plan.reduces()) {
    if (!wanted(r.worker())) continue;
    if (absl::Status s = Add(plan, r.dst(), views, out[r.worker()]); !s.ok()) return s;
  }
  for (const v1::Quantize& q : plan.quantizes()) {
    if (!wanted(q.worker())) continue;
    if (absl::Status s = Add(plan, q.dst(), views, out[q.worker()]); !s.ok()) return s;
    if (absl::Status s = Add(plan, q.scale_dst(), views, out[q.worker()]); !s.ok()) return s;
  }
  return out;
}

std::map<std::string, int64_t> ExtentsOf(const Writes& writes) {
  std::map<std::string, int64_t> out;
  for (const auto& [name, w] : writes) out[name] = w.extent;
  return out;
}

}  // namespace

bool StagesShadow(const std::map<std::string, int64_t>& extents) {
  for (const auto& [name, bytes] : extents) {
    if (bytes > 0) return true;
  }
  return false;
}

absl::StatusOr<std::map<std::string, int64_t>> ShadowExtents(const v1::Plan& plan, int32_t worker) {
  if (worker < 0) return std::map<std::string, int64_t>();
  auto all = Collect(plan, worker, /*views=*/false);
  if (!all.ok()) return all.status();
  auto it = all->find(worker);
  if (it == all->end()) return std::map<std::string, int64_t>();
  return ExtentsOf(it->second);
}

absl::StatusOr<std::map<std::string, BufferWrites>> ShadowWrites(const v1::Plan& plan,
                                                                 int32_t worker) {
  if (worker < 0) return Writes();
  auto all = Collect(plan, worker, /*views=*/true);
  if (!all.ok()) return all.status();
  auto it = all->find(worker);
  if (it == all->end()) return Writes();
  Writes out;
  for (auto& [name, w] : it->second) {
    if (w.extent > 0) out.emplace(name, std::move(w));
  }
  return out;
}

absl::StatusOr<std::map<int32_t, int64_t>> ShadowBytesByWorker(const v1::Plan& plan) {
  auto all = Collect(plan, -1, /*views=*/false);
  if (!all.ok()) return all.status();
  std::map<int32_t, int64_t> out;
  for (const auto& [worker, writes] : *all) {
    const std::map<std::string, int64_t> extents = ExtentsOf(writes);
    if (!StagesShadow(extents)) continue;
    int64_t sum = 0;
    for (const auto& [name, bytes] : extents) sum += bytes;
    out[worker] = sum;
  }
  return out;
}

absl::StatusOr<int64_t> ShadowBytes(const v1::Plan& plan, int32_t worker) {
  auto extents = ShadowExtents(plan, worker);
  if (!extents.ok()) return extents.status();
  int64_t sum = 0;
  for (const auto& [name, bytes] : *extents) sum += bytes;
  return sum;
}

}  // namespace wsync
