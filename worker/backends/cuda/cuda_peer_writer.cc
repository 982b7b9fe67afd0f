// CudaPeerWriter: the put path (direct writes into a peer's IPC-mapped
// memory) and the tokens. See cuda_peer_writer.h.
#include "worker/backends/cuda/cuda_peer_writer.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_data_ops_internal.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/cuda/stream_marks.h"

namespace wsync::cuda {

using data_ops_internal::Annotate;
using data_ops_internal::CheckCopyItems;
using data_ops_internal::CopyItemsKey;
using data_ops_internal::NamedItemsKey;
using data_ops_internal::RowMajor;
using exec::StridedView;

namespace {

// The device whose memory `p` is (IPC- and VMM-mapped memory of a peer
// included); -1 when the runtime cannot tell, which only costs the
// interleaving (PutList::Emit) its knowledge of that put's peer.
int DeviceOf(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaPeerWriter>> CudaPeerWriter::Create(CudaDataOps* ops) {
  std::unique_ptr<CudaPeerWriter> w(new CudaPeerWriter(ops));
  w->table_cache_bytes_ = ops->options_.table_cache_bytes;
  w->retired_ = &ops->retired_;
  RETURN_IF_ERROR(w->Init(ops->options_));
  return w;
}

CudaPeerWriter::~CudaPeerWriter() {
  // Resident tables and scratch may still be read by queued puts.
  if (put_stream_.get() != nullptr) SynchronizePuts().IgnoreError();
  // The ops outlive the writer: their copies need no SMs left to puts.
  if (reserved_sms_) ops_->ReleaseSmsForPuts();
}

std::string CudaPeerWriter::Name() const { return absl::StrCat("cuda-ipc:", device_); }

absl::Status CudaPeerWriter::AddItems(absl::Span<const exec::CopyItem> items,
                                      const std::vector<size_t>& via_scratch) {
  int64_t scratch_used = 0;
  size_t next_scratch = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const exec::CopyItem& it = items[i];
    if (it.src.num_elements() == 0) continue;
    if (next_scratch == via_scratch.size() || via_scratch[next_scratch] != i) {
      RETURN_IF_ERROR(exec::TagItem(AddPutRequest(it.src, it.dst, i), i));
      continue;
    }
    ++next_scratch;
    char* tmp = static_cast<char*>(put_scratch_.data()) + scratch_used;
    scratch_used += (it.src.num_elements() * DTypeSize(it.src.dtype) + 255) / 256 * 256;
    StridedView mid_src = it.src;  // contiguous, src shape
    mid_src.data = tmp;
    RowMajor(mid_src.shape.data(), mid_src.ndim, mid_src.strides.data());
    int64_t shape[kMaxRequestDims], ss[kMaxRequestDims], ds[kMaxRequestDims];
    int n = 0;
    if (!CommonShape(it.src, mid_src, shape, ss, ds, &n)) {
      return Annotate(absl::InternalError("shapes have no common refinement"), "put", i);
    }
    char label[32];
    snprintf(label, sizeof(label), "put item %zu", i);
    RETURN_IF_ERROR(
        exec::TagItem(pre_table_.AddCopy(ViewRef{it.src.data, it.src.dtype, ss},
                                         ViewRef{mid_src.data, mid_src.dtype, ds}, shape, n, label),
                      i));
    StridedView mid_dst = it.dst;  // contiguous, dst shape, src dtype
    mid_dst.data = tmp;
    mid_dst.dtype = it.src.dtype;
    RowMajor(mid_dst.shape.data(), mid_dst.ndim, mid_dst.strides.data());
    RETURN_IF_ERROR(exec::TagItem(AddPutRequest(mid_dst, it.dst, i), i));
  }
  return absl::OkStatus();
}

absl::Status CudaPeerWriter::Init(const CudaDataOps::Options& options) {
  if (options.put_copy_engine_min_bytes < 0 || options.put_copy_engine_min_row_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "negative put copy-engine threshold: min bytes ", options.put_copy_engine_min_bytes,
        ", min row bytes ", options.put_copy_engine_min_row_bytes));
  }
  if (options.put_copy_streams < 1 || options.put_copy_streams > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("put copy streams must be in [1, 16], got ", options.put_copy_streams));
  }
  ASSIGN_OR_RETURN(put_stream_, Stream::Create(options.device));
  ASSIGN_OR_RETURN(staging_io_stream_, Stream::Create(options.device));
  ASSIGN_OR_RETURN(mailboxes_, CudaMailboxes::Create(options.device));
  for (int i = 1; i < options.put_copy_streams; ++i) {
    ASSIGN_OR_RETURN(Stream st, Stream::Create(options.device));
    put_copy_streams_.push_back(std::move(st));
  }
  ASSIGN_OR_RETURN(put_kernels_, BatchedKernels::Create(options.device, options.put_blocks_per_sm));
  ASSIGN_OR_RETURN(put_kernels_alone_, BatchedKernels::Create(options.device, 8));
  put_kernels_->set_retired(retired_);
  put_kernels_alone_->set_retired(retired_);
  put_launcher_ = put_kernels_.get();
  if (options.put_interleave_mib < 0 || options.put_interleave_mib > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "put interleave part must be in [0, 1 TiB] (MiB), got ", options.put_interleave_mib));
  }
  put_interleave_bytes_ = options.put_interleave_mib << 20;
  put_min_bytes_ = options.put_copy_engine_min_bytes;
  put_min_row_bytes_ = options.put_copy_engine_min_row_bytes;
  int max_pitch = 0;
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, options.device),
      absl::StrCat("max pitch of device ", options.device));
  max_pitch_ = max_pitch;
  return absl::OkStatus();
}

