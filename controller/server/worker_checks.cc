#include "controller/server/worker_checks.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/bucket_steps.h"
#include "common/dtype.h"
#include "common/plan_names.h"
#include "common/plan_pieces.h"
#include "common/shadow_extents.h"
#include "controller/plan/planner.h"

namespace wsync::controller {

namespace {

// One past the last byte a view touches; 0 if it has no element.
int64_t ViewEnd(const v1::TensorView& v) {
  int64_t last = 0;
  for (int d = 0; d < v.shape_size(); ++d) {
    if (v.shape(d) <= 0) return 0;
    const int64_t stride = d < v.strides_size() ? v.strides(d) : 0;
    last += (v.shape(d) - 1) * stride;
  }
  const int64_t es = DTypeSize(v.dtype());
  return v.byte_offset() + es * (last + 1);
}

// A worker that lists no transports predates them: host memory over Gloo.
bool Offers(const WorkerSnapshot& w, v1::TransportKind kind) {
  if (w.info->transports().empty()) return kind == v1::TRANSPORT_GLOO;
  return absl::c_linear_search(w.info->transports(), kind);
}

int64_t CapOf(int64_t limit_bytes) { return limit_bytes / 256 * 256; }

struct BufferNeeds {
  absl::flat_hash_map<std::string, int64_t> end;       // buffer -> end byte
  absl::flat_hash_map<std::string, v1::DType> dtypes;  // buffer -> a view dtype
  absl::Status bad_name;
};

BufferNeeds NeedsOf(const v1::Plan& part, int32_t worker) {
  BufferNeeds needs;
  auto use = [&](const v1::TensorView& v) {
    absl::StatusOr<const std::string*> name =
        PlanName(part, v.buffer_name(), absl::StrCat("plan for worker ", worker));
    if (!name.ok()) {
      needs.bad_name.Update(name.status());
      return;
    }
    int64_t& end = needs.end[**name];
    end = std::max(end, ViewEnd(v));
    needs.dtypes.emplace(**name, v.dtype());
  };
  if (absl::Status s = CheckPlanRuns(part); !s.ok()) {  // every run, members bounded in all
    needs.bad_name.Update(s);
    return needs;
  }
  for (const v1::Bucket& b : part.buckets()) {
    (void)ForEachPiece(b, [&](int64_t, const v1::Piece& p) {
      // A block-fp8 scale piece (scales_of) has no src: its quantized piece's pack writes it.
      if (b.sender() == worker && p.scales_of() == 0) use(p.src());
      if (b.receiver() == worker && p.reduce_id() == 0 && p.quantize_id() == 0) use(p.dst());
      return absl::OkStatus();
    });
  }
  for (const v1::Reduce& red : part.reduces()) {
    if (red.worker() == worker) use(red.dst());
  }
  for (const v1::Quantize& q : part.quantizes()) {
    if (q.worker() != worker) continue;
    use(q.dst());
    use(q.scale_dst());
  }
  return needs;
}

// What a part may need of a worker beyond buffers: a plan feature an older
// worker would misread, the capability that says it reads it, and what the
// older worker would do.
struct CapabilityNeed {
  bool (*uses)(const v1::Plan&);
  const char* capability;
  const char* feature;
  const char* older_worker_would;
};

absl::Status CheckCapabilities(const v1::Plan& part, int32_t worker, const WorkerSnapshot& w) {
  static constexpr CapabilityNeed kNeeds[] = {
      {HasPieceRunRows, kPieceRunRowsCapability, "rows of piece runs (a stacked plan)",
       "read each run's first row only"},
      {HasBucketSteps, kBucketStepsCapability, "steps inside rounds",
       "move a round's steps at once, relaying bytes before they arrive"},
  };
  for (const CapabilityNeed& need : kNeeds) {
    if (!need.uses(part) || absl::c_linear_search(w.info->capabilities(), need.capability)) {
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        w.description, " [worker ", worker, "] receives a part of plan '", part.key(), "' with ",
        need.feature, " but did not register the capability '", need.capability,
        "' (an older worker would ", need.older_worker_would, "); upgrade it"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string TransportName(v1::TransportKind kind) {
  switch (kind) {
    case v1::TRANSPORT_NCCL:
      return "nccl";
    case v1::TRANSPORT_GLOO:
      return "gloo";
    default:
      return "unspecified";
  }
}

absl::Status CheckBuffers(const v1::Plan& part, int32_t worker, const WorkerSnapshot& w,
                          bool require_all) {
  if (absl::Status st = CheckCapabilities(part, worker, w); !st.ok()) return st;
  const BufferNeeds needs = NeedsOf(part, worker);
  if (!needs.bad_name.ok()) return needs.bad_name;
  for (const auto& [buffer, end] : needs.end) {
    std::pair<std::string, std::string> gn = absl::StrSplit(buffer, absl::MaxSplits('/', 1));
    const v1::BufferInfo* found = nullptr;
    bool group_has_buffers = false;
    for (const v1::BufferInfo& info : w.info->buffers()) {
      if (info.group() != gn.first) continue;
      group_has_buffers = true;
      if (info.name() == gn.second) found = &info;
    }
    const std::string who = absl::StrCat(w.description, " [worker ", worker, "]");
    if (found == nullptr) {
      if (!require_all && !group_has_buffers) continue;
      return absl::FailedPreconditionError(absl::StrCat(who, " has no buffer '", gn.second,
                                                        "' registered in group '", gn.first,
                                                        "' (the plan uses ", end, " bytes of it)"));
    }
    if (found->bytes() < end) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": buffer '", gn.second, "' of group '", gn.first, "' has ",
                       found->bytes(), " bytes but the plan accesses up to byte ", end));
    }
    const v1::DType want = needs.dtypes.at(buffer);
    if (found->dtype() != v1::DTYPE_UNSPECIFIED && found->dtype() != v1::UINT8 &&
        found->dtype() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": buffer '", gn.second, "' of group '", gn.first, "' is registered as ",
          DTypeName(found->dtype()), " but the layout says ", DTypeName(want)));
    }
  }
  return absl::OkStatus();
}

