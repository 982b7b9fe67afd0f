#include "worker/backends/cuda/cuda_data_ops.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_data_ops_internal.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/staging_pool.h"
#include "worker/backends/cuda/stream_marks.h"

namespace wsync::cuda {

using data_ops_internal::Annotate;
using data_ops_internal::CheckPackItem;
using data_ops_internal::CheckView;
using data_ops_internal::RowMajor;

namespace {

using exec::StridedView;

}  // namespace

using data_ops_internal::AppendRaw;
using data_ops_internal::AppendView;
using data_ops_internal::CheckCopyItems;
using data_ops_internal::CopyItemsKey;
using data_ops_internal::NamedItemsKey;

bool CommonShape(const StridedView& a, const StridedView& b, int64_t* shape, int64_t* a_strides,
                 int64_t* b_strides, int* ndim) {
  // Walk both shapes from the innermost dim, splitting the larger dim by the
  // smaller one; output is built innermost first, then reversed.
  int64_t out_shape[kMaxRequestDims], out_a[kMaxRequestDims], out_b[kMaxRequestDims];
  int n = 0;
  int i = a.ndim - 1, j = b.ndim - 1;
  auto next_a = [&](int64_t& size, int64_t& stride) {
    while (i >= 0 && a.shape[i] == 1) --i;
    if (i < 0) return false;
    size = a.shape[i];
    stride = a.strides[i];
    return true;
  };
  auto next_b = [&](int64_t& size, int64_t& stride) {
    while (j >= 0 && b.shape[j] == 1) --j;
    if (j < 0) return false;
    size = b.shape[j];
    stride = b.strides[j];
    return true;
  };
  int64_t sa = 0, ta = 0, sb = 0, tb = 0;
  bool have_a = next_a(sa, ta), have_b = next_b(sb, tb);
  while (have_a && have_b) {
    if (n == kMaxRequestDims) return false;
    const int64_t m = std::min(sa, sb);
    if (std::max(sa, sb) % m != 0) return false;
    out_shape[n] = m;
    out_a[n] = ta;
    out_b[n] = tb;
    ++n;
    if (sa == m) {
      --i;
      have_a = next_a(sa, ta);
    } else {
      sa /= m;
      ta *= m;
    }
    if (sb == m) {
      --j;
      have_b = next_b(sb, tb);
    } else {
      sb /= m;
      tb *= m;
    }
  }
  if (have_a || have_b) return false;  // element counts differ
  if (n == 0) {
    out_shape[0] = 1;
    out_a[0] = out_b[0] = 1;
    n = 1;
  }
  for (int k = 0; k < n; ++k) {
    shape[k] = out_shape[n - 1 - k];
    a_strides[k] = out_a[n - 1 - k];
    b_strides[k] = out_b[n - 1 - k];
  }
  *ndim = n;
  return true;
}

absl::StatusOr<std::unique_ptr<CudaDataOps>> CudaDataOps::Create(const Options& options) {
  std::unique_ptr<CudaDataOps> ops(new CudaDataOps());
  ops->options_ = options;
  ops->device_ = options.device;
  ops->table_cache_bytes_ = options.table_cache_bytes;
  auto stream = Stream::Create(options.device);
  if (!stream.ok()) return stream.status();
  ops->stream_ = std::move(*stream);
  auto kernels = BatchedKernels::Create(options.device, options.blocks_per_sm);
  if (!kernels.ok()) return kernels.status();
  ops->kernels_ = std::move(*kernels);
  ops->kernels_->set_reserved_sms(options.reserved_sms);
  ops->kernels_->set_retired(&ops->retired_);
  ops->pool_ = std::make_shared<StagingPool>(options.device);
  return ops;
}

void CudaDataOps::ReserveSmsForPuts() {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_) != cudaSuccess) return;
  // Never every SM: the kernel's blocks on reserved SMs leave without work.
  const int n = std::min(options_.put_reserved_sms, sms / 2);
  kernels_->set_reserved_sms(std::max(options_.reserved_sms, n));
}