int CudaPeerWriter::PeerOf(const void* dst) const {
  // Only the interleaving reads the peer: no runtime query without it.
  return put_interleave_bytes_ > 0 ? DeviceOf(dst) : 0;
}

absl::Status CudaPeerWriter::AddPutRequest(const StridedView& src, const StridedView& dst,
                                           size_t index) {
  int64_t shape[kMaxRequestDims], ss[kMaxRequestDims], ds[kMaxRequestDims];
  int n = 0;
  if (!CommonShape(src, dst, shape, ss, ds, &n)) {
    return Annotate(absl::InternalError("shapes have no common refinement"), "put", index);
  }
  const int64_t esize = DTypeSize(src.dtype);
  const int64_t bytes = src.num_elements() * esize;
  if (put_min_bytes_ > 0 && src.dtype == dst.dtype && bytes >= put_min_bytes_) {
    // CommonShape drops unit dims but does not merge contiguous ones.
    int64_t cs[kMaxRequestDims], css[kMaxRequestDims], cds[kMaxRequestDims];
    std::copy(shape, shape + n, cs);
    std::copy(ss, ss + n, css);
    std::copy(ds, ds + n, cds);
    int64_t* strides[] = {css, cds};
    const int m = NormalizeDims(cs, n, strides, 2);
    const bool unit_inner = m >= 1 && css[m - 1] == 1 && cds[m - 1] == 1;
    const int64_t width = m >= 1 ? cs[m - 1] * esize : 0;
    // Rows must not overlap (the engines take pitch >= width) and must be
    // long enough that the engines stream them at full rate.
    const bool rows_ok = m == 2 && width >= put_min_row_bytes_ && css[0] * esize >= width &&
                         cds[0] * esize >= width && css[0] * esize <= max_pitch_ &&
                         cds[0] * esize <= max_pitch_;
    if (unit_inner && (m == 1 || rows_ok)) {
      PutCopy c;
      c.dst = dst.data;
      c.src = src.data;
      c.width = static_cast<size_t>(width);
      c.height = m == 2 ? static_cast<size_t>(cs[0]) : 1;
      c.src_pitch = m == 2 ? static_cast<size_t>(css[0] * esize) : c.width;
      c.dst_pitch = m == 2 ? static_cast<size_t>(cds[0] * esize) : c.width;
      c.item = index;
      put_list_.AddCopy(c, PeerOf(dst.data));
      return absl::OkStatus();
    }
  }
  PutRequest r;
  r.src = src.data;
  r.src_dtype = src.dtype;
  r.dst = dst.data;
  r.dst_dtype = dst.dtype;
  r.n = n;
  std::copy(shape, shape + n, r.shape);
  std::copy(ss, ss + n, r.src_strides);
  std::copy(ds, ds + n, r.dst_strides);
  r.item = index;
  put_list_.AddRequest(r, PeerOf(dst.data));
  return absl::OkStatus();
}

