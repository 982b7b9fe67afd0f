// The replay oracle: host buffers, the plan executed round by round
// (replay_structure.cc checks it first) and VerifyPlan (replay_check.cc
// writes the test data and checks the result).
#include "controller/verify/replay.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/block_fp8.h"
#include "common/cast.h"
#include "common/checked_math.h"
#include "common/plan_names.h"
#include "common/plan_pieces.h"
#include "common/status_macros.h"
#include "controller/verify/replay_internal.h"

namespace wsync::plan {

std::vector<uint8_t>* HostMemory::Find(int32_t worker, v1::BufferSide side,
                                       const std::string& buffer) {
  auto it = buffers_.find(Key(worker, side, buffer));
  return it == buffers_.end() ? nullptr : &it->second;
}

std::vector<uint8_t>& HostMemory::Ensure(int32_t worker, v1::BufferSide side,
                                         const std::string& buffer, int64_t bytes) {
  std::vector<uint8_t>& b = buffers_[Key(worker, side, buffer)];
  if (static_cast<int64_t>(b.size()) < bytes) b.resize(bytes, 0);
  return b;
}

namespace replay_detail {

int64_t ViewElems(const v1::TensorView& v) {
  int64_t n = 1;
  for (int64_t s : v.shape()) n *= s;
  return n;
}

// Block grid of a quantized view: blocks over its last two dims.
absl::StatusOr<BlockGrid> GridOf(const google::protobuf::RepeatedField<int64_t>& shape,
                                 const google::protobuf::RepeatedField<int64_t>& block,
                                 const std::string& what) {
  if (shape.size() < 2 || block.size() != 2 || block[0] <= 0 || block[1] <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": block quantization needs a view of >= 2 dims and 2 positive blocks"));
  }
  BlockGrid g;
  for (int d = 0; d + 2 < shape.size(); ++d) g.outer *= shape[d];
  g.rows = shape[shape.size() - 2];
  g.cols = shape[shape.size() - 1];
  g.block_rows = block[0];
  g.block_cols = block[1];
  return g;
}

}  // namespace replay_detail

namespace {

using replay_detail::CheckPlanStructure;
using replay_detail::GridOf;
using replay_detail::ViewElems;

std::string SideName(v1::BufferSide s) { return s == v1::SOURCE_BUFFER ? "source" : "destination"; }

// Byte span [lo, hi) a view touches; false if empty.
bool ViewSpan(const v1::TensorView& v, int64_t* lo, int64_t* hi) {
  const int64_t es = DTypeSize(v.dtype());
  int64_t min_e = 0, max_e = 0;
  for (int d = 0; d < v.shape_size(); ++d) {
    if (v.shape(d) == 0) return false;
    const int64_t span = (v.shape(d) - 1) * v.strides(d);
    if (span < 0)
      min_e += span;
    else
      max_e += span;
  }
  *lo = v.byte_offset() + min_e * es;
  *hi = v.byte_offset() + (max_e + 1) * es;
  return true;
}

// Calls fn(byte offset of element) for every element in row-major order.
template <typename Fn>
void ForEachElement(const v1::TensorView& v, Fn fn) {
  const int rank = v.shape_size();
  const int64_t es = DTypeSize(v.dtype());
  if (ViewElems(v) == 0) return;
  std::vector<int64_t> idx(rank, 0);
  while (true) {
    int64_t e = 0;
    for (int d = 0; d < rank; ++d) e += idx[d] * v.strides(d);
    fn(v.byte_offset() + e * es);
    int d = rank - 1;
    while (d >= 0 && ++idx[d] == v.shape(d)) idx[d--] = 0;
    if (d < 0) return;
  }
}

class Replayer {
 public:
  Replayer(const v1::Plan& plan, HostMemory* mem) : plan_(plan), mem_(mem) {}

