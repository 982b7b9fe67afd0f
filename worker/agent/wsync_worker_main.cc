// wsync-worker: one per device. Holds a controller lease, executes its part of
// every sync over the data plane, serves the owner process on a Unix socket.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/env_flags.h"
#include "common/logging.h"
#include "common/service_signals.h"
#include "common/staging_limits.h"
#include "grpcpp/grpcpp.h"
#include "worker/agent/agent.h"
#include "worker/agent/controller_channel.h"
#include "worker/agent/launch_env.h"
#include "worker/agent/local_endpoint.h"
#include "worker/node/backend_registry.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:50051",
          "Controller address host:port. Env: WSYNC_CONTROLLER.");
ABSL_FLAG(bool, insecure, false,
          "Dial a plaintext (--insecure) controller. Without it the worker speaks TLS and needs "
          "--controller_ca. Env: WSYNC_INSECURE.");
ABSL_FLAG(std::string, controller_ca, "",
          "PEM CA bundle that signed the controller's certificate; the certificate must name "
          "the --controller host (SAN DNS or IP). Env: WSYNC_CONTROLLER_CA.");
ABSL_FLAG(std::string, cert, "",
          "PEM client certificate of this worker (mutual TLS), with a URI SAN "
          "wsync://group/<group> for each group of --groups (docs/security.md). Re-read every "
          "--tls_reload_interval. Env: WSYNC_CERT.");
ABSL_FLAG(std::string, key, "", "PEM private key of --cert. Env: WSYNC_KEY.");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "How often --controller_ca, --cert and --key are re-read (rotation without restart). "
          "Env: WSYNC_TLS_RELOAD_INTERVAL.");
ABSL_FLAG(std::string, groups, "",
          "Comma-separated memberships group:rank:size, e.g. 'trainer:0:4' or, for a worker "
          "colocated in two groups, 'trainer:1:4,inference:1:2'. 'group' or 'group:size' takes "
          "the rank (and size) from a launcher's environment: RANK, JOB_COMPLETION_INDEX or the "
          "pod name's ordinal; WSYNC_GROUP_SIZE or WORLD_SIZE. Env: WSYNC_GROUPS, or WSYNC_GROUP.");
ABSL_FLAG(std::string, node, "",
          "Node name for topology (default: hostname): the planner's NVLink vs NIC links, and "
          "direct writes only between workers of one node (two nodes on one host: give each "
          "its own name). Env: WSYNC_NODE.");
ABSL_FLAG(std::string, device_uuid, "",
          "Device UUID reported to the controller. Env: "
          "WSYNC_DEVICE_UUID.");
ABSL_FLAG(std::string, data_address, "127.0.0.1",
          "Address the data plane (Gloo TCP) listens on and advertises. Env: "
          "WSYNC_DATA_ADDRESS.");
ABSL_FLAG(std::string, local_socket, "",
          "Unix socket path of the local API for the owner process (default "
          "$XDG_RUNTIME_DIR/wsync/worker-<group>-<rank>.sock of the first group, or "
          "/tmp/wsync-<uid>/... without XDG_RUNTIME_DIR). Its directory must be this user's and "
          "writable by no one else (a missing one is created 0700); the socket is mode 0600. "
          "Env: WSYNC_LOCAL_SOCKET.");
ABSL_FLAG(std::string, local_socket_group, "",
          "Group (name or gid) whose processes may also use the local socket: the socket "
          "becomes mode 0660 of that group (its directory 0710 when created). Env: "
          "WSYNC_LOCAL_SOCKET_GROUP.");
ABSL_FLAG(std::string, local_allowed_uids, "",
          "Comma-separated uids that may connect to the local socket besides this worker's own "
          "(checked with SO_PEERCRED; the socket's mode must let them in too). Env: "
          "WSYNC_LOCAL_ALLOWED_UIDS.");
ABSL_FLAG(std::string, local_admin_uids, "",
          "Comma-separated uids whose processes may replace tensors another live process "
          "registered (otherwise only the registering process may, or its successor once it "
          "exited). Env: WSYNC_LOCAL_ADMIN_UIDS.");
ABSL_FLAG(int32_t, metrics_port, 0,
          "Port of the Prometheus /metrics endpoint (0: any free port, -1: disabled). Env: "
          "WSYNC_METRICS_PORT.");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0",
          "Address /metrics binds to. Env: "
          "WSYNC_METRICS_HOST.");
