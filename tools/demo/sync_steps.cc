#include "tools/demo/sync_steps.h"

#include <signal.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace wsync::demo {

grpc::Status WaitUntilDone(Cluster& cluster, const std::string& id, const std::atomic<bool>& stop,
                           v1::SyncStatus* st) {
  grpc::Status gs;
  do {
    v1::WaitSyncRequest w;
    w.set_sync_id(id);
    w.set_timeout_ms(200);
    gs = CallWithDeadline(
        [&](grpc::ClientContext* c) { return cluster.trainer().WaitSync(c, w, st); });
  } while (gs.ok() && st->phase() == v1::SYNC_RUNNING && !stop.load());
  return gs;
}

absl::StatusOr<v1::WarmUpStatus> AwaitWarmUp(Cluster& cluster, const std::string& name,
                                             absl::Duration timeout,
                                             const std::atomic<bool>& stop) {
  const absl::Time until = absl::Now() + timeout;
  while (true) {
    v1::GetStatusResponse status;
    grpc::Status gs = CallWithDeadline([&](grpc::ClientContext* c) {
      return cluster.trainer().GetStatus(c, v1::GetStatusRequest(), &status);
    });
    if (!gs.ok()) return absl::UnavailableError(absl::StrCat("GetStatus: ", gs.error_message()));
    v1::WarmUpStatus warm;
    for (const v1::TransferStatus& t : status.transfers()) {
      if (t.name() == name) warm = t.warm_up();
    }
    if (warm.state() != v1::WARM_UP_RUNNING || stop.load()) return warm;
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat("warm-up ", warm.id(), " of transfer '", name,
                                                      "' still running after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

absl::Status KillMidSync(Cluster& cluster, int v, int victim, const std::vector<int>& src_worker,
                         const std::vector<int>& dst_worker,
                         std::vector<std::unique_ptr<Owner>>& src_owner,
                         std::vector<std::unique_ptr<Owner>>& dst_owner,
                         const std::atomic<bool>& stop) {
  const std::string name = cluster.worker(victim).name;
  if (kill(cluster.worker(victim).child.pid(), SIGSTOP) != 0) {
    return absl::InternalError(absl::StrCat("SIGSTOP of ", name, " failed"));
  }
  v1::SyncRequest req;
  req.set_transfer("demo");
  req.set_version(v);
  req.set_deadline_ms(15000);
  v1::SyncResponse started;
  grpc::Status gs = CallWithDeadline(
      [&](grpc::ClientContext* c) { return cluster.trainer().Sync(c, req, &started); });
  if (!gs.ok()) return absl::InternalError(absl::StrCat("Sync: ", gs.error_message()));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time killed = absl::Now();
  cluster.KillWorker(victim);
  v1::SyncStatus st;
  gs = WaitUntilDone(cluster, started.sync_id(), stop, &st);
  if (!gs.ok() || st.phase() != v1::SYNC_FAILED) {
    return absl::InternalError(absl::StrCat(
        "the sync with ", name,
        " killed did not fail: ", gs.ok() ? v1::SyncPhase_Name(st.phase()) : gs.error_message()));
  }
  std::printf("v%d %s: %s killed mid-sync: failed after %.2f s as it must (%s/%d: %s)\n", v,
              started.sync_id().c_str(), name.c_str(), absl::ToDoubleSeconds(absl::Now() - killed),
              st.failed_group().c_str(), st.failed_rank(), st.error().c_str());
  RETURN_IF_ERROR(cluster.RestartWorker(victim));
  for (size_t r = 0; r < src_worker.size(); ++r) {
    if (src_worker[r] == victim) RETURN_IF_ERROR(src_owner[r]->Register());
  }
  for (size_t r = 0; r < dst_worker.size(); ++r) {
    if (dst_worker[r] == victim) RETURN_IF_ERROR(dst_owner[r]->Register());
  }
  RETURN_IF_ERROR(cluster.WaitForWorkers(cluster.num_workers(), absl::Seconds(30)));
  std::printf("v%d: %s restarted and registered again; syncing v%d again\n", v, name.c_str(), v);
  return absl::OkStatus();
}

void PrintVersionLines(const VersionFigures& f, const v1::SyncResponse& sresp,
                       const v1::SyncStatus& st) {
  const double mib = st.bytes_total() / 1048576.0;
  std::printf(
      "v%d %s: %.3f MiB in %.2f ms (%.1f MiB/s) | plan %.2f ms (cache %s), dispatch %.2f ms, "
      "transport setup %.2f ms, execute %.2f ms, controller elapsed %.2f ms, direct-write "
      "pairs %d | fill %.1f ms, verify %.1f ms: %lld bytes checked, %lld wrong\n",
      f.version, sresp.sync_id().c_str(), mib, f.wall_s * 1e3, mib / f.wall_s,
      st.plan_seconds() * 1e3, sresp.plan_cache_hit() ? "hit" : "miss", st.dispatch_seconds() * 1e3,
      st.max_setup_seconds() * 1e3, st.max_execute_seconds() * 1e3, st.elapsed_seconds() * 1e3,
      st.direct_pairs(), f.fill_s * 1e3, f.verify_s * 1e3, static_cast<long long>(f.checked_bytes),
      static_cast<long long>(f.wrong));
  if (!f.result_line) {
    std::fflush(stdout);
    return;
  }
  std::printf(
      "RESULT {\"bench\":\"wsync_demo\",\"version\":%d,\"bytes\":%lld,\"wall_s\":%.6f,"
      "\"execute_s\":%.6f,\"elapsed_s\":%.6f,\"setup_s\":%.6f,\"direct_pairs\":%d,"
      "\"checked_bytes\":%lld,\"wrong\":%lld}\n",
      f.version, static_cast<long long>(st.bytes_total()), f.wall_s, st.max_execute_seconds(),
      st.elapsed_seconds(), st.max_setup_seconds(), st.direct_pairs(),
      static_cast<long long>(f.checked_bytes), static_cast<long long>(f.wrong));
  std::fflush(stdout);
}

}  // namespace wsync::demo
