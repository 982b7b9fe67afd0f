// `wsyncctl plan`: plan a TransferSpec (a JSON file or a catalog case) and
// print its summary, the whole plan as JSON (--json), and/or replay it on host
// memory with the planner's replay oracle (--verify).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/plan_arena.h"
#include "controller/plan/planner.h"
#include "controller/plan/simulator.h"
#include "controller/verify/replay.h"
#include "tools/args.h"
#include "tools/case_flags.h"
#include "tools/plan_sim.h"
#include "tools/spec_io.h"
#include "tools/subcommands.h"

namespace wsync::tools {
namespace {

// As wsync-controller's --max_plan_pieces / --max_plan_buckets: a plan the
// controller would refuse is refused here too, before it exhausts memory.
constexpr int64_t kDefaultMaxPieces = 4'000'000;
constexpr int64_t kDefaultMaxBuckets = 2'000'000;

void PlanUsage(FILE* out) {
  std::fprintf(out,
               "usage: wsyncctl plan SPEC.json|- [--json [--pretty]] [--verify] [--top N]\n"
               "       wsyncctl plan --model M --source S --destination D [case flags] [...]\n"
               "  --json            print the complete plan (proto3 JSON, docs/plan-format.md);\n"
               "                    with a simulator flag (below: the rates, --sim-rates-only,\n"
               "                    --nccl-net, --sim-json, --rounds) the simulator's lines go\n"
               "                    to stderr\n"
               "  --verify          replay every op on host arrays and check every destination\n"
               "                    element (needs the buffers of both sides in host memory)\n"
               "  --verify-max-gib  refuse --verify above this much host memory (default 16,\n"
               "                    at most 2^32): every buffer up to its furthest fragment,\n"
               "                    strides counted\n"
               "  --top N           workers listed in the summary (default 10)\n"
               "  --stages          print each stage's CPU and wall time, minor page faults and\n"
               "                    resident memory (building the spec, the planner's stages,\n"
               "                    the simulator, the JSON) to stderr\n"
               "  --rounds          also list every round's simulated time and critical worker\n"
               "  --max-pieces N    refuse a plan of more pieces (default 4000000, as\n"
               "                    wsync-controller's --max_plan_pieces; 0: no limit). A spec\n"
               "                    over it by its source shards alone is refused before planning\n"
               "  --max-buckets N   refuse a plan of more buckets (default 2000000; 0: no limit)\n"
               "  --no-piece-runs   write every piece out (no PieceRun): the plan as planners\n"
               "                    before piece runs emitted it\n"
               "  --stacking M      off, on or auto (default): plan each group of alike tensors\n"
               "                    as one stacked tensor and write its pieces back as runs\n"
               "                    (docs/plan-compact.md section 6); auto stacks only a spec\n"
               "                    the piece limit refuses unstacked, and then the limit\n"
               "                    counts pieces and runs\n"
               "  --stop-after-cells  measurement: stop (exit status of a refused plan) once the\n"
               "                    cells are built, so that with --stages the stages up to\n"
               "                    there can be measured on specs too large to plan whole\n"
               "  --nvlink-gbps X   link model (GB/s = 1e9 B/s, > 0), replacing the spec's\n"
               "  --nic-gbps X      options.link_model field before planning: NVLink within a\n"
               "  --copy-gbps X     node, NIC across nodes, local HBM copy; and the fixed cost\n"
               "  --round-latency-us X  of each round barrier (>= 0)\n"
               "  --step-latency-us X   of one more step inside a round (>= 0; 0, the\n"
               "                    default, makes no steps: docs/plan-format.md \"Steps\")\n"
               "  --sim-rates-only  the rate flags reach the simulator only: the plan is built\n"
               "                    with the spec's link model (the controller's plan)\n"
               "  --nccl-net        simulate NCCL forced onto its network transport inside a\n"
               "                    node too (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1): only the\n"
               "                    same-node pairs the plan lets write directly keep NVLink\n"
               "  --sim-json        also print one line 'SIM {...}' with the simulated makespan,\n"
               "                    its bound, the pairs simulated on NVLink and (--nccl-net)\n"
               "                    the same-node pairs left on the transport\n"
               "\ncase flags:\n%s",
               CaseFlagsUsage().c_str());
}

int Fail(int code, const absl::Status& status) {
  spdlog::error("plan: {}", std::string(status.message()));
  return code;
}

std::string Bytes(int64_t b) {
  if (b >= (1ll << 30)) return absl::StrFormat("%.2f GiB", b / double(1ll << 30));
  if (b >= (1ll << 20)) return absl::StrFormat("%.2f MiB", b / double(1ll << 20));
  if (b >= (1ll << 10)) return absl::StrFormat("%.2f KiB", b / double(1ll << 10));
  return absl::StrFormat("%d B", b);
}

// Host bytes the replay oracle allocates: every buffer of both sides, as far
// as its furthest fragment reaches (strides counted, overflow-checked).
absl::StatusOr<int64_t> ReplayBytes(const v1::TransferSpec& spec) {
  ASSIGN_OR_RETURN(plan::CompiledSide source,
                   plan::CompileSide(spec.source(), plan::SideRole::kSource));
  ASSIGN_OR_RETURN(plan::CompiledSide destination,
                   plan::CompileSide(spec.destination(), plan::SideRole::kDestination));
  ASSIGN_OR_RETURN(auto ends, plan::ReplayBufferBytes(source, destination));
  int64_t total = 0;
  for (const auto& [key, bytes] : ends) {
    ASSIGN_OR_RETURN(total, CheckedAdd(total, bytes, "--verify: host bytes of all buffers"));
  }
  return total;
}

void PrintSummary(const v1::TransferSpec& spec, const v1::Plan& plan,
                  const plan::SimulationResult* sim, const plan::WorkerNodes& nodes, int64_t top,
                  bool nccl_net) {
  const v1::PlanSummary& s = plan.summary();
  std::printf("plan %s  '%s'\n", plan.key().c_str(), spec.name().c_str());
  std::printf("  ranks            %d source, %d destination\n", spec.source().ranks_size(),
              spec.destination().ranks_size());
  std::printf("  bytes            destination %s, network %s, local %s\n",
              Bytes(s.destination_bytes()).c_str(), Bytes(s.network_bytes()).c_str(),
              Bytes(s.local_bytes()).c_str());
  std::printf(
      "  ops              %lld ops, %d rounds, %lld buckets, %lld pieces (%lld relayed), "
      "%d reduces\n",
      static_cast<long long>(s.num_ops()), s.num_rounds(), static_cast<long long>(s.num_buckets()),
      static_cast<long long>(s.num_pieces()), static_cast<long long>(s.num_relay_pieces()),
      plan.reduces_size());
  int64_t plain = 0, runs = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    plain += b.pieces_size();
    runs += b.runs_size();
  }
  if (runs > 0) {
    std::printf("  piece runs       %lld runs for %lld pieces, %lld plain pieces (%lld records)\n",
                static_cast<long long>(runs), static_cast<long long>(s.num_pieces() - plain),
                static_cast<long long>(plain), static_cast<long long>(plain + runs));
  }
  if (s.num_quantizes() > 0) {
    std::printf(
        "  block fp8        %lld receiver-side quantizations (blocks cut by source shards)\n",
        static_cast<long long>(s.num_quantizes()));
  }
  std::printf("  per-worker max   out %s, in %s, peak staging %s\n",
              Bytes(s.max_rank_bytes_out()).c_str(), Bytes(s.max_rank_bytes_in()).c_str(),
              Bytes(s.peak_staging_bytes()).c_str());
  std::printf("  time             predicted %s, lower bound %s (ratio %.3f)\n",
              SecondsText(s.predicted_seconds()).c_str(),
              SecondsText(s.lower_bound_seconds()).c_str(),
              s.lower_bound_seconds() > 0 ? s.predicted_seconds() / s.lower_bound_seconds() : 0.0);
  std::printf(
      "  routing bound    %s (ratio %.3f): %s\n", SecondsText(s.routing_bound_seconds()).c_str(),
      s.routing_bound_seconds() > 0 ? s.predicted_seconds() / s.routing_bound_seconds() : 0.0,
      s.routing_bound_term().c_str());
  if (sim != nullptr) std::fputs(SimulatorLine(plan, *sim, nccl_net).c_str(), stdout);
  std::printf("  plan time        %s\n", SecondsText(s.plan_seconds()).c_str());
  std::vector<v1::RankSummary> ranks(s.ranks().begin(), s.ranks().end());
  std::sort(ranks.begin(), ranks.end(), [](const v1::RankSummary& a, const v1::RankSummary& b) {
    const int64_t ma = std::max(a.bytes_in(), a.bytes_out());
    const int64_t mb = std::max(b.bytes_in(), b.bytes_out());
    return ma != mb ? ma > mb : a.worker() < b.worker();
  });
  if (ranks.empty() || top <= 0) return;
  std::printf("  top %lld of %zu workers by max(bytes in, bytes out):\n",
              static_cast<long long>(std::min<int64_t>(top, ranks.size())), ranks.size());
  std::printf("    %6s %-8s %12s %12s %12s %8s %12s %9s\n", "worker", "node", "out", "in", "local",
              "ops", "peak stage", "busy");
  for (int64_t i = 0; i < top && i < static_cast<int64_t>(ranks.size()); ++i) {
    const v1::RankSummary& r = ranks[i];
    auto node = nodes.find(r.worker());
    std::printf("    %6d %-8s %12s %12s %12s %8lld %12s %9s\n", r.worker(),
                node == nodes.end() ? "?" : node->second.c_str(), Bytes(r.bytes_out()).c_str(),
                Bytes(r.bytes_in()).c_str(), Bytes(r.bytes_local()).c_str(),
                static_cast<long long>(r.ops()), Bytes(r.peak_staging_bytes()).c_str(),
                SecondsText(r.busy_seconds()).c_str());
  }
}

}  // namespace