  absl::Status Run() {
    RETURN_IF_ERROR(CheckPlanStructure(plan_));
    for (int32_t r = 0; r < plan_.num_rounds(); ++r) RETURN_IF_ERROR(RunRound(r));
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::vector<uint8_t>*> Buffer(int32_t worker, const v1::TensorView& v,
                                               const std::string& what) {
    ASSIGN_OR_RETURN(const std::string* name, PlanName(plan_, v.buffer_name(), what));
    std::vector<uint8_t>* b = mem_->Find(worker, v.side(), *name);
    if (b == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": worker ", worker, " has no ",
                                                     SideName(v.side()), " buffer '", *name, "'"));
    }
    if (v.shape_size() != v.strides_size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": view shape/strides rank differ"));
    }
    int64_t lo, hi;
    if (ViewSpan(v, &lo, &hi) && (lo < 0 || hi > static_cast<int64_t>(b->size()))) {
      return absl::OutOfRangeError(
          absl::StrCat(what, ": view [", lo, ", ", hi, ") outside ", SideName(v.side()),
                       " buffer '", *name, "' of worker ", worker, " (", b->size(), " bytes)"));
    }
    return b;
  }

  absl::Status Gather(int32_t worker, const v1::TensorView& v, v1::DType wire, uint8_t* out,
                      const std::string& what) {
    ASSIGN_OR_RETURN(std::vector<uint8_t> * b, Buffer(worker, v, what));
    const int64_t es = DTypeSize(v.dtype());
    std::vector<uint8_t> tmp(ViewElems(v) * es);
    int64_t k = 0;
    ForEachElement(v, [&](int64_t at) {
      std::memcpy(&tmp[k], b->data() + at, es);
      k += es;
    });
    return ConvertElements(tmp.data(), v.dtype(), out, wire, ViewElems(v));
  }

  absl::Status Scatter(int32_t worker, const v1::TensorView& v, v1::DType from, const uint8_t* in,
                       const std::string& what) {
    ASSIGN_OR_RETURN(std::vector<uint8_t> * b, Buffer(worker, v, what));
    const int64_t es = DTypeSize(v.dtype());
    std::vector<uint8_t> tmp(ViewElems(v) * es);
    RETURN_IF_ERROR(ConvertElements(in, from, tmp.data(), v.dtype(), ViewElems(v)));
    int64_t k = 0;
    ForEachElement(v, [&](int64_t at) {
      std::memcpy(b->data() + at, &tmp[k], es);
      k += es;
    });
    return absl::OkStatus();
  }

  // Round r as a worker runs it: the staged buckets (and local copies) are
  // packed first; then step by step, the zero-copy buckets of the step are
  // all read, then all written (so a zero-copy relay sees what earlier steps
  // of the round brought, never its own step's); then the staged buckets
  // are unpacked, and the round's reduces and quantizes run.
  absl::Status RunRound(int32_t r) {
    std::vector<int> staged;
    std::map<int32_t, std::vector<int>> zero_copy_steps;
    for (int i = 0; i < plan_.buckets_size(); ++i) {
      const v1::Bucket& b = plan_.buckets(i);
      if (b.round() != r) continue;
      if (b.zero_copy() && b.transport() == v1::TRANSPORT_NETWORK) {
        zero_copy_steps[b.step()].push_back(i);
      } else {
        staged.push_back(i);
      }
    }
    std::map<int, std::vector<uint8_t>> wire;
    for (int i : staged) RETURN_IF_ERROR(Pack(i, &wire[i]));
    for (const auto& [step, in_step] : zero_copy_steps) {
      for (int i : in_step) RETURN_IF_ERROR(Pack(i, &wire[i]));
      for (int i : in_step) RETURN_IF_ERROR(Unpack(i, wire[i]));
    }
    for (int i : staged) RETURN_IF_ERROR(Unpack(i, wire[i]));
    for (const v1::Reduce& red : plan_.reduces()) {
      if (red.round() == r) RETURN_IF_ERROR(RunReduce(red, wire));
    }
    for (const v1::Quantize& q : plan_.quantizes()) {
      if (q.round() == r) RETURN_IF_ERROR(RunQuantize(q, wire));
    }
    return absl::OkStatus();
  }

  // Bucket i's wire bytes: every piece read from the sender's view and cast
  // to its wire dtype; a quantized piece block-quantized, its scales written
  // into its scale piece.
  absl::Status Pack(int i, std::vector<uint8_t>* data) {
    const v1::Bucket& b = plan_.buckets(i);
    data->assign(b.bytes(), 0);
    for (int k = 0; k < b.pieces_size(); ++k) {
      const v1::Piece& p = b.pieces(k);
      const std::string what = absl::StrCat("bucket ", i, " piece ", k, " (",
                                            PlanNameOrIndex(plan_, p.tensor_name()), ") src");
      if (p.scales_of() != 0) continue;  // written with its quantized piece
      if (p.quant_block_size() == 0) {
        RETURN_IF_ERROR(
            Gather(b.sender(), p.src(), p.wire_dtype(), data->data() + p.bucket_offset(), what));
        continue;
      }
      ASSIGN_OR_RETURN(BlockGrid g, GridOf(p.dst().shape(), p.quant_block(), what));
      std::vector<float> x(ViewElems(p.src()));
      RETURN_IF_ERROR(
          Gather(b.sender(), p.src(), v1::FP32, reinterpret_cast<uint8_t*>(x.data()), what));
      std::vector<float> scales(g.num_blocks());
      RETURN_IF_ERROR(
          QuantizeBlocksFp8E4M3(x.data(), g, data->data() + p.bucket_offset(), scales.data()));
      for (const v1::Piece& o : b.pieces()) {
        if (o.scales_of() == k + 1) {
          std::memcpy(data->data() + o.bucket_offset(), scales.data(), scales.size() * 4);
        }
      }
    }
    return absl::OkStatus();
  }

  // Bucket i's pieces (but reduce and quantize inputs) cast into the
  // receiver's views.
  absl::Status Unpack(int i, const std::vector<uint8_t>& data) {
    const v1::Bucket& b = plan_.buckets(i);
    for (int k = 0; k < b.pieces_size(); ++k) {
      const v1::Piece& p = b.pieces(k);
      if (p.reduce_id() != 0 || p.quantize_id() != 0) continue;
      RETURN_IF_ERROR(Scatter(b.receiver(), p.dst(), p.wire_dtype(),
                              data.data() + p.bucket_offset(),
                              absl::StrCat("bucket ", i, " piece ", k, " (",
                                           PlanNameOrIndex(plan_, p.tensor_name()), ") dst")));
    }
    return absl::OkStatus();
  }

  // Reduces the inputs of `red` (its round's contributions, in the
  // accumulate dtype) into its destination view.
  absl::Status RunReduce(const v1::Reduce& red, std::map<int, std::vector<uint8_t>>& wire) {
    const int64_t n = ViewElems(red.dst());
    const int64_t es = DTypeSize(red.accumulate_dtype());
    std::vector<std::vector<uint8_t>> inputs;
    std::vector<const void*> ptrs;
    for (const v1::ReduceInput& in : red.inputs()) {
      if (in.bucket() < 0 || in.bucket() >= plan_.buckets_size() || in.piece() < 0 ||
          in.piece() >= plan_.buckets(in.bucket()).pieces_size()) {
        return absl::InvalidArgumentError(absl::StrCat("reduce ", red.id(), ": bad input"));
      }
      const v1::Bucket& b = plan_.buckets(in.bucket());
      const v1::Piece& p = b.pieces(in.piece());
      if (b.round() != red.round() || p.reduce_id() != red.id() || ViewElems(p.src()) != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("reduce ", red.id(), ": input bucket ", in.bucket(), " piece ", in.piece(),
                         " is not its contribution in round ", red.round()));
      }
      inputs.emplace_back(n * es);
      RETURN_IF_ERROR(ConvertElements(wire[in.bucket()].data() + p.bucket_offset(), p.wire_dtype(),
                                      inputs.back().data(), red.accumulate_dtype(), n));
    }
    for (const auto& v : inputs) ptrs.push_back(v.data());
    std::vector<uint8_t> acc(n * es);
    RETURN_IF_ERROR(ReduceElements(ptrs, red.accumulate_dtype(), red.op(), acc.data(), n));
    return Scatter(red.worker(), red.dst(), red.accumulate_dtype(), acc.data(),
                   absl::StrCat("reduce ", red.id(), " dst"));
  }

  // Assembles the inputs (each exactly once over the region), then quantizes.
  absl::Status RunQuantize(const v1::Quantize& q, std::map<int, std::vector<uint8_t>>& wire) {
    const std::string what = absl::StrCat("quantize ", q.id());
    ASSIGN_OR_RETURN(BlockGrid g, GridOf(q.dst().shape(), q.block(), what));
    const int rank = q.dst().shape_size();
    const int64_t n = ViewElems(q.dst());
    std::vector<float> x(n, 0.0f);
    std::vector<uint8_t> seen(n, 0);
    for (const v1::QuantizeInput& in : q.inputs()) {
      if (in.bucket() < 0 || in.bucket() >= plan_.buckets_size() || in.piece() < 0 ||
          in.piece() >= plan_.buckets(in.bucket()).pieces_size() || in.offset_size() != rank) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": bad input"));
      }
      const v1::Bucket& b = plan_.buckets(in.bucket());
      const v1::Piece& p = b.pieces(in.piece());
      if (b.round() != q.round() || p.quantize_id() != q.id() || p.dst().shape_size() != rank) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": input bucket ", in.bucket(),
                                                       " piece ", in.piece(), " is not its part"));
      }
      const int64_t m = ViewElems(p.dst());
      std::vector<float> v(m);
      RETURN_IF_ERROR(ConvertElements(wire[in.bucket()].data() + p.bucket_offset(), p.wire_dtype(),
                                      v.data(), v1::FP32, m));
      std::vector<int64_t> idx(rank, 0);
      for (int64_t k = 0; k < m; ++k) {
        int64_t lin = 0;
        for (int d = 0; d < rank; ++d) {
          const int64_t c = idx[d] + in.offset(d);
          if (c < 0 || c >= q.dst().shape(d)) {
            return absl::InvalidArgumentError(absl::StrCat(what, ": input outside the region"));
          }
          lin = lin * q.dst().shape(d) + c;
        }
        if (seen[lin]++) return absl::InvalidArgumentError(absl::StrCat(what, ": inputs overlap"));
        x[lin] = v[k];
        for (int d = rank - 1; d >= 0 && ++idx[d] == p.dst().shape(d); --d) idx[d] = 0;
      }
    }
    if (std::find(seen.begin(), seen.end(), 0) != seen.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": inputs do not cover the region"));
    }
    std::vector<uint8_t> fp8(n);
    std::vector<float> scales(g.num_blocks());
    RETURN_IF_ERROR(QuantizeBlocksFp8E4M3(x.data(), g, fp8.data(), scales.data()));
    if (ViewElems(q.scale_dst()) != g.num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": scale_dst is not the block grid"));
    }
    RETURN_IF_ERROR(Scatter(q.worker(), q.dst(), v1::FP8_E4M3, fp8.data(), what + " dst"));
    return Scatter(q.worker(), q.scale_dst(), v1::FP32, reinterpret_cast<uint8_t*>(scales.data()),
                   what + " scale_dst");
  }

  const v1::Plan& plan_;
  HostMemory* mem_;
};

}  // namespace

