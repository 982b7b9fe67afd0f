// wsync end to end on 2-8 GPUs, one process per GPU (as in production): a
// catalog model's TransferSpec -> BuildPlan -> BindPlan -> the shared
// Executor of a channel the composition root (node::DataPlane) builds from
// the CUDA backend: CudaDataOps + NcclTransport + CudaPeerWriter. Cases (--mode, comma-separated):
//   tp1          trainer (FSDP, 1 rank) on GPU0 -> vLLM TP=1 on GPU1
//   colocated    FSDP2 Shard(0) over GPUs 0-1 -> vLLM TP=2 on the same GPUs
//   fanout_tp2   Megatron TP=2 on GPUs 0-1 -> two vLLM TP=1 replicas on GPUs 2-3
//   fanout_dp2   Megatron DP=2 (two full replicas) on GPUs 0-1 -> two vLLM TP=1
//                replicas on GPUs 2-3 (every trainer replica sends)
//   colocated4   FSDP2 over GPUs 0-3 -> two vLLM TP=2 replicas on the same GPUs
//   colocated1   one GPU: the trainer's tensors -> vLLM TP=1 on the same GPU
// Reports time to first sync (communicator init, binding, first run) apart
// from the steady state (median of --iters syncs), per-GPU bytes in / out, the
// planner's simulated time under this run's measured link rates, and checks
// every sync end to end (bench/gpu/fragment_check.h).
//
//   wsync_bench_gpu_sync --model llama3-8b [--mode tp1,colocated] [--iters 5]
//       [--pause-ms 0]   (idle before each timed sync, as between training steps)
//       [--bucket-mib 256] [--staging-mib 2048] [--zero-copy-mib 32] [--pipeline 1]
//       [--blocks-per-sm 8] [--direct 0] [--put-copy-engine-kib 4096]
//       [--put-blocks-per-sm 1] [--put-copy-streams 4] [--put-copy-engine-row-bytes 8192]
//       [--nvlink-gbps 368] [--bidir-gbps 354] [--copy-gbps 2071]
//       [--diagnose-drop local|puts]   (time one part alone; checksums then fail)
//       [--reserved-sms 0]   (data-op kernel blocks on SMs below this leave at once)
//       [--put-reserved-sms 48]   (the same while puts run beside the copies)
//       [--put-interleave-mib 0]   (puts to several peers cut into parts of N MiB, interleaved)
//       [--slab-round-kib 2048]   (slab allocations are multiples of this)
//       [--diagnose-ce-probes 1]   (time ipc_put_bench's copy-engine writes at
//                                   each set-up step, in fresh memory)
//       [--diagnose-barrier spin|nccl]   (with probes: what the diagnoses meet on
//                                         once NCCL is up)
//       [--diagnose-raw-puts 1]   (also time the direct writes alone, straight
//                                  through the data ops: no executor, no tokens)
//       [--timeline 1]   (one line per timed sync: when each copy, put and NCCL
//                         round finished on the GPU and was issued by the host)
//       [--early-local-rounds 1]   (ExecutorOptions::early_local_rounds; -1: all)
//       [--mailbox 1]   (ExecutorOptions::mailbox_tokens: direct-write tokens through
//                        peer mailboxes; 0: a NCCL round each, the A/B baseline)
//       [--piece-runs 1]   (the planner writes piece runs; 0: every piece plain)
//       [--put-phases 1] [--put-gates 1] [--put-gate-timeout-ms 100]
//                       (put phases and the gates between them, phase_gates.h)
//       [--measure-issue-keys 1]   (CPU only: the data ops' cache-key cost per round, exits)
//       [--dump-shapes FILE]   (writes the source tensors for bench/gpu/peers.py, exits)
//       [--staging device_shadow|host_shadow] [--commit copy|swap|flip] [--checksums 1]
//       [--commit-barrier 1]   (staged: every worker's run ends before any commits)
//       [--finish-barrier 0]   (staged: the twin's remap after every worker's commit)
//       [--staging in_place|host_shadow|device_shadow] [--checksums 1] [--commit copy|swap|flip]
//                                   (staged syncs, docs/staging.md: receivers
//                                    fill shadows, then commit; bucket checksums)
//       [--landing-parts 16] [--min-landing-part-mib 64] [--part-tail-ratio 4]
//                                   (checksum parts: ExecutorOptions; ratio <= 1: equal parts)
//       [--hash-blocks-per-sm 4]    (grid of the checksum kernels)
//       [--spec FILE --mode spec]   (a TransferSpec in JSON whose sides list their
//                                    workers, instead of a catalog model)
#include <cuda_runtime_api.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/gpu/bench_cases.h"
#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/bench_util.h"
#include "bench/gpu/ce_probe.h"
#include "bench/gpu/device_timeline.h"
#include "bench/gpu/fragment_check.h"
#include "bench/gpu/issue_keys.h"
#include "bench/gpu/raw_puts.h"
#include "bench/gpu/slabs.h"
#include "bench/gpu/staged_run.h"
#include "bench/gpu/sync_bench_flags.h"
#include "bench/gpu/sync_bench_steps.h"
#include "catalog/case.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "controller/plan/compiled_layout.h"
#include "controller/plan/planner.h"
#include "controller/plan/put_phases.h"
#include "controller/plan/routes.h"
#include "google/protobuf/util/json_util.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_peer_writer.h"
#include "worker/backends/cuda/ipc_registry.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/buffer_registry.h"
#include "worker/exec/executor.h"
#include "worker/node/data_plane.h"
#include "worker/plane/kv_store.h"

