#include "controller/verify/replay.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/block_fp8.h"
#include "common/cast.h"
#include "common/plan_names.h"
#include "common/status_macros.h"

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

namespace {

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

int64_t ViewElems(const v1::TensorView& v) {
  int64_t n = 1;
  for (int64_t s : v.shape()) n *= s;
  return n;
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

class Replayer {
 public:
  Replayer(const v1::Plan& plan, HostMemory* mem) : plan_(plan), mem_(mem) {}

  absl::Status Run() {
    RETURN_IF_ERROR(CheckStructure());
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

  static bool ContiguousView(const v1::TensorView& v) {
    int64_t expect = 1;
    for (int d = v.shape_size() - 1; d >= 0; --d) {
      if (v.shape(d) == 1) continue;
      if (v.strides(d) != expect) return false;
      expect *= v.shape(d);
    }
    return true;
  }

  absl::Status CheckStructure() {
    const int nb = plan_.buckets_size();
    std::vector<int> sends(nb, 0), recvs(nb, 0), copies(nb, 0);
    absl::flat_hash_map<int64_t, int> reduce_index;
    for (int i = 0; i < plan_.reduces_size(); ++i) reduce_index[plan_.reduces(i).id()] = i;
    std::vector<int> reduce_ops(plan_.reduces_size(), 0);
    absl::flat_hash_map<int64_t, int> quant_index;
    for (int i = 0; i < plan_.quantizes_size(); ++i) quant_index[plan_.quantizes(i).id()] = i;
    std::vector<int> quant_ops(plan_.quantizes_size(), 0);
    for (int i = 0; i < nb; ++i) {
      const v1::Bucket& b = plan_.buckets(i);
      const std::string what = absl::StrCat("bucket ", b.id());
      if (b.id() != i) return absl::InvalidArgumentError(absl::StrCat(what, ": ids not dense"));
      if (b.round() < 0 || b.round() >= plan_.num_rounds()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": round ", b.round(), " out of range"));
      }
      if ((b.transport() == v1::TRANSPORT_LOCAL) != (b.sender() == b.receiver())) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": transport contradicts sender/receiver"));
      }
      if (i > 0) {
        const v1::Bucket& p = plan_.buckets(i - 1);
        const bool same =
            p.sender() == b.sender() && p.receiver() == b.receiver() && p.round() == b.round();
        // Ids are ordered by (round, sender, receiver) so seq is a running count.
        if (std::make_tuple(p.round(), p.sender(), p.receiver()) >
            std::make_tuple(b.round(), b.sender(), b.receiver())) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": buckets not ordered by round"));
        }
        if (b.seq() != (same ? p.seq() + 1 : 0)) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": seq ", b.seq(), " wrong"));
        }
      } else if (b.seq() != 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": seq ", b.seq(), " wrong"));
      }
      std::vector<std::pair<int64_t, int64_t>> spans;
      int64_t piece_bytes = 0;
      for (int k = 0; k < b.pieces_size(); ++k) {
        const v1::Piece& p = b.pieces(k);
        const int64_t n = ViewElems(p.dst());
        if (p.scales_of() != 0) {
          // Scales computed by another piece of the bucket: no src to read.
          const int q = p.scales_of() - 1;
          if (q < 0 || q >= b.pieces_size() || b.pieces(q).quant_block_size() == 0 ||
              p.wire_dtype() != v1::FP32 || p.dst().dtype() != v1::FP32) {
            return absl::InvalidArgumentError(absl::StrCat(
                what, " piece ", k, ": scales_of names no quantized piece, or not fp32"));
          }
          ASSIGN_OR_RETURN(BlockGrid g, GridOf(b.pieces(q).dst().shape(), b.pieces(q).quant_block(),
                                               absl::StrCat(what, " piece ", q)));
          if (g.num_blocks() != n) {
            return absl::InvalidArgumentError(absl::StrCat(
                what, " piece ", k, ": ", n, " scales for ", g.num_blocks(), " blocks"));
          }
        } else if (ViewElems(p.src()) != n) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, " piece ", k, ": src and dst sizes differ"));
        }
        if (p.quant_block_size() != 0) {
          int scale_pieces = 0;
          for (const v1::Piece& o : b.pieces()) scale_pieces += o.scales_of() == k + 1;
          if (p.wire_dtype() != v1::FP8_E4M3 || scale_pieces != 1) {
            return absl::InvalidArgumentError(absl::StrCat(
                what, " piece ", k, ": a quantized piece needs wire FP8_E4M3 and one scale piece"));
          }
          RETURN_IF_ERROR(
              GridOf(p.dst().shape(), p.quant_block(), absl::StrCat(what, " piece ", k)).status());
        }
        if (p.quantize_id() != 0) {
          auto it = quant_index.find(p.quantize_id());
          if (it == quant_index.end() || p.reduce_id() != 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(what, " piece ", k, ": unknown quantize ", p.quantize_id()));
          }
          const v1::Quantize& q = plan_.quantizes(it->second);
          if (q.round() != b.round() || q.worker() != b.receiver()) {
            return absl::InvalidArgumentError(absl::StrCat(
                what, " piece ", k, ": quantize ", q.id(), " runs in another round or worker"));
          }
        }
        const int64_t bytes = n * DTypeSize(p.wire_dtype());
        if (p.bucket_offset() < 0 || p.bucket_offset() + bytes > b.bytes()) {
          return absl::InvalidArgumentError(absl::StrCat(what, " piece ", k, " (tensor '",
                                                         PlanNameOrIndex(plan_, p.tensor_name()),
                                                         "') outside the bucket"));
        }
        spans.emplace_back(p.bucket_offset(), p.bucket_offset() + bytes);
        piece_bytes += bytes;
        if (p.reduce_id() != 0) {
          auto it = reduce_index.find(p.reduce_id());
          if (it == reduce_index.end()) {
            return absl::InvalidArgumentError(
                absl::StrCat(what, " piece ", k, ": unknown reduce ", p.reduce_id()));
          }
          const v1::Reduce& r = plan_.reduces(it->second);
          if (r.round() != b.round() || r.worker() != b.receiver()) {
            return absl::InvalidArgumentError(absl::StrCat(what, " piece ", k, ": reduce ", r.id(),
                                                           " runs in another round or worker"));
          }
        }
      }
      std::sort(spans.begin(), spans.end());
      for (size_t k = 1; k < spans.size(); ++k) {
        if (spans[k].first < spans[k - 1].second) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": pieces overlap in the bucket"));
        }
      }
      if (b.zero_copy()) {
        if (b.pieces_size() != 1)
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": zero-copy with ", b.pieces_size(), " pieces"));
        const v1::Piece& p = b.pieces(0);
        if (p.wire_dtype() != p.src().dtype() || p.wire_dtype() != p.dst().dtype() ||
            !ContiguousView(p.src()) || !ContiguousView(p.dst()) || p.bucket_offset() != 0 ||
            p.reduce_id() != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": zero-copy piece is cast or not contiguous"));
        }
      }
    }
    // Ops.
    std::map<std::pair<int32_t, int32_t>, int64_t> staging;  // (worker, round)
    for (const v1::Bucket& b : plan_.buckets()) {
      if (b.transport() == v1::TRANSPORT_LOCAL || b.zero_copy()) continue;
      staging[{b.sender(), b.round()}] += b.bytes();
      staging[{b.receiver(), b.round()}] += b.bytes();
    }
    for (const v1::RankPlan& rp : plan_.ranks()) {
      int32_t last_round = -1;
      for (const v1::Round& round : rp.rounds()) {
        const std::string where = absl::StrCat("worker ", rp.worker(), " round ", round.index());
        if (round.index() <= last_round || round.index() >= plan_.num_rounds()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": rounds out of order or range"));
        }
        last_round = round.index();
        if (round.ops_size() == 0)
          return absl::InvalidArgumentError(absl::StrCat(where, ": empty round"));
        auto st = staging.find({rp.worker(), round.index()});
        if (round.staging_bytes() != (st == staging.end() ? 0 : st->second)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": staging_bytes ", round.staging_bytes(), " wrong"));
        }
        std::tuple<int, int32_t, int32_t, int64_t> prev(-1, 0, 0, 0);
        for (const v1::Op& op : round.ops()) {
          std::tuple<int, int32_t, int32_t, int64_t> key;
          if (op.kind() == v1::Op::REDUCE) {
            auto it = reduce_index.find(op.reduce());
            if (it == reduce_index.end() || plan_.reduces(it->second).worker() != rp.worker() ||
                plan_.reduces(it->second).round() != round.index()) {
              return absl::InvalidArgumentError(absl::StrCat(where, ": bad REDUCE ", op.reduce()));
            }
            ++reduce_ops[it->second];
            key = {2, 0, 0, op.reduce()};
          } else if (op.kind() == v1::Op::QUANTIZE) {
            auto it = quant_index.find(op.quantize());
            if (it == quant_index.end() || plan_.quantizes(it->second).worker() != rp.worker() ||
                plan_.quantizes(it->second).round() != round.index()) {
              return absl::InvalidArgumentError(
                  absl::StrCat(where, ": bad QUANTIZE ", op.quantize()));
            }
            ++quant_ops[it->second];
            key = {3, 0, 0, op.quantize()};
          } else {
            if (op.bucket() < 0 || op.bucket() >= nb) {
              return absl::InvalidArgumentError(
                  absl::StrCat(where, ": unknown bucket ", op.bucket()));
            }
            const v1::Bucket& b = plan_.buckets(op.bucket());
            bool ok = b.round() == round.index();
            if (op.kind() == v1::Op::SEND) {
              ok = ok && b.sender() == rp.worker() && op.peer() == b.receiver() &&
                   b.sender() != b.receiver();
              ++sends[op.bucket()];
              key = {0, op.peer(), b.seq(), 0};
            } else if (op.kind() == v1::Op::RECV) {
              ok = ok && b.receiver() == rp.worker() && op.peer() == b.sender() &&
                   b.sender() != b.receiver();
              ++recvs[op.bucket()];
              key = {0, op.peer(), b.seq(), 1};
            } else {
              ok = ok && b.sender() == rp.worker() && b.receiver() == rp.worker();
              ++copies[op.bucket()];
              key = {1, 0, 0, op.bucket()};
            }
            if (!ok)
              return absl::InvalidArgumentError(
                  absl::StrCat(where, ": op on bucket ", op.bucket(), " does not match it"));
          }
          if (key < prev)
            return absl::InvalidArgumentError(absl::StrCat(where, ": ops out of order"));
          prev = key;
        }
      }
    }
    for (int i = 0; i < nb; ++i) {
      const v1::Bucket& b = plan_.buckets(i);
      const bool local = b.sender() == b.receiver();
      if (local ? copies[i] != 1 || sends[i] || recvs[i]
                : sends[i] != 1 || recvs[i] != 1 || copies[i]) {
        return absl::InvalidArgumentError(absl::StrCat("bucket ", i, ": wrong number of ops"));
      }
    }
    for (int i = 0; i < plan_.reduces_size(); ++i) {
      if (reduce_ops[i] != 1)
        return absl::InvalidArgumentError(
            absl::StrCat("reduce ", plan_.reduces(i).id(), ": wrong number of ops"));
    }
    for (int i = 0; i < plan_.quantizes_size(); ++i) {
      if (quant_ops[i] != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("quantize ", plan_.quantizes(i).id(), ": wrong number of ops"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunRound(int32_t r) {
    std::vector<int> in_round;
    for (int i = 0; i < plan_.buckets_size(); ++i) {
      if (plan_.buckets(i).round() == r) in_round.push_back(i);
    }
    // Pack everything first.
    std::map<int, std::vector<uint8_t>> wire;
    for (int i : in_round) {
      const v1::Bucket& b = plan_.buckets(i);
      std::vector<uint8_t>& data = wire[i];
      data.assign(b.bytes(), 0);
      for (int k = 0; k < b.pieces_size(); ++k) {
        const v1::Piece& p = b.pieces(k);
        const std::string what = absl::StrCat("bucket ", i, " piece ", k, " (",
                                              PlanNameOrIndex(plan_, p.tensor_name()), ") src");
        if (p.scales_of() != 0) continue;  // written with its quantized piece
        if (p.quant_block_size() == 0) {
          RETURN_IF_ERROR(
              Gather(b.sender(), p.src(), p.wire_dtype(), data.data() + p.bucket_offset(), what));
          continue;
        }
        ASSIGN_OR_RETURN(BlockGrid g, GridOf(p.dst().shape(), p.quant_block(), what));
        std::vector<float> x(ViewElems(p.src()));
        RETURN_IF_ERROR(
            Gather(b.sender(), p.src(), v1::FP32, reinterpret_cast<uint8_t*>(x.data()), what));
        std::vector<float> scales(g.num_blocks());
        RETURN_IF_ERROR(
            QuantizeBlocksFp8E4M3(x.data(), g, data.data() + p.bucket_offset(), scales.data()));
        for (const v1::Piece& o : b.pieces()) {
          if (o.scales_of() == k + 1) {
            std::memcpy(data.data() + o.bucket_offset(), scales.data(), scales.size() * 4);
          }
        }
      }
    }
    for (int i : in_round) {
      const v1::Bucket& b = plan_.buckets(i);
      for (int k = 0; k < b.pieces_size(); ++k) {
        const v1::Piece& p = b.pieces(k);
        if (p.reduce_id() != 0 || p.quantize_id() != 0) continue;
        RETURN_IF_ERROR(Scatter(b.receiver(), p.dst(), p.wire_dtype(),
                                wire[i].data() + p.bucket_offset(),
                                absl::StrCat("bucket ", i, " piece ", k, " (",
                                             PlanNameOrIndex(plan_, p.tensor_name()), ") dst")));
      }
    }
    for (const v1::Reduce& red : plan_.reduces()) {
      if (red.round() != r) continue;
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
        if (b.round() != r || p.reduce_id() != red.id() || ViewElems(p.src()) != n) {
          return absl::InvalidArgumentError(absl::StrCat("reduce ", red.id(), ": input bucket ",
                                                         in.bucket(), " piece ", in.piece(),
                                                         " is not its contribution in round ", r));
        }
        inputs.emplace_back(n * es);
        RETURN_IF_ERROR(ConvertElements(wire[in.bucket()].data() + p.bucket_offset(),
                                        p.wire_dtype(), inputs.back().data(),
                                        red.accumulate_dtype(), n));
      }
      for (const auto& v : inputs) ptrs.push_back(v.data());
      std::vector<uint8_t> acc(n * es);
      RETURN_IF_ERROR(ReduceElements(ptrs, red.accumulate_dtype(), red.op(), acc.data(), n));
      RETURN_IF_ERROR(Scatter(red.worker(), red.dst(), red.accumulate_dtype(), acc.data(),
                              absl::StrCat("reduce ", red.id(), " dst")));
    }
    for (const v1::Quantize& q : plan_.quantizes()) {
      if (q.round() != r) continue;
      RETURN_IF_ERROR(RunQuantize(q, wire));
    }
    return absl::OkStatus();
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

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

uint64_t NameHash(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status WriteValue(double v, v1::DType dtype, uint8_t* at) {
  if (IsFloatingPoint(dtype)) {
    const float f = static_cast<float>(v);
    return ConvertElements(&f, v1::FP32, at, dtype, 1);
  }
  switch (dtype) {
    case v1::INT8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(at, &x, 1);
      break;
    }
    case v1::UINT8:
    case v1::BOOL: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(at, &x, 1);
      break;
    }
    case v1::INT32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(at, &x, 4);
      break;
    }
    case v1::INT64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(at, &x, 8);
      break;
    }
    default:
      return absl::InvalidArgumentError("unsupported dtype");
  }
  return absl::OkStatus();
}