absl::Status ReplayPlan(const v1::Plan& plan, HostMemory* mem) {
  if (!HasPieceRuns(plan)) return Replayer(plan, mem).Run();
  // Runs replay as the pieces they stand for: checked (naming bucket and
  // run), then written out, so every later check sees each member.
  RETURN_IF_ERROR(CheckPlanRuns(plan));
  const v1::Plan expanded = ExpandPlanRuns(plan);
  return Replayer(expanded, mem).Run();
}

absl::StatusOr<std::map<HostMemory::Key, int64_t>> ReplayBufferBytes(
    const CompiledSide& source, const CompiledSide& destination) {
  std::map<HostMemory::Key, int64_t> ends;
  for (const CompiledSide* side : {&source, &destination}) {
    const v1::BufferSide bs = side == &source ? v1::SOURCE_BUFFER : v1::DESTINATION_BUFFER;
    for (const CompiledTensor& t : side->tensors) {
      for (const CompiledFragment& f : t.fragments()) {
        const std::string what = absl::StrCat(SideName(bs), " tensor '", t.name, "' on rank ",
                                              f.rank, " box ", f.box.ToString());
        ASSIGN_OR_RETURN(const int64_t extent,
                         StridedExtent(f.box.length, f.strides, DTypeSize(t.dtype), what));
        ASSIGN_OR_RETURN(const int64_t end, CheckedAdd(f.byte_offset, extent, what));
        int64_t& e =
            ends[HostMemory::Key(side->workers[f.rank], bs, side->buffer_names[t.buffer(f)])];
        e = std::max(e, end);
      }
    }
  }
  return ends;
}

