#include "bench/gpu/bench_cases.h"

#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "bench/gpu/bench_util.h"
#include "catalog/case.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "controller/plan/planner.h"
#include "google/protobuf/util/json_util.h"

namespace wsync::bench {
namespace {

// Workaround, not a semantic change: BindPlan (worker/exec/bound_plan.cc)
// checks a zero-copy bucket's view for contiguity before coalescing it, so a
// row-major [rows, cols] view is refused as "strided". The same bytes as a 1-D
// view bind. Fix belongs in CheckZeroCopy (coalesce first).
void FlattenZeroCopyViews(v1::Plan& plan) {
  for (v1::Bucket& b : *plan.mutable_buckets()) {
    if (!b.zero_copy() || b.pieces_size() != 1) continue;
    for (v1::TensorView* v :
         {b.mutable_pieces(0)->mutable_src(), b.mutable_pieces(0)->mutable_dst()}) {
      int64_t expect = 1, n = 1;
      bool row_major = true;
      for (int d = v->shape_size() - 1; d >= 0; --d) {
        if (v->shape(d) != 1 && v->strides(d) != expect) row_major = false;
        expect *= v->shape(d);
        n *= v->shape(d);
      }
      if (!row_major) continue;
      v->clear_shape();
      v->clear_strides();
      v->add_shape(n);
      v->add_strides(1);
    }
  }
}

struct CaseLayout {
  const char* mode;
  const char* source;
  const char* destination;
  bool colocated;
};
constexpr CaseLayout kCases[] = {
    {"tp1", "fsdp:1", "vllm-tp:1", false},
    {"colocated", "fsdp:2", "vllm-tp:2", true},
    // One GPU: the layout change is a local copy only (a commit's phases
    // measured where only one GPU is lent).
    {"colocated1", "fsdp:1", "vllm-tp:1", true},
    {"fanout_tp2", "megatron:tp2", "vllm-tp:1x2", false},
    {"fanout_dp2", "megatron:tp1,dp2", "vllm-tp:1x2", false},
    {"colocated4", "fsdp:4", "vllm-tp:2x2", true},
};

// --spec: a TransferSpec in JSON whose sides name their workers (RankInfo),
// e.g. the one tests/python/gpu/sync_proof.py syncs through the services.
absl::StatusOr<v1::TransferSpec> LoadSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --spec ", path));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RETURN_IF_ERROR(
      CheckStrictJson(text, *v1::TransferSpec::descriptor(), absl::StrCat("--spec ", path)));
  v1::TransferSpec spec;
  const auto s = google::protobuf::util::JsonStringToMessage(text, &spec);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--spec ", path, ": ", s.ToString()));
  if (spec.source().ranks().empty() || spec.destination().ranks().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec ", path, ": both sides must list their ranks' workers"));
  }
  return spec;
}

absl::StatusOr<v1::TransferSpec> CaseSpec(const CaseParams& f, const std::string& mode) {
  if (mode == "spec") return LoadSpec(f.spec_file);
  catalog::CaseOptions o;
  o.model = f.model;
  const CaseLayout* layout = nullptr;
  for (const CaseLayout& l : kCases) {
    if (mode == l.mode) layout = &l;
  }
  if (layout == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown mode ", mode));
  ASSIGN_OR_RETURN(o.source, catalog::ParseSource(layout->source));
  ASSIGN_OR_RETURN(o.destination, catalog::ParseDestination(layout->destination));
  o.colocated = layout->colocated;
  return catalog::BuildCase(o);
}

}  // namespace

absl::StatusOr<Case> MakeCase(const CaseParams& f, const std::string& mode) {
  Case c;
  c.mode = mode;
  ASSIGN_OR_RETURN(c.spec, CaseSpec(f, mode));
  // Both GPUs of the test machine share one node (NVLink).
  for (auto* side : {c.spec.mutable_source(), c.spec.mutable_destination()}) {
    for (auto& r : *side->mutable_ranks()) r.set_node("node0");
  }
  for (const auto* side : {&c.spec.source(), &c.spec.destination()}) {
    for (const auto& r : side->ranks()) c.workers = std::max(c.workers, r.worker() + 1);
  }
  auto* opt = c.spec.mutable_options();
  // The simulator's prediction under this run's measured rates (same node).
  opt->mutable_link_model()->set_nvlink_bytes_per_second(f.nvlink_gbps * 1e9);
  opt->mutable_link_model()->set_local_copy_bytes_per_second(f.copy_gbps * 1e9);
  opt->set_bucket_bytes(f.bucket_mib << 20);
  opt->set_staging_cap_bytes(f.staging_mib << 20);
  opt->set_zero_copy_min_bytes(f.zero_copy_mib << 20);
  const double t0 = Now();
  plan::BuildOptions build;
  build.emit_piece_runs = f.piece_runs;
  auto plan = plan::BuildPlan(c.spec, build);
  if (!plan.ok()) return plan.status();
  c.plan_seconds = Now() - t0;
  c.plan = std::move(*plan);
  FlattenZeroCopyViews(c.plan);
  return c;
}

}  // namespace wsync::bench
