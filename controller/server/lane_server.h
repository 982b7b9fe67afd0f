// The control fast lane (docs/performance-notes.md "The control fast lane";
// trust model: docs/security.md): an opt-in Unix socket beside gRPC
// (--lane_socket) carrying the hot calls of a sync on one host, with no gRPC
// thread and no thread hand-off on their path:
//  - trainer -> controller: Sync (with its wait) and WaitSync, answered on
//    the same connection;
//  - worker -> controller: ReportResult, on a connection the worker bound to
//    its lease first (LaneHello);
//  - controller -> worker: the assignment stream (a lane connection of its
//    own; AssignmentFeed, the gRPC stream's own rules), written by this
//    thread as soon as it learns of an assignment; for a Sync that came over
//    the lane, right after the sync started, on the same thread.
// Frames and messages: proto/wsync/v1/lane.proto, common/lane_frame.h. The
// calls run the same bodies as the gRPC handlers (handlers.h) after the same
// admission (auth.h).
//
// One thread owns every socket (non-blocking, epoll). It reads a frame, runs
// its call and writes the answer itself. A Sync's wait is held here, not in
// the wait hub: when a report read on this thread ends a sync, the waiting
// trainer's answer is written from this thread right after it (before the
// report's own acknowledgement). A sync that ends elsewhere (a report over
// gRPC, a deadline, a lost worker) reaches it through the controller's
// change observer (Notify): a flag, and an eventfd write only while the
// thread sleeps.
//
// Under --busy_poll_ms the thread spins (epoll_wait with timeout 0 and the
// common/busy_poll.h policy) for the window after its last activity;
// otherwise it sleeps in epoll_wait.
//
// It never blocks on a peer: frames are bounded (max_frame_bytes), a
// connection's unsent answers are bounded (max_pending_bytes: a peer that
// stops reading is dropped), buffers a large frame grew are shrunk once
// mostly empty, a malformed frame gets an error frame (call_id 0) and the
// connection is closed; accept errors such as EMFILE pause accepting with
// a backoff. Connections are accepted only from the controller's own user
// (or root), checked with SO_PEERCRED; the socket file is created with mode
// 0600 (under a 0177 umask), replaces only a dead socket of this user, and
// is removed at the end only while the path is still that file. Worker
// calls are admitted one by one as on gRPC (CheckLease).
#ifndef WSYNC_CONTROLLER_SERVER_LANE_SERVER_H_
#define WSYNC_CONTROLLER_SERVER_LANE_SERVER_H_

#include <sys/types.h>
#include <sys/un.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/busy_poll.h"
#include "common/lane_frame.h"
#include "controller/server/assignment_feed.h"
#include "controller/server/auth.h"
#include "controller/server/controller.h"
#include "wsync/v1/lane.pb.h"

namespace wsync::controller {

struct LaneOptions {
  std::string socket_path;  // created here (an existing dead socket is replaced)
  uint32_t max_frame_bytes = kLaneMaxFrameBytes;        // of a request
  uint32_t max_response_bytes = kLaneMaxResponseBytes;  // of an answer (an assignment)
  // Unsent answers a connection may hold before it is dropped: one answer
  // of the largest size and a few small ones.
  size_t max_pending_bytes =
      static_cast<size_t>(kLaneMaxResponseBytes) + static_cast<size_t>(kLaneMaxFrameBytes);
  int max_connections = 1024;
  // Sync / WaitSync waits held at once (beyond: RESOURCE_EXHAUSTED).
  int64_t max_waits = 4096;
  absl::Duration busy_poll = absl::ZeroDuration();  // --busy_poll_ms
};

class LaneServer;

// How other threads (the controller's change observer, the registry's
// stream wakes) reach the lane thread; they may hold it past the server's
// life. Detach (in the server's destructor, before its descriptors close)
// waits for a Notify in progress and makes later ones no-ops.
class LaneWake {
 public:
  explicit LaneWake(LaneServer* server) : server_(server) {}
  void Notify();
  void Detach();

 private:
  absl::Mutex mu_;
  LaneServer* server_ ABSL_GUARDED_BY(mu_);
};

class LaneServer {
 public:
  // Binds the socket and starts the thread. `controller` and `auth` must
  // outlive the server; call it before the controller serves (it sets the
  // controller's change observer). INVALID_ARGUMENT for a bad path,
  // ALREADY_EXISTS when a live controller listens there, UNAVAILABLE when
  // the socket cannot be created.
  static absl::StatusOr<std::unique_ptr<LaneServer>> Start(LaneOptions options,
                                                           Controller* controller,
                                                           Authenticator* auth);
  // Shutdown, then the socket file is removed.
  ~LaneServer();
  LaneServer(const LaneServer&) = delete;
  LaneServer& operator=(const LaneServer&) = delete;

  // The coordinator's state changed (any thread; the controller's observer).
  void Notify();
  // Answers every wait UNAVAILABLE, closes every connection, stops the
  // thread. Idempotent.
  void Shutdown();

  const std::string& path() const { return options_.socket_path; }
  // Bytes the connections' read and write buffers hold now (any thread):
  // a buffer a large frame grew is shrunk once it is mostly empty again.
  size_t buffer_bytes() const { return buffer_bytes_.load(); }

