// wsync-controller: the control plane of weight syncs (see docs/api.md).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>  // std::rename
#include <cstdlib>
#include <fstream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/busy_poll.h"
#include "common/env_flags.h"
#include "common/logging.h"
#include "common/service_signals.h"
#include "controller/plan/huge_page_allocator.h"
#include "controller/server/server.h"

ABSL_FLAG(std::string, listen, "",
          "gRPC listen address host:port of the worker and trainer services (port 0: any free "
          "port, see --port_file). Default: $POD_IP:50051 when POD_IP is set, else "
          "127.0.0.1:50051 (never every interface unless asked). Env: WSYNC_LISTEN.");
ABSL_FLAG(int32_t, metrics_port, 9464,
          "Port of the Prometheus /metrics endpoint (0: any free port, -1: disabled). Env: "
          "WSYNC_METRICS_PORT.");
ABSL_FLAG(std::string, metrics_host, "",
          "Address the /metrics endpoint binds to (plain HTTP). Default: $POD_IP when set, else "
          "127.0.0.1. Env: WSYNC_METRICS_HOST.");
ABSL_FLAG(int32_t, metrics_max_transfers, 16,
          "Distinct transfer names the metrics label `transfer` takes; later transfers share "
          "the value \"_other\" (bounds the series count). Env: WSYNC_METRICS_MAX_TRANSFERS.");
ABSL_FLAG(bool, insecure, false,
          "Serve plaintext gRPC without certificates (logs a warning): any network peer can "
          "then act as any worker or trainer that knows a lease id or token. Only for tests "
          "and trusted networks. Env: WSYNC_INSECURE.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the controller (TLS; required unless --insecure). Reloaded "
          "every --tls_reload_interval. Env: WSYNC_TLS_CERT.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert. Env: WSYNC_TLS_KEY.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle that signs client certificates (mutual TLS). Workers must present one "
          "with a URI SAN wsync://group/<group> per group they register in; trainers may "
          "present one with wsync://role/<reader|trainer|admin> instead of a token. Empty: no "
          "client certificates (then no worker can register). Env: WSYNC_TLS_CLIENT_CA.");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "How often --tls_cert, --tls_key and --tls_client_ca are re-read (rotation without "
          "restart; at least 1s). Env: WSYNC_TLS_RELOAD_INTERVAL.");
ABSL_FLAG(std::string, tls_crl_file, "",
          "PEM certificate revocation list(s) of the --tls_client_ca CAs (e.g. `openssl ca "
          "-gencrl`): a worker or trainer whose client certificate is listed is refused with "
          "UNAUTHENTICATED naming its serial. Re-read every --tls_reload_interval when it "
          "changed. Empty: no revocation check. Env: WSYNC_TLS_CRL_FILE.");
ABSL_FLAG(absl::Duration, max_connection_age, absl::Minutes(30),
          "A client connection older than this is asked to reconnect (GOAWAY; calls and streams "
          "under way finish on it), so that rotated certificates and --tls_crl_file reach "
          "long-lived workers through a fresh TLS handshake. 0: never. Env: "
          "WSYNC_MAX_CONNECTION_AGE.");
ABSL_FLAG(std::string, tokens_file, "",
          "Bearer tokens of the trainer API, one '<token> <role> <name>' per line (role: "
          "reader, trainer or admin; tokens of 16+ characters); re-read when it changes. "
          "Clients send 'authorization: Bearer <token>'. Env: WSYNC_TOKENS_FILE.");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(10),
          "Worker lease time-to-live: a worker without a heartbeat for this long is dead and "
          "its syncs fail. Workers heartbeat every TTL/4. Env: WSYNC_LEASE_TTL.");
ABSL_FLAG(absl::Duration, sync_deadline, absl::Seconds(120),
          "Default deadline of a sync (trigger to every worker's report); a Sync request may "
          "set its own. Past it the sync fails and workers get an abort. Env: "
          "WSYNC_SYNC_DEADLINE.");
ABSL_FLAG(bool, warm_up_on_define, true,
          "Warm a transfer's workers up when it is defined and whenever they change: op lists "
          "bound, peers mapped, the transport connected (a message with every peer), staging "
          "allocated, so that the first sync runs as fast as the next (docs/warm-up.md). A "
          "DefineTransfer may opt out (no_warm_up). Env: WSYNC_WARM_UP_ON_DEFINE.");