absl::Status CudaPeerWriter::IssuePutCopies(const std::vector<PutCopy>& copies, int64_t bytes,
                                            bool one_stream) {
  // Each copy goes to the stream with the fewest bytes queued so far.
  std::vector<cudaStream_t> streams = {put_stream_.get()};
  if (!one_stream) {
    for (const Stream& st : put_copy_streams_) streams.push_back(st.get());
  }
  std::vector<int64_t> queued(streams.size(), 0);
  for (const PutCopy& c : copies) {
    const size_t k = std::min_element(queued.begin(), queued.end()) - queued.begin();
    queued[k] += static_cast<int64_t>(c.width * c.height);
    cudaStream_t stream = streams[k];
    // cudaMemcpyDefault: UVA tells local, peer and IPC-mapped memory apart.
    const cudaError_t err = c.height == 1
                                ? cudaMemcpyAsync(c.dst, c.src, c.width, cudaMemcpyDefault, stream)
                                : cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src, c.src_pitch, c.width,
                                                    c.height, cudaMemcpyDefault, stream);
    if (err != cudaSuccess) {
      return Annotate(
          CudaStatus(err, absl::StrCat(c.height == 1 ? "cudaMemcpyAsync" : "cudaMemcpy2DAsync",
                                       " of ", c.height, " x ", c.width, " bytes (pitches ",
                                       c.src_pitch, " -> ", c.dst_pitch, ") on device ", device_)),
          "put", c.item);
    }
  }
  copy_engine_copies_ += static_cast<int64_t>(copies.size());
  copy_engine_bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status CudaPeerWriter::RunPut(std::string key) {
  // Uncached calls read put scratch that the pre-copy kernel on the put
  // stream fills: their copies must follow it on that stream.
  RETURN_IF_ERROR(IssuePutCopies(put_copies_, put_copies_bytes_, /*one_stream=*/key.empty()));
  if (key.empty()) {
    return table_.empty() ? absl::OkStatus() : put_launcher_->Launch(table_, put_stream_.get());
  }
  if (table_.empty() && put_copies_.empty()) return absl::OkStatus();
  // Copy lists count against the budget too, so calls that use only the
  // copy engines cannot grow the cache without bound.
  const int64_t list_bytes = static_cast<int64_t>(put_copies_.size() * sizeof(PutCopy));
  const TableLayout layout = table_.empty() ? TableLayout{} : TableLayout::Of(table_);
  if (put_cache_bytes_ + static_cast<int64_t>(layout.total) + list_bytes > table_cache_bytes_) {
    // Put kernels may still read the tables: wait for them before freeing.
    RETURN_IF_ERROR(put_stream_.Synchronize());  // tables are read by the kernel stream only
    for (auto& [k, e] : put_cache_) retired_->Retire(std::move(e.table));
    put_cache_.clear();
    put_named_.clear();
    put_cache_bytes_ = 0;
  }
  CachedPut entry;
  if (!table_.empty()) {
    if (absl::Status s = put_launcher_->Launch(table_, put_stream_.get(), &entry.table); !s.ok()) {
      retired_->Retire(std::move(entry.table));  // may be allocated already: not freed here
      return s;
    }
    entry.layout = layout;
    put_cache_bytes_ += static_cast<int64_t>(entry.table.size());
  }
  put_cache_bytes_ += list_bytes;
  entry.copies = put_copies_;
  entry.copy_bytes = put_copies_bytes_;
  put_cache_[std::move(key)] = std::move(entry);
  return absl::OkStatus();
}

exec::ItemsHandle CudaPeerWriter::Prepare(absl::Span<const exec::CopyItem> items) {
  if (!items.empty()) {
    ops_->ReserveSmsForPuts();
    reserved_sms_ = true;
  } else if (reserved_sms_) {
    ops_->ReleaseSmsForPuts();  // a plan without puts: the copies get every SM again
    reserved_sms_ = false;
  }
  return PeerWriter::Prepare(items);
}