 private:
  struct Conn {
    int fd = -1;
    uint64_t id = 0;
    std::string in;
    std::string out;  // unsent, from out_at
    size_t out_at = 0;
    bool want_write = false;
    std::string lease_id;  // bound by LaneHello or the stream; empty: none
    // Its assignment stream (AssignmentFeed, shared with gRPC's); null: none.
    std::unique_ptr<AssignmentFeed> feed;
    bool streaming() const { return feed != nullptr && feed->open(); }
    uint64_t stream_call = 0;  // its call_id
    size_t held = 0;           // in's and out's capacity, as counted in buffer_bytes_
  };
  struct Wait {
    uint64_t conn = 0;
    uint64_t call_id = 0;
    std::string sync_id;
    absl::Time until;
    // A Sync's started response (its status filled at the end); null for
    // WaitSync.
    std::unique_ptr<v1::SyncResponse> sync;
  };

  LaneServer(LaneOptions options, Controller* controller, Authenticator* auth);
  absl::Status Bind();
  // An existing socket at `path` is replaced only when it is a socket of
  // this user that refuses connections (a dead controller's): otherwise
  // INVALID_ARGUMENT (not a socket), PERMISSION_DENIED (another user's),
  // ALREADY_EXISTS (live) or UNAVAILABLE (the probe failed otherwise).
  absl::Status RemoveDeadSocket(const std::string& path, const sockaddr_un& addr);
  void Run();
  // One epoll round: accept, read and run frames, write.
  void Round(bool spin);
  int SleepMs() const;
  void Accept();
  // After an accept error other than "nothing queued": stops watching the
  // listener for accept_backoff_ (50 ms, doubling to 1 s), warning once per
  // episode; ResumeAcceptsIfDue watches it again and accepts.
  void PauseAccepts(int e);
  void ResumeAcceptsIfDue();
  void OnReadable(Conn& c);
  void OnWritable(Conn& c);
  // Runs every complete frame in c.in; false when the connection was closed.
  bool RunFrames(Conn& c);
  // lane_calls.cc: one call; its answer queued on `c` (or held as a wait).
  void Dispatch(Conn& c, const v1::LaneRequest& req);
  void Hello(Conn& c, const v1::LaneRequest& req);
  void Report(Conn& c, const v1::LaneRequest& req);
  void SyncCall(Conn& c, const v1::LaneRequest& req);
  void WaitSyncCall(Conn& c, const v1::LaneRequest& req);
  void AssignmentsCall(Conn& c, const v1::LaneRequest& req);
  // Writes what the open assignment streams have to say.
  void PumpStreams();
  // The lane's admission of a worker call (each Hello, ReportResult and
  // Assignments), as gRPC's per call: UNAUTHENTICATED unless `lease` is a
  // live lease (the lane's credential) whose registration certificate the
  // CRL does not revoke (as last loaded; revocation.h CheckIdentity).
  absl::Status CheckLease(const std::string& lease, absl::string_view call);
  void AddWait(Conn& c, Wait w);
  // Whether the lane holds --max_waits waits already; the refusal naming it.
  bool WaitsFull() const;
  absl::Status WaitsFullError(absl::string_view what) const;
  // Answers the waits whose sync ended (or, when `all_expired`, every one).
  void PollWaits(bool all_expired);
  void PollDueWaits();
  // If the coordinator signalled a change since the last poll.
  void PollIfNotified();
  bool AnswerWait(Wait& w, bool expired);
  // Answers the waits `which(w)` selects whose sync ended, or all of them
  // when `expired(w)`; keeps the others.
  template <typename Which, typename Expired>
  void AnswerWaits(Which which, Expired expired);
  // Queues `resp` on connection `c` and writes what the socket takes; drops
  // the connection when over max_pending_bytes (false then).
  bool Send(Conn& c, const v1::LaneResponse& resp);
  bool Send(uint64_t conn, const v1::LaneResponse& resp);
  bool Flush(Conn& c);
  // Shrinks c's buffers when large and mostly empty; updates buffer_bytes_.
  void Trim(Conn& c);
  // Sends an error frame (call_id 0) best-effort, then closes.
  void Refuse(Conn& c, const absl::Status& status);
  void Close(uint64_t conn);

  const LaneOptions options_;
  Controller* const controller_;
  Authenticator* const auth_;
  int listen_fd_ = -1;
  bool bound_ = false;   // the socket file is ours (removed at the end)
  dev_t bound_dev_ = 0;  // its identity: removed only while the path is it
  ino_t bound_ino_ = 0;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd
  BusyPoll busy_;
  std::atomic<bool> notified_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  std::atomic<size_t> buffer_bytes_{0};
  // Thread-owned from Start on.
  uint64_t next_conn_ = 2;  // 0: the listener, 1: the eventfd
  absl::flat_hash_map<uint64_t, std::unique_ptr<Conn>> conns_;
  bool closed_any_ = false;  // a connection closed since the last sweep
  absl::Duration accept_backoff_ = absl::ZeroDuration();  // zero: accepting
  absl::Time accept_resume_ = absl::InfiniteFuture();
  std::vector<Wait> waits_;
  std::thread thread_;
  // The controller's change observer and the registry's stream wakes reach
  // the server through this (detached once it is going).
  std::shared_ptr<LaneWake> self_ = std::make_shared<LaneWake>(this);
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_LANE_SERVER_H_