absl::Status AllocateBuffers(const CompiledSide& source, const CompiledSide& destination,
                             HostMemory* mem) {
  ASSIGN_OR_RETURN(auto ends, ReplayBufferBytes(source, destination));
  for (const auto& [key, bytes] : ends) {
    const auto& [worker, side, buffer] = key;
    try {
      mem->Ensure(worker, static_cast<v1::BufferSide>(side), buffer, bytes);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("replay: cannot allocate ", bytes, " host bytes for ",
                       SideName(static_cast<v1::BufferSide>(side)), " buffer '", buffer,
                       "' of worker ", worker));
    } catch (const std::length_error&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "replay: ", bytes, " bytes for ", SideName(static_cast<v1::BufferSide>(side)),
          " buffer '", buffer, "' of worker ", worker, " exceed what one host array can hold"));
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyPlan(const v1::TransferSpec& spec, const v1::Plan& plan) {
  ASSIGN_OR_RETURN(CompiledSide source, CompileSide(spec.source(), SideRole::kSource));
  ASSIGN_OR_RETURN(CompiledSide destination,
                   CompileSide(spec.destination(), SideRole::kDestination));
  int64_t range = 1000000;
  for (const CompiledSide* side : {&source, &destination}) {
    for (const CompiledTensor& t : side->tensors) {
      // Block-fp8 tensors are checked against a reference quantization, not
      // by exact values: they need no narrow range (and a wide one rounds).
      if (t.quantized() || t.scales_for >= 0) continue;
      range = std::min(range, SyntheticRange(t.dtype));
    }
  }
  HostMemory mem;
  RETURN_IF_ERROR(AllocateBuffers(source, destination, &mem));
  RETURN_IF_ERROR(FillSource(source, range, &mem));
  RETURN_IF_ERROR(ReplayPlan(plan, &mem));
  return CheckDestination(spec, source, destination, range, mem);
}

}  // namespace wsync::plan
