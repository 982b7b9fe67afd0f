#include "worker/exec/verify_pass.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chunk_hash.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace wsync::exec {
namespace {

// [offset, offset + bytes) of a bucket (relative to its start).
using Range = std::pair<int64_t, int64_t>;

constexpr int64_t kLocalAlign = 256;

int64_t AlignUp(int64_t x) { return (x + kLocalAlign - 1) / kLocalAlign * kLocalAlign; }

int64_t WireBytes(const StridedView& v, DType wire) { return v.num_elements() * DTypeSize(wire); }

int64_t CeilDiv(int64_t a, int64_t b) { return b <= 0 ? 0 : (a + b - 1) / b; }

// The ranges a pack item writes, relative to `base`.
void PackRanges(const PackItem& item, int64_t base, std::vector<Range>& out) {
  out.emplace_back(item.staging_offset - base, WireBytes(item.src, item.wire_dtype));
  if (item.quant_block_rows > 0) {
    const int64_t scales = item.quant_outer * CeilDiv(item.quant_rows, item.quant_block_rows) *
                           CeilDiv(item.quant_cols, item.quant_block_cols);
    out.emplace_back(item.scale_offset - base, scales * static_cast<int64_t>(sizeof(float)));
  }
}

bool Inside(int64_t offset, const BoundTransfer& t) {
  return offset >= t.staging_offset && offset < t.staging_offset + t.bytes;
}

// The verify hash of the bytes `ranges` cover at `data` (see the header).
absl::StatusOr<uint64_t> HashRuns(DataOps* ops, const uint8_t* data, std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<Range> runs;  // merged: [begin, end)
  for (const auto& [offset, bytes] : ranges) {
    if (bytes <= 0) continue;
    if (!runs.empty() && offset <= runs.back().second) {
      runs.back().second = std::max(runs.back().second, offset + bytes);
    } else {
      runs.emplace_back(offset, offset + bytes);
    }
  }
  uint64_t sum = 0;
  int64_t covered = 0;
  for (const auto& [begin, end] : runs) {
    ASSIGN_OR_RETURN(const uint64_t h, ops->Checksum(data + begin, end - begin));
    sum += chunk_hash::Term(h, begin);  // each run tied to its offset
    covered += end - begin;
  }
  return chunk_hash::Finish(sum, covered);
}

class Pass {
 public:
  Pass(const BoundPlan& plan, DataOps* ops, VerifySides sides)
      : plan_(plan), ops_(ops), sides_(sides) {}

  absl::StatusOr<VerifyResult> Run() {
    int64_t scratch = 0;
    for (const BoundRound& r : plan_.rounds) {
      scratch = std::max(scratch, std::max(r.staging_bytes, r.plan_staging_bytes));
      size_t item = 0;
      for (size_t k = 0; k < r.copy_buckets.size(); ++k) {
        int64_t bytes = 0;
        for (int32_t i = 0; i < r.copy_counts[k]; ++i, ++item) {
          bytes += AlignUp(WireBytes(r.copies[item].dst, r.copies[item].dst.dtype));
        }
        scratch = std::max(scratch, 2 * bytes);
      }
    }
    ASSIGN_OR_RETURN(buffer_, ops_->AllocateStaging(scratch));
    base_ = static_cast<uint8_t*>(buffer_.data());
    for (const BoundRound& r : plan_.rounds) {
      const std::string where = absl::StrCat("worker ", plan_.worker, " round ", r.index);
      if (sides_.sends) RETURN_IF_ERROR(Annotate(Sends(r), where));
      if (sides_.receives) RETURN_IF_ERROR(Annotate(Receives(r), where));
      if (sides_.locals) RETURN_IF_ERROR(Annotate(Locals(r), where));
    }
    return std::move(result_);
  }

 private:
  static absl::Status Annotate(absl::Status s, const std::string& where) {
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("verify pass, ", where, ": ", s.message()));
  }

  absl::Status Sends(const BoundRound& r) {
    if (!r.pack.empty()) RETURN_IF_ERROR(ops_->Pack(r.pack, base_));
    for (const BoundTransfer& t : r.sends) {
      std::vector<Range> ranges;
      const uint8_t* data = base_ + t.staging_offset;
      if (t.zero_copy) {
        ranges.emplace_back(0, t.bytes);
        data = static_cast<const uint8_t*>(t.direct);
      } else {
        for (const PackItem& p : r.pack) {
          if (Inside(p.staging_offset, t)) PackRanges(p, t.staging_offset, ranges);
        }
      }
      RETURN_IF_ERROR(Hash(t, data, std::move(ranges), /*sent=*/true));
    }
    return absl::OkStatus();
  }

