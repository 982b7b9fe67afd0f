#include "bench/gpu/sync_bench_steps.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/bench_util.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/ipc_registry.h"

namespace wsync::bench {

void PrintTimeline(const std::string& model, const std::string& mode, int worker, int iter,
                   double seconds, const std::vector<cuda::DeviceTimeline::Entry>& marks,
                   int dropped) {
  std::string list;
  for (const auto& m : marks) {
    absl::StrAppend(&list, list.empty() ? "" : ",",
                    absl::StrFormat(R"(["%s",%.3f,%.3f])", m.label, m.device_ms, m.host_ms));
  }
  Result(absl::StrFormat(
      R"({"bench":"wsync_timeline","model":"%s","mode":"%s","worker":%d,"iter":%d,"sync_ms":%.3f,"dropped":%d,"marks":[%s]})",
      model, mode, worker, iter, seconds * 1e3, dropped, list));
}

absl::Status SetUpDirectWrites(const Case& c, int worker, const Slab& dst,
                               transport::KvStore& store, const std::string& tag,
                               plane::Backend& backend, DirectSetup& out) {
  out.pairs = plan::PeerWriteEligiblePairs(c.plan);
  out.write_to = plan::RoutesOf(out.pairs, worker).write_to;
  if (dst.bytes > 0) {
    ASSIGN_OR_RETURN(cuda::IpcTensorHandle h,
                     cuda::ExportTensor(dst.base, dst.bytes, "destination slab"));
    RETURN_IF_ERROR(store.Set(absl::StrCat(tag, "dst/", worker), h.Serialize()));
  }
  for (int32_t peer : out.write_to) {
    ASSIGN_OR_RETURN(std::string text,
                     store.Get(absl::StrCat(tag, "dst/", peer), absl::Now() + absl::Seconds(60)));
    ASSIGN_OR_RETURN(cuda::IpcTensorHandle h, cuda::IpcTensorHandle::Parse(text));
    v1::CudaIpc ipc;
    ipc.set_gpu_uuid(h.gpu_uuid);
    ipc.set_handle(h.base_handle);
    ipc.set_base_size(static_cast<int64_t>(h.base_bytes));
    ipc.set_offset(static_cast<int64_t>(h.offset));
    ipc.set_size(static_cast<int64_t>(h.bytes));
    plane::BufferLocation where;
    where.cuda_ipc = &ipc;
    ASSIGN_OR_RETURN(plane::OpenedBuffer opened,
                     backend.OpenBuffer(where, ipc.size(), /*peer=*/true,
                                        absl::StrCat("slab of worker ", peer), nullptr));
    void* base = opened.data;
    out.holds.push_back(std::move(opened.hold));
    ASSIGN_OR_RETURN(auto need,
                     BuffersOf(c.spec.destination(), plan::SideRole::kDestination, peer));
    exec::BufferRegistry& reg = out.peers[peer];
    for (const auto& [name, b] : CarveSlab(need, base)) {
      RETURN_IF_ERROR(reg.Register(exec::BufferSide::kDestination, name, b));
    }
    out.direct.peer_buffers[peer] = &reg;
    // The slabs never change here: any fixed per-worker token will do.
    out.direct.expected_ready_tokens[peer] = peer + 1;
  }
  out.direct.ready_token = worker + 1;
  return absl::OkStatus();
}

absl::Status ReportStaged(const Flags& f, const Case& c, int worker, transport::KvStore& store,
                          const std::string& tag, const StagedPart& staged,
                          const std::vector<double>& runs, const std::vector<double>& commits,
                          const std::vector<agent::ShadowSet::CommitTimes>& phases,
                          const exec::SyncStats& last) {
  if (f.staging == v1::STAGING_IN_PLACE && !f.checksums) return absl::OkStatus();
  int verified = -1;
  if (f.checksums) {
    RETURN_IF_ERROR(PublishChecksums(store, tag, worker, last.checksums));
    if (worker == 0) {
      ASSIGN_OR_RETURN(verified, CompareChecksums(store, tag, c.workers, c.plan));
    }
  }
  const agent::ShadowSet* sh = staged.shadows.get();
  // The commit's phases (ShadowSet::CommitTimes), median of each.
  auto phase = [&](double agent::ShadowSet::CommitTimes::*field) {
    std::vector<double> v;
    for (const auto& p : phases) v.push_back(p.*field);
    return v.empty() ? 0.0 : Median(v);
  };
  Result(absl::StrFormat(
      R"({"bench":"wsync_staged","model":"%s","mode":"%s","worker":%d,"staging":"%s","checksums":%d,"stages":%d,"iters":%d,"run_median_s":%.6f,"commit_median_s":%.6f,"commit_max_s":%.6f,"pause_median_s":%.6f,"shadow_bytes":%d,"commit_bytes":%d,"checksums_taken":%d,"recv_hashes_as_landed":%d,"direct_hashes_as_landed":%d,"direct_parts_posted":%d,"direct_tail_hash_bytes":%d,"landing_parts":%d,"part_tail_ratio":%d,"hash_blocks_per_sm":%d,"buckets_verified":%d,"commit":"%s","commit_barrier":%d,"finish_barrier":%d,"commit_wait_ops_median_s":%.6f,"commit_copy_median_s":%.6f,"commit_swap_median_s":%.6f})",
      f.model, c.mode, worker, StagingModeName(f.staging), f.checksums ? 1 : 0,
      sh != nullptr ? 1 : 0, f.iters, Median(runs), commits.empty() ? 0.0 : Median(commits),
      commits.empty() ? 0.0 : *std::max_element(commits.begin(), commits.end()),
      sh != nullptr ? Median(commits) : Median(runs), sh != nullptr ? sh->bytes() : 0,
      sh != nullptr ? sh->commit_bytes() : 0, last.checksums.size(), last.recv_hashes_as_landed,
      last.direct_hashes_as_landed, last.direct_parts_posted, last.direct_tail_hash_bytes,
      f.landing_parts, f.part_tail_ratio, f.hash_blocks_per_sm, verified,
      sh != nullptr ? sh->commit_kind() : "none", f.commit_barrier ? 1 : 0,
      f.finish_barrier ? 1 : 0, phase(&agent::ShadowSet::CommitTimes::wait_ops_s),
      phase(&agent::ShadowSet::CommitTimes::copy_s),
      phase(&agent::ShadowSet::CommitTimes::swap_s)));
  return absl::OkStatus();
}

}  // namespace wsync::bench
