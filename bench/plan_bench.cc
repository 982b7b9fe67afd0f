// plan_bench: plans every catalog case and reports plan wall time (the planner
// is single-threaded), peak RSS, the predicted makespan (simulator) against
// the plan's lower bound, and for disjoint placements the node-NIC bound that
// no routing can beat. Each case runs in a forked child so that its peak RSS
// (getrusage ru_maxrss) is its own.
//
//   plan_bench [--filter SUBSTR] [--skip SUBSTR[,SUBSTR..]] [--out bench/results/plan.md]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "catalog/case.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "controller/plan/huge_page_allocator.h"
#include "controller/plan/plan_arena.h"
#include "controller/plan/planner.h"
#include "controller/plan/simulator.h"
#include "google/protobuf/arena.h"

namespace wsync::bench {
namespace {

struct Case {
  const char* model;
  const char* source;
  const char* destination;
  bool colocated;
  v1::DType trainer_dtype;
  const char* experts = "";  // "" = catalog default (separate for FSDP, stacked for Megatron)
  bool fp8_block = false;    // vLLM fp8 serving (--fp8-block): block-quantized linear weights
};

const Case kCases[] = {
    {"llama3-8b", "fsdp:8", "vllm-tp:2x4", false, v1::BF16},
    {"llama3-8b", "fsdp:8", "vllm-tp:1x8", true, v1::FP32},
    {"llama3-70b", "fsdp:64", "vllm-tp:8x4", false, v1::FP32},
    {"llama3-70b", "megatron:tp8,pp4,dp2", "vllm-tp:8x8", true, v1::BF16},
    {"qwen3-30b-a3b", "fsdp:8", "vllm-tp:2x4", false, v1::BF16},
    {"qwen3-30b-a3b", "fsdp:8", "vllm-tp:4x2,ep", true, v1::FP32},
    {"qwen3-235b-a22b", "fsdp:8", "vllm-tp:8x1,ep", false, v1::BF16},
    {"qwen3-235b-a22b", "megatron:tp4,pp4,dp4,ep4", "vllm-tp:8x4,ep", false, v1::BF16},
    {"deepseek-v3", "megatron:tp8,pp4,dp8,ep8", "vllm-tp:16x8,ep", false, v1::BF16},
    {"kimi-k2", "megatron:tp8,pp4,dp8,ep8", "vllm-tp:16x8,ep", false, v1::BF16},
    {"kimi-k2", "megatron:tp8,pp4,dp8,ep8", "vllm-tp:16x8,ep", true, v1::BF16},
    {"kimi-k2", "fsdp:256", "vllm-tp:16x8,ep", false, v1::BF16, "stacked"},
    {"deepseek-v3", "megatron:tp8,pp4,dp8,ep8", "vllm-tp:16x8,ep", false, v1::BF16, "", true},
    {"kimi-k2", "megatron:tp8,pp4,dp8,ep8", "vllm-tp:16x8,ep", false, v1::BF16, "", true},
};

struct Result {
  char error[512] = {0};
  double spec_seconds = 0, plan_seconds = 0, plan_cpu_seconds = 0;
  double predicted = 0, simulated = 0, bound = 0, node_bound = 0, planner_bound = 0;
  double routing_bound = 0;  // the planner's routing-independent bound
  int64_t rss_kib = 0, destination_bytes = 0, network_bytes = 0, buckets = 0, ops = 0;
  int32_t rounds = 0, bound_worker = 0, src_ranks = 0, dst_ranks = 0;
  char bound_link[16] = {0};
};

std::string Name(const Case& c) {
  return absl::StrCat(c.model, " ", c.source, " -> ", c.destination, c.colocated ? " colo" : "",
                      c.trainer_dtype == v1::FP32 ? " fp32" : "",
                      c.experts[0] != 0 ? absl::StrCat(" ", c.experts, " experts") : "",
                      c.fp8_block ? " fp8-block" : "");
}

// Bytes each destination node must take in through its NICs when no source
// rank shares the node: the distinct destination boxes of its ranks (identical
// boxes on several ranks of the node count once), over the node's NICs.
double NodeNicBound(const v1::TransferSpec& spec) {
  absl::flat_hash_map<int32_t, std::string> node_of_rank;
  absl::flat_hash_map<std::string, int64_t> gpus;
  for (int i = 0; i < spec.destination().ranks_size(); ++i) {
    node_of_rank[i] = spec.destination().ranks(i).node();
    ++gpus[spec.destination().ranks(i).node()];
  }
  absl::flat_hash_map<std::string, int64_t> bytes;
  for (const v1::TensorLayout& t : spec.destination().tensors()) {
    absl::flat_hash_set<std::string> seen;
    for (const v1::Fragment& f : t.fragments().fragments()) {
      const std::string& node = node_of_rank[f.rank()];
      std::string key = node;
      int64_t n = 1;
      for (int d = 0; d < f.box().offset_size(); ++d) {
        absl::StrAppend(&key, ",", f.box().offset(d), ":", f.box().length(d));
        n *= f.box().length(d);
      }
      if (seen.insert(key).second) bytes[node] += n * DTypeSize(t.dtype());
    }
  }
  const double nic = plan::EffectiveRates(spec.options().link_model()).nic;
  double worst = 0;
  for (const auto& [node, b] : bytes) worst = std::max(worst, b / (gpus[node] * nic));
  return worst;
}

void RunCase(const Case& c, Result* r) {
  catalog::CaseOptions o = *catalog::ParseCase(c.model, c.source, c.destination, c.experts);
  o.colocated = c.colocated;
  o.gpus_per_node = 8;
  o.trainer_dtype = c.trainer_dtype;
  o.fp8_block = c.fp8_block;
  auto t0 = std::chrono::steady_clock::now();
  auto spec = catalog::BuildCase(o);
  auto t1 = std::chrono::steady_clock::now();
  if (!spec.ok()) {
    std::snprintf(r->error, sizeof(r->error), "spec: %s",
                  std::string(spec.status().message()).c_str());
    return;
  }
  r->spec_seconds = std::chrono::duration<double>(t1 - t0).count();
  r->src_ranks = spec->source().ranks_size();
  r->dst_ranks = spec->destination().ranks_size();
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  t0 = std::chrono::steady_clock::now();
  // The plan lives on an arena, as the controller's plan cache keeps it.
  std::shared_ptr<google::protobuf::Arena> arena = plan::NewPlanArena();
  v1::Plan* plan = google::protobuf::Arena::CreateMessage<v1::Plan>(arena.get());
  const absl::Status built = plan::BuildPlanInto(*spec, plan);
  t1 = std::chrono::steady_clock::now();
  if (!built.ok()) {
    std::snprintf(r->error, sizeof(r->error), "plan: %s", std::string(built.message()).c_str());
    return;
  }
  r->plan_seconds = std::chrono::duration<double>(t1 - t0).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  r->rss_kib = usage.ru_maxrss;
  auto cpu = [](const rusage& u) {
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  r->plan_cpu_seconds = cpu(usage) - cpu(before);
  const v1::PlanSummary& s = plan->summary();
  r->predicted = s.predicted_seconds();
  r->planner_bound = s.lower_bound_seconds();
  r->routing_bound = s.routing_bound_seconds();
  r->destination_bytes = s.destination_bytes();
  r->network_bytes = s.network_bytes();
  r->buckets = s.num_buckets();
  r->ops = s.num_ops();
  r->rounds = s.num_rounds();
  auto nodes = plan::WorkerNodesFromSpec(*spec);
  auto sim = nodes.ok() ? plan::SimulatePlan(*plan, *nodes, spec->options().link_model())
                        : absl::StatusOr<plan::SimulationResult>(nodes.status());
  if (!sim.ok()) {
    std::snprintf(r->error, sizeof(r->error), "simulate: %s",
                  std::string(sim.status().message()).c_str());
    return;
  }
  r->simulated = sim->makespan_seconds;
  r->bound = sim->lower_bound_seconds;
  r->bound_worker = sim->bound_worker;
  std::snprintf(r->bound_link, sizeof(r->bound_link), "%s", sim->bound_link.c_str());
  r->node_bound = c.colocated ? 0 : NodeNicBound(*spec);
}

bool RunForked(const Case& c, Result* r) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Result child;
    RunCase(c, &child);
    const ssize_t w = write(fds[1], &child, sizeof(child));
    _exit(w == sizeof(child) ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = 0;
  while (got < static_cast<ssize_t>(sizeof(*r))) {
    const ssize_t n = read(fds[0], reinterpret_cast<char*>(r) + got, sizeof(*r) - got);
    if (n <= 0) break;
    got += n;
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != sizeof(*r)) {
    std::snprintf(r->error, sizeof(r->error), "child died (status %d)", status);
  }
  return true;
}

int Main(int argc, char** argv) {
  InitLogging("plan_bench");
  plan::KeepFreedMemoryForPlanning();  // as the controller does
  std::string filter, skip, out_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) {
      filter = argv[++i];
    } else if (!std::strcmp(argv[i], "--skip") && i + 1 < argc) {
      skip = argv[++i];
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else {
      spdlog::error(
          "usage: plan_bench [--filter SUBSTR] [--skip SUBSTR[,SUBSTR..]] [--out FILE.md]");
      return 2;
    }
  }
  std::string table =
      "| case | ranks src→dst | dest GB | spec s | plan wall s | plan CPU s | peak RSS MiB | "
      "buckets | ops | rounds "
      "| simulated s | lower bound s (worker, link) | sim/bound | routing bound s | sim/routing "
      "bound | node-NIC bound s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  int failures = 0;
  for (const Case& c : kCases) {
    const std::string name = Name(c);
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    bool skipped = false;
    for (absl::string_view part : absl::StrSplit(skip, ',', absl::SkipEmpty())) {
      skipped = skipped || name.find(std::string(part)) != std::string::npos;
    }
    if (skipped) continue;
    Result r;
    RunForked(c, &r);
    std::string row;
    if (r.error[0] != 0) {
      ++failures;
      row = absl::StrFormat("| %s | | | | | | | | | FAILED: %s | | | | | | |\n", name, r.error);
    } else {
      row = absl::StrFormat(
          "| %s | %d→%d | %.1f | %.3f | %.3f | %.3f | %.0f | %d | %d | %d | %.4f | %.4f (%d, %s) | "
          "%.4f | %.4f | %.3f | "
          "%s |\n",
          name, r.src_ranks, r.dst_ranks, r.destination_bytes / 1e9, r.spec_seconds, r.plan_seconds,
          r.plan_cpu_seconds, r.rss_kib / 1024.0, r.buckets, r.ops, r.rounds, r.simulated, r.bound,
          r.bound_worker, r.bound_link, r.bound > 0 ? r.simulated / r.bound : 0.0, r.routing_bound,
          r.routing_bound > 0 ? r.simulated / r.routing_bound : 0.0,
          r.node_bound > 0 ? absl::StrFormat("%.4f", r.node_bound) : "-");
      if (std::abs(r.simulated - r.predicted) > 1e-6 * r.simulated ||
          std::abs(r.bound - r.planner_bound) > 1e-6 * r.bound) {
        absl::StrAppend(
            &row, absl::StrFormat("| ↳ planner summary differs from simulator: predicted %.6f, "
                                  "bound %.6f | | | | | | | | | | | | | | | |\n",
                                  r.predicted, r.planner_bound));
      }
    }
    std::fputs(row.c_str(), stdout);
    std::fflush(stdout);
    table += row;
  }
  if (!out_path.empty()) {
    std::ofstream out(out_path, std::ios::app);
    out << table;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) { return wsync::bench::Main(argc, argv); }
