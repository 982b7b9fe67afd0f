// Spec builders and plan invariants for the planner tests.
#ifndef WSYNC_TESTS_CONTROLLER_PLAN_PLANNER_TEST_UTIL_H_
#define WSYNC_TESTS_CONTROLLER_PLAN_PLANNER_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/plan_pieces.h"
#include "controller/plan/plan_estimate.h"
#include "controller/plan/planner.h"
#include "controller/verify/replay.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "wsync/v1/layout.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::plan::planner_testing {

// Seeded random choices for the property tests.
struct Gen {
  std::mt19937_64 rng;
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  bool Coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng); }
};

// `m` serialized deterministically (map fields in key order): equal
// messages give equal bytes.
inline std::string DeterministicBytes(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::io::StringOutputStream out(&s);
  google::protobuf::io::CodedOutputStream cos(&out);
  cos.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&cos);
  return s;
}

inline v1::Placement Sh(int dim) {
  v1::Placement p;
  p.mutable_shard()->set_dim(dim);
  return p;
}
inline v1::Placement Strided(int dim, int split) {
  v1::Placement p;
  p.mutable_strided_shard()->set_dim(dim);
  p.mutable_strided_shard()->set_split_factor(split);
  return p;
}
inline v1::Placement Rep() {
  v1::Placement p;
  p.mutable_replicate();
  return p;
}
inline v1::Placement Part(v1::ReduceOp op = v1::REDUCE_SUM) {
  v1::Placement p;
  p.mutable_partial()->set_op(op);
  return p;
}

// Ranks r -> workers[r]; node of each worker = "n" + worker / per_node
// (per_node 0: no node names, everything over the NIC).
inline v1::Side Side(const std::string& name, const std::vector<int32_t>& workers,
                     int per_node = 0) {
  v1::Side s;
  s.set_name(name);
  for (int32_t w : workers) {
    v1::RankInfo* r = s.add_ranks();
    r->set_worker(w);
    if (per_node > 0) r->set_node("n" + std::to_string(w / per_node));
  }
  return s;
}

inline std::vector<int32_t> Range(int32_t begin, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(begin + i);
  return v;
}

inline v1::TensorLayout* Mesh(v1::Side* side, const std::string& name, std::vector<int64_t> shape,
                              std::vector<int64_t> mesh, std::vector<v1::Placement> placements,
                              v1::DType dtype = v1::FP32, std::vector<int32_t> ranks = {}) {
  v1::TensorLayout* t = side->add_tensors();
  t->set_name(name);
  t->set_dtype(dtype);
  for (int64_t s : shape) t->add_shape(s);
  v1::MeshLayout* m = t->mutable_mesh();
  int32_t n = 1;
  for (int64_t s : mesh) {
    m->add_mesh_shape(s);
    n *= static_cast<int32_t>(s);
  }
  if (ranks.empty()) ranks = Range(0, n);
  for (int32_t r : ranks) m->add_ranks(r);
  for (const v1::Placement& p : placements) *m->add_placements() = p;
  return t;
}

inline v1::TensorLayout* Explicit(v1::Side* side, const std::string& name,
                                  std::vector<int64_t> shape, v1::DType dtype = v1::FP32) {
  v1::TensorLayout* t = side->add_tensors();
  t->set_name(name);
  t->set_dtype(dtype);
  for (int64_t s : shape) t->add_shape(s);
  t->mutable_fragments();
  return t;
}

inline v1::Fragment* Frag(v1::TensorLayout* t, int32_t rank, std::vector<int64_t> offset,
                          std::vector<int64_t> length, const std::string& buffer = "",
                          int64_t byte_offset = 0, std::vector<int64_t> strides = {}) {
  v1::Fragment* f = t->mutable_fragments()->add_fragments();
  f->set_rank(rank);
  for (int64_t o : offset) f->mutable_box()->add_offset(o);
  for (int64_t l : length) f->mutable_box()->add_length(l);
  f->set_buffer(buffer);
  f->set_byte_offset(byte_offset);
  for (int64_t s : strides) f->add_strides(s);
  return f;
}

inline void Map(v1::TransferSpec* spec, const std::string& dst, std::vector<int64_t> dst_offset,
                const std::string& src, std::vector<int64_t> src_offset,
                std::vector<int64_t> src_length) {
  v1::TensorMapping* m = spec->add_mappings();
  m->set_dst(dst);
  m->set_src(src);
  for (int64_t o : dst_offset) m->add_dst_offset(o);
  for (int64_t o : src_offset) m->mutable_src_box()->add_offset(o);
  for (int64_t l : src_length) m->mutable_src_box()->add_length(l);
}

inline void AllowCast(v1::TransferSpec* spec, v1::DType from, v1::DType to) {
  v1::Cast* c = spec->mutable_options()->add_allowed_casts();
  c->set_from(from);
  c->set_to(to);
}

inline v1::TransferSpec Spec(v1::Side src, v1::Side dst) {
  v1::TransferSpec s;
  s.set_name("test");
  *s.mutable_source() = std::move(src);
  *s.mutable_destination() = std::move(dst);
  return s;
}

// Calls fn(bucket, piece) for every piece of `plan`, piece runs' members
// included (the runs checked first).
inline void ForEachPlanPiece(const v1::Plan& plan,
                             const std::function<void(const v1::Bucket&, const v1::Piece&)>& fn) {
  absl::Status runs = CheckPlanRuns(plan);
  EXPECT_TRUE(runs.ok()) << runs;
  if (!runs.ok()) return;
  for (const v1::Bucket& b : plan.buckets()) {
    (void)ForEachPiece(b, [&](int64_t, const v1::Piece& p) {
      fn(b, p);
      return absl::OkStatus();
    });
  }
}

