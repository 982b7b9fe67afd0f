// Hand-built plans for executor tests: the test lists buckets (with pieces)
// and reduces; Build() derives what the planner would: bucket bytes, seq,
// transport kind, per-worker rounds of ops in (peer, seq) order and each
// round's staging bytes.
#ifndef WSYNC_TESTS_WORKER_EXEC_PLAN_BUILDER_H_
#define WSYNC_TESTS_WORKER_EXEC_PLAN_BUILDER_H_

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::exec::testing {

// Plans name buffers and tensors by index into Plan.names: views built here
// index one process-wide table, which Build() copies into every plan.
inline std::vector<std::string>& TestNames() {
  static std::vector<std::string> names;
  return names;
}
inline int32_t TestName(const std::string& name) {
  std::vector<std::string>& names = TestNames();
  auto it = std::find(names.begin(), names.end(), name);
  if (it != names.end()) return static_cast<int32_t>(it - names.begin());
  names.push_back(name);
  return static_cast<int32_t>(names.size()) - 1;
}
inline void SetTestNames(v1::Plan* plan) {
  plan->mutable_names()->Clear();
  for (const std::string& n : TestNames()) plan->add_names(n);
}

// strides empty = row-major over shape.
inline v1::TensorView View(const std::string& buffer, int64_t byte_offset,
                           std::vector<int64_t> shape, v1::DType dtype,
                           std::vector<int64_t> strides = {}) {
  if (strides.empty()) {
    strides.assign(shape.size(), 1);
    for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
      strides[d] = strides[d + 1] * shape[d + 1];
    }
  }
  v1::TensorView v;
  v.set_buffer_name(TestName(buffer));
  v.set_byte_offset(byte_offset);
  for (int64_t n : shape) v.add_shape(n);
  for (int64_t s : strides) v.add_strides(s);
  v.set_dtype(dtype);
  return v;
}

inline int64_t NumElements(const v1::TensorView& v) {
  int64_t n = 1;
  for (int64_t s : v.shape()) n *= s;
  return n;
}

// The same view in the worker's destination buffers (what a relay reads).
inline v1::TensorView Dst(v1::TensorView v) {
  v.set_side(v1::DESTINATION_BUFFER);
  return v;
}

// bucket_offset < 0: placed after the bucket's previous pieces. dst always
// names a destination buffer.
inline v1::Piece Piece(const v1::TensorView& src, const v1::TensorView& dst, v1::DType wire,
                       int64_t reduce_id = 0, int64_t bucket_offset = -1) {
  v1::Piece p;
  p.set_tensor_name(src.buffer_name());
  *p.mutable_src() = src;
  *p.mutable_dst() = Dst(dst);
  p.set_wire_dtype(wire);
  p.set_reduce_id(reduce_id);
  p.set_bucket_offset(bucket_offset);
  return p;
}

class PlanBuilder {
 public:
  int64_t AddBucket(int32_t sender, int32_t receiver, int32_t round, std::vector<v1::Piece> pieces,
                    bool zero_copy = false) {
    v1::Bucket* b = plan_.add_buckets();
    b->set_id(plan_.buckets_size() - 1);
    b->set_sender(sender);
    b->set_receiver(receiver);
    b->set_round(round);
    b->set_transport(sender == receiver ? v1::TRANSPORT_LOCAL : v1::TRANSPORT_NETWORK);
    b->set_zero_copy(zero_copy);
    int64_t offset = 0;
    for (v1::Piece& p : pieces) {
      if (p.bucket_offset() < 0) p.set_bucket_offset(offset);
      offset =
          std::max(offset, p.bucket_offset() + NumElements(p.src()) * DTypeSize(p.wire_dtype()));
      *b->add_pieces() = p;
    }
    b->set_bytes(offset);
    return b->id();
  }

  int64_t AddReduce(int32_t worker, int32_t round, v1::ReduceOp op, v1::DType acc,
                    const v1::TensorView& dst, std::vector<std::pair<int64_t, int32_t>> inputs) {
    v1::Reduce* r = plan_.add_reduces();
    r->set_id(plan_.reduces_size());  // reduce ids start at 1 (0 = not partial)
    r->set_worker(worker);
    r->set_round(round);
    r->set_op(op);
    r->set_accumulate_dtype(acc);
    *r->mutable_dst() = Dst(dst);
    for (auto [bucket, piece] : inputs) {
      v1::ReduceInput* in = r->add_inputs();
      in->set_bucket(bucket);
      in->set_piece(piece);
    }
    return r->id();
  }

  v1::Bucket& bucket(int64_t id) { return *plan_.mutable_buckets(static_cast<int>(id)); }

  v1::Plan Build(const std::string& key = "test-plan") {
    v1::Plan plan = plan_;
    plan.set_key(key);
    SetTestNames(&plan);
    std::map<std::tuple<int32_t, int32_t, int32_t>, int32_t> seq;
    // (worker, round) -> ops
    std::map<std::pair<int32_t, int32_t>, std::vector<std::tuple<int32_t, int32_t, v1::Op>>> ops;
    std::map<std::pair<int32_t, int32_t>, int64_t> staging;
    int32_t rounds = 0;
    for (v1::Bucket& b : *plan.mutable_buckets()) {
      rounds = std::max(rounds, b.round() + 1);
      b.set_seq(seq[{b.sender(), b.receiver(), b.round()}]++);
      v1::Op op;
      op.set_bucket(b.id());
      if (b.transport() == v1::TRANSPORT_LOCAL) {
        op.set_kind(v1::Op::COPY);
        ops[{b.sender(), b.round()}].push_back({-1, b.seq(), op});
        continue;
      }
      op.set_kind(v1::Op::SEND);
      op.set_peer(b.receiver());
      ops[{b.sender(), b.round()}].push_back({b.receiver(), b.seq(), op});
      op.set_kind(v1::Op::RECV);
      op.set_peer(b.sender());
      ops[{b.receiver(), b.round()}].push_back({b.sender(), b.seq(), op});
      if (!b.zero_copy()) {
        staging[{b.sender(), b.round()}] += b.bytes();
        staging[{b.receiver(), b.round()}] += b.bytes();
      }
    }
    for (const v1::Reduce& r : plan.reduces()) {
      v1::Op op;
      op.set_kind(v1::Op::REDUCE);
      op.set_reduce(r.id());
      ops[{r.worker(), r.round()}].push_back({1 << 30, 0, op});
    }
    plan.set_num_rounds(rounds);
    std::map<int32_t, v1::RankPlan*> ranks;
    for (auto& [key2, list] : ops) {
      auto [worker, round] = key2;
      if (!ranks.count(worker)) {
        ranks[worker] = plan.add_ranks();
        ranks[worker]->set_worker(worker);
      }
      v1::Round* r = ranks[worker]->add_rounds();
      r->set_index(round);
      r->set_staging_bytes(staging[key2]);
      std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
        return std::make_pair(std::get<0>(a), std::get<1>(a)) <
               std::make_pair(std::get<0>(b), std::get<1>(b));
      });
      for (auto& [peer, s, op] : list) *r->add_ops() = op;
    }
    return plan;
  }

 private:
  v1::Plan plan_;
};

}  // namespace wsync::exec::testing

#endif  // WSYNC_TESTS_WORKER_EXEC_PLAN_BUILDER_H_
