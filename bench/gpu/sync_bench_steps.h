// Steps of the data-plane bench's rank (sync_bench.cc): direct writes set
// up through CUDA IPC handles exchanged in the bench's key-value store, and
// its result lines (the device timeline of a sync, the staged-sync report).
#ifndef WSYNC_BENCH_GPU_SYNC_BENCH_STEPS_H_
#define WSYNC_BENCH_GPU_SYNC_BENCH_STEPS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/gpu/bench_cases.h"
#include "bench/gpu/device_timeline.h"
#include "bench/gpu/slabs.h"
#include "bench/gpu/staged_run.h"
#include "bench/gpu/sync_bench_flags.h"
#include "controller/plan/routes.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/buffer_registry.h"
#include "worker/exec/executor.h"
#include "worker/plane/backend.h"
#include "worker/plane/kv_store.h"

namespace wsync::bench {

// One line per sync: each mark as label@device_ms/host_ms since the sync began
// (device: when its stream got there; host: when it was issued).
void PrintTimeline(const std::string& model, const std::string& mode, int worker, int iter,
                   double seconds, const std::vector<cuda::DeviceTimeline::Entry>& marks,
                   int dropped);

// Direct writes of `worker`: every eligible pair of the plan; the peers'
// destination slabs are exported by CUDA IPC through `store` and opened by
// the backend, as wsync-worker does with the handles the controller relays.
struct DirectSetup {
  std::vector<std::shared_ptr<void>> holds;  // the peers' slabs, mapped
  std::map<int32_t, exec::BufferRegistry> peers;
  exec::DirectWrites direct;
  std::vector<plan::WorkerPair> pairs;  // routed ROUTE_PEER_WRITE
  std::vector<int32_t> write_to;
};
absl::Status SetUpDirectWrites(const Case& c, int worker, const Slab& dst,
                               transport::KvStore& store, const std::string& tag,
                               plane::Backend& backend, DirectSetup& out);

// With --staging or --checksums: one line per worker (the run, the commit,
// the shadow) and, on worker 0, the bucket checksums compared.
absl::Status ReportStaged(const Flags& f, const Case& c, int worker, transport::KvStore& store,
                          const std::string& tag, const StagedPart& staged,
                          const std::vector<double>& runs, const std::vector<double>& commits,
                          const std::vector<agent::ShadowSet::CommitTimes>& phases,
                          const exec::SyncStats& last);

}  // namespace wsync::bench

#endif  // WSYNC_BENCH_GPU_SYNC_BENCH_STEPS_H_
