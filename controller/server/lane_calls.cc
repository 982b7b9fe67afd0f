// LaneServer's calls (lane_server.h): admission, then the bodies the gRPC
// handlers run (handlers.h); and the waits of Sync / WaitSync, answered from
// the lane's own thread.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/wire_text.h"
#include "controller/server/handlers.h"
#include "controller/server/lane_server.h"

namespace wsync::controller {
namespace {

v1::LaneResponse Answer(uint64_t call_id, const absl::Status& status) {
  v1::LaneResponse resp;
  resp.set_call_id(call_id);
  resp.set_code(static_cast<int>(status.code()));
  // Clipped as gRPC's are (common/wire_text.h): a message may echo a huge
  // request field.
  resp.set_message(ClipForWire(status.message()));
  return resp;
}

}  // namespace

void LaneServer::Dispatch(Conn& c, const v1::LaneRequest& req) {
  switch (req.call_case()) {
    case v1::LaneRequest::kHello:
      return Hello(c, req);
    case v1::LaneRequest::kReport:
      return Report(c, req);
    case v1::LaneRequest::kSync:
      return SyncCall(c, req);
    case v1::LaneRequest::kWaitSync:
      return WaitSyncCall(c, req);
    case v1::LaneRequest::kAssignments:
      return AssignmentsCall(c, req);
    case v1::LaneRequest::CALL_NOT_SET:
      break;
  }
  Send(c, Answer(req.call_id(),
                 absl::InvalidArgumentError("lane: a request names no call (hello, sync, wait_sync "
                                            "or report; an older controller?)")));
}

absl::Status LaneServer::CheckLease(const std::string& lease, absl::string_view call) {
  // The lease secret is the worker's credential here (it learnt it by
  // registering over gRPC, with its certificate when TLS is on); the peer is
  // of the controller's own user (SO_PEERCRED, at accept). Checked on every
  // call, as gRPC admits each call (services.cc Admit): the lease still
  // alive, and the certificate it registered with not revoked by the CRL as
  // last loaded (by the list's own reloader: nothing here parses or waits;
  // revocation.h CheckIdentity).
  std::optional<std::shared_ptr<const CertificateIdentity>> cert;
  if (!lease.empty()) cert = controller_->workers().LiveCertificate(lease);
  if (!cert.has_value()) {
    return absl::UnauthenticatedError(
        absl::StrCat("lane: ", call, ": ",
                     lease.empty() ? "no lease_id; a worker registers first (RegisterWorker)"
                                   : "not a live lease (register again over gRPC)"));
  }
  return auth_->CheckRevokedCertificate(cert->get(), absl::StrCat("lane: ", call));
}

void LaneServer::Hello(Conn& c, const v1::LaneRequest& req) {
  const std::string& lease = req.hello().lease_id();
  if (c.streaming()) {
    // Its lease is the stream's until the stream ends (Close ends that
    // lease): a Hello must not rebind it to another.
    Send(c, Answer(req.call_id(),
                   absl::FailedPreconditionError(
                       "lane: LaneHello on a connection that carries an assignment stream (bound "
                       "to the stream's lease until it ends); report on a connection of its own")));
    return;
  }
  if (absl::Status st = CheckLease(lease, "LaneHello"); !st.ok()) {
    Send(c, Answer(req.call_id(), st));
    return;
  }
  if (c.lease_id != lease) {
    std::optional<WorkerSnapshot> w = controller_->workers().Find(lease);
    spdlog::info("[controller] lane: {} reports over the lane",
                 w.has_value() ? w->description : "a worker");
  }
  c.lease_id = lease;
  Send(c, Answer(req.call_id(), absl::OkStatus()));
}

void LaneServer::AssignmentsCall(Conn& c, const v1::LaneRequest& req) {
  const std::string& lease = req.assignments().lease_id();
  absl::Status st = CheckLease(lease, "Assignments");
  if (st.ok() && (c.streaming() || (!c.lease_id.empty() && c.lease_id != lease))) {
    st = absl::FailedPreconditionError(
        "lane: Assignments on a connection that already streams or is bound to another lease");
  }
  auto feed = std::make_unique<AssignmentFeed>(&controller_->workers(), lease);
  if (st.ok()) {
    std::shared_ptr<LaneWake> self = self_;
    st = feed->Open([self] { self->Notify(); });
  }
  if (!st.ok()) {
    Send(c, Answer(req.call_id(), st));
    return;
  }
  std::optional<WorkerSnapshot> w = controller_->workers().Find(lease);
  spdlog::info("[controller] lane: {} receives its assignments over the lane",
               w.has_value() ? w->description : "a worker");
  c.lease_id = lease;
  c.feed = std::move(feed);
  c.stream_call = req.call_id();
  if (Send(c, Answer(req.call_id(), absl::OkStatus()))) PumpStreams();  // pushed before the token
}

void LaneServer::PumpStreams() {
  for (auto& [id, conn] : conns_) {
    Conn& c = *conn;
    bool more = true;
    while (more && c.fd >= 0 && c.streaming()) {
      v1::Assignment a;
      absl::Status end;
      switch (c.feed->Next(&a, &end)) {
        case AssignmentFeed::Step::kNothing:
          more = false;
          break;
        case AssignmentFeed::Step::kEnd:  // the lease died, a newer stream
          Send(c, Answer(c.stream_call, end));
          more = false;
          break;
        case AssignmentFeed::Step::kAssignment: {
          v1::LaneResponse resp = Answer(c.stream_call, absl::OkStatus());
          *resp.mutable_assignment() = std::move(a);
          more = Send(c, resp);
          break;
        }
      }
    }
  }
}

void LaneServer::Report(Conn& c, const v1::LaneRequest& req) {
  absl::Status st;
  if (c.lease_id.empty()) {
    st = absl::FailedPreconditionError(
        "lane: ReportResult on a connection not bound to a lease: send LaneHello first");
  } else if (req.report().lease_id() != c.lease_id) {
    st = absl::PermissionDeniedError(
        "lane: ReportResult names another lease than the one this connection is bound to");
  } else if (st = CheckLease(c.lease_id, "ReportResult"); !st.ok()) {
    // The lease died or its certificate was revoked since the Hello: the
    // connection is bound no more (a Hello would be refused the same way;
    // a stream's connection keeps its lease for Close).
    if (!c.streaming()) c.lease_id.clear();
  } else {
    st = ReportResultCall(*controller_, req.report());
    // The report may have ended a sync: its waiting trainer hears it from
    // this thread now, before this report's acknowledgement.
    PollIfNotified();
  }
  v1::LaneResponse resp = Answer(req.call_id(), st);
  if (st.ok()) resp.mutable_report();
  Send(c, resp);
}

void LaneServer::SyncCall(Conn& c, const v1::LaneRequest& req) {
  absl::StatusOr<Caller> caller = auth_->RequireRoleByToken(req.token(), Role::kTrainer, "Sync");
  if (!caller.ok()) {
    Send(c, Answer(req.call_id(), caller.status()));
    return;
  }
  // A Sync that would wait with the lane's waits full is refused before it
  // starts: answered after starting, the refusal would read as a failed sync
  // while it runs.
  if (req.sync().wait_ms() > 0 && WaitsFull()) {
    v1::LaneResponse refused = Answer(req.call_id(), WaitsFullError("the sync was not started"));
    refused.set_not_started(true);
    Send(c, refused);
    return;
  }
  std::optional<absl::Time> until;
  absl::StatusOr<v1::SyncResponse> started =
      StartSyncCall(*controller_, req.sync(), *caller, &until);
  // The sync's assignments go to the workers' lane streams now, from this
  // thread (and any waits it may have ended hear it).
  PollIfNotified();
  if (!started.ok()) {
    Send(c, Answer(req.call_id(), started.status()));
    return;
  }
  if (!until.has_value()) {
    v1::LaneResponse resp = Answer(req.call_id(), absl::OkStatus());
    *resp.mutable_sync() = *std::move(started);
    Send(c, resp);
    return;
  }
  Wait w;
  w.conn = c.id;
  w.call_id = req.call_id();
  w.sync_id = started->sync_id();
  w.until = *until;
  w.sync = std::make_unique<v1::SyncResponse>(*std::move(started));
  AddWait(c, std::move(w));
}

void LaneServer::WaitSyncCall(Conn& c, const v1::LaneRequest& req) {
  absl::StatusOr<Caller> caller = auth_->RequireRoleByToken(req.token(), Role::kReader, "WaitSync");
  if (!caller.ok()) {
    Send(c, Answer(req.call_id(), caller.status()));
    return;
  }
  Wait w;
  w.conn = c.id;
  w.call_id = req.call_id();
  w.sync_id = req.wait_sync().sync_id();
  w.until = WaitSyncUntil(*controller_, req.wait_sync());
  AddWait(c, std::move(w));
}

void LaneServer::AddWait(Conn& c, Wait w) {
  if (AnswerWait(w, /*expired=*/false)) return;  // it ended already
  if (WaitsFull()) {
    // A started Sync's wait (the waits filled since its check): the sync
    // runs, so it is answered as started, to be waited for again.
    if (w.sync != nullptr) {
      v1::LaneResponse resp = Answer(w.call_id, absl::OkStatus());
      resp.mutable_sync()->Swap(w.sync.get());
      Send(c, resp);
      return;
    }
    v1::LaneResponse refused = Answer(w.call_id, WaitsFullError("wait again later or over gRPC"));
    refused.set_not_started(true);
    Send(c, refused);
    return;
  }
  waits_.push_back(std::move(w));
}

bool LaneServer::WaitsFull() const {
  return static_cast<int64_t>(waits_.size()) >= options_.max_waits;
}

absl::Status LaneServer::WaitsFullError(absl::string_view what) const {
  return absl::ResourceExhaustedError(
      absl::StrCat("lane: ", waits_.size(), " waits already (the most the lane holds); ", what));
}

bool LaneServer::AnswerWait(Wait& w, bool expired) {
  std::optional<absl::StatusOr<v1::SyncStatus>> end = PollSyncEnd(*controller_, w.sync_id, expired);
  if (!end.has_value()) return false;
  v1::LaneResponse resp = Answer(w.call_id, end->status());
  if (end->ok()) {
    if (w.sync != nullptr) {
      *w.sync->mutable_status() = **std::move(end);
      resp.mutable_sync()->Swap(w.sync.get());
    } else {
      *resp.mutable_wait_sync() = **std::move(end);
    }
  }
  Send(w.conn, resp);
  return true;
}

void LaneServer::PollIfNotified() {
  if (!notified_.exchange(false)) return;
  busy_.Touch();
  PumpStreams();
  PollWaits(/*all_expired=*/false);
}

void LaneServer::PollWaits(bool all_expired) {
  const absl::Time now = absl::Now();
  AnswerWaits([](const Wait&) { return true; },
              [&](const Wait& w) { return all_expired || w.until <= now; });
}

void LaneServer::PollDueWaits() {
  const absl::Time now = absl::Now();
  auto due = [&](const Wait& w) { return w.until <= now; };
  AnswerWaits(due, due);
}

template <typename Which, typename Expired>
void LaneServer::AnswerWaits(Which which, Expired expired) {
  // AnswerWait may close a connection (Send) but never touches waits_.
  size_t kept = 0;
  for (size_t i = 0; i < waits_.size(); ++i) {
    Wait& w = waits_[i];
    if (which(w) && AnswerWait(w, expired(w))) continue;
    if (kept != i) waits_[kept] = std::move(w);
    ++kept;
  }
  waits_.resize(kept);
}

}  // namespace wsync::controller
