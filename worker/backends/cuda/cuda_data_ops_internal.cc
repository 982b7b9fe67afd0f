// The helpers of cuda_data_ops_internal.h.
#include "worker/backends/cuda/cuda_data_ops_internal.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/piece_table.h"

namespace wsync::cuda {

namespace data_ops_internal {

absl::Status CheckView(const exec::StridedView& v, const char* what) {
  if (DTypeSize(v.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no dtype"));
  }
  if (v.ndim < 1 || v.ndim > exec::kMaxViewDims) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad ndim ", v.ndim));
  }
  if (v.data == nullptr && v.num_elements() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null data"));
  }
  return absl::OkStatus();
}

void RowMajor(const int64_t* shape, int ndim, int64_t* strides) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

absl::Status CheckPackItem(const exec::PackItem& it, const void* staging_base, size_t index) {
  absl::Status s = CheckView(it.src, "pack source");
  if (s.ok() && staging_base == nullptr && it.src.num_elements() > 0) {
    s = absl::InvalidArgumentError("null staging");
  }
  return Annotate(s, "pack", index);
}

absl::Status Annotate(const absl::Status& s, const char* what, size_t index) {
  return exec::ItemError(s, what, index);
}

// Field by field: raw struct bytes would include padding, which differs
// between equal items.
void AppendView(std::string& key, const exec::StridedView& v) {
  AppendRaw(key, v.data);
  AppendRaw(key, static_cast<int32_t>(v.dtype));
  AppendRaw(key, v.ndim);
  const int n = std::clamp<int>(v.ndim, 0, exec::kMaxViewDims);
  key.append(reinterpret_cast<const char*>(v.shape.data()), n * sizeof(int64_t));
  key.append(reinterpret_cast<const char*>(v.strides.data()), n * sizeof(int64_t));
}

std::string CopyItemsKey(char kind, absl::Span<const exec::CopyItem> items) {
  std::string key;
  key.reserve(8 + items.size() * 96);
  key.push_back(kind);
  for (const exec::CopyItem& it : items) {
    AppendView(key, it.src);
    AppendView(key, it.dst);
  }
  return key;
}

std::string NamedItemsKey(char kind, exec::ItemsHandle handle,
                          absl::Span<const exec::CopyItem> items) {
  std::string key(1, kind);
  AppendRaw(key, handle.id);
  // Not needed while the handle's promise holds; cheap insurance if it breaks.
  AppendRaw(key, items.data());
  AppendRaw(key, items.size());
  return key;
}

absl::Status CheckCopyItems(absl::Span<const exec::CopyItem> items, const char* what,
                            bool check_cast, std::vector<size_t>* via_scratch,
                            int64_t* scratch_bytes) {
  const std::string src_what = absl::StrCat(what, " source");
  const std::string dst_what = absl::StrCat(what, " destination");
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::CopyItem& it = items[i];
    absl::Status s = CheckView(it.src, src_what.c_str());
    if (s.ok()) s = CheckView(it.dst, dst_what.c_str());
    if (s.ok() && it.src.num_elements() != it.dst.num_elements()) {
      s = absl::InvalidArgumentError(absl::StrCat("element count mismatch: ", it.src.num_elements(),
                                                  " vs ", it.dst.num_elements()));
    }
    if (s.ok() && check_cast && !KernelSupportsCast(it.src.dtype, it.dst.dtype)) {
      s = absl::InvalidArgumentError(absl::StrCat("no conversion from ", DTypeName(it.src.dtype),
                                                  " to ", DTypeName(it.dst.dtype)));
    }
    if (!s.ok()) return Annotate(s, what, i);
    if (it.src.num_elements() == 0) continue;
    int64_t shape[kMaxRequestDims], ss[kMaxRequestDims], ds[kMaxRequestDims];
    int n = 0;
    if (!CommonShape(it.src, it.dst, shape, ss, ds, &n)) {
      via_scratch->push_back(i);
      *scratch_bytes += (it.src.num_elements() * DTypeSize(it.src.dtype) + 255) / 256 * 256;
    }
  }
  return absl::OkStatus();
}

}  // namespace data_ops_internal

}  // namespace wsync::cuda
