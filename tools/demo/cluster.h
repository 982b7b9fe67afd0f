// A controller and worker processes on this machine, started from their real
// binaries (for wsync-demo and the integration tests). Ports are picked by
// the processes themselves (port 0) and read back from port files.
#ifndef WSYNC_TOOLS_DEMO_CLUSTER_H_
#define WSYNC_TOOLS_DEMO_CLUSTER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/demo/process.h"
#include "wsync/v1/controller.grpc.pb.h"

namespace wsync::demo {

struct ClusterOptions {
  std::string controller_bin;
  std::string worker_bin;
  std::string work_dir;  // logs, sockets, port files (created)
  absl::Duration lease_ttl = absl::Seconds(2);
  absl::Duration sync_deadline = absl::Seconds(30);
  std::vector<std::string> controller_flags;  // extra
  std::vector<std::string> worker_flags;      // extra
};

struct WorkerProcess {
  std::vector<v1::Membership> groups;
  std::string name;
  std::string socket;
  std::vector<std::string> flags;  // this worker's own, after the cluster's
  int metrics_port = 0;
  Child child;
};

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(ClusterOptions options);
  ~Cluster();

  // (Re)starts the controller; port 0 the first time, then the same port.
  absl::Status StartController();
  void StopController();
  void KillController();
  int controller_port() const { return port_; }
  pid_t controller_pid() const { return controller_.pid(); }
  int controller_metrics_port() const { return metrics_port_; }
  std::string controller_address() const;

  // Spawns a worker in `groups` ("group:rank:size" each), with `flags` added
  // to ClusterOptions::worker_flags (e.g. its --device); returns its index.
  absl::StatusOr<int> AddWorker(const std::vector<std::string>& groups,
                                const std::vector<std::string>& flags = {});
  absl::Status RestartWorker(int index);
  void KillWorker(int index);
  WorkerProcess& worker(int index) { return *workers_[index]; }
  int num_workers() const { return static_cast<int>(workers_.size()); }

  // Until `n` workers are alive with an open assignment stream.
  absl::Status WaitForWorkers(int n, absl::Duration timeout);

  v1::TrainerService::Stub& trainer() { return *trainer_; }
  v1::WorkerService::Stub& worker_api() { return *worker_api_; }

  // Stops every process (workers first), SIGTERM then SIGKILL.
  void StopAll();

 private:
  explicit Cluster(ClusterOptions o) : options_(std::move(o)) {}
  absl::Status SpawnWorker(WorkerProcess& w);

  ClusterOptions options_;
  Child controller_;
  int port_ = 0;
  int metrics_port_ = 0;
  int controller_starts_ = 0;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
  std::unique_ptr<v1::TrainerService::Stub> trainer_;
  std::unique_ptr<v1::WorkerService::Stub> worker_api_;
};

// Reads "key=value" lines of a port file, waiting for it to appear.
// Fails early if `child` (may be null) exits first.
absl::StatusOr<std::map<std::string, std::string>> ReadPortFile(const std::string& path,
                                                                absl::Duration timeout,
                                                                Child* child);

}  // namespace wsync::demo

#endif  // WSYNC_TOOLS_DEMO_CLUSTER_H_