void CudaDataOps::ReleaseSmsForPuts() { kernels_->set_reserved_sms(options_.reserved_sms); }

int CudaDataOps::reserved_sms() const { return kernels_->reserved_sms(); }

CudaDataOps::~CudaDataOps() {
  // Resident tables and scratch may still be read by queued kernels.
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
}

std::string CudaDataOps::Name() const { return absl::StrCat("cuda:", device_); }

absl::StatusOr<exec::StagingBuffer> CudaDataOps::AllocateStaging(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative staging size ", bytes));
  if (bytes == 0) return exec::StagingBuffer();
  auto p = pool_->Get(bytes);
  if (!p.ok()) return p.status();
  std::shared_ptr<StagingPool> pool = pool_;
  return exec::StagingBuffer(*p, bytes, [pool](void* q) { pool->Put(q); });
}

absl::StatusOr<char*> CudaDataOps::Scratch(int64_t bytes) {
  // Callers reserve the whole call's scratch first (scratch_ never moves
  // while a table refers to it), then carve it here.
  const int64_t aligned = (bytes + 255) / 256 * 256;
  if (scratch_used_ + aligned > static_cast<int64_t>(scratch_.size())) {
    return absl::InternalError("scratch carve past its reservation");
  }
  char* p = static_cast<char*>(scratch_.data()) + scratch_used_;
  scratch_used_ += aligned;
  return p;
}

absl::Status CudaDataOps::Run(std::string key) {
  if (table_.empty()) return absl::OkStatus();
  if (key.empty()) return kernels_->Launch(table_, stream_.get());
  CachedTable entry;
  const TableLayout layout = TableLayout::Of(table_);
  if (cache_device_bytes_ + static_cast<int64_t>(layout.total) > table_cache_bytes_) {
    // Queued kernels may still read them: freed by the next Synchronize().
    for (auto& [k, e] : cache_) retired_.Retire(std::move(e.table));
    cache_.clear();
    named_.clear();
    cache_device_bytes_ = 0;
  }
  if (absl::Status s = kernels_->Launch(table_, stream_.get(), &entry.table); !s.ok()) {
    retired_.Retire(std::move(entry.table));  // may be allocated already: not freed here
    return s;
  }
  entry.layout = layout;
  cache_device_bytes_ += static_cast<int64_t>(entry.table.size());
  entry.key = key;
  cache_[std::move(key)] = std::move(entry);
  return absl::OkStatus();
}

absl::Status CudaDataOps::Replay(CachedTable& entry) {
  ++cache_hits_;
  if (entry.table.size() == 0) return absl::OkStatus();
  return kernels_->LaunchResident(entry.table.data(), entry.layout, stream_.get());
}

absl::Status CudaDataOps::AddPackRequest(const exec::PackItem& it, void* staging_base,
                                         size_t index) {
  int64_t strides[kMaxRequestDims];
  RowMajor(it.src.shape.data(), it.src.ndim, strides);
  char label[32];
  snprintf(label, sizeof(label), "pack item %zu", index);
  const ViewRef src{it.src.data, it.src.dtype, it.src.strides.data()};
  const ViewRef dst{static_cast<char*>(staging_base) + it.staging_offset, it.wire_dtype, strides};
  return table_.AddCopy(src, dst, it.src.shape.data(), it.src.ndim, label);
}

absl::Status CudaDataOps::AddCopyItem(const StridedView& src, const StridedView& dst,
                                      const char* what, size_t index) {
  int64_t shape[kMaxRequestDims], ss[kMaxRequestDims], ds[kMaxRequestDims];
  int n = 0;
  if (!CommonShape(src, dst, shape, ss, ds, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " item ", index, ": shapes have no common refinement"));
  }
  char label[64];
  snprintf(label, sizeof(label), "%s item %zu", what, index);
  const ViewRef s{src.data, src.dtype, ss}, d{dst.data, dst.dtype, ds};
  return table_.AddCopy(s, d, shape, n, label);
}

