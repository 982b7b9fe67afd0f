#include "worker/plane/data_ops.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/chunk_hash.h"
#include "common/status_macros.h"
#include "worker/plane/wire_hash.h"

namespace wsync::exec {

int64_t StridedView::num_elements() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool StridedView::contiguous() const {
  if (num_elements() <= 1) return true;
  return ndim == 1 && strides[0] == 1;
}

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = other.data_;
    bytes_ = other.bytes_;
    free_ = std::move(other.free_);
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.free_ = nullptr;
  }
  return *this;
}

void StagingBuffer::Reset() {
  if (data_ != nullptr && free_) free_(data_);
  data_ = nullptr;
  bytes_ = 0;
  free_ = nullptr;
}

absl::StatusOr<StridedView> MakeStridedView(void* data, DType dtype,
                                            absl::Span<const int64_t> shape,
                                            absl::Span<const int64_t> strides) {
  if (shape.size() != strides.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("view has ", shape.size(), " dims but ", strides.size(), " strides"));
  }
  if (shape.size() > static_cast<size_t>(kMaxViewDims)) {
    return absl::InvalidArgumentError(absl::StrCat("view shape [", absl::StrJoin(shape, ","),
                                                   "] has more than ", kMaxViewDims, " dims"));
  }
  StridedView v;
  v.data = data;
  v.dtype = dtype;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0 || strides[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative size or stride in view shape [",
                                                     absl::StrJoin(shape, ","), "] strides [",
                                                     absl::StrJoin(strides, ","), "]"));
    }
    v.shape[d] = shape[d];
    v.strides[d] = strides[d];
  }
  v.ndim = static_cast<int32_t>(shape.size());
  if (v.ndim == 0) {
    v.ndim = 1;
    v.shape[0] = 1;
    v.strides[0] = 1;
  }
  return v;
}

void CoalesceViews(absl::Span<StridedView* const> views) {
  if (views.empty()) return;
  const StridedView& first = *views[0];
  const int ndim = first.ndim;
  bool empty = false;
  for (int d = 0; d < ndim; ++d) empty |= first.shape[d] == 0;
  if (empty) {
    for (StridedView* v : views) {
      v->ndim = 1;
      v->shape[0] = 0;
      v->strides[0] = 1;
    }
    return;
  }
  // Keep the non-unit dims, then merge from the outside in: a dim folds into
  // the previous kept one when every view steps exactly over it.
  int kept[kMaxViewDims];
  int nkept = 0;
  for (int d = 0; d < ndim; ++d) {
    if (first.shape[d] != 1) kept[nkept++] = d;
  }
  bool merge[kMaxViewDims] = {};
  for (int k = 1; k < nkept; ++k) {
    merge[k] = true;
    for (const StridedView* w : views) {
      merge[k] = merge[k] && w->strides[kept[k - 1]] == w->shape[kept[k]] * w->strides[kept[k]];
    }
  }
  for (StridedView* v : views) {
    StridedView out = *v;
    int n = 0;
    for (int k = 0; k < nkept; ++k) {
      const int d = kept[k];
      if (merge[k]) {
        out.shape[n - 1] *= v->shape[d];
        out.strides[n - 1] = v->strides[d];
      } else {
        out.shape[n] = v->shape[d];
        out.strides[n] = v->strides[d];
        ++n;
      }
    }
    if (n == 0) {
      out.shape[0] = 1;
      out.strides[0] = 1;
      n = 1;
    }
    for (int d = n; d < kMaxViewDims; ++d) {
      out.shape[d] = 0;
      out.strides[d] = 0;
    }
    out.ndim = n;
    *v = out;
  }
}

absl::StatusOr<uint64_t> DataOps::Checksum(const void* data, int64_t bytes) {
  if (memory_space() != MemorySpace::kHost) {
    return absl::UnimplementedError(
        absl::StrCat(Name(), " data ops cannot checksum their memory (staged syncs' checksums)"));
  }
  if (bytes < 0 || (bytes > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum of ", bytes, " bytes at ", data == nullptr ? "null" : "an address"));
  }
  RETURN_IF_ERROR(Synchronize());
  return chunk_hash::Hash(data, bytes);
}

absl::StatusOr<StagingBuffer> DataOps::AllocateHostShadow(int64_t bytes) {
  if (memory_space() == MemorySpace::kHost) return AllocateStaging(bytes);
  return absl::UnimplementedError(
      absl::StrCat(Name(), " data ops have no host shadow memory (staging host_shadow)"));
}

ItemsHandle DataOps::Prepare(absl::Span<const CopyItem> items) {
  (void)items;
  return ItemsHandle{++next_handle_};
}

namespace {
constexpr char kItemIndexPayload[] = "type.wsync/data_ops.item_index";
}  // namespace

absl::Status TagItem(absl::Status s, size_t index) {
  if (!s.ok()) s.SetPayload(kItemIndexPayload, absl::Cord(absl::StrCat(index)));
  return s;
}

absl::Status ItemError(const absl::Status& s, const char* what, size_t index) {
  if (s.ok()) return s;
  return TagItem(absl::Status(s.code(), absl::StrCat(what, " item ", index, ": ", s.message())),
                 index);
}

int64_t ErrorItemIndex(const absl::Status& s) {
  const auto p = s.GetPayload(kItemIndexPayload);
  if (!p.has_value()) return -1;
  const std::string text(*p);
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  return (end == text.c_str() || *end != '\0' || v < 0) ? -1 : static_cast<int64_t>(v);
}

absl::Status DataOps::ResetChecksums(int64_t slots) {
  if (slots < 0) return absl::InvalidArgumentError(absl::StrCat("negative checksum slots ", slots));
  checksum_slots_.assign(static_cast<size_t>(slots), chunk_hash::Hash(nullptr, 0));
  return absl::OkStatus();
}

absl::Status DataOps::QueueChecksum(const void* data, int64_t bytes, int64_t slot) {
  if (slot < 0 || slot >= static_cast<int64_t>(checksum_slots_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum slot ", slot, " of ", checksum_slots_.size(), " (ResetChecksums)"));
  }
  auto h = Checksum(data, bytes);
  if (!h.ok()) return h.status();
  checksum_slots_[static_cast<size_t>(slot)] = *h;
  return absl::OkStatus();
}

ItemsHandle DataOps::PrepareWireHash(absl::Span<const WireHashItem> items) {
  (void)items;
  return ItemsHandle{++next_handle_};
}

absl::Status DataOps::QueueWireChecksum(absl::Span<const WireHashItem> items, int64_t bucket_bytes,
                                        int64_t slot, ItemsHandle handle) {
  (void)handle;
  if (slot < 0 || slot >= static_cast<int64_t>(checksum_slots_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum slot ", slot, " of ", checksum_slots_.size(), " (ResetChecksums)"));
  }
  if (memory_space() != MemorySpace::kHost) {
    return absl::UnimplementedError(
        absl::StrCat(Name(), " data ops cannot checksum buckets from their views"));
  }
  RETURN_IF_ERROR(Synchronize());
  ASSIGN_OR_RETURN(checksum_slots_[static_cast<size_t>(slot)], HostWireHash(items, bucket_bytes));
  return absl::OkStatus();
}

absl::Status DataOps::WaitForLanding(const transport::LandingMark& mark) {
  if (mark.handle == nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(Name(), " data ops cannot wait for a device transport's landing mark"));
}

absl::StatusOr<std::vector<uint64_t>> DataOps::CollectChecksums() {
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  return checksum_slots_;
}

}  // namespace wsync::exec