ABSL_FLAG(absl::Duration, round_timeout, absl::Seconds(60),
          "Longest one plan round may take on the data plane. Env: WSYNC_ROUND_TIMEOUT.");
ABSL_FLAG(absl::Duration, put_gate_timeout, absl::Milliseconds(100),
          "Longest a phase gate between this worker's direct-write put phases waits for its "
          "peers (docs/direct-writes.md, \"Phase gates\"); a gate that times out costs time, "
          "never bytes. 0: no phase gates. Env: WSYNC_PUT_GATE_TIMEOUT.");
ABSL_FLAG(int64_t, staging_limit_bytes, 0,
          "Most staging memory a sync may hold (the executor overlaps neighbouring rounds only "
          "where both fit); 0: up to two plan rounds' worth. Sent at registration: the "
          "controller plans no round over it. Env: WSYNC_STAGING_LIMIT_BYTES.");
ABSL_FLAG(int64_t, staging_budget_bytes, 0,
          "Most shadow memory a staged sync (docs/staging.md: host_shadow / device_shadow) may "
          "allocate on this worker; 0: no limit. Sent at registration: the controller refuses "
          "a staged plan over it, naming this worker. Env: WSYNC_STAGING_BUDGET_BYTES.");
ABSL_FLAG(absl::Duration, decision_slack, absl::Seconds(5),
          "Staged syncs (docs/staging.md): how long past a sync's deadline a receiver that "
          "staged waits for the pool's commit decision before it rolls back; >= 0. Sent at "
          "registration: the controller offers a decided commit to this worker that long. Env: "
          "WSYNC_DECISION_SLACK.");
ABSL_FLAG(absl::Duration, hold_commit_wait, absl::Seconds(10),
          "Staged syncs (docs/staging.md, \"An owner holding syncs off\"): how long an owner's "
          "HoldSyncs waits for a commit that began before the hold to end (it then says which "
          "commit it waited for, or DEADLINE_EXCEEDED while that commit still writes; the hold "
          "stands either way); > 0. Env: WSYNC_HOLD_COMMIT_WAIT.");
ABSL_FLAG(absl::Duration, staged_flush_timeout, absl::Seconds(5),
          "Staged syncs (docs/staging.md, \"The owner's view\"): how long a receiver that "
          "staged waits for each local subscriber (owner) to read STAGED before it reports "
          "staged; one that does not read it in time fails the sync (the receiver rolls back), "
          "so the pool never commits while an owner did not hear STAGED; > 0. Env: "
          "WSYNC_STAGED_FLUSH_TIMEOUT.");
ABSL_FLAG(std::string, controller_lane, "",
          "The controller's control fast lane (its --lane_socket, a Unix socket on this "
          "host): sync results are reported there, with no gRPC thread on the controller's "
          "side (docs/performance-notes.md). When it is absent or refuses, the worker reports "
          "over gRPC (a warning) and tries the lane again 10 s later. Empty: gRPC only. Env: "
          "WSYNC_CONTROLLER_LANE.");
ABSL_FLAG(int64_t, busy_poll_ms, 0,
          "Low-latency mode: after the last assignment or report, the assignment stream's "
          "reader and the exec thread poll for this many milliseconds instead of sleeping "
          "(a core each while they spin), so that a sync after an idle spell pays no thread "
          "wake-up; then they sleep until the next assignment. -1: spin forever; 0: off. "
          "docs/performance-notes.md. Env: WSYNC_BUSY_POLL_MS.");
ABSL_FLAG(std::string, test_corrupt_after_sync, "",
          "TEST ONLY, refused unless the environment sets WSYNC_TEST_FAILPOINTS=1. "
          "'<group>/<tensor>': after each sync this worker receives (after the commit of a "
          "staged one) flip the first byte of that registered tensor's live memory, before the "
          "verify pass (docs/staging.md, \"Verify\"). Host memory only.");
ABSL_FLAG(absl::Duration, test_commit_delay, absl::ZeroDuration(),
          "TEST ONLY, refused unless the environment sets WSYNC_TEST_FAILPOINTS=1. Each staged "
          "commit on this worker sleeps this long after COMMIT, before it copies: a slow "
          "commit, which later rolling waves wait for (docs/staging.md, \"Flags\").");
ABSL_FLAG(int64_t, parts_cache_bytes, int64_t{256} << 20,
          "Most bytes of op lists (plan parts, serialized size) this worker caches between "
          "syncs; the least recently used go first and the controller sends them again (the "
          "newest always stays). Must be > 0. Env: WSYNC_PARTS_CACHE_BYTES.");