absl::Status CudaDataOps::Pack(absl::Span<const exec::PackItem> items, void* staging_base) {
  const StreamMarkOnExit mark("pack", stream_.get());
  for (const exec::PackItem& it : items) {
    if (it.quant_block_rows > 0) return PackQuantized(items, staging_base);
  }
  std::string key;
  key.reserve(16 + items.size() * 64);
  key.push_back('P');
  AppendRaw(key, staging_base);
  for (const exec::PackItem& it : items) {
    AppendView(key, it.src);
    AppendRaw(key, it.staging_offset);
    AppendRaw(key, static_cast<int32_t>(it.wire_dtype));
  }
  if (auto it = cache_.find(key); it != cache_.end()) return Replay(it->second);
  table_.Clear();
  for (size_t i = 0; i < items.size(); ++i) {
    RETURN_IF_ERROR(CheckPackItem(items[i], staging_base, i));
    if (items[i].src.num_elements() == 0) continue;
    RETURN_IF_ERROR(AddPackRequest(items[i], staging_base, i));
  }
  return Run(std::move(key));
}

absl::Status CudaDataOps::Unpack(const void* staging_base,
                                 absl::Span<const exec::UnpackItem> items) {
  const StreamMarkOnExit mark("unpack", stream_.get());
  std::string key;
  key.reserve(16 + items.size() * 64);
  key.push_back('U');
  AppendRaw(key, staging_base);
  for (const exec::UnpackItem& it : items) {
    AppendView(key, it.dst);
    AppendRaw(key, it.staging_offset);
    AppendRaw(key, static_cast<int32_t>(it.wire_dtype));
  }
  if (auto it = cache_.find(key); it != cache_.end()) return Replay(it->second);
  table_.Clear();
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::UnpackItem& it = items[i];
    absl::Status s = CheckView(it.dst, "unpack destination");
    const int64_t n = it.dst.num_elements();
    if (s.ok() && staging_base == nullptr && n > 0) s = absl::InvalidArgumentError("null staging");
    if (!s.ok()) return Annotate(s, "unpack", i);
    if (n == 0) continue;
    int64_t strides[kMaxRequestDims];
    RowMajor(it.dst.shape.data(), it.dst.ndim, strides);
    char label[32];
    snprintf(label, sizeof(label), "unpack item %zu", i);
    s = table_.AddCopy(
        ViewRef{static_cast<const char*>(staging_base) + it.staging_offset, it.wire_dtype, strides},
        ViewRef{it.dst.data, it.dst.dtype, it.dst.strides.data()}, it.dst.shape.data(), it.dst.ndim,
        label);
    if (!s.ok()) return s;
  }
  return Run(std::move(key));
}

absl::Status CudaDataOps::Copy(absl::Span<const exec::CopyItem> items, exec::ItemsHandle handle) {
  if (handle.id == 0) return CopyKeyed(items, CopyItemsKey('C', items));
  std::string named = NamedItemsKey('c', handle, items);
  if (auto it = named_.find(named); it != named_.end()) {
    return CopyKeyed(items, std::string(), it->second);
  }
  std::string key = CopyItemsKey('C', items);
  const std::string lookup = key;  // once per handle
  RETURN_IF_ERROR(CopyKeyed(items, std::move(key)));
  if (auto it = cache_.find(lookup); it != cache_.end()) named_[std::move(named)] = &it->second;
  return absl::OkStatus();
}

