#include "worker/plane/wire_hash.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cast.h"
#include "common/chunk_hash.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace wsync::exec {
namespace {

// The chunk_hash sum of a byte stream fed in order from offset 0.
class WordSum {
 public:
  void Bytes(const uint8_t* p, int64_t n) {
    for (; n > 0 && fill_ != 0; --n) Put(*p++);
    for (; n >= 8; n -= 8, p += 8) {
      uint64_t w = 0;
      std::memcpy(&w, p, 8);  // little-endian, as chunk_hash's words
      sum_ += chunk_hash::Term(w, pos_ / 8);
      pos_ += 8;
    }
    for (; n > 0; --n) Put(*p++);
  }
  // Zero bytes up to offset `end`.
  void ZerosTo(int64_t end) {
    while (pos_ < end && fill_ != 0) Put(0);
    for (; end - pos_ >= 8; pos_ += 8) sum_ += chunk_hash::Term(0, pos_ / 8);
    while (pos_ < end) Put(0);
  }
  int64_t pos() const { return pos_; }
  uint64_t Finish(int64_t total) {
    ZerosTo(total);
    if (fill_ != 0) sum_ += chunk_hash::Term(word_, (pos_ - fill_) / 8);  // zero-padded
    return chunk_hash::Finish(sum_, total);
  }

 private:
  void Put(uint8_t b) {
    word_ |= static_cast<uint64_t>(b) << (8 * fill_);
    ++pos_;
    if (++fill_ == 8) {
      sum_ += chunk_hash::Term(word_, (pos_ - 8) / 8);
      word_ = 0;
      fill_ = 0;
    }
  }
  uint64_t sum_ = 0;
  int64_t pos_ = 0;
  uint64_t word_ = 0;
  int fill_ = 0;
};

// Feeds item `it`'s wire bytes, a chunk of elements at a time.
absl::Status FeedItem(const WireHashItem& it, WordSum& sum) {
  const StridedView& v = it.view;
  const int64_t es = DTypeSize(v.dtype);
  const int64_t n = v.num_elements();
  if (n == 0) return absl::OkStatus();
  const DType mid = it.via != v1::DTYPE_UNSPECIFIED ? it.via : v.dtype;
  const auto* base = static_cast<const uint8_t*>(v.data);
  if (v.contiguous() && mid == v.dtype && it.wire_dtype == mid) {
    sum.Bytes(base, n * es);  // the wire bytes themselves
    return absl::OkStatus();
  }
  constexpr int64_t kChunk = 4096;
  std::vector<uint8_t> src(static_cast<size_t>(kChunk * es));
  std::vector<uint8_t> via(static_cast<size_t>(kChunk * DTypeSize(mid)));
  std::vector<uint8_t> wire(static_cast<size_t>(kChunk * DTypeSize(it.wire_dtype)));
  const int nd = std::max(v.ndim, 1);
  std::array<int64_t, kMaxViewDims> idx{};
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(kChunk, n - done);
    const uint8_t* out = src.data();
    // Gather m elements row-major from idx on (in place when contiguous).
    if (v.contiguous()) out = base + done * es;
    for (int64_t e = 0; !v.contiguous() && e < m; ++e) {
      int64_t off = 0;
      for (int d = 0; d < nd; ++d) off += idx[d] * (v.ndim == 0 ? 0 : v.strides[d]);
      std::memcpy(src.data() + e * es, base + off * es, static_cast<size_t>(es));
      for (int d = nd - 1; d >= 0; --d) {
        if (v.ndim == 0 || ++idx[d] < v.shape[d]) break;
        idx[d] = 0;
      }
    }
    if (mid != v.dtype) {
      RETURN_IF_ERROR(ConvertElements(out, v.dtype, via.data(), mid, m));
      out = via.data();
    }
    if (it.wire_dtype != mid) {
      RETURN_IF_ERROR(ConvertElements(out, mid, wire.data(), it.wire_dtype, m));
      out = wire.data();
    }
    sum.Bytes(out, m * DTypeSize(it.wire_dtype));
    done += m;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckWireHashItems(absl::Span<const WireHashItem> items, int64_t bucket_bytes) {
  if (bucket_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("wire checksum of ", bucket_bytes, " bytes"));
  }
  int64_t end = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const WireHashItem& it = items[i];
    const int64_t ws = DTypeSize(it.wire_dtype);
    const DType mid = it.via != v1::DTYPE_UNSPECIFIED ? it.via : it.view.dtype;
    absl::Status bad;
    if (ws <= 0 || DTypeSize(it.view.dtype) <= 0) {
      bad = absl::InvalidArgumentError("no view or wire dtype");
    } else if (!CanConvert(it.view.dtype, mid) || !CanConvert(mid, it.wire_dtype)) {
      bad = absl::InvalidArgumentError(absl::StrCat("no conversion ", DTypeName(it.view.dtype),
                                                    " -> ", DTypeName(mid), " -> ",
                                                    DTypeName(it.wire_dtype)));
    } else if (it.view.ndim < 0 || it.view.ndim > kMaxViewDims ||
               (it.view.data == nullptr && it.view.num_elements() > 0)) {
      bad = absl::InvalidArgumentError("malformed view");
    } else if (it.bucket_offset < end) {
      bad = absl::InvalidArgumentError(absl::StrCat("bucket offset ", it.bucket_offset,
                                                    " before the end of the item before (", end,
                                                    "): items overlap or are not sorted"));
    } else {
      const int64_t n = it.view.num_elements();
      if (n > (bucket_bytes - it.bucket_offset) / ws) {
        bad = absl::InvalidArgumentError(absl::StrCat(n, " elements of ", ws, " bytes at offset ",
                                                      it.bucket_offset, " pass the end of a ",
                                                      bucket_bytes, "-byte bucket"));
      } else {
        end = it.bucket_offset + n * ws;
      }
    }
    if (!bad.ok()) return ItemError(bad, "wire checksum", i);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostWireHash(absl::Span<const WireHashItem> items, int64_t bucket_bytes) {
  RETURN_IF_ERROR(CheckWireHashItems(items, bucket_bytes));
  WordSum sum;
  for (size_t i = 0; i < items.size(); ++i) {
    sum.ZerosTo(items[i].bucket_offset);
    if (absl::Status s = FeedItem(items[i], sum); !s.ok()) {
      return ItemError(s, "wire checksum", i);
    }
  }
  return sum.Finish(bucket_bytes);
}

}  // namespace wsync::exec