namespace {

// The NCCL version a worker's GPU plane loaded ("nccl=2.28.9" among its
// capabilities); "" if it does not say.
std::string NcclVersionOf(const WorkerSnapshot& w) {
  for (const std::string& cap : w.info->capabilities()) {
    if (absl::StartsWith(cap, "nccl=")) return cap.substr(5);
  }
  return "";
}

// Ranks of one NCCL communicator must run one NCCL version; mixed ones hang
// in communicator set-up. An embedded worker runs its process's libnccl
// (e.g. torch's), a sidecar the one its library path finds.
absl::Status CheckOneNcclVersion(const std::string& transfer,
                                 const std::vector<WorkerSnapshot>& workers) {
  std::map<std::string, std::string> first_of;  // version -> a worker running it
  for (const WorkerSnapshot& w : workers) {
    const std::string v = NcclVersionOf(w);
    if (!v.empty()) first_of.emplace(v, w.description);
  }
  if (first_of.size() <= 1) return absl::OkStatus();
  std::string which;
  for (const auto& [version, worker] : first_of) {
    absl::StrAppend(&which, which.empty() ? "" : ", ", worker, " runs NCCL ", version);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "Sync: transfer '", transfer, "' mixes NCCL versions (", which,
      "): ranks of one communicator must run the same one; start the sidecars with the "
      "owner's libnccl first on LD_LIBRARY_PATH (an embedded worker uses its process's, e.g. "
      "torch's nvidia/nccl/lib)"));
}

}  // namespace

int32_t ClearStepsUnlessEveryWorkerRunsThem(const std::vector<WorkerSnapshot>& workers,
                                            v1::TransferSpec* spec) {
  // An invalid latency (NaN, negative, infinite) is the planner's to refuse,
  // whoever the workers are.
  const double latency = spec->options().link_model().step_latency_seconds();
  if (!(latency > 0) || !std::isfinite(latency)) return -1;
  for (size_t w = 0; w < workers.size(); ++w) {
    if (!absl::c_linear_search(workers[w].info->capabilities(), kBucketStepsCapability)) {
      spec->mutable_options()->mutable_link_model()->clear_step_latency_seconds();
      return static_cast<int32_t>(w);
    }
  }
  return -1;
}

absl::StatusOr<v1::TransportKind> CommonTransport(const std::string& transfer,
                                                  const std::vector<WorkerSnapshot>& workers) {
  if (absl::c_all_of(workers,
                     [](const WorkerSnapshot& w) { return Offers(w, v1::TRANSPORT_NCCL); })) {
    if (absl::Status st = CheckOneNcclVersion(transfer, workers); !st.ok()) return st;
    return v1::TRANSPORT_NCCL;
  }
  if (absl::c_all_of(workers,
                     [](const WorkerSnapshot& w) { return Offers(w, v1::TRANSPORT_GLOO); })) {
    return v1::TRANSPORT_GLOO;
  }
  std::string gpu, host;
  for (const WorkerSnapshot& w : workers) {
    std::string& slot = Offers(w, v1::TRANSPORT_NCCL) ? gpu : host;
    if (slot.empty()) slot = w.description;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "Sync: transfer '", transfer, "' mixes workers without a common transport: ",
      gpu.empty() ? "none" : gpu, " runs the GPU plane (nccl), ", host.empty() ? "none" : host,
      " runs on host memory (gloo); start every worker of a transfer with --device, or none"));
}