// Structural invariants every plan must satisfy, beyond what replay checks.
inline void ExpectInvariants(const v1::TransferSpec& spec, const v1::Plan& plan) {
  const int64_t cap = spec.options().staging_cap_bytes() > 0 ? spec.options().staging_cap_bytes()
                                                             : kDefaultStagingCapBytes;
  const int64_t bucket =
      spec.options().bucket_bytes() > 0 ? spec.options().bucket_bytes() : kDefaultBucketBytes;
  std::map<std::pair<int32_t, int32_t>, int64_t> staged;
  int64_t relays = 0, network = 0, local = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    EXPECT_LE(b.bytes(), bucket) << "bucket " << b.id();
    EXPECT_GT(b.pieces_size() + b.runs_size(), 0);
    absl::Status runs = CheckPieceRuns(b, plan.names_size());
    EXPECT_TRUE(runs.ok()) << runs;
    if (!runs.ok()) continue;
    (void)ForEachPiece(b, [&](int64_t, const v1::Piece& p) {  // run members too
      if (p.relay()) {
        ++relays;
        EXPECT_EQ(p.wire_dtype(), p.dst().dtype());
        EXPECT_EQ(p.src().side(), v1::DESTINATION_BUFFER);
      }
      if (p.reduce_id() != 0) {
        EXPECT_EQ(p.wire_dtype(), p.src().dtype());
      }
      return absl::OkStatus();
    });
    if (b.transport() == v1::TRANSPORT_LOCAL) {
      local += b.bytes();
      continue;
    }
    network += b.bytes();
    if (b.zero_copy()) continue;
    staged[{b.sender(), b.round()}] += b.bytes();
    staged[{b.receiver(), b.round()}] += b.bytes();
  }
  int64_t peak = 0;
  for (const auto& [k, v] : staged) {
    EXPECT_LE(v, cap) << "worker " << k.first << " round " << k.second;
    peak = std::max(peak, v);
  }
  EXPECT_EQ(plan.summary().peak_staging_bytes(), peak);
  EXPECT_EQ(plan.summary().num_relay_pieces(), relays);
  EXPECT_EQ(plan.summary().network_bytes(), network);
  EXPECT_EQ(plan.summary().local_bytes(), local);
  EXPECT_EQ(plan.summary().num_buckets(), plan.buckets_size());
  EXPECT_EQ(plan.summary().num_rounds(), plan.num_rounds());
  EXPECT_LE(plan.summary().lower_bound_seconds(), plan.summary().predicted_seconds() * (1 + 1e-9));
  // The routing-independent bound holds for every plan, this one included,
  // and never exceeds the plan's own bound by more than two round latencies.
  EXPECT_LE(plan.summary().routing_bound_seconds(), plan.summary().predicted_seconds() * (1 + 1e-9))
      << plan.summary().routing_bound_term();
  EXPECT_LE(plan.summary().routing_bound_seconds(),
            (plan.summary().lower_bound_seconds() +
             2 * spec.options().link_model().round_latency_seconds()) *
                (1 + 1e-9));
  if (plan.summary().network_bytes() + plan.summary().local_bytes() > 0) {
    EXPECT_GT(plan.summary().routing_bound_seconds(), 0);
  }
}

// One bf16 tensor [rows, cols], replicated on `holders` trainer ranks
// (workers 0..) and on `receivers` inference ranks (workers 100..), nodes as
// Side's; the link model is the caller's.
inline v1::TransferSpec ReplicatedTensorSpec(int holders, int receivers, int64_t rows, int64_t cols,
                                             int per_node = 0) {
  v1::Side src = Side("trainer", Range(0, holders), per_node);
  v1::Side dst = Side("infer", Range(100, receivers), per_node);
  Mesh(&src, "w", {rows, cols}, {holders}, {Rep()}, v1::BF16);
  Mesh(&dst, "w", {rows, cols}, {receivers}, {Rep()}, v1::BF16);
  return Spec(src, dst);
}

// One trainer copy on 2 ranks -> 8 inference replicas of TP=2 (16 ranks):
// the fan-out where the planner relays (unless disable_relay).
inline v1::TransferSpec FanOutSpec(bool disable_relay) {
  v1::Side src = Side("trainer", Range(0, 2), 8);
  v1::Side dst = Side("infer", Range(16, 16), 8);
  for (int t = 0; t < 6; ++t) {
    const std::string name = "layer" + std::to_string(t);
    Mesh(&src, name, {64, 32}, {2}, {Sh(0)});
    Mesh(&dst, name, {64, 32}, {8, 2}, {Rep(), Sh(1)});
  }
  v1::TransferSpec spec = Spec(src, dst);
  spec.mutable_options()->set_disable_relay(disable_relay);
  spec.mutable_options()->set_bucket_bytes(2048);
  return spec;
}

// Builds, replays on element-id data and checks every destination element.
inline v1::Plan BuildAndVerify(const v1::TransferSpec& spec) {
  absl::StatusOr<v1::Plan> plan = BuildPlan(spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return v1::Plan();
  absl::Status st = VerifyPlan(spec, *plan);
  EXPECT_TRUE(st.ok()) << st;
  ExpectInvariants(spec, *plan);
  // The early limit check's count never exceeds a real plan's pieces.
  EXPECT_LE(MinPiecesFromSpec(spec), plan->summary().num_pieces());
  return *plan;
}

}  // namespace wsync::plan::planner_testing

#endif  // WSYNC_TESTS_CONTROLLER_PLAN_PLANNER_TEST_UTIL_H_