double ReadValue(v1::DType dtype, const uint8_t* at) {
  if (IsFloatingPoint(dtype)) {
    float f = 0;
    (void)ConvertElements(at, dtype, &f, v1::FP32, 1);
    return f;
  }
  switch (dtype) {
    case v1::INT8: {
      int8_t x;
      std::memcpy(&x, at, 1);
      return x;
    }
    case v1::UINT8:
    case v1::BOOL: {
      uint8_t x;
      std::memcpy(&x, at, 1);
      return x;
    }
    case v1::INT32: {
      int32_t x;
      std::memcpy(&x, at, 4);
      return x;
    }
    case v1::INT64: {
      int64_t x;
      std::memcpy(&x, at, 8);
      return static_cast<double>(x);
    }
    default:
      return 0;
  }
}

// Visits every element of fragment f: fn(linear index in the tensor, byte offset).
template <typename Fn>
void ForEachFragmentElement(const CompiledTensor& t, const CompiledFragment& f, Fn fn) {
  const int rank = f.box.rank();
  if (rank > 0 && f.box.Empty()) return;
  const DimVector gstrides = RowMajorStrides(t.shape);
  const int64_t es = DTypeSize(t.dtype);
  std::vector<int64_t> idx(rank, 0);
  while (true) {
    int64_t lin = 0, e = 0;
    for (int d = 0; d < rank; ++d) {
      lin += (f.box.offset[d] + idx[d]) * gstrides[d];
      e += idx[d] * f.strides[d];
    }
    fn(lin, f.byte_offset + e * es, idx);
    int d = rank - 1;
    while (d >= 0 && ++idx[d] == f.box.length[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

}  // namespace

absl::Status ReplayPlan(const v1::Plan& plan, HostMemory* mem) { return Replayer(plan, mem).Run(); }

absl::Status AllocateBuffers(const CompiledSide& source, const CompiledSide& destination,
                             HostMemory* mem) {
  for (const CompiledSide* side : {&source, &destination}) {
    const v1::BufferSide bs = side == &source ? v1::SOURCE_BUFFER : v1::DESTINATION_BUFFER;
    for (const CompiledTensor& t : side->tensors) {
      const int64_t es = DTypeSize(t.dtype);
      for (const CompiledFragment& f : t.fragments) {
        int64_t max_e = 0;
        bool empty = false;
        for (int d = 0; d < f.box.rank(); ++d) {
          if (f.box.length[d] == 0)
            empty = true;
          else
            max_e += (f.box.length[d] - 1) * f.strides[d];
        }
        const int64_t end = empty ? f.byte_offset : f.byte_offset + (max_e + 1) * es;
        mem->Ensure(side->workers[f.rank], bs, side->buffer_names[f.buffer], end);
      }
    }
  }
  return absl::OkStatus();
}

int64_t SyntheticRange(v1::DType dtype) {
  switch (dtype) {
    case v1::FP8_E4M3:
    case v1::FP8_E5M2:
      return 8;
    case v1::BF16:
      return 120;
    case v1::FP16:
      return 1000;
    case v1::INT8:
      return 100;
    case v1::UINT8:
      return 200;
    case v1::BOOL:
      return 1;
    default:
      return 1000000;
  }
}

double SyntheticValue(const std::string& tensor, int64_t linear_index, int64_t range) {
  const uint64_t h = Mix(NameHash(tensor) ^ Mix(static_cast<uint64_t>(linear_index) + 0x9e37));
  return static_cast<double>(static_cast<int64_t>(h % static_cast<uint64_t>(2 * range + 1)) -
                             range);
}

absl::Status FillSource(const CompiledSide& source, int64_t range, HostMemory* mem) {
  for (const CompiledTensor& t : source.tensors) {
    const bool unsigned_t = t.dtype == v1::UINT8 || t.dtype == v1::BOOL;
    std::map<int32_t, std::vector<const CompiledFragment*>> groups;
    for (const CompiledFragment& f : t.fragments) {
      if (f.partial_group != 0) groups[f.partial_group].push_back(&f);
    }
    for (const CompiledFragment& f : t.fragments) {
      std::vector<uint8_t>* buf =
          mem->Find(source.workers[f.rank], v1::SOURCE_BUFFER, source.buffer_names[f.buffer]);
      if (buf == nullptr) return absl::InternalError("source buffer not allocated");
      int member = 0, members = 1;
      if (f.partial_group != 0) {
        const auto& g = groups[f.partial_group];
        members = static_cast<int>(g.size());
        member = static_cast<int>(std::find(g.begin(), g.end(), &f) - g.begin());
      }
      absl::Status st;
      ForEachFragmentElement(t, f, [&](int64_t lin, int64_t at, const std::vector<int64_t>&) {
        double v = SyntheticValue(t.name, lin, range);
        if (unsigned_t) v = std::abs(v);
        if (f.partial_group != 0 && f.partial_op == v1::REDUCE_SUM) {
          double others = 0;
          for (int k = 0; k < members - 1; ++k) others += static_cast<double>((lin + k) % 3) - 1;
          v = member < members - 1 ? static_cast<double>((lin + member) % 3) - 1 : v - others;
        }
        if (st.ok()) st = WriteValue(v, t.dtype, buf->data() + at);
      });
      RETURN_IF_ERROR(st);
    }
  }
  return absl::OkStatus();
}

namespace {

// Block fp8 tensor `t`: every fragment (whole blocks) against a reference
// quantization of the source values written here from the documented rule
// (amax, scale = amax / 448 or 1, element / scale rounded by
// FloatToFp8E4M3), both the fp8 bytes and the scale tensor's values.
template <typename WantFn>
absl::Status CheckQuantized(const CompiledTensor& t, const CompiledSide& destination,
                            const HostMemory& mem, WantFn want_of) {
  const CompiledTensor& sc = destination.tensors[t.scale_tensor];
  const int rank = static_cast<int>(t.shape.size());
  for (size_t fi = 0; fi < t.fragments.size(); ++fi) {
    const CompiledFragment& f = t.fragments[fi];
    if (f.box.Empty()) continue;
    const int32_t worker = destination.workers[f.rank];
    const CompiledFragment& sf = sc.fragments[t.scale_fragment[fi]];
    const std::vector<uint8_t>* buf = const_cast<HostMemory&>(mem).Find(
        worker, v1::DESTINATION_BUFFER, destination.buffer_names[f.buffer]);
    const std::vector<uint8_t>* sbuf = const_cast<HostMemory&>(mem).Find(
        worker, v1::DESTINATION_BUFFER, destination.buffer_names[sf.buffer]);
    if (buf == nullptr || sbuf == nullptr) {
      return absl::InternalError("destination buffer not allocated");
    }
    // Per block (in global block coordinates): amax over the block's source values.
    std::map<std::vector<int64_t>, float> amax;
    absl::Status st;
    auto block_of = [&](const std::vector<int64_t>& q) {
      std::vector<int64_t> b = q;
      b[rank - 2] /= t.quant_block[0];
      b[rank - 1] /= t.quant_block[1];
      return b;
    };
    auto value = [&](const std::vector<int64_t>& idx, std::vector<int64_t>* q) -> float {
      q->resize(rank);
      for (int d = 0; d < rank; ++d) (*q)[d] = f.box.offset[d] + idx[d];
      const CompiledTensor* src = nullptr;
      const double v = want_of(*q, &src);
      if (src == nullptr && st.ok()) {
        st = absl::InternalError(absl::StrCat("tensor ", t.name, ": element not mapped"));
      }
      return static_cast<float>(v);
    };
    std::vector<int64_t> q;
    ForEachFragmentElement(t, f, [&](int64_t, int64_t, const std::vector<int64_t>& idx) {
      const float v = std::fabs(value(idx, &q));
      float& a = amax[block_of(q)];
      a = std::max(a, v);
    });
    RETURN_IF_ERROR(st);
    ForEachFragmentElement(t, f, [&](int64_t, int64_t at, const std::vector<int64_t>& idx) {
      if (!st.ok()) return;
      const float v = value(idx, &q);
      const float a = amax[block_of(q)];
      const float scale = a == 0.0f ? 1.0f : a / 448.0f;
      const uint8_t want = FloatToFp8E4M3(v / scale);
      const uint8_t got = buf->data()[at];
      if (got != want) {
        std::string qs;
        for (int d = 0; d < rank; ++d) absl::StrAppend(&qs, d ? "," : "", q[d]);
        st = absl::DataLossError(absl::StrCat("block-fp8 tensor '", t.name, "' on worker ", worker,
                                              " element [", qs, "]: got fp8 0x", absl::Hex(got),
                                              ", want 0x", absl::Hex(want), " (source value ", v,
                                              ", scale ", scale, ")"));
      }
    });
    RETURN_IF_ERROR(st);
    for (const auto& [b, a] : amax) {
      int64_t e = 0;
      for (int d = 0; d < rank; ++d) e += (b[d] - sf.box.offset[d]) * sf.strides[d];
      float got;
      std::memcpy(&got, sbuf->data() + sf.byte_offset + 4 * e, 4);
      const float want = a == 0.0f ? 1.0f : a / 448.0f;
      if (!(got == want)) {
        std::string bs;
        for (int d = 0; d < rank; ++d) absl::StrAppend(&bs, d ? "," : "", b[d]);
        return absl::DataLossError(absl::StrCat("scale tensor '", sc.name, "' on worker ", worker,
                                                " block [", bs, "]: got ", got, ", want ", want));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDestination(const v1::TransferSpec& spec, const CompiledSide& source,
                              const CompiledSide& destination, int64_t range,
                              const HostMemory& mem) {
  struct Entry {
    const CompiledTensor* src;
    std::vector<int64_t> src_off, dst_off, dst_len;
  };
  for (const CompiledTensor& t : destination.tensors) {
    if (t.scales_for >= 0) continue;  // checked with its quantized tensor
    std::vector<Entry> entries;
    for (const v1::TensorMapping& m : spec.mappings()) {
      if (m.dst() != t.name) continue;
      Entry e;
      e.src = source.Find(m.src());
      if (e.src == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("unknown source ", m.src()));
      e.src_off.assign(m.src_box().offset().begin(), m.src_box().offset().end());
      e.dst_off.assign(m.dst_offset().begin(), m.dst_offset().end());
      const int n = std::min(m.src_box().length_size(), static_cast<int>(t.shape.size()));
      e.dst_len.assign(t.shape.size(), 1);
      for (int k = 0; k < n; ++k) {
        e.dst_len[t.shape.size() - n + k] = m.src_box().length(m.src_box().length_size() - n + k);
      }
      entries.push_back(std::move(e));
    }
    if (entries.empty()) {
      Entry e;
      e.src = source.Find(t.name);
      if (e.src == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("no source for ", t.name));
      e.src_off.assign(t.shape.size(), 0);
      e.dst_off.assign(t.shape.size(), 0);
      e.dst_len = t.shape;
      entries.push_back(std::move(e));
    }
    // The source value of destination element q (global coordinates).
    auto want_of = [&](const std::vector<int64_t>& q, const CompiledTensor** src) -> double {
      const Entry* hit = nullptr;
      for (const Entry& e : entries) {
        bool in = true;
        for (size_t d = 0; d < q.size(); ++d) {
          if (q[d] < e.dst_off[d] || q[d] >= e.dst_off[d] + e.dst_len[d]) in = false;
        }
        if (in) hit = &e;
      }
      *src = hit == nullptr ? nullptr : hit->src;
      if (hit == nullptr) return 0;
      const CompiledTensor& s = *hit->src;
      const int sr = static_cast<int>(s.shape.size());
      const int n = std::min<int>(sr, static_cast<int>(q.size()));
      const DimVector gs = RowMajorStrides(s.shape);
      int64_t lin = 0;
      for (int d = 0; d < sr; ++d) {
        int64_t coord = hit->src_off[d];
        if (d >= sr - n) {
          const size_t qd = q.size() - n + (d - (sr - n));
          coord = q[qd] - hit->dst_off[qd] + hit->src_off[d];
        }
        lin += coord * gs[d];
      }
      double want = SyntheticValue(s.name, lin, range);
      if (s.dtype == v1::UINT8 || s.dtype == v1::BOOL) want = std::abs(want);
      return want;
    };
    if (t.quantized()) {
      RETURN_IF_ERROR(CheckQuantized(t, destination, mem, want_of));
      continue;
    }
    for (const CompiledFragment& f : t.fragments) {
      const int32_t worker = destination.workers[f.rank];
      const std::vector<uint8_t>* buf = const_cast<HostMemory&>(mem).Find(
          worker, v1::DESTINATION_BUFFER, destination.buffer_names[f.buffer]);
      if (buf == nullptr) return absl::InternalError("destination buffer not allocated");
      absl::Status st;
      ForEachFragmentElement(t, f, [&](int64_t, int64_t at, const std::vector<int64_t>& idx) {
        if (!st.ok()) return;
        std::vector<int64_t> q(idx.size());
        for (size_t d = 0; d < idx.size(); ++d) q[d] = f.box.offset[d] + idx[d];
        const CompiledTensor* src = nullptr;
        const double want = want_of(q, &src);
        if (src == nullptr) {
          st = absl::InternalError(absl::StrCat("tensor ", t.name, ": element not mapped"));
          return;
        }
        const CompiledTensor& s = *src;
        const double got = ReadValue(t.dtype, buf->data() + at);
        if (got != want) {
          std::string qs;
          for (size_t d = 0; d < q.size(); ++d) absl::StrAppend(&qs, d ? "," : "", q[d]);
          st = absl::DataLossError(absl::StrCat("destination tensor '", t.name, "' on worker ",
                                                worker, " element [", qs, "]: got ", got, ", want ",
                                                want, " (from '", s.name, "')"));
        }
      });
      RETURN_IF_ERROR(st);
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
