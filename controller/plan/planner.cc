#include "controller/plan/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "controller/plan/plan_bound.h"
#include "controller/plan/plan_estimate.h"
#include "controller/plan/planner_internal.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace wsync::plan {
namespace planner_detail {

absl::Status ResolveOptions(const v1::PlanOptions& in, Options* out) {
  out->bucket_bytes = in.bucket_bytes() > 0 ? in.bucket_bytes() : kDefaultBucketBytes;
  out->staging_cap = in.staging_cap_bytes() > 0 ? in.staging_cap_bytes() : kDefaultStagingCapBytes;
  out->zero_copy_min =
      in.zero_copy_min_bytes() > 0 ? in.zero_copy_min_bytes() : kDefaultZeroCopyMinBytes;
  out->relay = !in.disable_relay();
  out->link = EffectiveLinkModel(in);
  if (in.bucket_bytes() < 0 || in.staging_cap_bytes() < 0 || in.zero_copy_min_bytes() < 0) {
    return absl::InvalidArgumentError(
        "options: bucket_bytes, staging_cap_bytes and "
        "zero_copy_min_bytes must not be negative");
  }
  if (out->bucket_bytes > out->staging_cap) {
    return absl::InvalidArgumentError(
        absl::StrCat("options: bucket_bytes (", out->bucket_bytes, ") exceeds staging_cap_bytes (",
                     out->staging_cap, "): a full bucket could never be staged"));
  }
  // The spec's own rates: a negative one is refused, not taken as 0.
  const v1::LinkModel& given = in.link_model();
  if (given.nvlink_bytes_per_second() < 0 || given.nic_bytes_per_second() < 0 ||
      given.local_copy_bytes_per_second() < 0 || given.round_latency_seconds() < 0 ||
      given.step_latency_seconds() < 0) {
    return absl::InvalidArgumentError("options.link_model: negative bandwidth or latency");
  }
  const v1::LinkModel& lm = out->link;
  // Each link's seconds (bytes / rate) and their sums must stay finite.
  for (double rate : {lm.nvlink_bytes_per_second(), lm.nic_bytes_per_second(),
                      lm.local_copy_bytes_per_second()}) {
    if (!std::isfinite(rate) || !(rate >= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.link_model: a bandwidth must be finite and at least 1 byte/s (0 takes the "
          "default), not ",
          rate));
    }
  }
  if (!std::isfinite(lm.round_latency_seconds()) || !std::isfinite(lm.step_latency_seconds())) {
    return absl::InvalidArgumentError(
        "options.link_model: round_latency_seconds and step_latency_seconds must be finite");
  }
  return absl::OkStatus();
}

absl::Status IndexWorkers(Work* w) {
  std::vector<std::pair<int32_t, std::string>> all;
  for (const CompiledSide* side : {w->src, w->dst}) {
    for (size_t r = 0; r < side->workers.size(); ++r) {
      all.emplace_back(side->workers[r], r < side->nodes.size() ? side->nodes[r] : "");
    }
  }
  std::sort(all.begin(), all.end());
  absl::flat_hash_map<std::string, int32_t> node_index;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0 && all[i].first == all[i - 1].first) {
      if (all[i].second != all[i - 1].second) {
        return absl::InvalidArgumentError(absl::StrCat("worker ", all[i].first, " is on node '",
                                                       all[i - 1].second, "' on one side and '",
                                                       all[i].second, "' on the other"));
      }
      continue;
    }
    w->worker_ids.push_back(all[i].first);
    const std::string& node = all[i].second;
    int32_t idx;
    if (node.empty()) {  // unknown node: a node of its own (network only)
      idx = static_cast<int32_t>(w->node_names.size());
      w->node_names.push_back("");
    } else {
      auto [it, inserted] = node_index.emplace(node, static_cast<int32_t>(w->node_names.size()));
      if (inserted) w->node_names.push_back(node);
      idx = it->second;
    }
    w->worker_node.push_back(idx);
  }
  auto dense = [&](int32_t id) {
    return static_cast<int32_t>(std::lower_bound(w->worker_ids.begin(), w->worker_ids.end(), id) -
                                w->worker_ids.begin());
  };
  for (int32_t id : w->src->workers) w->src_rank_worker.push_back(dense(id));
  for (int32_t id : w->dst->workers) w->dst_rank_worker.push_back(dense(id));
  return absl::OkStatus();
}