ABSL_FLAG(std::string, instance_id, "",
          "Identity of this process for re-registration (default: random). Env: "
          "WSYNC_INSTANCE_ID.");
ABSL_FLAG(int32_t, device, -1,
          "CUDA device of this worker's GPU data plane: owners register device tensors (CUDA "
          "IPC) and transfers run over NCCL. -1: host memory over Gloo. Needs a build with "
          "WSYNC_WITH_CUDA. Default: $LOCAL_RANK in such a build, else -1. Env: WSYNC_DEVICE.");
ABSL_FLAG(bool, direct_writes, true,
          "Offer direct writes: a peer worker that can map this worker's registered buffers "
          "(host: the same /dev/shm; GPU: the same host and PID namespace, with peer access) "
          "writes its buckets straight into them instead of sending them, and this worker "
          "writes its peers' likewise. The controller pairs workers (its --direct_writes). "
          "Env: WSYNC_DIRECT_WRITES.");
ABSL_FLAG(std::string, port_file, "",
          "When set, write 'metrics_port=M' and 'local_socket=P' lines here once serving. Env: "
          "WSYNC_PORT_FILE.");

namespace {
// Whether --flag (or -flag, with or without =value) is among the arguments.
bool OnCommandLine(int argc, char** argv, const std::string& flag) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--")) absl::ConsumePrefix(&arg, "-");
    if (arg == flag || absl::StartsWith(arg, flag + "=")) return true;
  }
  return false;
}
// Descriptor batches wait as open files: take the hard limit.
void RaiseOpenFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  lim.rlim_cur = lim.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) spdlog::warn("cannot raise RLIMIT_NOFILE");
}
}  // namespace