ABSL_FLAG(absl::Duration, warm_up_deadline, absl::Seconds(60),
          "A warm-up not reported by every worker within this fails (the next sync then sets "
          "its workers up itself). Env: WSYNC_WARM_UP_DEADLINE.");
ABSL_FLAG(int64_t, max_message_bytes, 256ll << 20,
          "Largest gRPC message the controller accepts or sends (full plans, op lists). "
          "Larger requests fail with RESOURCE_EXHAUSTED. Env: WSYNC_MAX_MESSAGE_BYTES.");
ABSL_FLAG(std::string, port_file, "",
          "When set, write 'grpc_port=N' and 'metrics_port=M' lines to this file once serving "
          "(written to a temporary name, then renamed). Env: WSYNC_PORT_FILE.");
ABSL_FLAG(bool, put_phases, true,
          "Issue each writer's direct writes in put phases, matchings of the sync's peer-write "
          "byte matrix, so that each GPU writes about one peer at a time (docs/direct-writes.md); "
          "false: all peers at once, in round order. Env: WSYNC_PUT_PHASES.");
ABSL_FLAG(bool, direct_writes, true,
          "Let a sender write a receiver's destination buffers directly (same shm / CUDA IPC "
          "peer access) when both registered the same direct_write_domain and the plan's "
          "buckets between them are plain copies; false: every bucket goes through the "
          "transport. Env: WSYNC_DIRECT_WRITES.");
ABSL_FLAG(int64_t, min_bucket_bytes, 64ll << 10,
          "Smallest PlanOptions.bucket_bytes a DefineTransfer may ask for (0 in the spec picks "
          "the default, 256 MiB); smaller: INVALID_ARGUMENT. Env: WSYNC_MIN_BUCKET_BYTES.");
ABSL_FLAG(int64_t, max_plan_buckets, 2'000'000,
          "Most buckets one plan may have (a Kimi-K2 plan has ~0.31 M); checked before the plan "
          "is built where a lower bound shows it, else before it is kept: RESOURCE_EXHAUSTED. "
          "Env: WSYNC_MAX_PLAN_BUCKETS.");
ABSL_FLAG(int64_t, max_plan_pieces, 4'000'000,
          "Most pieces one plan may have (a Kimi-K2 plan has ~0.63 M): RESOURCE_EXHAUSTED. Env: "
          "WSYNC_MAX_PLAN_PIECES.");
ABSL_FLAG(std::string, plan_stacking, "auto",
          "Tensor stacking: auto plans a spec over --max_plan_pieces with each group of alike "
          "destination tensors stacked (docs/plan-compact.md section 6) and every other spec as "
          "it is; on stacks every spec; off refuses a spec over the limit "
          "(RESOURCE_EXHAUSTED). Env: WSYNC_PLAN_STACKING.");
ABSL_FLAG(int64_t, plan_cache_bytes, 4ll << 30,
          "Bytes the plan cache keeps (the plans' arenas; a Kimi-K2 plan takes ~0.5 GB); the "
          "oldest plans go first, the newest is always kept. Env: WSYNC_PLAN_CACHE_BYTES.");
ABSL_FLAG(absl::Duration, max_sync_deadline, absl::Hours(1),
          "Longest deadline_ms a Sync may ask for; longer: INVALID_ARGUMENT. Env: "
          "WSYNC_MAX_SYNC_DEADLINE.");
ABSL_FLAG(int64_t, max_version_jump, int64_t{1} << 32,
          "Largest step of a Sync's version over its transfer's last successful version; "
          "larger: INVALID_ARGUMENT (a version of INT64_MAX would leave no newer one). Env: "
          "WSYNC_MAX_VERSION_JUMP.");
ABSL_FLAG(int64_t, kv_scope_bytes, 64ll << 20,
          "Bytes (keys + values) one rendezvous scope (transfer generation) may hold; more: "
          "RESOURCE_EXHAUSTED. Env: WSYNC_KV_SCOPE_BYTES.");
ABSL_FLAG(int64_t, kv_scope_keys, 65536,
          "Keys one rendezvous scope may hold; more: RESOURCE_EXHAUSTED. Env: "
          "WSYNC_KV_SCOPE_KEYS.");
ABSL_FLAG(absl::Duration, max_wait, absl::Minutes(10),
          "Longest one KvGet, AwaitWriters, WaitSync or Sync(wait_ms) waits; longer timeouts "
          "are cut to it. Env: WSYNC_MAX_WAIT.");