int RunPlanCommand(const std::vector<std::string>& argv) {
  FlagSpec flags{{"top", "verify-max-gib", "max-pieces", "max-buckets", "nvlink-gbps", "nic-gbps",
                  "copy-gbps", "round-latency-us", "step-latency-us", "stacking"},
                 {"json", "pretty", "verify", "rounds", "help", "nccl-net", "sim-json",
                  "sim-rates-only", "stages", "no-piece-runs", "stop-after-cells"}};
  AddCaseFlags(&flags);
  auto args = ParseArgs(argv, flags);
  if (!args.ok()) {
    Fail(kExitUsage, args.status());
    PlanUsage(stderr);
    return kExitUsage;
  }
  if (args->Has("help")) {
    PlanUsage(stdout);
    return kExitOk;
  }
  auto top = args->IntValue("top", 10);
  if (!top.ok()) return Fail(kExitUsage, top.status());
  auto max_gib = args->IntValue("verify-max-gib", 16);
  if (!max_gib.ok()) return Fail(kExitUsage, max_gib.status());
  plan::BuildOptions build;
  auto max_pieces = args->IntValue("max-pieces", kDefaultMaxPieces);
  if (!max_pieces.ok()) return Fail(kExitUsage, max_pieces.status());
  auto max_buckets = args->IntValue("max-buckets", kDefaultMaxBuckets);
  if (!max_buckets.ok()) return Fail(kExitUsage, max_buckets.status());
  if (*max_pieces < 0 || *max_buckets < 0) {
    return Fail(kExitUsage,
                absl::InvalidArgumentError("--max-pieces and --max-buckets must be >= 0"));
  }
  build.max_pieces = *max_pieces;
  build.max_buckets = *max_buckets;
  build.emit_piece_runs = !args->Has("no-piece-runs");
  build.stop_after_cells = args->Has("stop-after-cells");
  if (args->Has("stacking")) {
    absl::StatusOr<plan::StackingMode> mode =
        plan::ParseStackingMode(args->Value("stacking"), "--stacking");
    if (!mode.ok()) return Fail(kExitUsage, mode.status());
    build.stacking = *mode;
  }
  std::vector<plan::StageCost> stages;
  plan::StageClock clock(args->Has("stages") ? &stages : nullptr);
  if (args->Has("stages")) build.stages = &stages;
  // Printed however the command ends: a refused plan shows how far it got.
  absl::Cleanup print_stages = [&] {
    if (args->Has("stages")) std::fputs(plan::StageTable(stages).c_str(), stderr);
  };
  const bool from_case = HasCaseFlags(*args);
  if (from_case == (args->positional().size() == 1) || args->positional().size() > 1) {
    spdlog::error("plan: give exactly one of SPEC.json or --model/--source/--destination");
    PlanUsage(stderr);
    return kExitUsage;
  }
  absl::StatusOr<v1::TransferSpec> spec =
      from_case ? SpecFromCaseFlags(*args) : ReadSpecFile(args->positional()[0]);
  if (!spec.ok()) return Fail(kExitUsage, spec.status());
  // The simulator's link model: the spec's, with the rate flags applied;
  // the planner's too unless --sim-rates-only (then the plan is the one the
  // spec alone gives, e.g. the controller's, simulated at other rates). Only
  // the options are copied: a catalog spec of 256 ranks is tens of MiB.
  v1::PlanOptions sim_options = spec->options();
  if (absl::Status s = ApplyLinkFlags(*args, &sim_options); !s.ok()) return Fail(kExitUsage, s);
  if (!args->Has("sim-rates-only")) *spec->mutable_options() = sim_options;
  clock.Mark(from_case ? "catalog spec" : "read spec");

  // On the plan arena, as the controller's plan cache builds it.
  std::shared_ptr<google::protobuf::Arena> arena = plan::NewPlanArena();
  v1::Plan* plan = google::protobuf::Arena::CreateMessage<v1::Plan>(arena.get());
  absl::Status built = plan::BuildPlanInto(*spec, plan, build);
  if (!built.ok()) return Fail(kExitFailed, built);
  clock.Mark("plan (sum of the above)", /*aggregate=*/true);

  // The simulator: always for the text summary; with --json (stdout is the
  // plan) when a flag asks for it, its lines on stderr.
  const bool json = args->Has("json");
  std::optional<PlanSimulation> sim;
  if (!json || HasSimulatorFlags(*args)) {
    auto simulated = SimulatePlanForArgs(*args, *spec, sim_options, *plan);
    if (!simulated.ok()) return Fail(kExitFailed, simulated.status());
    sim = std::move(*simulated);
    clock.Mark("simulate");
  }
  if (json) {
    auto text = ToJson(*plan, args->Has("pretty"));
    if (!text.ok()) return Fail(kExitFailed, text.status());
    std::cout << *text << "\n" << std::flush;
    clock.Mark("json");
    if (sim.has_value()) {
      std::fputs(SimulatorLine(*plan, sim->result, sim->nccl_net).c_str(), stderr);
      PrintSimulationLines(*args, *plan, *sim, stderr);
    }
  } else {
    PrintSummary(*spec, *plan, &sim->result, sim->nodes, *top, sim->nccl_net);
    PrintSimulationLines(*args, *plan, *sim, stdout);
  }
  if (args->Has("verify")) {
    auto need = ReplayBytes(*spec);
    if (!need.ok()) return Fail(kExitFailed, need.status());
    if (*max_gib < 0 || *max_gib > (int64_t{1} << 32)) {
      return Fail(kExitUsage, absl::InvalidArgumentError(absl::StrCat("--verify-max-gib ", *max_gib,
                                                                      " is outside [0, 2^32]")));
    }
    if (*need > (*max_gib << 30)) {
      return Fail(kExitFailed,
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "--verify needs %s of host memory for both sides' buffers, above "
                      "--verify-max-gib %d; verify a scaled-down case (tiny-* models) instead",
                      Bytes(*need), *max_gib)));
    }
    absl::Status verified = plan::VerifyPlan(*spec, *plan);
    if (!verified.ok()) {
      return Fail(kExitFailed, absl::Status(verified.code(),
                                            absl::StrCat("verify FAILED: ", verified.message())));
    }
    // The result line: on stdout, or (stdout is the JSON plan) logged.
    if (args->Has("json")) {
      spdlog::info("verify: OK ({} buckets replayed, every destination element checked)",
                   plan->buckets_size());
    } else {
      std::printf("verify: OK (%d buckets replayed, every destination element checked)\n",
                  plan->buckets_size());
    }
  }
  return kExitOk;
}

}  // namespace wsync::tools
