// Checks of a transfer's workers against a plan, free of locks: their
// registered buffers, their common transport and their staging limits. The
// sync coordinator runs them on WorkerRegistry snapshots.
#ifndef WSYNC_CONTROLLER_SERVER_WORKER_CHECKS_H_
#define WSYNC_CONTROLLER_SERVER_WORKER_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/server/worker_registry.h"
#include "wsync/v1/controller.pb.h"
#include "wsync/v1/plan.pb.h"

namespace wsync::controller {

// "nccl", "gloo" (for messages).
std::string TransportName(v1::TransportKind kind);

// Every buffer `part` (worker `worker`'s part of a plan) reads or writes on
// the worker is registered by it, large enough and of the layout's dtype;
// a part with rows of piece runs goes only to a worker that registered
// kPieceRunRowsCapability, and one with steps (Bucket.step) only to a worker
// that registered kBucketStepsCapability (FAILED_PRECONDITION naming it
// otherwise).
// Without `require_all`, buffers of a group the worker registered none of
// yet are let pass (DefineTransfer before the owners registered).
absl::Status CheckBuffers(const v1::Plan& part, int32_t worker, const WorkerSnapshot& w,
                          bool require_all);

// The data-plane transport every worker (by plan worker id) offers: NCCL
// when all run the GPU plane, else Gloo when all run on host memory.
// FAILED_PRECONDITION naming a worker of each kind when they are mixed.
absl::StatusOr<v1::TransportKind> CommonTransport(const std::string& transfer,
                                                  const std::vector<WorkerSnapshot>& workers);

// The tightest staging limit among a transfer's workers.
struct StagingLimit {
  int64_t cap = 0;    // the per-round staging it allows (a multiple of 256); 0: no limit
  int64_t bytes = 0;  // the worker's staging_limit_bytes
  int32_t worker = -1;
  std::string description;
};
StagingLimit TightestStagingLimit(const std::vector<WorkerSnapshot>& workers);

// Lowers the spec's staging cap (and its default bucket size) to `limit`
// where it is tighter; returns whether it did.
bool ApplyStagingLimit(const StagingLimit& limit, v1::TransferSpec* spec);

// Steps inside rounds (LinkModel.step_latency_seconds > 0) are planned only
// for transfers whose every worker registered kBucketStepsCapability: where
// one did not (an older build), the step latency is cleared from `spec`, so
// the plan keeps round barriers, which every worker runs. Returns that
// worker's id, or -1 when `spec` is unchanged: no step latency, or one that
// is not positive and finite (NaN, negative, infinite), left for the
// planner to refuse.
int32_t ClearStepsUnlessEveryWorkerRunsThem(const std::vector<WorkerSnapshot>& workers,
                                            v1::TransferSpec* spec);

// Every worker with a staging limit stages at most its cap in each round of
// `plan`; INVALID_ARGUMENT naming the first one over it.
absl::Status CheckStagingLimits(const v1::Plan& plan, const std::vector<WorkerSnapshot>& workers);

// Staged syncs (docs/staging.md): each receiver's shadow memory under
// `mode` (none in place), by worker id (`workers`, of a transfer into
// `destination_group`); INVALID_ARGUMENT naming the first worker whose
// --staging_budget_bytes it exceeds.
absl::StatusOr<std::vector<v1::WorkerShadow>> CheckShadowBudgets(
    const v1::Plan& plan, v1::StagingMode mode, const std::string& destination_group,
    const std::vector<WorkerSnapshot>& workers);

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_WORKER_CHECKS_H_
