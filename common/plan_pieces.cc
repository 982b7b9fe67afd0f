#include "common/plan_pieces.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/plan_names.h"
#include "common/status_macros.h"

namespace wsync {
namespace {

// base + k * step, false on int64 overflow.
bool Stepped(int64_t base, int64_t step, int64_t k, int64_t* out) {
  int64_t by = 0;
  return !__builtin_mul_overflow(step, k, &by) && !__builtin_add_overflow(base, by, out);
}

// One stepped field checked at both ends: in [lo, hi) (hi 0: no upper bound).
absl::Status CheckEnds(int64_t base, int64_t step, int64_t last, int64_t lo, int64_t hi,
                       const std::string& where, const char* field) {
  int64_t end = 0;
  if (!Stepped(base, step, last, &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", field, " ", base, " + ", last, " x ", step, " overflows"));
  }
  for (int64_t v : {base, end}) {
    if (v < lo || (hi > 0 && v >= hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, " of a member is ", v, ", outside [", lo, ", ",
                       hi > 0 ? absl::StrCat(hi) : std::string("2^63"), ")"));
    }
  }
  return absl::OkStatus();
}

// One stepped field checked at the run's corners (rows 0 and olast, members
// 0 and last): values are linear in row and member, so the corners bound
// every member.
absl::Status CheckCorners(int64_t base, int64_t step, int64_t last, int64_t outer_step,
                          int64_t olast, int64_t lo, int64_t hi, const std::string& where,
                          const char* field) {
  for (int64_t j : {int64_t{0}, olast}) {
    int64_t row = 0;
    if (!Stepped(base, outer_step, j, &row)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " ", base, " + ", j,
                                                     " x outer step ", outer_step, " overflows"));
    }
    RETURN_IF_ERROR(CheckEnds(row, step, last, lo, hi, where, field));
  }
  return absl::OkStatus();
}

absl::Status CheckPieceKind(const v1::PieceRun& run, const std::string& where) {
  const v1::Piece& f = run.first();
  if (run.count() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": count ", run.count(), " (a run has at least 2 members)"));
  }
  if (run.outer_count() < 0 || run.outer_count() == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": outer_count ", run.outer_count(), " (0: one row; else >= 2)"));
  }
  if (f.reduce_id() != 0 || f.quantize_id() != 0 || f.scales_of() != 0 ||
      f.quant_block_size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": a run's piece may not be a reduce or quantize input, a scales piece or "
                     "quantized at the sender"));
  }
  return absl::OkStatus();
}

// The members' packed bytes lie in the bucket and never overlap.
absl::Status CheckBucketRange(const v1::PieceRun& run, int64_t bucket_bytes,
                              const std::string& where) {
  const v1::Piece& f = run.first();
  const int64_t elem = DTypeSize(f.wire_dtype());
  if (elem <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no wire dtype"));
  }
  absl::StatusOr<int64_t> wire = CheckedBytes(f.dst().shape(), elem, where + ": dst shape");
  if (!wire.ok()) return wire.status();
  if (run.bucket_step() < *wire) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bucket_step ", run.bucket_step(),
                                                   " is under one member's ", *wire,
                                                   " wire bytes: members would overlap"));
  }
  const int64_t last = run.count() - 1;
  const int64_t olast = RunRows(run) - 1;
  int64_t row_end = 0;  // a row's bytes from its first member's offset
  if (!Stepped(*wire, run.bucket_step(), last, &row_end)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bucket offsets overflow"));
  }
  if (olast > 0 && run.outer_bucket_step() < row_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": outer_bucket_step ", run.outer_bucket_step(), " is under one row's ", row_end,
        " bytes: rows would overlap"));
  }
  int64_t last_row = 0, last_offset = 0;
  if (f.bucket_offset() < 0 ||
      !Stepped(f.bucket_offset(), run.outer_bucket_step(), olast, &last_row) ||
      !Stepped(last_row, run.bucket_step(), last, &last_offset)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bucket offsets overflow"));
  }
  absl::Status within =
      RangeWithin(last_offset, *wire, bucket_bytes, where + ": the last member's bytes");
  return within.ok() ? within : absl::InvalidArgumentError(within.message());
}

absl::Status CheckRun(const v1::PieceRun& run, int64_t bucket_bytes, int32_t num_names,
                      const std::string& where) {
  RETURN_IF_ERROR(CheckPieceKind(run, where));
  const v1::Piece& f = run.first();
  const int64_t last = run.count() - 1;
  const int64_t olast = RunRows(run) - 1;
  const int64_t names = num_names;
  RETURN_IF_ERROR(CheckCorners(f.tensor_name(), run.tensor_name_step(), last,
                               run.outer_tensor_name_step(), olast, 0, names, where,
                               "tensor_name"));
  RETURN_IF_ERROR(CheckCorners(f.src().buffer_name(), run.src_buffer_step(), last,
                               run.outer_src_buffer_step(), olast, 0, names, where,
                               "src.buffer_name"));
  RETURN_IF_ERROR(CheckCorners(f.dst().buffer_name(), run.dst_buffer_step(), last,
                               run.outer_dst_buffer_step(), olast, 0, names, where,
                               "dst.buffer_name"));
  RETURN_IF_ERROR(CheckCorners(f.src().byte_offset(), run.src_byte_step(), last,
                               run.outer_src_byte_step(), olast, 0, 0, where, "src.byte_offset"));
  RETURN_IF_ERROR(CheckCorners(f.dst().byte_offset(), run.dst_byte_step(), last,
                               run.outer_dst_byte_step(), olast, 0, 0, where, "dst.byte_offset"));
  return CheckBucketRange(run, bucket_bytes, where);
}

}  // namespace