ABSL_FLAG(int64_t, max_waiters, 16384,
          "Waits and watchers (WaitSync, WatchSync, Sync with wait_ms, KvGet with timeout_ms, "
          "AwaitWriters) held at once, without a thread each; more: RESOURCE_EXHAUSTED. Env: "
          "WSYNC_MAX_WAITERS.");
ABSL_FLAG(int64_t, busy_poll_ms, 0,
          "Low-latency mode: after its last signal (a report, a sync's end) the thread that "
          "answers the waiting trainers (Sync with wait_ms, WaitSync) polls for this many "
          "milliseconds instead of sleeping (one core while it spins), so that a sync's end "
          "reaches the trainer without a thread wake-up. gRPC's own threads, which receive "
          "the requests and reports, still sleep (docs/performance-notes.md). -1: spin "
          "forever; 0: off. Env: WSYNC_BUSY_POLL_MS.");
ABSL_FLAG(std::string, lane_socket, "",
          "The control fast lane: a Unix socket (created mode 0600, for the controller's own "
          "user) beside gRPC, on which a trainer's Sync / WaitSync and the workers' "
          "ReportResult run with no gRPC thread and no thread hand-off (one thread; it spins "
          "under --busy_poll_ms). For a trainer and workers on this host "
          "(docs/performance-notes.md, docs/security.md). Empty: off. Env: WSYNC_LANE_SOCKET.");
ABSL_FLAG(int32_t, list_workers_page_size, 100,
          "Most workers one ListWorkers page lists (also the default page size). Env: "
          "WSYNC_LIST_WORKERS_PAGE_SIZE.");
ABSL_FLAG(int64_t, list_workers_page_buffers, 10'000,
          "Most buffers one ListWorkers page lists over its workers (a worker with more alone "
          "is listed with its first ones, buffers_truncated); keeps a page under default client "
          "message limits. Env: WSYNC_LIST_WORKERS_PAGE_BUFFERS.");

namespace {
// The --min_bucket_bytes ... --max_waiters flags; false (logged) if one is out of range.
bool ReadLimits(wsync::controller::ControllerLimits* l) {
  l->min_bucket_bytes = absl::GetFlag(FLAGS_min_bucket_bytes);
  l->max_plan_buckets = absl::GetFlag(FLAGS_max_plan_buckets);
  l->max_plan_pieces = absl::GetFlag(FLAGS_max_plan_pieces);
  l->plan_cache_bytes = absl::GetFlag(FLAGS_plan_cache_bytes);
  absl::StatusOr<wsync::plan::StackingMode> stacking =
      wsync::plan::ParseStackingMode(absl::GetFlag(FLAGS_plan_stacking), "--plan_stacking");
  if (!stacking.ok()) {
    spdlog::error("wsync-controller: {}", std::string(stacking.status().message()));
    return false;
  }
  l->plan_stacking = *stacking;
  l->max_sync_deadline = absl::GetFlag(FLAGS_max_sync_deadline);
  l->max_version_jump = absl::GetFlag(FLAGS_max_version_jump);
  l->kv_scope_bytes = absl::GetFlag(FLAGS_kv_scope_bytes);
  l->kv_scope_keys = absl::GetFlag(FLAGS_kv_scope_keys);
  l->max_wait = absl::GetFlag(FLAGS_max_wait);
  l->max_waiters = absl::GetFlag(FLAGS_max_waiters);
  l->list_page_workers = absl::GetFlag(FLAGS_list_workers_page_size);
  l->list_page_buffers = absl::GetFlag(FLAGS_list_workers_page_buffers);
  auto busy_poll = wsync::BusyPollWindow(absl::GetFlag(FLAGS_busy_poll_ms), "--busy_poll_ms");
  if (!busy_poll.ok()) {
    spdlog::error("wsync-controller: {}", std::string(busy_poll.status().message()));
    return false;
  }
  l->busy_poll = *busy_poll;
  if (l->min_bucket_bytes < 0 || l->max_plan_buckets <= 0 || l->max_plan_pieces <= 0 ||
      l->plan_cache_bytes <= 0 || l->max_sync_deadline <= absl::ZeroDuration() ||
      l->max_version_jump <= 0 || l->kv_scope_bytes <= 0 || l->kv_scope_keys <= 0 ||
      l->max_wait <= absl::ZeroDuration() || l->max_waiters <= 0 || l->list_page_workers <= 0 ||
      l->list_page_buffers <= 0) {
    spdlog::error(
        "wsync-controller: --max_plan_buckets, --max_plan_pieces, --plan_cache_bytes, "
        "--max_sync_deadline, --max_version_jump, --kv_scope_bytes, --kv_scope_keys, --max_wait "
        "--max_waiters and --list_workers_page_* must be positive, --min_bucket_bytes not "
        "negative");
    return false;
  }
  return true;
}
}  // namespace