v1::DType WireDType(v1::DType src, v1::DType dst) {
  return DTypeSize(src) < DTypeSize(dst) ? src : dst;
}

void SrcToDst(const MapEntry& m, const int64_t* src_off, const int64_t* src_len, int64_t* dst_off,
              int64_t* dst_len) {
  const int n = std::min(m.src_rank, m.dst_rank);
  const int ls = m.src_rank - n, ld = m.dst_rank - n;
  for (int d = 0; d < ld; ++d) {
    dst_off[d] = m.dst_offset[d];
    dst_len[d] = 1;
  }
  for (int d = 0; d < n; ++d) {
    dst_off[ld + d] = src_off[ls + d] - m.src_offset[ls + d] + m.dst_offset[ld + d];
    dst_len[ld + d] = src_len[ls + d];
  }
}

int64_t ViewByteOffset(const CompiledFragment& f, const int64_t* box_offset, int64_t elem_size) {
  int64_t e = 0;
  for (int d = 0; d < f.box.rank(); ++d) e += (box_offset[d] - f.box.offset[d]) * f.strides[d];
  return f.byte_offset + e * elem_size;
}

namespace {
constexpr char kPieceLimitPayload[] = "wsync.plan/piece-limit";
}  // namespace

absl::Status CheckPlanLimit(const char* what, int64_t count, int64_t limit, const char* flag,
                            const char* remedy) {
  if (limit <= 0 || count <= limit) return absl::OkStatus();
  absl::Status s = absl::ResourceExhaustedError(absl::StrCat("the plan would have ", count, " ",
                                                             what, ", over the limit of ", limit,
                                                             " (", flag, "); ", remedy));
  if (absl::string_view(flag) == kPiecesFlag) s.SetPayload(kPieceLimitPayload, absl::Cord("1"));
  return s;
}

bool IsPieceLimitRefusal(const absl::Status& s) {
  return s.code() == absl::StatusCode::kResourceExhausted &&
         s.GetPayload(kPieceLimitPayload).has_value();
}