absl::Status CheckPieceRuns(const v1::Bucket& bucket, int32_t num_names) {
  for (int i = 0; i < bucket.runs_size(); ++i) {
    const std::string where = absl::StrCat("bucket ", bucket.id(), " run ", i);
    if (absl::Status s = CheckRun(bucket.runs(i), bucket.bytes(), num_names, where); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPlanRuns(const v1::Plan& plan, int64_t max_members) {
  int64_t members = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    for (int i = 0; i < b.runs_size(); ++i) {
      const int64_t run_members = RunMembers(b.runs(i));  // members <= max_members here
      if (run_members > max_members - members) {
        return absl::InvalidArgumentError(absl::StrCat("bucket ", b.id(), " run ", i,
                                                       ": the plan's runs stand for more than ",
                                                       max_members, " pieces"));
      }
      members += run_members;
    }
    RETURN_IF_ERROR(CheckPieceRuns(b, plan.names_size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PieceCount(const v1::Bucket& bucket) {
  int64_t n = bucket.pieces_size();
  for (const v1::PieceRun& run : bucket.runs()) {
    if (run.count() < 0 || run.outer_count() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket.id(), ": a run of ",
                                                     run.count(), " x ", run.outer_count(),
                                                     " pieces"));
    }
    absl::StatusOr<int64_t> sum = CheckedAdd(n, RunMembers(run), "bucket pieces");
    if (!sum.ok()) return sum.status();
    n = *sum;
  }
  return n;
}

absl::Status ForEachPiece(const v1::Bucket& bucket,
                          absl::FunctionRef<absl::Status(int64_t, const v1::Piece&)> fn) {
  int64_t index = 0;
  for (const v1::Piece& p : bucket.pieces()) {
    if (absl::Status s = fn(index++, p); !s.ok()) return s;
  }
  v1::Piece member;
  for (const v1::PieceRun& run : bucket.runs()) {
    const v1::Piece& f = run.first();
    member = f;
    const int64_t rows = RunRows(run);
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t tensor = f.tensor_name() + j * run.outer_tensor_name_step();
      const int64_t src_buffer = f.src().buffer_name() + j * run.outer_src_buffer_step();
      const int64_t dst_buffer = f.dst().buffer_name() + j * run.outer_dst_buffer_step();
      const int64_t src_offset = f.src().byte_offset() + j * run.outer_src_byte_step();
      const int64_t dst_offset = f.dst().byte_offset() + j * run.outer_dst_byte_step();
      const int64_t bucket_offset = f.bucket_offset() + j * run.outer_bucket_step();
      for (int64_t k = 0; k < run.count(); ++k) {
        member.set_tensor_name(static_cast<int32_t>(tensor + k * run.tensor_name_step()));
        member.mutable_src()->set_buffer_name(
            static_cast<int32_t>(src_buffer + k * run.src_buffer_step()));
        member.mutable_dst()->set_buffer_name(
            static_cast<int32_t>(dst_buffer + k * run.dst_buffer_step()));
        member.mutable_src()->set_byte_offset(src_offset + k * run.src_byte_step());
        member.mutable_dst()->set_byte_offset(dst_offset + k * run.dst_byte_step());
        member.set_bucket_offset(bucket_offset + k * run.bucket_step());
        if (absl::Status s = fn(index++, member); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

v1::Bucket ExpandRuns(const v1::Bucket& bucket) {
  v1::Bucket out = bucket;
  out.clear_runs();
  out.clear_pieces();
  (void)ForEachPiece(bucket, [&](int64_t, const v1::Piece& p) {
    *out.add_pieces() = p;
    return absl::OkStatus();
  });
  return out;
}

bool HasPieceRuns(const v1::Plan& plan) {
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.runs_size() > 0) return true;
  }
  return false;
}

bool HasPieceRunRows(const v1::Plan& plan) {
  for (const v1::Bucket& b : plan.buckets()) {
    for (const v1::PieceRun& r : b.runs()) {
      if (r.outer_count() != 0) return true;
    }
  }
  return false;
}

v1::Plan ExpandPlanRuns(const v1::Plan& plan) {
  v1::Plan out = plan;
  for (v1::Bucket& b : *out.mutable_buckets()) {
    if (b.runs_size() > 0) b = ExpandRuns(b);
  }
  return out;
}

std::string BucketPieceNames(const v1::Plan& plan, const v1::Bucket& bucket) {
  const v1::Piece* first = nullptr;
  if (bucket.pieces_size() > 0) {
    first = &bucket.pieces(0);
  } else if (bucket.runs_size() > 0) {
    first = &bucket.runs(0).first();
  }
  if (first == nullptr) return "?";
  std::string names = PlanNameOrIndex(plan, first->tensor_name());
  absl::StatusOr<int64_t> n = PieceCount(bucket);
  if (!n.ok()) return absl::StrCat(names, " (", n.status().message(), ")");
  if (*n > 1) absl::StrAppend(&names, " and ", *n - 1, " more pieces");
  return names;
}

}  // namespace wsync