ABSL_FLAG(std::string, state_file, "wsync-controller.state",
          "File that keeps the transfers and their last delivered versions across restarts "
          "(written atomically after each definition and each finished sync; relative paths "
          "are taken from the working directory). A restarted controller serves the same "
          "transfers and refuses versions older than the last delivered one. Empty: nothing "
          "persists. An unreadable or corrupt file stops the start unless "
          "--state_start_empty. Env: WSYNC_STATE_FILE.");
ABSL_FLAG(std::string, state_fsync, "background",
          "When --state_file reaches the disk. 'background' (default): each save is written "
          "in place (the state is two files, <file> and <file>.alt, overwritten in turn) "
          "before the outcome is answered, so a controller crash loses nothing, and a flusher "
          "thread fdatasyncs it right after (a power cut can lose the last save, about a "
          "millisecond; workers still refuse older versions). 'always': each save is "
          "fdatasynced before the outcome is answered. Env: WSYNC_STATE_FSYNC.");
ABSL_FLAG(bool, state_start_empty, false,
          "When --state_file is corrupt or of another format, move it aside "
          "(<file>.corrupt-<time>) and start with no transfers instead of refusing to start. "
          "Env: WSYNC_STATE_START_EMPTY.");
ABSL_FLAG(absl::Duration, failure_grace, absl::Seconds(1),
          "How long a failure a worker reports about its peers (lost connection, silent peer) "
          "waits for its cause (a peer's loss, the other workers' reports) before the sync "
          "fails naming the reporter; also how long past its deadline a sync waits for the "
          "workers' own reports before it fails naming those that did not report. Env: "
          "WSYNC_FAILURE_GRACE.");

ABSL_FLAG(int32_t, test_crash_after_commits, -1,
          "TEST ONLY, refused unless the environment sets WSYNC_TEST_FAILPOINTS=1. -1: off. "
          "N >= 0: at a staged sync's commit decision (saved to --state_file first), send "
          "CommitSync to its first N receivers only and SIGKILL this process once they "
          "confirmed (N = 0: at once), i.e. a controller killed between the first and the last "
          "CommitSync (docs/staging.md).");

