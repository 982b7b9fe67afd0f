// The worker's assignment stream as a gRPC callback reactor: no thread per
// worker. The registry wakes it (WorkerRegistry::OpenStream's `wake`) when
// an assignment is pushed or the lease ends; it writes one assignment at a
// time, in order, and ends the stream with the registry's reason. A stream
// that ends (the worker went away, a write failed) kills its lease, as
// WorkerRegistry::CloseStream says. Those rules are AssignmentFeed's
// (assignment_feed.h), which the control fast lane's stream shares.
//
// Lifetime: gRPC owns the reactor and calls OnDone last; the registry holds
// only a StreamLink (shared), through which a late wake finds no stream.
// Every entry into the reactor (the start, a wake, OnWriteDone, OnCancel)
// goes through the link and counts as active, and the reactor is deleted
// only when it is done and no entry is active, so a Finish whose OnDone runs
// inline never frees the reactor under a running entry.
#ifndef WSYNC_CONTROLLER_SERVER_ASSIGNMENT_STREAM_H_
#define WSYNC_CONTROLLER_SERVER_ASSIGNMENT_STREAM_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/server/assignment_feed.h"
#include "controller/server/worker_registry.h"
#include "grpcpp/grpcpp.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::controller {

class AssignmentStream final : public grpc::ServerWriteReactor<v1::Assignment> {
 public:
  // Opens `lease_id`'s stream on `workers` (which outlives every stream) and
  // starts writing; a lease that cannot open one ends the call at once.
  static grpc::ServerWriteReactor<v1::Assignment>* Start(WorkerRegistry* workers,
                                                         const std::string& lease_id);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Link {
    absl::Mutex mu;
    AssignmentStream* stream ABSL_GUARDED_BY(mu) = nullptr;
    int active ABSL_GUARDED_BY(mu) = 0;  // entries running Pump
    bool done ABSL_GUARDED_BY(mu) = false;
  };

  AssignmentStream(WorkerRegistry* workers, std::string lease_id);
  // Pumps the stream behind `link`, if it still exists (see Lifetime).
  static void Enter(const std::shared_ptr<Link>& link);
  // Starts the next write, or ends the stream; no-op while a write is out.
  // Runs on any thread, also under the sync coordinator's lock (a wake from
  // Push): it calls nothing that reports a loss.
  void Pump();
  // Ends the lease (AssignmentFeed::Close); only from gRPC's reactions,
  // which hold no controller lock.
  void CloseLease(const char* why) { feed_.Close(why); }

  AssignmentFeed feed_;  // opened before the first Pump
  const std::shared_ptr<Link> link_;
  std::atomic<bool> cancelled_{false};

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::Assignment out_;  // the write in flight
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_ASSIGNMENT_STREAM_H_
