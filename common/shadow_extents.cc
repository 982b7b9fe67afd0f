#include "common/shadow_extents.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/plan_names.h"

namespace wsync {
namespace {

constexpr int64_t kMaxExtent = int64_t{1} << 56;

// One past the last byte `v` reaches (0 for an empty view).
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
    last += (n - 1) * stride;
    if (last > kMaxExtent) return absl::InvalidArgumentError("view extent overflows");
  }
  return v.byte_offset() + (last + 1) * elem;
}

absl::Status Add(const v1::Plan& plan, const v1::TensorView& v,
                 std::map<std::string, int64_t>& out) {
  if (v.side() != v1::DESTINATION_BUFFER) return absl::OkStatus();
  auto name = PlanName(plan, v.buffer_name(), "destination view buffer");
  if (!name.ok()) return name.status();
  auto end = ViewEnd(v);
  if (!end.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shadow extent of buffer '", **name, "': ", end.status().message()));
  }
  int64_t& e = out[**name];
  e = std::max(e, *end);
  return absl::OkStatus();
}

// Extents by worker for every worker (`only` < 0) or worker `only`.
absl::StatusOr<std::map<int32_t, std::map<std::string, int64_t>>> Collect(const v1::Plan& plan,
                                                                          int32_t only) {
  std::map<int32_t, std::map<std::string, int64_t>> out;
  auto wanted = [only](int32_t w) { return only < 0 || w == only; };
  for (const v1::Bucket& b : plan.buckets()) {
    if (!wanted(b.receiver())) continue;
    for (const v1::Piece& p : b.pieces()) {
      if (p.reduce_id() != 0 || p.quantize_id() != 0 || !p.has_dst()) continue;
      if (absl::Status s = Add(plan, p.dst(), out[b.receiver()]); !s.ok()) return s;
    }
  }
  for (const v1::Reduce& r : plan.reduces()) {
    if (!wanted(r.worker())) continue;
    if (absl::Status s = Add(plan, r.dst(), out[r.worker()]); !s.ok()) return s;
  }
  for (const v1::Quantize& q : plan.quantizes()) {
    if (!wanted(q.worker())) continue;
    if (absl::Status s = Add(plan, q.dst(), out[q.worker()]); !s.ok()) return s;
    if (absl::Status s = Add(plan, q.scale_dst(), out[q.worker()]); !s.ok()) return s;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, int64_t>> ShadowExtents(const v1::Plan& plan, int32_t worker) {
  if (worker < 0) return std::map<std::string, int64_t>();
  auto all = Collect(plan, worker);
  if (!all.ok()) return all.status();
  auto it = all->find(worker);
  if (it == all->end()) return std::map<std::string, int64_t>();
  return std::move(it->second);
}

absl::StatusOr<std::map<int32_t, int64_t>> ShadowBytesByWorker(const v1::Plan& plan) {
  auto all = Collect(plan, -1);
  if (!all.ok()) return all.status();
  std::map<int32_t, int64_t> out;
  for (const auto& [worker, extents] : *all) {
    int64_t sum = 0;
    for (const auto& [name, bytes] : extents) sum += bytes;
    if (!extents.empty()) out[worker] = sum;
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