StagingLimit TightestStagingLimit(const std::vector<WorkerSnapshot>& workers) {
  StagingLimit tightest;
  for (size_t w = 0; w < workers.size(); ++w) {
    const int64_t bytes = workers[w].info->staging_limit_bytes();
    if (bytes <= 0) continue;
    if (tightest.worker >= 0 && bytes >= tightest.bytes) continue;
    tightest.cap = CapOf(bytes);
    tightest.bytes = bytes;
    tightest.worker = static_cast<int32_t>(w);
    tightest.description = workers[w].description;
  }
  return tightest;
}

bool ApplyStagingLimit(const StagingLimit& limit, v1::TransferSpec* spec) {
  if (limit.worker < 0) return false;
  v1::PlanOptions* options = spec->mutable_options();
  const int64_t cap = options->staging_cap_bytes() > 0 ? options->staging_cap_bytes()
                                                       : plan::kDefaultStagingCapBytes;
  // A limit under 256 bytes allows no staged round; cap 1 lets the planner
  // say which bucket needs staging.
  const int64_t lowered = std::max<int64_t>(1, limit.cap);
  if (lowered >= cap) return false;
  options->set_staging_cap_bytes(lowered);
  if (options->bucket_bytes() == 0 && plan::kDefaultBucketBytes > lowered) {
    options->set_bucket_bytes(lowered);
  }
  return true;
}

absl::Status CheckStagingLimits(const v1::Plan& plan, const std::vector<WorkerSnapshot>& workers) {
  for (const v1::RankPlan& rp : plan.ranks()) {
    if (rp.worker() < 0 || rp.worker() >= static_cast<int32_t>(workers.size())) continue;
    const WorkerSnapshot& w = workers[rp.worker()];
    const int64_t bytes = w.info->staging_limit_bytes();
    if (bytes <= 0) continue;
    for (const v1::Round& round : rp.rounds()) {
      if (round.staging_bytes() <= CapOf(bytes)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          w.description, " [worker ", rp.worker(), "]: round ", round.index(), " of plan '",
          plan.key(), "' stages ", round.staging_bytes(), " bytes, over its staging limit of ",
          bytes, " bytes (--staging_limit_bytes); raise the limit or plan smaller buckets"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::WorkerShadow>> CheckShadowBudgets(
    const v1::Plan& plan, v1::StagingMode mode, const std::string& destination_group,
    const std::vector<WorkerSnapshot>& workers) {
  std::vector<v1::WorkerShadow> out;
  if (mode == v1::STAGING_IN_PLACE) return out;
  auto by_worker = ShadowBytesByWorker(plan);
  if (!by_worker.ok()) {
    return absl::Status(by_worker.status().code(),
                        absl::StrCat("plan '", plan.key(), "': ", by_worker.status().message()));
  }
  for (const auto& [worker, bytes] : *by_worker) {
    v1::WorkerShadow ws;
    ws.set_worker(worker);
    ws.set_shadow_bytes(bytes);
    if (worker >= 0 && worker < static_cast<int32_t>(workers.size())) {
      const WorkerSnapshot& w = workers[worker];
      if (!absl::c_linear_search(w.info->capabilities(), kStagedSyncsCapability)) {
        return absl::FailedPreconditionError(absl::StrCat(
            w.description, " [worker ", worker, "] receives a staged sync (",
            v1::StagingMode_Name(mode), ") of plan '", plan.key(),
            "' but did not register the capability '", kStagedSyncsCapability,
            "' (an older worker would write its live tensors in place); upgrade it, or stage "
            "in place"));
      }
      ws.set_budget_bytes(w.info->staging_budget_bytes());
      for (const v1::Membership& m : w.info->memberships()) {
        if (m.group() != destination_group) continue;
        ws.set_group(m.group());
        ws.set_rank(m.rank());
      }
      if (ws.budget_bytes() > 0 && bytes > ws.budget_bytes()) {
        return absl::InvalidArgumentError(
            absl::StrCat(w.description, " [worker ", worker, "]: a staged sync (",
                         v1::StagingMode_Name(mode), ") of plan '", plan.key(), "' needs ", bytes,
                         " bytes of shadow memory, over its --staging_budget_bytes of ",
                         ws.budget_bytes(), "; raise it, or stage in place"));
      }
    }
    out.push_back(std::move(ws));
  }
  return out;
}

}  // namespace wsync::controller