namespace wsync::bench {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  spdlog::error("sync_bench: {}: {}", what, s.ToString());
  return 3;
}

#define CUDA_OK(x, what)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) return Fail(what, absl::InternalError(cudaGetErrorString(e_))); \
  } while (0)

int RankMain(const Flags& f, const Case& c, int worker, const std::string& dir) {
  CUDA_OK(cudaSetDevice(worker), "cudaSetDevice");
  transport::FileKvStore store(dir);
  const std::string tag = absl::StrCat(c.mode, "/");
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::optional<SpinBarrier> spin;
  if (f.diagnose_ce_probes) {
    auto b = SpinBarrier::Open(absl::StrCat(dir, "/", c.mode, "-spin"), c.workers);
    if (!b.ok()) return Fail("spin barrier", b.status());
    spin.emplace(std::move(*b));
  }
  // Before the NCCL transport exists, diagnoses line up on the spin barrier.
  std::function<absl::Status()> diagnosis_barrier = [&] { return spin->Wait(); };
  auto probe = [&](const char* at) {
    return spin ? RunCeProbe(absl::StrCat(c.mode, "/", at), worker, f.iters, store,
                             diagnosis_barrier)
                : absl::OkStatus();
  };
  if (auto s = probe("start"); !s.ok()) return Fail("probe", s);

  // Buffers (a trainer's parameters and vLLM's weights in production).
  auto src_need = BuffersOf(c.spec.source(), plan::SideRole::kSource, worker);
  if (!src_need.ok()) return Fail("source buffers", src_need.status());
  auto dst_need = BuffersOf(c.spec.destination(), plan::SideRole::kDestination, worker);
  if (!dst_need.ok()) return Fail("destination buffers", dst_need.status());
  Slab src, dst;
  if (auto s = MakeSlab(*src_need, f.slab_round_kib << 10, src); !s.ok()) {
    return Fail("source slab", s);
  }
  // --commit swap: the destination slab is one weight arena (the backend
  // that makes it is the worker's, below).
  std::unique_ptr<cuda::CudaBackend> arena_backend;
  std::unique_ptr<agent::WeightArenas> arenas;
  if (f.commit_swap || f.commit_flip) {
    auto b = cuda::CudaBackend::Create(worker, {});
    if (!b.ok()) return Fail("CUDA backend (arenas)", b.status());
    arena_backend = std::move(*b);
    arenas = std::make_unique<agent::WeightArenas>(arena_backend.get());
    if (auto s = f.commit_flip ? MakeFlipSlab(*dst_need, *arena_backend, *arenas, dst)
                               : MakeArenaSlab(*dst_need, *arena_backend, *arenas, dst);
        !s.ok()) {
      return Fail("destination arena", s);
    }
  } else if (auto s = MakeSlab(*dst_need, f.slab_round_kib << 10, dst); !s.ok()) {
    return Fail("destination slab", s);
  }
  if (dst.bytes) cudaMemsetAsync(dst.base, 0, dst.bytes, stream);
  if (src.bytes) cudaMemsetAsync(src.base, 0, src.bytes, stream);
  exec::BufferRegistry registry;
  for (const auto& [name, b] : src.buffers) {
    if (auto s = registry.Register(exec::BufferSide::kSource, name, b); !s.ok())
      return Fail(name, s);
  }
  for (const auto& [name, b] : dst.buffers) {
    if (auto s = registry.Register(exec::BufferSide::kDestination, name, b); !s.ok()) {
      return Fail(name, s);
    }
  }
  if (auto s = FillSourceFragments(c.spec.source(), worker, registry, stream); !s.ok()) {
    return Fail("fill", s);
  }
  CUDA_OK(cudaStreamSynchronize(stream), "fill");
  auto src_sum = SideChecksum(c.spec.source(), plan::SideRole::kSource, worker, registry, stream);
  if (!src_sum.ok()) return Fail("checksum", src_sum.status());
  if (auto s = probe("slabs_filled"); !s.ok()) return Fail("probe", s);

  // The worker's data plane: the CUDA backend with this run's data-op
  // options, one channel (NCCL transport, data ops, peer writer, executor)
  // built by the composition root.
  auto backend = cuda::CudaBackend::Create(
      worker, {.blocks_per_sm = f.blocks_per_sm,
               .put_copy_engine_min_bytes = f.put_copy_engine_kib << 10,
               .put_copy_engine_min_row_bytes = f.put_copy_engine_row_bytes,
               .put_blocks_per_sm = f.put_blocks_per_sm,
               .put_copy_streams = f.put_copy_streams,
               .reserved_sms = f.reserved_sms,
               .put_reserved_sms = f.put_reserved_sms,
               .put_interleave_mib = f.put_interleave_mib,
               .hash_blocks_per_sm = f.hash_blocks_per_sm});
  if (!backend.ok()) return Fail("CUDA backend", backend.status());
  node::DataPlane data_plane(backend->get(), ExecutorOptionsOf(f));
  // Time to first sync: communicator (with the channel's data ops), binding,
  // first run (staging, tables).
  double t0 = Now();
  plane::ConnectOptions connect;
  connect.store = &store;
  connect.prefix = tag + "nccl";
  connect.rank = worker;
  connect.size = c.workers;
  connect.deadline = absl::Now() + absl::Seconds(120);
  auto channel = data_plane.Connect(connect);
  if (!channel.ok()) return Fail("NCCL channel", channel.status());
  transport::Transport* const transport = (*channel)->transport.get();
  cuda::CudaDataOps* const ops = static_cast<cuda::CudaDataOps*>((*channel)->ops.get());
  cuda::CudaPeerWriter* const writer = static_cast<cuda::CudaPeerWriter*>((*channel)->writer.get());
  exec::Executor& executor = *(*channel)->executor;
  const double comm_init_s = Now() - t0;
  if (auto s = probe("nccl_created"); !s.ok()) return Fail("probe", s);
  t0 = Now();
  auto rank_plan = plan::ExtractRankPlan(c.plan, worker);
  if (!rank_plan.ok()) return Fail("extract", rank_plan.status());
  DirectSetup direct;
  if (f.direct) {
    if (auto s = SetUpDirectWrites(c, worker, dst, store, tag, **backend, direct); !s.ok()) {
      return Fail("direct writes", s);
    }
    const plan::PutPhases phases =
        f.put_phases ? plan::PlanPutPhases(c.plan, direct.pairs) : plan::PutPhases{};
    if (worker == 0) fprintf(stderr, "put phases: %d\n", phases.num_phases);
    plan::MarkPeerWrites(direct.pairs, &*rank_plan, phases.phase_of_bucket);
  }
  if (auto s = probe("peer_slab_opened"); !s.ok()) return Fail("probe", s);
  auto staged =
      PrepareStaging(f.staging, *rank_plan, worker, backend->get(), registry, arenas.get());
  if (!staged.ok()) return Fail("staging", staged.status());
  const exec::BufferRegistry& bind_to = *staged->registry;
  auto bound = exec::BindPlan(*rank_plan, worker, bind_to, transport::MemorySpace::kCuda,
                              f.direct ? &direct.direct : nullptr);
  if (!bound.ok()) return Fail("bind", bound.status());
  if (!f.diagnose_drop.empty()) {
    auto edited = std::make_shared<exec::BoundPlan>(**bound);
    if (f.diagnose_drop == "local") {
      for (exec::BoundRound& r : edited->rounds) r.copies.clear();
    } else if (f.diagnose_drop == "puts") {
      edited->puts.clear();
    }
    *bound = std::move(edited);
  }
  const double bind_s = Now() - t0;
  if (auto s = probe("data_ops_created"); !s.ok()) return Fail("probe", s);

  // Barrier: one byte to and from every other worker over the transport.
  char* token = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&token), 2 * c.workers), "token");
  auto barrier = [&]() {
    std::vector<transport::SendRequest> sends;
    std::vector<transport::RecvRequest> recvs;
    for (int peer = 0; peer < c.workers; ++peer) {
      if (peer == worker) continue;
      sends.push_back({peer, 1 << 30, token + peer, 1});
      recvs.push_back({peer, 1 << 30, token + c.workers + peer, 1});
    }
    return transport->RunRound(sends, recvs, absl::Now() + absl::Seconds(60));
  };
  // The latency of one transport round of a byte each way on an idle GPU
  // (the direct-write tokens are such rounds).
  std::vector<double> barrier_times;
  for (int i = 0; i < 21; ++i) {
    const double tb = Now();
    if (auto s = barrier(); !s.ok()) return Fail("barrier", s);
    if (i > 0) barrier_times.push_back(Now() - tb);
  }
  if (!spin || f.diagnose_barrier == "nccl") diagnosis_barrier = barrier;
  if (auto s = probe("nccl_barrier_run"); !s.ok()) return Fail("probe", s);
  // A staged run ends with its commit (shadows -> live): the receiver's pause.
  std::vector<double> commit_times;
  std::vector<agent::ShadowSet::CommitTimes> commit_phases;
  // --commit flip: the owner's pointers (one per destination buffer) and its switches.
  std::vector<void*> owner;
  for (const auto& [name, b] : dst.buffers) owner.push_back(b.data);
  std::vector<double> owner_switch;
  // The barriers are met by every worker of a staged run, whether or not it
  // receives (a sender has no shadows but must meet its receivers).
  const bool staged_run = f.staging != v1::STAGING_IN_PLACE;
  auto commit = [&]() -> absl::Status {
    if (staged_run && f.commit_barrier) RETURN_IF_ERROR(barrier());
    if (staged->shadows != nullptr) {
      const double tc = Now();
      RETURN_IF_ERROR(staged->shadows->Commit());
      commit_times.push_back(Now() - tc);
      commit_phases.push_back(staged->shadows->last_commit_times());
      if (f.commit_flip) {
        // The owner serves V-1 through the commit; its pause is its switch.
        double s = 0;
        RETURN_IF_ERROR(FollowFlip(*staged->shadows, *arenas, dst, registry, owner, &s));
        owner_switch.push_back(s);
        RETURN_IF_ERROR(Restage(*staged->shadows, f.staging, *rank_plan, worker, registry));
        bound = exec::BindPlan(*rank_plan, worker, bind_to, transport::MemorySpace::kCuda, nullptr);
        RETURN_IF_ERROR(bound.status());
      }
    }
    // After the pause, before the next sync writes the twin (as the worker
    // does once it reported the commit): a swap commit's other half.
    if (staged_run && f.finish_barrier) RETURN_IF_ERROR(barrier());
    return staged->shadows != nullptr ? staged->shadows->FinishSwap() : absl::OkStatus();
  };
  executor.set_checksums(f.checksums);
  t0 = Now();
  auto first = executor.Run(**bound, bind_to.generation(), absl::Now() + absl::Seconds(120));
  if (!first.ok()) return Fail("first sync", first.status());
  if (auto s = commit(); !s.ok()) return Fail("first commit", s);
  commit_times.clear();
  commit_phases.clear();
  owner_switch.clear();
  const double first_run_s = Now() - t0;
  if (auto s = probe("first_sync_done"); !s.ok()) return Fail("probe", s);
  if (f.diagnose_raw_puts) {
    if (c.workers != 2) {
      return Fail("raw puts",
                  absl::InvalidArgumentError(absl::StrCat(
                      "--diagnose-raw-puts needs 2 workers, the case has ", c.workers)));
    }
    absl::Status s = DiagnoseRawPuts(f.iters, worker, (*bound)->puts, src.base, *writer, store, tag,
                                     diagnosis_barrier,
                                     [&](const std::string& at) { return probe(at.c_str()); });
    if (!s.ok()) return Fail("raw puts", s);
  }
  std::vector<double> times;
  exec::SyncStats last;
  cuda::DeviceTimeline* timeline = nullptr;
  if (f.timeline) {
    if (auto s = cuda::DeviceTimeline::Enable(worker, 256); !s.ok()) return Fail("timeline", s);
    timeline = cuda::DeviceTimeline::Active();
  }
  for (int i = 0; i < f.iters; ++i) {
    // --pause-ms: every worker idles first, as between an RL trainer's steps.
    absl::SleepFor(absl::Milliseconds(f.pause_ms));
    if (auto s = barrier(); !s.ok()) return Fail("barrier", s);
    if (timeline != nullptr) {
      if (auto s = timeline->Begin(ops->stream()); !s.ok()) return Fail("timeline", s);
    }
    t0 = Now();
    auto st = executor.Run(**bound, bind_to.generation(), absl::Now() + absl::Seconds(120));
    if (!st.ok()) return Fail("sync", st.status());
    times.push_back(Now() - t0);
    if (auto s = commit(); !s.ok()) return Fail("commit", s);
    last = *st;
    if (timeline != nullptr) {
      auto marks = timeline->Collect();
      if (!marks.ok()) return Fail("timeline", marks.status());
      PrintTimeline(f.model, c.mode, worker, i, times.back(), *marks, timeline->dropped());
    }
  }
  if (auto s = probe("timed_syncs_done"); !s.ok()) return Fail("probe", s);
  if (spin) {
    auto s = RunCeProbeMemorySweep(c.mode, worker, f.iters, store, diagnosis_barrier);
    if (!s.ok()) return Fail("probe", s);
  }
  auto dst_sum =
      SideChecksum(c.spec.destination(), plan::SideRole::kDestination, worker, registry, stream);
  if (!dst_sum.ok()) return Fail("checksum", dst_sum.status());
  double pack = 0, transfer = 0, unpack = 0, copy = 0, finish = 0;
  for (const auto& r : last.rounds) {
    finish += r.reduce_seconds;
    pack += r.pack_seconds;
    transfer += r.transfer_seconds;
    unpack += r.unpack_seconds;
    copy += r.copy_seconds;
  }
  (void)store.Set(absl::StrCat(tag, "sums/", worker), absl::StrCat(*src_sum, " ", *dst_sum));
  const auto& rs = c.plan.summary();
  Result(absl::StrFormat(
      R"({"bench":"wsync_sync","model":"%s","mode":"%s","bucket_mib":%d,"staging_mib":%d,"zero_copy_mib":%d,"pipeline":%d,"blocks_per_sm":%d,"copy_engine_copies":%d,"copy_engine_bytes":%d,"peak_staging_bytes":%d,"worker":%d,"iters":%d,"median_s":%.6f,"min_s":%.6f,"first_sync_total_s":%.4f,"comm_init_s":%.4f,"bind_s":%.4f,"first_run_s":%.4f,"plan_s":%.3f,"bytes_sent":%d,"bytes_received":%d,"bytes_local":%d,"rounds":%d,"pack_s":%.6f,"transfer_s":%.6f,"unpack_s":%.6f,"copy_s":%.6f,"kernel_launches":%d,"table_cache_hits":%d,"plan_buckets":%d,"plan_pieces":%d,"plan_destination_bytes":%d,"rounds_packed_ahead":%d,"rounds_local_early":%d,"rounds_finished_async":%d,"direct":%d,"direct_write_to":[%s],"bytes_put":%d,"bytes_put_into":%d,"put_issue_s":%.6f,"put_wait_s":%.6f,"token_s":%.6f,"ready_token_s":%.6f,"local_wait_s":%.6f,"finish_s":%.6f,"put_copy_engine_kib":%d,"put_blocks_per_sm":%d,"put_copy_streams":%d,"put_copy_engine_copies":%d,"barrier_s":%.6f,"mailbox":%d,"mailbox_polls":%d,"put_gates":%d,"put_gates_timed_out":%d})",
      f.model, c.mode, f.bucket_mib, f.staging_mib, f.zero_copy_mib, f.pipeline ? 1 : 0,
      f.blocks_per_sm, writer->copy_engine_copies(), writer->copy_engine_bytes(),
      last.peak_staging_bytes, worker, f.iters, Median(times),
      times.empty() ? 0 : *std::min_element(times.begin(), times.end()),
      comm_init_s + bind_s + first_run_s, comm_init_s, bind_s, first_run_s, c.plan_seconds,
      last.bytes_sent, last.bytes_received, last.bytes_local, last.rounds.size(), pack, transfer,
      unpack, copy, ops->launches() + writer->launches(),
      ops->table_cache_hits() + writer->table_cache_hits(), rs.num_buckets(), rs.num_pieces(),
      rs.destination_bytes(), last.rounds_packed_ahead, last.rounds_local_early,
      last.rounds_finished_async, f.direct ? 1 : 0, absl::StrJoin(direct.write_to, ","),
      last.bytes_put, last.bytes_put_into, last.put_issue_seconds, last.put_wait_seconds,
      last.token_seconds, last.ready_token_seconds, last.local_wait_seconds, finish,
      f.put_copy_engine_kib, f.put_blocks_per_sm, f.put_copy_streams, writer->copy_engine_copies(),
      Median(barrier_times), f.mailbox ? 1 : 0, last.mailbox_polls, last.put_gates,
      last.put_gates_timed_out));
  ReportFlip(f.model, c.mode, worker, owner_switch, commit_times, owner.size());
  if (auto s =
          ReportStaged(f, c, worker, store, tag, *staged, times, commit_times, commit_phases, last);
      !s.ok()) {
    return Fail("staged", s);
  }
  if (worker == 0) {
    unsigned long long s_total = 0, d_total = 0;
    for (int w = 0; w < c.workers; ++w) {
      auto v = store.Get(absl::StrCat(tag, "sums/", w), absl::Now() + absl::Seconds(60));
      if (!v.ok()) return Fail("sums", v.status());
      std::vector<std::string> parts = absl::StrSplit(*v, ' ');
      s_total += std::stoull(parts[0]);
      d_total += std::stoull(parts[1]);
    }
    // Lower bound from this run's measured link rates: every worker's bytes
    // on its busiest link (NVLink per direction, or HBM copies).
    double bound = 0;
    // Not part of the issue's bound, which treats links and copies as
    // independent: every byte read or written goes through the GPU's HBM
    // (a local copy twice, a sent byte once, a received one once), at the
    // rate cudaMemcpy moves it (2 x copy_gbps).
    double hbm_floor = 0;
    for (const auto& r : rs.ranks()) {
      const bool both = r.bytes_out() > 0 && r.bytes_in() > 0;
      const double link = (both ? f.bidir_gbps : f.nvlink_gbps) * 1e9;
      bound = std::max({bound, std::max(r.bytes_out(), r.bytes_in()) / link,
                        r.bytes_local() / (f.copy_gbps * 1e9)});
      hbm_floor = std::max(hbm_floor, (2.0 * r.bytes_local() + r.bytes_out() + r.bytes_in()) /
                                          (2 * f.copy_gbps * 1e9));
    }
    Result(absl::StrFormat(
        R"({"bench":"wsync_sync_check","model":"%s","mode":"%s","workers":%d,"bucket_mib":%d,"staging_mib":%d,"checksum_match":%s,"destination_bytes":%d,"network_bytes":%d,"local_bytes":%d,"lower_bound_s":%.6f,"hbm_floor_s":%.6f,"simulated_s":%.6f,"nvlink_gbps":%.1f,"bidir_gbps":%.1f,"copy_gbps":%.1f,"ranks":[%s]})",
        f.model, c.mode, c.workers, f.bucket_mib, f.staging_mib,
        s_total == d_total ? "true" : "false", rs.destination_bytes(), rs.network_bytes(),
        rs.local_bytes(), bound, hbm_floor, rs.predicted_seconds(), f.nvlink_gbps, f.bidir_gbps,
        f.copy_gbps, absl::StrJoin(rs.ranks(), ",", [](std::string* out, const v1::RankSummary& r) {
          absl::StrAppend(out, "{\"worker\":", r.worker(), ",\"bytes_in\":", r.bytes_in(),
                          ",\"bytes_out\":", r.bytes_out(), ",\"bytes_local\":", r.bytes_local(),
                          "}");
        })));
    if (s_total != d_total) return 6;
  }
  cudaFree(token);
  return 0;
}

