#include "tools/demo/cluster.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace wsync::demo {

absl::StatusOr<std::map<std::string, std::string>> ReadPortFile(const std::string& path,
                                                                absl::Duration timeout,
                                                                Child* child) {
  const absl::Time until = absl::Now() + timeout;
  while (true) {
    std::ifstream in(path);
    if (in) {
      std::map<std::string, std::string> kv;
      std::string line;
      while (std::getline(in, line)) {
        std::pair<std::string, std::string> p = absl::StrSplit(line, absl::MaxSplits('=', 1));
        if (!p.first.empty()) kv[p.first] = p.second;
      }
      return kv;
    }
    if (child != nullptr && !child->running()) {
      return absl::InternalError(absl::StrCat("process exited (wait status ", child->exit_status(),
                                              ") before writing ", path));
    }
    if (absl::Now() > until) {
      return absl::DeadlineExceededError(absl::StrCat("port file ", path, " did not appear"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(ClusterOptions options) {
  mkdir(options.work_dir.c_str(), 0755);
  std::unique_ptr<Cluster> c(new Cluster(std::move(options)));
  absl::Status s = c->StartController();
  if (!s.ok()) return s;
  return c;
}

Cluster::~Cluster() { StopAll(); }

std::string Cluster::controller_address() const { return absl::StrCat("127.0.0.1:", port_); }

absl::Status Cluster::StartController() {
  const std::string port_file =
      absl::StrCat(options_.work_dir, "/controller.", ++controller_starts_, ".ports");
  // A file left by an earlier run in a reused work dir would name a dead
  // controller's port.
  unlink(port_file.c_str());
  std::vector<std::string> argv = {
      options_.controller_bin,
      absl::StrCat("--listen=127.0.0.1:", port_),
      "--metrics_host=127.0.0.1",
      absl::StrCat("--metrics_port=", metrics_port_),
      absl::StrCat("--lease_ttl=", absl::FormatDuration(options_.lease_ttl)),
      absl::StrCat("--sync_deadline=", absl::FormatDuration(options_.sync_deadline)),
      absl::StrCat("--port_file=", port_file)};
  if (options_.insecure) argv.push_back("--insecure");
  // Kept across StartController calls: a restart resumes its transfers.
  argv.push_back(absl::StrCat("--state_file=", options_.work_dir, "/controller.state"));
  for (const auto& f : options_.controller_flags) argv.push_back(f);
  auto child = Child::Spawn(argv, options_.work_dir + "/controller.log");
  if (!child.ok()) return child.status();
  controller_ = *std::move(child);
  auto ports = ReadPortFile(port_file, absl::Seconds(20), &controller_);
  if (!ports.ok()) return ports.status();
  if (!absl::SimpleAtoi((*ports)["grpc_port"], &port_) ||
      !absl::SimpleAtoi((*ports)["metrics_port"], &metrics_port_)) {
    return absl::InternalError("bad controller port file");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options_.insecure ? grpc::InsecureChannelCredentials() : options_.credentials;
  if (credentials == nullptr) {
    return absl::InvalidArgumentError("ClusterOptions: TLS (insecure false) needs credentials");
  }
  if (!options_.token.empty()) {
    credentials = grpc::CompositeChannelCredentials(credentials,
                                                    grpc::AccessTokenCredentials(options_.token));
  }
  auto channel = grpc::CreateChannel(controller_address(), credentials);
  trainer_ = v1::TrainerService::NewStub(channel);
  worker_api_ = v1::WorkerService::NewStub(channel);
  return absl::OkStatus();
}

void Cluster::StopController() { controller_.Stop(absl::Seconds(3)); }
void Cluster::KillController() { controller_.Kill(); }

absl::Status Cluster::SpawnWorker(WorkerProcess& w) {
  const std::string port_file = absl::StrCat(options_.work_dir, "/", w.name, ".ports");
  unlink(port_file.c_str());
  std::vector<std::string> groups;
  for (const auto& m : w.groups) {
    groups.push_back(absl::StrCat(m.group(), ":", m.rank(), ":", m.group_size()));
  }
  std::vector<std::string> argv = {options_.worker_bin,
                                   absl::StrCat("--controller=", controller_address()),
                                   absl::StrCat("--groups=", absl::StrJoin(groups, ",")),
                                   "--node=local",
                                   absl::StrCat("--local_socket=", w.socket),
                                   "--metrics_host=127.0.0.1",
                                   absl::StrCat("--metrics_port=", w.metrics_port),
                                   absl::StrCat("--port_file=", port_file)};
  if (options_.insecure) argv.push_back("--insecure");
  for (const auto& f : options_.worker_flags) argv.push_back(f);
  for (const auto& f : w.flags) argv.push_back(f);
  auto child = Child::Spawn(argv, absl::StrCat(options_.work_dir, "/", w.name, ".log"));
  if (!child.ok()) return child.status();
  w.child = *std::move(child);
  auto ports = ReadPortFile(port_file, absl::Seconds(20), &w.child);
  if (!ports.ok()) return ports.status();
  if (!absl::SimpleAtoi((*ports)["metrics_port"], &w.metrics_port)) {
    return absl::InternalError("bad worker port file");
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Cluster::AddWorker(const std::vector<std::string>& groups,
                                       const std::vector<std::string>& flags) {
  auto w = std::make_unique<WorkerProcess>();
  w->flags = flags;
  for (const std::string& g : groups) {
    std::vector<std::string> parts = absl::StrSplit(g, ':');
    v1::Membership m;
    int32_t rank = 0, size = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &rank) ||
        !absl::SimpleAtoi(parts[2], &size)) {
      return absl::InvalidArgumentError(absl::StrCat("bad membership '", g, "'"));
    }
    m.set_group(parts[0]);
    m.set_rank(rank);
    m.set_group_size(size);
    w->groups.push_back(m);
  }
  w->name =
      absl::StrCat("worker", workers_.size(), "-", w->groups[0].group(), "-", w->groups[0].rank());
  w->socket = absl::StrCat(options_.work_dir, "/", w->name, ".sock");
  absl::Status s = SpawnWorker(*w);
  if (!s.ok()) return s;
  workers_.push_back(std::move(w));
  return static_cast<int>(workers_.size()) - 1;
}

absl::Status Cluster::RestartWorker(int index) {
  WorkerProcess& w = *workers_[index];
  w.child.Stop(absl::Seconds(3));
  return SpawnWorker(w);
}

void Cluster::KillWorker(int index) { workers_[index]->child.Kill(); }

namespace {
// The last `lines` lines of a log, for errors that must explain themselves.
std::string LogTail(const std::string& path, int lines) {
  std::ifstream in(path);
  if (!in) return "(no log)";
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n    ");
}
}  // namespace

absl::Status Cluster::WaitForWorkers(int n, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  int ready = 0;
  std::string list_error = "ListWorkers never answered";
  v1::ListWorkersResponse last;
  while (absl::Now() < until) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ListWorkersRequest req;
    v1::ListWorkersResponse resp;
    grpc::Status s = trainer_->ListWorkers(&ctx, req, &resp);
    if (s.ok()) {
      list_error.clear();
      ready = 0;
      for (const auto& w : resp.workers()) ready += (w.alive() && w.streaming()) ? 1 : 0;
      if (ready >= n) return absl::OkStatus();
      last = std::move(resp);
    } else {
      list_error = absl::StrCat("ListWorkers: ", s.error_message());
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Everything a flaky start needs to be understood from the error alone.
  std::string detail = absl::StrCat("only ", ready, " of ", n, " workers registered and streaming");
  if (!list_error.empty()) absl::StrAppend(&detail, "; last ", list_error);
  absl::StrAppend(&detail, "; controller ", controller_.running() ? "running" : "exited",
                  ", log:\n    ", LogTail(options_.work_dir + "/controller.log", 6));
  for (auto& w : workers_) {
    const pid_t pid = w->child.pid();
    std::string state = "running";
    if (!w->child.running()) {
      const int st = w->child.exit_status();
      state = WIFSIGNALED(st) ? absl::StrCat("killed by signal ", WTERMSIG(st))
                              : absl::StrCat("exited with status ", WEXITSTATUS(st));
    }
    absl::StrAppend(&detail, "\n  ", w->name, " (pid ", pid, ") ", state);
    for (const auto& info : last.workers()) {
      if (info.pid() == pid) {
        absl::StrAppend(&detail, ", lease", info.alive() ? " alive" : " dead",
                        info.streaming() ? " streaming" : " not streaming", ", last heartbeat ",
                        info.ms_since_heartbeat(), " ms ago");
      }
    }
    absl::StrAppend(&detail, ", log:\n    ",
                    LogTail(absl::StrCat(options_.work_dir, "/", w->name, ".log"), 4));
  }
  return absl::DeadlineExceededError(detail);
}

void Cluster::StopAll() {
  // All workers at once, so that the grace periods overlap.
  for (auto& w : workers_) w->child.Terminate();
  for (auto& w : workers_) w->child.Stop(absl::Seconds(3));
  controller_.Stop(absl::Seconds(3));
}

}  // namespace wsync::demo