absl::Status CudaDataOps::CopyKeyed(absl::Span<const exec::CopyItem> items, std::string key,
                                    CachedTable* known) {
  const StreamMarkOnExit mark("copy", stream_.get());
  if (known != nullptr) return Replay(*known);
  if (auto it = cache_.find(key); it != cache_.end()) return Replay(it->second);
  table_.Clear();
  pre_table_.Clear();
  // Items whose shapes have no common refinement go through a contiguous
  // scratch copy in the source dtype: reserve that scratch first.
  int64_t scratch_bytes = 0;
  std::vector<size_t> via_scratch;
  RETURN_IF_ERROR(
      CheckCopyItems(items, "copy", /*check_cast=*/false, &via_scratch, &scratch_bytes));
  if (scratch_bytes > static_cast<int64_t>(scratch_.size())) {
    // Queued kernels may still use the old scratch: it is retired, not freed.
    retired_.Retire(std::move(scratch_));
    ASSIGN_OR_RETURN(scratch_, DeviceBuffer::Allocate(device_, scratch_bytes));
  }
  scratch_used_ = 0;
  RETURN_IF_ERROR(AddItemsViaScratch(
      items, via_scratch, "copy", [this](int64_t bytes) { return Scratch(bytes); },
      [this](const StridedView& src, const StridedView& dst, size_t i) {
        return AddCopyItem(src, dst, "copy", i);
      }));
  if (!pre_table_.empty()) {
    RETURN_IF_ERROR(kernels_->Launch(pre_table_, stream_.get()));
    return Run(std::string());  // refers to scratch: not cached
  }
  return Run(std::move(key));
}

absl::Status CudaDataOps::AddItemsViaScratch(
    absl::Span<const exec::CopyItem> items, const std::vector<size_t>& via_scratch,
    const char* what, const std::function<absl::StatusOr<char*>(int64_t)>& carve,
    const ItemAdder& add) {
  size_t next_scratch = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::CopyItem& it = items[i];
    if (it.src.num_elements() == 0) continue;
    if (next_scratch == via_scratch.size() || via_scratch[next_scratch] != i) {
      RETURN_IF_ERROR(exec::TagItem(add(it.src, it.dst, i), i));
      continue;
    }
    ++next_scratch;
    ASSIGN_OR_RETURN(char* tmp, carve(it.src.num_elements() * DTypeSize(it.src.dtype)));
    StridedView mid_src = it.src;  // contiguous, src shape
    mid_src.data = tmp;
    RowMajor(mid_src.shape.data(), mid_src.ndim, mid_src.strides.data());
    std::swap(table_, pre_table_);
    absl::Status s = AddCopyItem(it.src, mid_src, what, i);
    std::swap(table_, pre_table_);
    RETURN_IF_ERROR(exec::TagItem(s, i));
    StridedView mid_dst = it.dst;  // contiguous, dst shape, src dtype
    mid_dst.data = tmp;
    mid_dst.dtype = it.src.dtype;
    RowMajor(mid_dst.shape.data(), mid_dst.ndim, mid_dst.strides.data());
    RETURN_IF_ERROR(exec::TagItem(add(mid_dst, it.dst, i), i));
  }
  return absl::OkStatus();
}