// [sender, receiver, bytes, buckets] per worker pair with network traffic.
std::string NetworkPairs(const v1::Plan& plan) {
  std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> pairs;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.sender() == b.receiver()) continue;
    auto& p = pairs[{b.sender(), b.receiver()}];
    p.first += b.bytes();
    ++p.second;
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : pairs) {
    out.push_back(absl::StrCat("[", k.first, ",", k.second, ",", v.first, ",", v.second, "]"));
  }
  return absl::StrJoin(out, ",");
}

int DumpShapes(const Flags& f) {
  auto c = MakeCase(ParamsOf(f), "tp1");
  if (!c.ok()) return Fail("case", c.status());
  std::ofstream out(f.dump_shapes);
  out << "[\n";
  const auto& ts = c->spec.source().tensors();
  for (int i = 0; i < ts.size(); ++i) {
    out << "  [\"" << ts[i].name() << "\", [" << absl::StrJoin(ts[i].shape(), ", ") << "]]"
        << (i + 1 < ts.size() ? ",\n" : "\n");
  }
  out << "]\n";
  return out.good() ? 0 : 4;
}

}  // namespace
}  // namespace wsync::bench

int main(int argc, char** argv) {
  wsync::InitLogging("wsync_bench_gpu_sync");
  using namespace wsync::bench;
  namespace exec = wsync::exec;
  namespace plan = wsync::plan;
  namespace transport = wsync::transport;
  Flags f;
  if (int rc = ParseFlags(argc, argv, &f); rc != 0) return rc;
  if (!f.spec_file.empty()) f.model = f.spec_file;  // names the case in the results
  if (!f.dump_shapes.empty()) return DumpShapes(f);
  if (f.direct && f.staging != wsync::v1::STAGING_IN_PLACE) {
    // As wsync-worker: peers would write the live tensors. (Checksums go
    // with direct writes: each side hashes the bucket's views.)
    spdlog::error("--staging needs --direct 0");
    return 2;
  }
  if ((f.commit_swap || f.commit_flip) && f.staging != wsync::v1::STAGING_DEVICE_SHADOW) {
    spdlog::error("--commit swap and flip need --staging device_shadow");
    return 2;
  }
  int rc = 0;
  for (const std::string& mode : f.modes) {
    auto c = MakeCase(ParamsOf(f), mode);
    if (!c.ok()) return Fail("case " + mode, c.status());
    const auto& sm = c->plan.summary();
    Result(absl::StrFormat(
        R"({"bench":"wsync_plan","model":"%s","mode":"%s","bucket_mib":%d,"staging_mib":%d,"plan_s":%.3f,"rounds":%d,"buckets":%d,"pieces":%d,"ops":%d,"network_bytes":%d,"local_bytes":%d,"peak_staging_bytes":%d,"predicted_s":%.6f,"model_lower_bound_s":%.6f,"network_pairs":[%s]})",
        f.model, mode, f.bucket_mib, f.staging_mib, c->plan_seconds, sm.num_rounds(),
        sm.num_buckets(), sm.num_pieces(), sm.num_ops(), sm.network_bytes(), sm.local_bytes(),
        sm.peak_staging_bytes(), sm.predicted_seconds(), sm.lower_bound_seconds(),
        NetworkPairs(c->plan)));
    if (f.measure_issue_keys) {
      if (auto s = MeasureIssueKeys(c->spec, c->plan, 0, f.model + "/" + mode); !s.ok()) {
        return Fail("issue keys", s);
      }
      continue;
    }
    if (std::getenv("WSYNC_BENCH_PLAN_ONLY") != nullptr) {
      // CPU-only check that both workers' parts bind (fake, never touched
      // addresses; binding only checks bounds, dtypes and layouts).
      for (int w = 0; w < c->workers; ++w) {
        exec::BufferRegistry reg;
        char* next = reinterpret_cast<char*>(uintptr_t{1} << 40);
        for (auto [side, role, bside] :
             {std::tuple{&c->spec.source(), plan::SideRole::kSource, exec::BufferSide::kSource},
              std::tuple{&c->spec.destination(), plan::SideRole::kDestination,
                         exec::BufferSide::kDestination}}) {
          auto need = BuffersOf(*side, role, w);
          if (!need.ok()) return Fail("buffers", need.status());
          for (const auto& [name, n] : *need) {
            (void)reg.Register(bside, name,
                               {next, n.bytes, n.dtype, transport::MemorySpace::kCuda});
            next += (n.bytes + 255) / 256 * 256;
          }
        }
        auto rp = plan::ExtractRankPlan(c->plan, w);
        if (!rp.ok()) return Fail("extract", rp.status());
        auto b = exec::BindPlan(*rp, w, reg, transport::MemorySpace::kCuda);
        std::printf("bind %s worker %d: %s\n", mode.c_str(), w,
                    b.ok() ? "ok" : b.status().ToString().c_str());
        if (!b.ok()) rc = 1;
      }
      continue;
    }
    const std::string dir = MakeStoreDir("sync");
    std::fflush(stdout);
    rc |= ForkRanks(c->workers, [&](int r) { return RankMain(f, *c, r, dir); });
  }
  return rc;
}