int main(int argc, char** argv) {
  wsync::plan::KeepFreedMemoryForPlanning();
  wsync::ParseFlagsWithEnv(
      argc, argv,
      "wsync-controller: control plane of wsync weight syncs (gRPC, package wsync.v1).\n"
      "Flags also read WSYNC_<FLAG> environment variables; the command line wins.",
      "controller/server/",
      {"listen",
       "metrics_port",
       "metrics_host",
       "metrics_max_transfers",
       "lease_ttl",
       "sync_deadline",
       "warm_up_on_define",
       "warm_up_deadline",
       "max_message_bytes",
       "port_file",
       "direct_writes",
       "put_phases",
       "min_bucket_bytes",
       "max_plan_buckets",
       "max_plan_pieces",
       "plan_stacking",
       "plan_cache_bytes",
       "max_sync_deadline",
       "max_version_jump",
       "kv_scope_bytes",
       "kv_scope_keys",
       "max_wait",
       "max_waiters",
       "busy_poll_ms",
       "lane_socket",
       "list_workers_page_size",
       "list_workers_page_buffers",
       "state_file",
       "state_fsync",
       "state_start_empty",
       "failure_grace",
       "insecure",
       "tls_cert",
       "tls_key",
       "tls_client_ca",
       "tls_reload_interval",
       "tls_crl_file",
       "max_connection_age",
       "tokens_file"});
  wsync::InitLogging("wsync-controller");

  // SIGINT / SIGTERM are taken by sigwait below.
  sigset_t signals = wsync::PrepareServiceSignals(argv[0]);

  wsync::controller::ServerOptions options;
  const char* pod_ip = std::getenv("POD_IP");
  const std::string default_host = pod_ip != nullptr && *pod_ip != '\0' ? pod_ip : "127.0.0.1";
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.lane_socket = absl::GetFlag(FLAGS_lane_socket);
  if (options.listen_address.empty()) options.listen_address = default_host + ":50051";
  std::string metrics_host = absl::GetFlag(FLAGS_metrics_host);
  if (metrics_host.empty()) metrics_host = default_host;
  const int32_t metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port >= 0) {
    options.metrics_address = absl::StrCat(metrics_host, ":", metrics_port);
  } else {
    options.metrics_address.clear();
  }
  options.metrics_max_transfers = absl::GetFlag(FLAGS_metrics_max_transfers);
  if (options.metrics_max_transfers < 1) {
    spdlog::error("wsync-controller: --metrics_max_transfers must be at least 1, got {}",
                  options.metrics_max_transfers);
    return 2;
  }
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.config.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  options.config.sync_deadline = absl::GetFlag(FLAGS_sync_deadline);
  options.config.direct_writes = absl::GetFlag(FLAGS_direct_writes);
  options.config.put_phases = absl::GetFlag(FLAGS_put_phases);
  options.config.warm_up_on_define = absl::GetFlag(FLAGS_warm_up_on_define);
  options.config.warm_up_deadline = absl::GetFlag(FLAGS_warm_up_deadline);
  options.auth.insecure = absl::GetFlag(FLAGS_insecure);
  options.auth.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.auth.key_file = absl::GetFlag(FLAGS_tls_key);
  options.auth.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  options.auth.crl_file = absl::GetFlag(FLAGS_tls_crl_file);
  options.max_connection_age = absl::GetFlag(FLAGS_max_connection_age);
  options.auth.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  if (options.auth.insecure) {
    spdlog::warn(
        "wsync-controller: --insecure: plaintext gRPC, no certificates; anyone who can reach "
        "{} can act as a worker that knows a lease id{}",
        options.listen_address, options.auth.tokens_file.empty() ? " and as an admin trainer" : "");
  }
  if (!ReadLimits(&options.config.limits)) return 2;
  options.config.failure_grace = absl::GetFlag(FLAGS_failure_grace);
  options.state_file = absl::GetFlag(FLAGS_state_file);
  options.state_start_empty = absl::GetFlag(FLAGS_state_start_empty);
  absl::StatusOr<wsync::controller::StateFlush> flush =
      wsync::controller::ParseStateFlush(absl::GetFlag(FLAGS_state_fsync));
  if (!flush.ok()) {
    spdlog::error("wsync-controller: {}", std::string(flush.status().message()));
    return 2;
  }
  options.state_flush = *flush;
  if (options.config.lease_ttl <= absl::ZeroDuration() ||
      options.config.sync_deadline <= absl::ZeroDuration() ||
      options.config.warm_up_deadline <= absl::ZeroDuration() || options.max_message_bytes <= 0 ||
      options.config.failure_grace < absl::ZeroDuration()) {
    spdlog::error(
        "wsync-controller: --lease_ttl, --sync_deadline, --warm_up_deadline and "
        "--max_message_bytes must be "
        "positive, --failure_grace not negative");
    return 2;
  }
  options.config.test_crash_after_commits = absl::GetFlag(FLAGS_test_crash_after_commits);
  if (options.config.test_crash_after_commits >= 0) {
    const char* failpoints = std::getenv("WSYNC_TEST_FAILPOINTS");
    if (failpoints == nullptr || std::string(failpoints) != "1") {
      spdlog::error(
          "wsync-controller: --test_crash_after_commits is a test failpoint (it kills the "
          "controller mid-commit); refused unless WSYNC_TEST_FAILPOINTS=1 is set");
      return 2;
    }
    spdlog::warn(
        "wsync-controller: TEST FAILPOINT --test_crash_after_commits={}: the first "
        "staged commit decision kills this process",
        options.config.test_crash_after_commits);
  }
  std::random_device rd;
  options.config.instance = absl::StrFormat("%08x", rd());

  auto server = wsync::controller::ControllerServer::Start(options);
  if (!server.ok()) {
    spdlog::error("wsync-controller: {}", server.status().ToString());
    return 1;
  }
  spdlog::info("[controller] instance {} serving gRPC on port {}, metrics on port {}",
               options.config.instance, (*server)->port(), (*server)->metrics_port());
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << "grpc_port=" << (*server)->port() << "\nmetrics_port=" << (*server)->metrics_port()
          << "\n";
    }
    if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      spdlog::error("wsync-controller: cannot write {}", port_file);
      return 1;
    }
  }
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("[controller] signal {}: shutting down", sig);
  (*server)->Shutdown();
  return 0;
}