absl::Status CudaPeerWriter::Put(absl::Span<const exec::CopyItem> items, exec::ItemsHandle handle,
                                 bool alone) {
  if (handle.id == 0) return PutKeyed(items, alone, CopyItemsKey('W', items));
  std::string named = NamedItemsKey('w', handle, items);
  if (auto it = put_named_.find(named); it != put_named_.end()) {
    return PutKeyed(items, alone, std::string(), it->second);
  }
  std::string key = CopyItemsKey('W', items);
  const std::string lookup = key;  // once per handle
  RETURN_IF_ERROR(PutKeyed(items, alone, std::move(key)));
  if (auto it = put_cache_.find(lookup); it != put_cache_.end()) {
    put_named_[std::move(named)] = &it->second;
  }
  return absl::OkStatus();
}

absl::Status CudaPeerWriter::PutKeyed(absl::Span<const exec::CopyItem> items, bool alone,
                                      std::string key, CachedPut* known) {
  if (items.empty()) return absl::OkStatus();
  StreamMark("put_issue", put_stream_.get());
  const auto marks = absl::MakeCleanup([this] {  // every put stream's end
    StreamMark("put", put_stream_.get());
    for (const Stream& st : put_copy_streams_) StreamMark("put_ce", st.get());
  });
  put_launcher_ = alone ? put_kernels_alone_.get() : put_kernels_.get();
  DeviceGuard guard(device_);  // launches need the put stream's device current
  if (known == nullptr) {
    if (auto it = put_cache_.find(key); it != put_cache_.end()) known = &it->second;
  }
  if (known != nullptr) {
    ++cache_hits_;
    CachedPut& entry = *known;
    RETURN_IF_ERROR(IssuePutCopies(entry.copies, entry.copy_bytes));
    if (entry.table.size() == 0) return absl::OkStatus();
    return put_launcher_->LaunchResident(entry.table.data(), entry.layout, put_stream_.get());
  }
  table_.Clear();
  pre_table_.Clear();
  put_list_.Clear();
  put_copies_.clear();
  put_copies_bytes_ = 0;
  // Every item is checked before anything is enqueued, so a bad call writes
  // nothing. Items whose shapes have no common refinement go through a
  // contiguous copy in put scratch (source dtype, this device) first.
  int64_t scratch_bytes = 0;
  std::vector<size_t> via_scratch;
  RETURN_IF_ERROR(CheckCopyItems(items, "put", /*check_cast=*/true, &via_scratch, &scratch_bytes));
  if (scratch_bytes > static_cast<int64_t>(put_scratch_.size())) {
    RETURN_IF_ERROR(SynchronizePuts());  // earlier puts may still read it
    retired_->Retire(std::move(put_scratch_));
    ASSIGN_OR_RETURN(put_scratch_, DeviceBuffer::Allocate(device_, scratch_bytes));
  }
  RETURN_IF_ERROR(AddItems(items, via_scratch));
  RETURN_IF_ERROR(
      put_list_.Emit(device_, put_interleave_bytes_, &table_, &put_copies_, &put_copies_bytes_));
  if (!pre_table_.empty()) {
    RETURN_IF_ERROR(put_launcher_->Launch(pre_table_, put_stream_.get()));
    return RunPut(std::string());  // refers to put scratch: not cached
  }
  return RunPut(std::move(key));
}

absl::StatusOr<uint8_t*> CudaPeerWriter::TokenSlots(size_t count) {
  const int64_t need = static_cast<int64_t>(count * kTokenBytes);
  if (tokens_.bytes() < need) {
    tokens_.Reset();
    ASSIGN_OR_RETURN(tokens_, ops_->AllocateStaging(need));
  }
  return static_cast<uint8_t*>(tokens_.data());
}

absl::Status CudaPeerWriter::WriteToken(uint8_t* slot, uint64_t value) {
  DeviceGuard guard(device_);
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(slot, &value, kTokenBytes, cudaMemcpyHostToDevice, staging_io_stream_.get()),
      absl::StrCat("writing a token on device ", device_));
  return staging_io_stream_.Synchronize();
}