absl::Status CudaDataOps::Reduce(absl::Span<const exec::ReduceInput> inputs,
                                 absl::Span<const exec::ReduceItem> items,
                                 const void* staging_base) {
  table_.Clear();
  pre_table_.Clear();
  // Pass 1: validate, and size the scratch for inputs that are strided or not
  // in the accumulate dtype (converted first, like the host does).
  int64_t scratch_bytes = 0;
  std::vector<StridedView> views(inputs.size());
  std::vector<char> convert(inputs.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::ReduceItem& it = items[i];
    RETURN_IF_ERROR(Annotate(CheckView(it.dst, "reduce destination"), "reduce", i));
    if (it.num_inputs < 1 || it.input_begin < 0 ||
        static_cast<size_t>(it.input_begin) + it.num_inputs > inputs.size()) {
      return Annotate(
          absl::InvalidArgumentError(absl::StrCat("inputs [", it.input_begin, ", +", it.num_inputs,
                                                  ") outside ", inputs.size())),
          "reduce", i);
    }
    const DType acc = it.accumulate_dtype;
    const int64_t n = it.dst.num_elements();
    if (!KernelSupportsCast(acc, it.dst.dtype)) {
      return Annotate(absl::InvalidArgumentError(absl::StrCat("no conversion from ", DTypeName(acc),
                                                              " to ", DTypeName(it.dst.dtype))),
                      "reduce", i);
    }
    for (int k = 0; k < it.num_inputs; ++k) {
      const size_t idx = it.input_begin + k;
      const exec::ReduceInput& in = inputs[idx];
      StridedView v = in.view;
      if (in.staging_offset >= 0) {
        if (staging_base == nullptr && n > 0) {
          return Annotate(absl::InvalidArgumentError("staged reduce input but null staging"),
                          "reduce", i);
        }
        v.data = const_cast<char*>(static_cast<const char*>(staging_base)) + in.staging_offset;
        v.ndim = 1;
        v.shape[0] = n;
        v.strides[0] = 1;
      }
      RETURN_IF_ERROR(Annotate(CheckView(v, "reduce input"), "reduce", i));
      if (v.num_elements() != n) {
        return Annotate(absl::InvalidArgumentError(absl::StrCat(
                            "input ", k, " has ", v.num_elements(), " elements, destination ", n)),
                        "reduce", i);
      }
      if (!KernelSupportsCast(v.dtype, acc)) {
        return Annotate(
            absl::InvalidArgumentError(absl::StrCat("input ", k, ": no conversion from ",
                                                    DTypeName(v.dtype), " to ", DTypeName(acc))),
            "reduce", i);
      }
      views[idx] = v;
      if (!(v.contiguous() && v.dtype == acc)) {
        convert[idx] = 1;
        scratch_bytes += (n * DTypeSize(acc) + 255) / 256 * 256;
      }
    }
  }
  if (scratch_bytes > static_cast<int64_t>(scratch_.size())) {
    // Queued kernels may still use the old scratch: it is retired, not freed.
    retired_.Retire(std::move(scratch_));
    ASSIGN_OR_RETURN(scratch_, DeviceBuffer::Allocate(device_, scratch_bytes));
  }
  scratch_used_ = 0;
  std::vector<const void*> ptrs;
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::ReduceItem& it = items[i];
    const DType acc = it.accumulate_dtype;
    const int64_t n = it.dst.num_elements();
    if (n == 0) continue;
    ptrs.clear();
    for (int k = 0; k < it.num_inputs; ++k) {
      const size_t idx = it.input_begin + k;
      const StridedView& v = views[idx];
      if (!convert[idx]) {
        ptrs.push_back(v.data);
        continue;
      }
      ASSIGN_OR_RETURN(char* tmp, Scratch(n * DTypeSize(acc)));
      StridedView conv = v;  // contiguous in acc, v's shape
      conv.data = tmp;
      conv.dtype = acc;
      RowMajor(conv.shape.data(), conv.ndim, conv.strides.data());
      std::swap(table_, pre_table_);
      absl::Status s = AddCopyItem(v, conv, "reduce input of", i);
      std::swap(table_, pre_table_);
      if (!s.ok()) return s;
      ptrs.push_back(tmp);
    }
    char label[32];
    snprintf(label, sizeof(label), "reduce item %zu", i);
    RETURN_IF_ERROR(table_.AddReduce(ptrs.data(), static_cast<int>(ptrs.size()), acc, acc, it.op,
                                     ViewRef{it.dst.data, it.dst.dtype, it.dst.strides.data()},
                                     it.dst.shape.data(), it.dst.ndim, label));
  }
  if (!pre_table_.empty()) RETURN_IF_ERROR(kernels_->Launch(pre_table_, stream_.get()));
  return Run(std::string());
}

absl::Status CudaDataOps::ReserveScratch(int64_t bytes) {
  if (bytes > static_cast<int64_t>(scratch_.size())) {
    // Queued kernels may still use the old scratch: it is retired, not freed.
    retired_.Retire(std::move(scratch_));
    ASSIGN_OR_RETURN(scratch_, DeviceBuffer::Allocate(device_, bytes));
  }
  scratch_used_ = 0;
  return absl::OkStatus();
}

absl::Status CudaDataOps::Synchronize() {
  absl::Status s = CudaStatus(
      cudaStreamSynchronize(stream_.get()),
      absl::StrCat("data ops on device ", device_, " (a pack/unpack/copy/reduce kernel failed)"));
  // Nothing retired is in use: no queued kernel is left, and put memory is
  // retired only after the put streams drained.
  retired_.Release();
  return s;
}

}  // namespace wsync::cuda