  // Why bucket `t` received in round `r` cannot be verified ("": it can).
  static std::string NotVerifiable(const BoundRound& r, const BoundTransfer& t) {
    for (const ReduceInput& in : r.reduce_inputs) {
      if (in.staging_offset >= 0 && Inside(in.staging_offset, t)) return "reduced on receive";
    }
    for (const QuantizeInput& in : r.quantize_inputs) {
      if (in.staging_offset >= 0 && Inside(in.staging_offset, t)) {
        return "block-fp8 quantized on receive";
      }
    }
    for (const UnpackItem& u : r.unpack) {
      if (Inside(u.staging_offset, t) && u.dst.dtype != u.wire_dtype) {
        return absl::StrCat("cast on receive from ", DTypeName(u.wire_dtype), " to ",
                            DTypeName(u.dst.dtype));
      }
    }
    return "";
  }

  absl::Status Receives(const BoundRound& r) {
    std::vector<PackItem> back;  // the unpack reversed: live destination -> wire layout
    for (const BoundTransfer& t : r.recvs) {
      if (t.zero_copy || !NotVerifiable(r, t).empty()) continue;
      for (const UnpackItem& u : r.unpack) {
        if (Inside(u.staging_offset, t))
          back.push_back(PackItem{u.dst, u.staging_offset, u.wire_dtype});
      }
    }
    if (!back.empty()) RETURN_IF_ERROR(ops_->Pack(back, base_));
    for (const BoundTransfer& t : r.recvs) {
      std::vector<Range> ranges;
      const uint8_t* data = base_ + t.staging_offset;
      if (t.zero_copy) {
        ranges.emplace_back(0, t.bytes);
        data = static_cast<const uint8_t*>(t.direct);
      } else if (std::string why = NotVerifiable(r, t); !why.empty()) {
        result_.notes.push_back(VerifyNote{t.bucket, std::move(why), false});
        continue;
      } else {
        for (const PackItem& p : back) {
          if (Inside(p.staging_offset, t)) PackRanges(p, t.staging_offset, ranges);
        }
      }
      RETURN_IF_ERROR(Hash(t, data, std::move(ranges), /*sent=*/false));
    }
    return absl::OkStatus();
  }

  absl::Status Hash(const BoundTransfer& t, const uint8_t* data, std::vector<Range> ranges,
                    bool sent) {
    auto h = HashRuns(ops_, data, std::move(ranges));
    if (!h.ok()) {
      return absl::Status(h.status().code(), absl::StrCat(sent ? "sent" : "received", " bucket ",
                                                          t.bucket, ": ", h.status().message()));
    }
    result_.hashes.push_back(BucketChecksum{t.bucket, *h, sent});
    return absl::OkStatus();
  }

  // Each local bucket: sources and destinations packed side by side in the
  // destination dtype, hashed and compared.
  absl::Status Locals(const BoundRound& r) {
    size_t item = 0;
    for (size_t k = 0; k < r.copy_buckets.size(); ++k) {
      const int64_t bucket = r.copy_buckets[k];
      const size_t begin = item;
      item += r.copy_counts[k];
      if (r.copy_transformed[k]) {
        result_.notes.push_back(
            VerifyNote{bucket, "local copy quantized or reduced on this worker", false});
        continue;
      }
      std::vector<PackItem> src, dst;
      std::vector<Range> ranges;
      int64_t offset = 0, bytes = 0;
      for (size_t i = begin; i < item; ++i) {
        const CopyItem& c = r.copies[i];
        const int64_t n = WireBytes(c.dst, c.dst.dtype);
        src.push_back(PackItem{c.src, offset, c.dst.dtype});
        dst.push_back(PackItem{c.dst, offset, c.dst.dtype});
        ranges.emplace_back(offset, n);
        offset += AlignUp(n);
        bytes += n;
      }
      if (!src.empty()) {
        RETURN_IF_ERROR(ops_->Pack(src, base_));
        RETURN_IF_ERROR(ops_->Pack(dst, base_ + offset));
      }
      ASSIGN_OR_RETURN(const uint64_t from, HashRuns(ops_, base_, ranges));
      ASSIGN_OR_RETURN(const uint64_t to, HashRuns(ops_, base_ + offset, ranges));
      if (from != to) {
        result_.notes.push_back(VerifyNote{
            bucket,
            absl::StrCat("local copy: the destination hashes ", absl::Hex(to, absl::kZeroPad16),
                         ", its source ", absl::Hex(from, absl::kZeroPad16)),
            true});
        continue;
      }
      ++result_.local_buckets;
      result_.local_bytes += bytes;
    }
    return absl::OkStatus();
  }

  const BoundPlan& plan_;
  DataOps* const ops_;
  const VerifySides sides_;
  StagingBuffer buffer_;
  uint8_t* base_ = nullptr;
  VerifyResult result_;
};

}  // namespace

absl::StatusOr<VerifyResult> VerifyPass(const BoundPlan& plan, DataOps* ops, VerifySides sides) {
  return Pass(plan, ops, sides).Run();
}

}  // namespace wsync::exec
