#include "worker/exec/direct_parts.h"

#include <algorithm>
#include <limits>

namespace wsync::exec {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

int64_t SaturatingAdd(int64_t a, int64_t b) { return b > kMax - a ? kMax : a + b; }

}  // namespace

std::vector<int32_t> CutDirectParts(absl::Span<const int64_t> bytes, const DirectPartCut& cut) {
  auto size_of = [&](size_t i) { return std::max<int64_t>(bytes[i], 0); };
  int64_t total = 0;
  for (size_t i = 0; i < bytes.size(); ++i) total = SaturatingAdd(total, size_of(i));
  int64_t parts = std::clamp<int64_t>(cut.max_parts, 1, kMaxDirectParts);
  if (cut.min_part_bytes > 0)
    parts = std::min(parts, std::max<int64_t>(1, total / cut.min_part_bytes));
  // The tail, from the end: each part's first bucket, last part first.
  std::vector<size_t> tail_starts;
  size_t body_end = bytes.size();
  int64_t body_bytes = total;
  if (cut.tail_ratio > 1) {
    int64_t target = std::max<int64_t>(cut.min_part_bytes, 1);
    while (static_cast<int64_t>(tail_starts.size()) + 1 < parts) {
      size_t start = body_end;
      int64_t part = 0;
      while (start > 0 && part < target) part = SaturatingAdd(part, size_of(--start));
      if (start == 0) break;  // the buckets before keep at least one
      const int64_t rest = body_bytes - part;
      const int64_t body_parts = parts - static_cast<int64_t>(tail_starts.size()) - 1;
      if (part >= rest / body_parts) break;  // no smaller than an equal part before it
      tail_starts.push_back(start);
      body_end = start;
      body_bytes = rest;
      target = part > kMax / cut.tail_ratio ? kMax : part * cut.tail_ratio;
    }
  }
  // The body: parts of about equal bytes (as landing parts are).
  const int64_t body_parts = parts - static_cast<int64_t>(tail_starts.size());
  const int64_t step = std::max<int64_t>(1, body_bytes / body_parts);
  std::vector<int32_t> out;
  out.reserve(bytes.size());
  int64_t run = 0;
  int32_t k = 0;
  for (size_t i = 0; i < body_end; ++i) {
    out.push_back(k);
    run = SaturatingAdd(run, size_of(i));
    if (k + 1 < body_parts && run / step >= k + 1) ++k;
  }
  // The tail's parts follow the body's last (k may have moved past it).
  if (!out.empty()) k = out.back();
  for (auto it = tail_starts.rbegin(); it != tail_starts.rend(); ++it) {
    ++k;
    const size_t end = it + 1 == tail_starts.rend() ? bytes.size() : *(it + 1);
    for (size_t i = *it; i < end; ++i) out.push_back(k);
  }
  return out;
}

}  // namespace wsync::exec