bool Contiguous(int rank, const int64_t* shape, const int64_t* strides) {
  int64_t expect = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (strides[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

}  // namespace planner_detail

v1::LinkModel EffectiveLinkModel(const v1::PlanOptions& options) {
  v1::LinkModel lm = options.link_model();
  if (lm.nvlink_bytes_per_second() <= 0)
    lm.set_nvlink_bytes_per_second(kDefaultNvlinkBytesPerSecond);
  if (lm.nic_bytes_per_second() <= 0) lm.set_nic_bytes_per_second(kDefaultNicBytesPerSecond);
  if (lm.local_copy_bytes_per_second() <= 0) {
    lm.set_local_copy_bytes_per_second(kDefaultLocalCopyBytesPerSecond);
  }
  return lm;
}

namespace {

void Fnv1a(const char* data, size_t size, uint64_t* h) {
  for (size_t i = 0; i < size; ++i) {
    *h ^= static_cast<unsigned char>(data[i]);
    *h *= 1099511628211ull;
  }
}

// Hashes what is written through it, a buffer at a time: a 256-rank spec's
// sides serialize to tens of MiB that need never exist as one string.
class Fnv1aOutputStream : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  explicit Fnv1aOutputStream(uint64_t* h) : h_(h) {}
  ~Fnv1aOutputStream() override { Flush(); }

  bool Next(void** data, int* size) override {
    Flush();
    *data = buffer_;
    *size = sizeof(buffer_);
    pending_ = sizeof(buffer_);
    return true;
  }
  void BackUp(int count) override { pending_ -= count; }
  int64_t ByteCount() const override { return hashed_ + pending_; }

 private:
  void Flush() {
    Fnv1a(buffer_, pending_, h_);
    hashed_ += pending_;
    pending_ = 0;
  }

  uint64_t* h_;
  char buffer_[64 << 10];
  int pending_ = 0;  // bytes of buffer_ handed out and not backed up
  int64_t hashed_ = 0;
};

}  // namespace

std::string PlanKey(const v1::TransferSpec& spec) {
  uint64_t h = 14695981039346656037ull;
  // Each part is its deterministic serialization, length-prefixed so that
  // field boundaries cannot shift.
  auto part = [&](const google::protobuf::Message& m) {
    const size_t size = m.ByteSizeLong();  // also caches the sizes serializing uses
    const std::string prefix = absl::StrCat(size, ":");
    Fnv1a(prefix.data(), prefix.size(), &h);
    Fnv1aOutputStream hashed(&h);
    google::protobuf::io::CodedOutputStream cos(&hashed);
    cos.SetSerializationDeterministic(true);
    m.SerializeWithCachedSizes(&cos);
  };
  part(spec.source());
  part(spec.destination());
  for (const v1::TensorMapping& m : spec.mappings()) part(m);
  Fnv1a("|", 1, &h);
  part(spec.options());
  return absl::StrFormat("%016x", h);
}

absl::StatusOr<v1::Plan> BuildPlanFromCompiled(const v1::TransferSpec& spec,
                                               const CompiledSide& source,
                                               const CompiledSide& destination,
                                               const BuildOptions& build) {
  v1::Plan plan;
  RETURN_IF_ERROR(BuildPlanFromCompiledInto(spec, source, destination, &plan, build));
  return plan;
}

absl::Status BuildPlanFromCompiledInto(const v1::TransferSpec& spec, const CompiledSide& source,
                                       const CompiledSide& destination, v1::Plan* out,
                                       const BuildOptions& build) {
  using namespace planner_detail;  // NOLINT
  out->Clear();
  const auto start = std::chrono::steady_clock::now();
  StageClock clock(build.stages);
  Work w;
  w.spec = &spec;
  w.src = &source;
  w.dst = &destination;
  RETURN_IF_ERROR(ResolveOptions(spec.options(), &w.opt));
  if (source.tensors.empty() || source.workers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("source side '", source.name, "' is empty (no ranks or no tensors)"));
  }
  if (destination.tensors.empty() || destination.workers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("destination side '", destination.name,
                                                   "' is empty (no ranks or no tensors)"));
  }
  RETURN_IF_ERROR(IndexWorkers(&w));
  {
    // Bytes the busiest destination worker receives, and the rounds the
    // staging cap forces on it (in + relayed out): aim for >= 16 buckets per
    // worker and round, but never below 4 MiB (nor above bucket_bytes).
    std::vector<int64_t> need(w.worker_ids.size(), 0);
    int64_t total = 0;
    for (const CompiledTensor& t : destination.tensors) {
      for (const CompiledFragment& f : t.fragments()) {
        const int64_t bytes = f.box.NumElements() * DTypeSize(t.dtype);
        need[w.dst_rank_worker[f.rank]] += bytes;
        total += bytes;
      }
    }
    int64_t most = 0;
    for (int64_t n : need) most = std::max(most, n);
    const int64_t rounds =
        std::max<int64_t>(1, (2 * most + w.opt.staging_cap - 1) / w.opt.staging_cap);
    w.opt.pack_bytes =
        std::min(w.opt.bucket_bytes, std::max<int64_t>(4ll << 20, most / (rounds * 16)));
    // Every destination byte arrives in some bucket of at most pack_bytes.
    RETURN_IF_ERROR(CheckPlanLimit("buckets (at least: destination bytes / bucket size)",
                                   total / w.opt.pack_bytes, build.max_buckets, kBucketsFlag));
  }
  clock.Mark("index workers");
  RETURN_IF_ERROR(ValidateAndMap(&w));
  clock.Mark("validate, map");
  int32_t copied = 0;
  RETURN_IF_ERROR(BuildCells(&w, build.tensor_classes, &copied));
  if (build.stages != nullptr) {
    clock.Mark(absl::StrCat("cells (", copied, " of ", destination.tensors.size(), " copied; ",
                            w.cells.size(), " cells, ", w.holder_groups.size(), " holder groups, ",
                            w.boxes.end(), " box words)"));
  }
  // Each cell becomes at least one piece, and a plain cell one transfer per
  // destination of its group (direct, relayed or local) at least: checked
  // before any is made. Block fp8 cells count none (a rooted group's parts
  // go to its root only).
  RETURN_IF_ERROR(CheckPlanLimit("pieces (at least: cells)", static_cast<int64_t>(w.cells.size()),
                                 build.max_pieces, kPiecesFlag));
  int64_t deliveries = 0;
  for (const Cell& c : w.cells) {
    if (c.quant == 0) deliveries += w.dst_groups[c.dst_group].frag_count;
  }

  RETURN_IF_ERROR(CheckPlanLimit("pieces (at least: cells x their destinations)", deliveries,
                                 build.max_pieces, kPiecesFlag));
  if (build.stop_after_cells) {
    return absl::CancelledError(absl::StrCat("stopped after the cells stage (", w.cells.size(),
                                             " cells; BuildOptions::stop_after_cells)"));
  }
  {
    const RoutingBound bound = ComputeRoutingBound(w);
    w.routing_bound_seconds = bound.seconds;
    w.routing_bound_term = bound.term;
    SplitCellsForRouting(&w, bound.data_seconds, bound.one_round_seconds);
  }
  clock.Mark("bound, fan-out split");
  RETURN_IF_ERROR(ChooseSources(&w));
  if (build.stages != nullptr) {
    int64_t relays = 0;
    for (const Xfer& x : w.xfers) relays += x.relay ? 1 : 0;
    clock.Mark(absl::StrCat("sources (", w.cells.size(), " cells, ", w.xfers.size(), " transfers, ",
                            relays, " relays)"));
  }
  // Buckets, then rounds (and steps); the clock splits the first packing off.
  bool packed = false;
  RETURN_IF_ERROR(ScheduleBuckets(&w, [&](const Work& packing) -> absl::Status {
    if (!packed && build.stages != nullptr) {
      clock.Mark(absl::StrCat("buckets (", packing.buckets.size(), ")"));
    }
    packed = true;
    RETURN_IF_ERROR(CheckPlanLimit("buckets", static_cast<int64_t>(packing.buckets.size()),
                                   build.max_buckets, kBucketsFlag));
    return CheckPlanLimit("pieces", static_cast<int64_t>(packing.xfers.size()), build.max_pieces,
                          kPiecesFlag);
  }));
  clock.Mark(w.round_first_slot.empty()
                 ? std::string("rounds")
                 : absl::StrCat("rounds, steps (", w.num_rounds, " rounds)"));
  out->set_key(PlanKey(spec));
  RETURN_IF_ERROR(Emit(w, build.summary_only, build.emit_piece_runs, out));
  clock.Mark("emit");
  if (build.record_plan_seconds) {
    out->mutable_summary()->set_plan_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Plan> BuildPlan(const v1::TransferSpec& spec, const BuildOptions& build) {
  v1::Plan plan;
  RETURN_IF_ERROR(BuildPlanInto(spec, &plan, build));
  return plan;
}

absl::StatusOr<v1::Plan> ExtractRankPlan(const v1::Plan& plan, int32_t worker) {
  v1::Plan out;
  out.set_key(plan.key());
  out.set_num_rounds(plan.num_rounds());
  bool found = false;
  for (const v1::RankPlan& rp : plan.ranks()) {
    if (rp.worker() == worker) {
      *out.add_ranks() = rp;
      found = true;
    }
  }
  if (!found) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker, " has no part in plan ", plan.key()));
  }
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.sender() == worker || b.receiver() == worker) *out.add_buckets() = b;
  }
  for (const v1::Reduce& r : plan.reduces()) {
    if (r.worker() == worker) *out.add_reduces() = r;
  }
  for (const v1::Quantize& q : plan.quantizes()) {
    if (q.worker() == worker) *out.add_quantizes() = q;
  }
  for (const v1::RankSummary& rs : plan.summary().ranks()) {
    if (rs.worker() == worker) *out.mutable_summary()->add_ranks() = rs;
  }
  *out.mutable_workers() = plan.workers();
  *out.mutable_names() = plan.names();
  return out;
}

}  // namespace wsync::plan