absl::StatusOr<uint64_t> CudaPeerWriter::ReadToken(const uint8_t* slot) {
  DeviceGuard guard(device_);
  uint64_t value = 0;
  WSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&value, slot, kTokenBytes, cudaMemcpyDeviceToHost, staging_io_stream_.get()),
      absl::StrCat("reading a token on device ", device_));
  RETURN_IF_ERROR(staging_io_stream_.Synchronize());
  return value;
}

absl::Status CudaPeerWriter::SynchronizePuts() {
  absl::Status first = CudaStatus(cudaStreamSynchronize(put_stream_.get()), "put stream");
  for (const Stream& st : put_copy_streams_) {
    absl::Status s = CudaStatus(cudaStreamSynchronize(st.get()), "put copy stream");
    if (first.ok()) first = s;
  }
  return first;
}

absl::Status CudaPeerWriter::EnsureGateEvents() {
  while (gate_events_.size() < put_copy_streams_.size() + 1) {
    ASSIGN_OR_RETURN(Event e, Event::Create(device_));
    gate_events_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status CudaPeerWriter::JoinPutStreams() {
  RETURN_IF_ERROR(EnsureGateEvents());
  DeviceGuard guard(device_);
  for (size_t i = 0; i < put_copy_streams_.size(); ++i) {
    RETURN_IF_ERROR(gate_events_[i].Record(put_copy_streams_[i].get()));
    WSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(put_stream_.get(), gate_events_[i].get(), 0),
                               absl::StrCat("joining the put streams on device ", device_));
  }
  return absl::OkStatus();
}

absl::Status CudaPeerWriter::ForkPutStreams() {
  if (put_copy_streams_.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(EnsureGateEvents());
  DeviceGuard guard(device_);
  const Event& e = gate_events_[put_copy_streams_.size()];
  RETURN_IF_ERROR(e.Record(put_stream_.get()));
  for (const Stream& st : put_copy_streams_) {
    WSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(st.get(), e.get(), 0),
                               absl::StrCat("forking the put streams on device ", device_));
  }
  return absl::OkStatus();
}

absl::Status CudaPeerWriter::SignalAfterPuts(absl::Span<const GatePost> posts) {
  RETURN_IF_ERROR(JoinPutStreams());
  return mailboxes_->SignalOn(put_stream_.get(), posts);
}

absl::Status CudaPeerWriter::GatePuts(absl::Span<const GateWait> waits, absl::Duration timeout) {
  RETURN_IF_ERROR(JoinPutStreams());
  RETURN_IF_ERROR(mailboxes_->WaitOn(put_stream_.get(), waits, timeout));
  return ForkPutStreams();
}

absl::Status CudaPeerWriter::Fence() {
  absl::Status s = SynchronizePuts();
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("puts from device ", device_,
                                             " (a put copy or put kernel failed, or a peer's "
                                             "memory is not reachable): ",
                                             s.message()));
}

absl::StatusOr<uint64_t> CudaPeerWriter::Mark() {
  DeviceGuard guard(device_);
  std::vector<Event> events;
  std::vector<cudaStream_t> streams = {put_stream_.get()};
  for (const Stream& st : put_copy_streams_) streams.push_back(st.get());
  for (cudaStream_t st : streams) {
    Event e;
    if (!spare_events_.empty()) {
      e = std::move(spare_events_.back());
      spare_events_.pop_back();
    } else {
      ASSIGN_OR_RETURN(e, Event::Create(device_));
    }
    RETURN_IF_ERROR(e.Record(st));
    events.push_back(std::move(e));
  }
  marks_[++last_mark_] = std::move(events);
  return last_mark_;
}

absl::StatusOr<bool> CudaPeerWriter::PollMark(uint64_t mark) {
  if (mark == 0 || mark > last_mark_) {
    return absl::InvalidArgumentError(absl::StrCat("put mark ", mark, " was never made"));
  }
  auto it = marks_.find(mark);
  if (it == marks_.end()) return true;  // reached and dropped before
  for (const Event& e : it->second) {
    auto done = e.Query();
    if (!done.ok()) {
      return absl::Status(done.status().code(),
                          absl::StrCat("puts from device ", device_, " (put mark ", mark,
                                       "): ", done.status().message()));
    }
    if (!*done) return false;
  }
  for (Event& e : it->second) spare_events_.push_back(std::move(e));
  marks_.erase(it);
  return true;
}

}  // namespace wsync::cuda