int main(int argc, char** argv) {
  wsync::InitLogging("wsync-worker");
  wsync::ParseFlagsWithEnv(
      argc, argv,
      "wsync-worker: executes its part of every weight sync; serves the owner process on a "
      "Unix socket.\nFlags also read WSYNC_<FLAG> environment variables; the command line wins.",
      "worker/agent/",
      {"controller",
       "groups",
       "node",
       "device_uuid",
       "data_address",
       "local_socket",
       "metrics_port",
       "metrics_host",
       "round_timeout",
       "put_gate_timeout",
       "staging_limit_bytes",
       "staging_budget_bytes",
       "decision_slack",
       "hold_commit_wait",
       "staged_flush_timeout",
       "busy_poll_ms",
       "controller_lane",
       "parts_cache_bytes",
       "instance_id",
       "port_file",
       "device",
       "direct_writes",
       "insecure",
       "controller_ca",
       "cert",
       "key",
       "tls_reload_interval",
       "local_socket_group",
       "local_allowed_uids",
       "local_admin_uids"});
  // SIGINT / SIGTERM are taken by sigwait below.
  sigset_t signals = wsync::PrepareServiceSignals(argv[0]);

  wsync::agent::AgentOptions options;
  wsync::agent::LaunchFlags launch;
  launch.groups = absl::GetFlag(FLAGS_groups);
  launch.device = absl::GetFlag(FLAGS_device);
  launch.device_given =
      OnCommandLine(argc, argv, "device") || std::getenv("WSYNC_DEVICE") != nullptr;
  const std::vector<std::string> backends = wsync::node::BackendNames();
  launch.cuda_built = std::find(backends.begin(), backends.end(), "cuda") != backends.end();
  auto settings = wsync::agent::ResolveLaunch(launch, wsync::agent::ProcessEnvironment());
  if (!settings.ok()) {
    spdlog::error("wsync-worker: {}", std::string(settings.status().message()));
    return 2;
  }
  for (const std::string& line : settings->sources) spdlog::info("wsync-worker: {}", line);
  options.memberships = settings->memberships;
  options.controller = absl::GetFlag(FLAGS_controller);
  wsync::agent::ControllerTls tls;
  tls.insecure = absl::GetFlag(FLAGS_insecure);
  tls.ca_file = absl::GetFlag(FLAGS_controller_ca);
  tls.cert_file = absl::GetFlag(FLAGS_cert);
  tls.key_file = absl::GetFlag(FLAGS_key);
  tls.reload_seconds =
      static_cast<int>(absl::ToInt64Seconds(absl::GetFlag(FLAGS_tls_reload_interval)));
  auto credentials = wsync::agent::ControllerCredentials(tls);
  if (!credentials.ok()) {
    spdlog::error("wsync-worker: {}", std::string(credentials.status().message()));
    return 2;
  }
  if (tls.insecure) {
    spdlog::warn("wsync-worker: --insecure: plaintext to the controller at {}", options.controller);
  }
  options.controller_credentials = credentials->credentials;
  options.controller_tls_files = credentials->files;
  options.node = absl::GetFlag(FLAGS_node);
  if (options.node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.node = host;
  }
  options.device_uuid = absl::GetFlag(FLAGS_device_uuid);
  options.data_address = absl::GetFlag(FLAGS_data_address);
  options.round_timeout = absl::GetFlag(FLAGS_round_timeout);
  options.put_gate_timeout = absl::GetFlag(FLAGS_put_gate_timeout);
  if (options.put_gate_timeout < absl::ZeroDuration()) {
    spdlog::error("wsync-worker: --put_gate_timeout must be >= 0, got {}",
                  absl::FormatDuration(options.put_gate_timeout));
    return 2;
  }
  options.staging_limit_bytes = absl::GetFlag(FLAGS_staging_limit_bytes);
  if (options.staging_limit_bytes < 0) {
    spdlog::error("wsync-worker: --staging_limit_bytes must be >= 0, got {}",
                  options.staging_limit_bytes);
    return 2;
  }
  options.staging_budget_bytes = absl::GetFlag(FLAGS_staging_budget_bytes);
  if (options.staging_budget_bytes < 0) {
    spdlog::error("wsync-worker: --staging_budget_bytes must be >= 0, got {}",
                  options.staging_budget_bytes);
    return 2;
  }
  options.decision_slack = absl::GetFlag(FLAGS_decision_slack);
  if (options.decision_slack < absl::ZeroDuration() ||
      options.decision_slack > absl::Milliseconds(wsync::kMaxDecisionSlackMs)) {
    spdlog::error("wsync-worker: --decision_slack must be within [0, {}], got {}",
                  absl::FormatDuration(absl::Milliseconds(wsync::kMaxDecisionSlackMs)),
                  absl::FormatDuration(options.decision_slack));
    return 2;
  }
  options.staged_flush_timeout = absl::GetFlag(FLAGS_staged_flush_timeout);
  if (options.staged_flush_timeout <= absl::ZeroDuration()) {
    spdlog::error("wsync-worker: --staged_flush_timeout must be > 0, got {}",
                  absl::FormatDuration(options.staged_flush_timeout));
    return 2;
  }
  options.hold_commit_wait = absl::GetFlag(FLAGS_hold_commit_wait);
  if (options.hold_commit_wait <= absl::ZeroDuration()) {
    spdlog::error("wsync-worker: --hold_commit_wait must be > 0, got {}",
                  absl::FormatDuration(options.hold_commit_wait));
    return 2;
  }
  auto busy_poll = wsync::BusyPollWindow(absl::GetFlag(FLAGS_busy_poll_ms), "--busy_poll_ms");
  if (!busy_poll.ok()) {
    spdlog::error("wsync-worker: {}", std::string(busy_poll.status().message()));
    return 2;
  }
  options.busy_poll = *busy_poll;
  options.controller_lane = absl::GetFlag(FLAGS_controller_lane);
  if (options.busy_poll > absl::ZeroDuration()) {
    spdlog::info("wsync-worker: --busy_poll_ms={}: two threads spin {} after each activity",
                 absl::GetFlag(FLAGS_busy_poll_ms),
                 options.busy_poll == absl::InfiniteDuration()
                     ? std::string("forever")
                     : absl::FormatDuration(options.busy_poll));
  }
  options.test_commit_delay = absl::GetFlag(FLAGS_test_commit_delay);
  if (options.test_commit_delay != absl::ZeroDuration()) {
    const char* failpoints = std::getenv("WSYNC_TEST_FAILPOINTS");
    if (failpoints == nullptr || std::string(failpoints) != "1" ||
        options.test_commit_delay < absl::ZeroDuration()) {
      spdlog::error(
          "wsync-worker: --test_commit_delay is a test failpoint (>= 0; it slows every staged "
          "commit); refused unless WSYNC_TEST_FAILPOINTS=1 is set");
      return 2;
    }
    spdlog::warn("wsync-worker: TEST FAILPOINT --test_commit_delay={}: every staged commit waits",
                 absl::FormatDuration(options.test_commit_delay));
  }
  options.test_corrupt_after_sync = absl::GetFlag(FLAGS_test_corrupt_after_sync);
  if (!options.test_corrupt_after_sync.empty()) {
    const char* failpoints = std::getenv("WSYNC_TEST_FAILPOINTS");
    if (failpoints == nullptr || std::string(failpoints) != "1") {
      spdlog::error(
          "wsync-worker: --test_corrupt_after_sync is a test failpoint (it corrupts live "
          "tensors); refused unless WSYNC_TEST_FAILPOINTS=1 is set");
      return 2;
    }
    spdlog::warn(
        "wsync-worker: TEST FAILPOINT --test_corrupt_after_sync={}: every sync "
        "corrupts that tensor after it lands",
        options.test_corrupt_after_sync);
  }
  options.parts_cache_bytes = absl::GetFlag(FLAGS_parts_cache_bytes);
  if (options.parts_cache_bytes <= 0) {
    spdlog::error("wsync-worker: --parts_cache_bytes must be > 0, got {}",
                  options.parts_cache_bytes);
    return 2;
  }
  options.instance_id = absl::GetFlag(FLAGS_instance_id);
  if (options.instance_id.empty()) {
    std::random_device rd;
    options.instance_id = absl::StrFormat("%08x%08x-%d", rd(), rd(), getpid());
  }
  if (settings->device < -1) {
    spdlog::error("wsync-worker: --device must be a GPU index or -1 (host memory), got {}",
                  settings->device);
    return 2;
  }
  wsync::plane::BackendConfig config;
  config.device = settings->device;
  config.data_address = options.data_address;
  auto backend = wsync::node::CreateBackend(wsync::node::BackendNameFor(config), config);
  if (!backend.ok()) {
    spdlog::error("wsync-worker: {}", backend.status().ToString());
    return 2;
  }
  options.backend = backend->get();
  options.capabilities = (*backend)->capabilities();
  if (options.device_uuid.empty()) options.device_uuid = (*backend)->device_uuid();
  if (absl::GetFlag(FLAGS_direct_writes)) {
    options.direct_write_domain = (*backend)->MemoryDomain();
    options.peer_gpu_uuids = (*backend)->WritableDevices();
  }
  auto local_socket = wsync::agent::ResolveLocalSocket(
      absl::GetFlag(FLAGS_local_socket), absl::GetFlag(FLAGS_local_socket_group),
      absl::GetFlag(FLAGS_local_allowed_uids), options.memberships[0].group(),
      options.memberships[0].rank());
  auto admin_uids =
      wsync::agent::ParseUids(absl::GetFlag(FLAGS_local_admin_uids), "--local_admin_uids");
  if (!local_socket.ok() || !admin_uids.ok()) {
    spdlog::error("wsync-worker: {}",
                  (local_socket.ok() ? admin_uids.status() : local_socket.status()).ToString());
    return 2;
  }
  const std::string socket_path = local_socket->path;
  auto local = wsync::agent::LocalEndpoint::Open(*std::move(local_socket));
  if (!local.ok()) {
    spdlog::error("wsync-worker: {}", local.status().ToString());
    return 2;
  }

  wsync::agent::WorkerMetrics metrics;
  const int32_t metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port >= 0) {
    absl::Status s =
        metrics.Serve(absl::StrCat(absl::GetFlag(FLAGS_metrics_host), ":", metrics_port));
    if (!s.ok()) {
      spdlog::error("wsync-worker: {}", s.ToString());
      return 1;
    }
  }
  // Many descriptors (CUDA virtual memory) may arrive at the local socket.
  RaiseOpenFileLimit();
  options.fd_inbox = (*local)->fd_inbox();
  wsync::agent::WorkerAgent agent(options, &metrics);
  if (absl::Status s = (*local)->Serve(&agent, *admin_uids); !s.ok()) {
    spdlog::error("wsync-worker: {}", s.ToString());
    local->reset();
    return 1;
  }
  agent.Start();
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    {
      std::ofstream out(port_file + ".tmp");
      out << "metrics_port=" << metrics.port() << "\nlocal_socket=" << socket_path << "\n";
      if ((*local)->fd_inbox() != nullptr) {
        out << "fd_socket=" << (*local)->fd_inbox()->path() << "\n";
      }
    }
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: stopping", sig);
  agent.Stop();
  local->reset();  // no new connections, socket files removed
  return 0;
}
