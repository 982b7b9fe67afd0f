// libFuzzer target: a controller restarted on a state file (StateFuzzInput,
// tests/fuzz/proto/state_fuzz_input.proto). The state is saved through a
// real StateStore (framed, checksummed), loaded back and restored as
// `wsync-controller --state_file` does at start: transfers with their served
// versions (ServedRankState), decided staged syncs with their participants
// (replica, commit_sent, wave, decision_slack_ms, held) and rollout. Then
// the workers register through the Controller (decided commits are listed
// to the ranks they await), report (committed, staged, commit_held /
// commit_admitted, verify_*, warm_up, peers_greeted, checksums: whatever the
// input says) with deadline ticks between, and everything the controller
// reports is read (GetStatus, ListWorkers, each sync's status). Last, the
// state it saved meanwhile is loaded into a second controller (the
// reload after a crash). The store lives in /dev/shm where there is one
// (tmpfs: fsync is cheap). Inputs are bounded: at most kMaxRegistrations workers and
// kMaxReports reports per run. Every step is checked against invariants that
// hold for every input (tests/fuzz/state_invariants.h): the restored state
// is what was saved, versions and outcomes never change back, and the
// reloaded controller reports what the first one did.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "controller/server/controller.h"
#include "controller/server/state_store.h"
#include "state_fuzz_input.pb.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "tests/fuzz/spec_limits.h"
#include "tests/fuzz/state_invariants.h"

namespace {

constexpr int kMaxRegistrations = 16;
constexpr int kMaxReports = 48;

using wsync::controller::Controller;
using wsync::controller::ControllerConfig;
using wsync::controller::ControllerMetrics;
using wsync::controller::PlanSource;
using wsync::controller::StateStore;

// The store's directory, removed at exit.
struct Dir {
  std::string path = absl::StrCat(std::filesystem::is_directory("/dev/shm")
                                      ? std::string("/dev/shm")
                                      : std::filesystem::temp_directory_path().string(),
                                  "/wsync-state-fuzz-", getpid());
  Dir() { std::filesystem::create_directories(path); }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

ControllerConfig Config() {
  ControllerConfig c;
  c.lease_ttl = absl::Milliseconds(50);
  c.sync_deadline = absl::Seconds(30);
  c.failure_grace = absl::Milliseconds(1);
  c.instance = "fuzz";
  c.warm_up_on_define = false;  // nothing plans: a restart plans at the next sync
  return c;
}

// Reads everything a restarted controller reports.
void ReadBack(Controller& controller) {
  const wsync::v1::GetStatusResponse status = controller.syncs().GetStatus();
  for (const wsync::v1::TransferStatus& t : status.transfers()) {
    if (!t.last_sync().sync_id().empty()) {
      (void)controller.syncs().WaitSync(t.last_sync().sync_id(), absl::Nanoseconds(1));
    }
  }
  (void)controller.ListWorkers("");
}

// Observes `c` again, checks it against the last observation, keeps it;
// also follows the transfers' last syncs (up to kMaxFollowedSyncs).
void Recheck(Controller& c, std::set<std::string>* followed, wsync::fuzz::Observed* last) {
  const wsync::v1::GetStatusResponse status = c.syncs().GetStatus();
  for (const wsync::v1::TransferStatus& t : status.transfers()) {
    const std::string& id = t.last_sync().sync_id();
    if (!id.empty() && followed->size() < wsync::fuzz::kMaxFollowedSyncs) followed->insert(id);
  }
  wsync::fuzz::Observed now = wsync::fuzz::Observe(c, *followed);
  wsync::fuzz::CheckMonotonic(*last, now);
  *last = std::move(now);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Dir* dir = [] {
    static Dir d;
    spdlog::set_level(spdlog::level::off);  // the controller logs every step
    return &d;
  }();
  wsync::fuzz::StateFuzzInput in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const wsync::v1::TransferState& t : in.state().transfers()) {
    if (!wsync::fuzz::SpecWithinLimits(t.spec())) return 0;
  }
  const std::string path = dir->path + "/controller.state";
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".alt");
  StateStore store(path);
  if (!store.Save(in.state()).ok()) return 0;
  PlanSource plans(8);
  ControllerMetrics metrics;
  std::vector<std::string> leases;
  std::set<std::string> followed;  // the saved syncs' ids (state_invariants.h)
  wsync::fuzz::Observed observed;  // what the first controller reported last
  {
    Controller controller(Config(), &metrics, &plans, &store);
    auto loaded = store.Load();
    if (!loaded.ok()) return 0;
    controller.syncs().Restore(*loaded);
    followed = wsync::fuzz::SavedSyncIds(*loaded);
    observed = wsync::fuzz::Observe(controller, followed);
    wsync::fuzz::CheckRestored(*loaded, observed);
    ReadBack(controller);
    for (const wsync::v1::RegisterWorkerRequest& r : in.registrations()) {
      if (static_cast<int>(leases.size()) >= kMaxRegistrations) break;
      auto resp = controller.RegisterWorker(r, "", "");
      leases.push_back(resp.ok() ? resp->lease_id() : "");
      if (resp.ok()) (void)controller.workers().OpenStream(resp->lease_id());
    }
    const std::string first_decided = loaded->decided_syncs_size() > 0
                                          ? loaded->decided_syncs(0).status().sync_id()
                                          : std::string();
    int reports = 0;
    for (const wsync::fuzz::ReportStep& step : in.reports()) {
      if (++reports > kMaxReports) break;
      wsync::v1::ReportResultRequest r = step.report();
      if (!leases.empty()) {
        r.set_lease_id(leases[static_cast<uint32_t>(step.registration()) % leases.size()]);
      }
      if (r.sync_id().empty()) r.set_sync_id(first_decided);
      (void)controller.syncs().ReportResult(r);
      if (step.tick()) controller.Tick();
      Recheck(controller, &followed, &observed);
    }
    controller.Tick();
    ReadBack(controller);
    Recheck(controller, &followed, &observed);
  }
  // The reload after a crash: what the controller saved meanwhile.
  auto saved = store.Load();
  if (!saved.ok()) return 0;
  Controller again(Config(), &metrics, &plans, &store);
  again.syncs().Restore(*saved);
  wsync::fuzz::CheckReloaded(observed, wsync::fuzz::Observe(again, followed));
  ReadBack(again);
  return 0;
}
