#include "worker/backends/cuda/put_list.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/status_macros.h"
#include "worker/plane/data_ops.h"
#include "worker/plane/put_order.h"

namespace wsync::cuda {

void PutList::AddCopy(const PutCopy& copy, int peer) {
  Entry e;
  e.is_copy = true;
  e.copy = copy;
  e.peer = peer;
  e.bytes = static_cast<int64_t>(copy.width * copy.height);
  entries_.push_back(e);
}

void PutList::AddRequest(const PutRequest& request, int peer) {
  Entry e;
  e.request = request;
  e.peer = peer;
  int64_t elements = request.n > 0 ? 1 : 0;
  for (int d = 0; d < request.n; ++d) elements *= request.shape[d];
  e.bytes = elements * DTypeSize(request.dst_dtype);
  entries_.push_back(e);
}

std::vector<int> PutList::peers() const {
  std::set<int> seen;
  for (const Entry& e : entries_) seen.insert(e.peer);
  return std::vector<int>(seen.begin(), seen.end());
}

void PutList::Cut(const Entry& e, int64_t max_part_bytes, std::vector<Entry>* out) {
  if (e.is_copy) {
    const PutCopy& c = e.copy;
    const bool rows = c.height > 1;
    const int64_t units = static_cast<int64_t>(rows ? c.height : c.width);
    const int64_t unit_bytes = static_cast<int64_t>(rows ? c.width : 1);
    const plane::PartCut cut = plane::CutIntoParts(units, unit_bytes, max_part_bytes);
    for (int64_t k = 0; k < cut.parts; ++k) {
      const int64_t first = k * cut.units_per_part;
      const int64_t count = std::min(cut.units_per_part, units - first);
      Entry part = e;
      if (rows) {
        part.copy.src = static_cast<const char*>(c.src) + first * c.src_pitch;
        part.copy.dst = static_cast<char*>(c.dst) + first * c.dst_pitch;
        part.copy.height = static_cast<size_t>(count);
      } else {
        part.copy.src = static_cast<const char*>(c.src) + first;
        part.copy.dst = static_cast<char*>(c.dst) + first;
        part.copy.width = static_cast<size_t>(count);
      }
      part.bytes = static_cast<int64_t>(part.copy.width * part.copy.height);
      out->push_back(part);
    }
    return;
  }
  const PutRequest& r = e.request;
  const int64_t rows = r.n > 0 ? r.shape[0] : 0;
  const int64_t row_bytes = rows > 0 ? e.bytes / rows : 0;
  const plane::PartCut cut = plane::CutIntoParts(rows, row_bytes, max_part_bytes);
  if (cut.parts == 1) {
    out->push_back(e);
    return;
  }
  const int64_t src_row = r.src_strides[0] * DTypeSize(r.src_dtype);
  const int64_t dst_row = r.dst_strides[0] * DTypeSize(r.dst_dtype);
  for (int64_t k = 0; k < cut.parts; ++k) {
    const int64_t first = k * cut.units_per_part;
    Entry part = e;
    part.request.src = static_cast<const char*>(r.src) + first * src_row;
    part.request.dst = static_cast<const char*>(r.dst) + first * dst_row;
    part.request.shape[0] = std::min(cut.units_per_part, rows - first);
    part.bytes = part.request.shape[0] * row_bytes;
    out->push_back(part);
  }
}

absl::Status PutList::EmitOne(const Entry& e, PieceTable* table, std::vector<PutCopy>* copies,
                              int64_t* copy_bytes) {
  if (e.is_copy) {
    copies->push_back(e.copy);
    *copy_bytes += e.bytes;
    return absl::OkStatus();
  }
  const PutRequest& r = e.request;
  char label[32];
  snprintf(label, sizeof(label), "put item %zu", r.item);
  return exec::TagItem(
      table->AddCopy(ViewRef{r.src, r.src_dtype, r.src_strides},
                     ViewRef{r.dst, r.dst_dtype, r.dst_strides}, r.shape, r.n, label),
      r.item);
}

absl::Status PutList::Emit(int self, int64_t max_part_bytes, PieceTable* table,
                           std::vector<PutCopy>* copies, int64_t* copy_bytes) const {
  const std::vector<int> peers = this->peers();
  if (max_part_bytes <= 0 || peers.size() < 2) {
    for (const Entry& e : entries_) RETURN_IF_ERROR(EmitOne(e, table, copies, copy_bytes));
    return absl::OkStatus();
  }
  std::vector<Entry> parts;
  for (const Entry& e : entries_) Cut(e, max_part_bytes, &parts);
  std::vector<plane::PutShare> shares;
  shares.reserve(parts.size());
  for (const Entry& p : parts) shares.push_back({p.peer, p.bytes});
  const int n = static_cast<int>(peers.size());
  const int first_peer = peers[((self % n) + n) % n];
  for (size_t i : plane::InterleaveByPeer(shares, first_peer)) {
    RETURN_IF_ERROR(EmitOne(parts[i], table, copies, copy_bytes));
  }
  return absl::OkStatus();
}

}  // namespace wsync::cuda
