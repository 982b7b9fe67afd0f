// WorkerAgent: reading the assignment stream, by default with the blocking
// reader, and in the low-latency mode (busy_poll.h) with the async API on a
// completion queue this thread polls without sleeping (AsyncNext with an
// immediate deadline) while the spin window lasts. The worker's process
// holds no gRPC server, so between syncs this thread is gRPC's only poller:
// the assignment's bytes are read by a running thread, not by one the
// kernel must wake.
#include "absl/time/clock.h"
#include "worker/agent/agent.h"

namespace wsync::agent {

namespace {
// Tags of the stream's operations (one in flight at a time).
enum Op : intptr_t { kStart = 1, kRead, kFinish };
void* Tag(Op op) { return reinterpret_cast<void*>(op); }

// The next completion on `cq`: polled without sleeping while `busy` spins,
// else slept for (in slices of at most 100 ms, re-deciding in between).
// False only once the queue is shut down.
bool NextEvent(grpc::CompletionQueue& cq, const BusyPoll& busy, void** tag, bool* ok) {
  for (;;) {
    const bool spin = busy.Spinning();
    // Spinning: a deadline long past. gRPC rounds deadlines up to the next
    // millisecond, so "now" would nap up to 1 ms in the poller each call.
    const auto deadline =
        spin ? gpr_inf_past(GPR_CLOCK_MONOTONIC)
             : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN));
    switch (cq.AsyncNext(tag, ok, deadline)) {
      case grpc::CompletionQueue::GOT_EVENT:
        return true;
      case grpc::CompletionQueue::SHUTDOWN:
        return false;
      case grpc::CompletionQueue::TIMEOUT:
        if (spin) BusyPoll::Relax();
        break;
    }
  }
}

// Waits for the completion of operation `op` (the only one in flight).
bool Await(grpc::CompletionQueue& cq, const BusyPoll& busy, Op op) {
  void* tag = nullptr;
  bool ok = false;
  while (NextEvent(cq, busy, &tag, &ok)) {
    if (tag == Tag(op)) return ok;
  }
  return false;
}
}  // namespace

grpc::Status WorkerAgent::ReadAssignments(grpc::ClientContext* ctx, const std::string& lease_id,
                                          uint64_t epoch) {
  if (std::optional<grpc::Status> lane = ReadAssignmentsLane(lease_id, epoch)) return *lane;
  v1::AssignmentsRequest req;
  req.set_lease_id(lease_id);
  if (busy_.enabled()) return ReadAssignmentsPolled(ctx, req, epoch);
  auto reader = stub_->Assignments(ctx, req);
  v1::Assignment a;
  while (reader->Read(&a)) OnAssignment(a, lease_id, epoch);
  return reader->Finish();
}

grpc::Status WorkerAgent::ReadAssignmentsPolled(grpc::ClientContext* ctx,
                                                const v1::AssignmentsRequest& req, uint64_t epoch) {
  grpc::CompletionQueue cq;
  auto reader = stub_->PrepareAsyncAssignments(ctx, req, &cq);
  reader->StartCall(Tag(kStart));
  if (Await(cq, busy_, kStart)) {
    v1::Assignment a;
    for (;;) {
      reader->Read(&a, Tag(kRead));
      if (!Await(cq, busy_, kRead)) break;
      busy_.Touch();
      OnAssignment(a, req.lease_id(), epoch);
    }
  }
  // The stream ended (or never started): its status, then drain the queue.
  grpc::Status status;
  reader->Finish(&status, Tag(kFinish));
  Await(cq, busy_, kFinish);
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

}  // namespace wsync::agent
