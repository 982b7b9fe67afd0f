// The shipped monitoring against a real Prometheus server (Debian's
// `prometheus`): it scrapes a real controller and two host workers on
// loopback every second through a few syncs, loads the alert rules, and every
// Grafana panel query and every alert's inputs must return data through its
// HTTP API (/api/v1/query). Skipped, with the reason, without the binary.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <set>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tests/integration/http_get.h"
#include "tests/integration/monitoring_artifacts.h"
#include "tools/demo/owner.h"
#include "tools/demo/process.h"

namespace wsync::integration {
namespace {

const std::string kDashboard =
    std::string(WSYNC_SOURCE_DIR) + "/deploy/grafana/wsync-dashboard.json";
const std::string kRules = std::string(WSYNC_SOURCE_DIR) + "/deploy/prometheus/wsync-rules.yaml";
// The window Grafana's $__rate_interval stands for here: it covers the syncs.
constexpr char kRateWindow[] = "1m";

// $WSYNC_PROMETHEUS_BIN, else `prometheus` on $PATH; "" if none.
std::string FindPrometheus() {
  if (const char* env = std::getenv("WSYNC_PROMETHEUS_BIN"); env != nullptr && *env != '\0') {
    return env;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/prometheus");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// The wsync_* series names an expression reads.
std::set<std::string> MetricNames(const std::string& expr) {
  static const std::regex kName("wsync_[a-z0-9_]+");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kName);
       it != std::sregex_iterator(); ++it) {
    out.insert(it->str());
  }
  return out;
}

class PrometheusServer {
 public:
  // Scrapes `targets` (job -> host:port list) every second, loads `rules`.
  absl::Status Start(const std::string& bin, const std::string& dir,
                     const std::vector<std::pair<std::string, std::vector<std::string>>>& targets,
                     const std::string& rules) {
    port_ = FreeLoopbackPort();
    if (port_ == 0) return absl::UnavailableError("no free loopback port for prometheus");
    std::string config = absl::StrCat(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
        "rule_files:\n  - ",
        rules, "\nscrape_configs:\n");
    for (const auto& [job, hosts] : targets) {
      absl::StrAppend(&config, "  - job_name: ", job, "\n    static_configs:\n      - targets: ['",
                      absl::StrJoin(hosts, "', '"), "']\n");
    }
    std::ofstream(dir + "/prometheus.yml") << config;
    auto child = demo::Child::Spawn(
        {bin, "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/tsdb",
         absl::StrCat("--web.listen-address=127.0.0.1:", port_), "--log.level=warn"},
        dir + "/prometheus.log");
    if (!child.ok()) return child.status();
    child_ = *std::move(child);
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (HttpGet(port_, "/-/ready").find("Ready") == std::string::npos) {
      if (!child_.running() || absl::Now() > until) {
        return absl::UnavailableError(absl::StrCat("prometheus did not get ready on port ", port_,
                                                   "; see ", dir, "/prometheus.log"));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return absl::OkStatus();
  }

  // The `data` object of an API answer, or why there is none.
  absl::StatusOr<google::protobuf::Value> Api(const std::string& path_and_query) {
    const std::string body = HttpGet(port_, path_and_query);
    auto json = ParseJsonObject(body);
    if (!json.ok()) return absl::InternalError(absl::StrCat(path_and_query, ": ", body));
    if (StringField(*json, "status") != "success" || Field(*json, "data") == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path_and_query, " answered ", body));
    }
    return *Field(*json, "data");
  }

  // The number of series an instant query returns.
  absl::StatusOr<int> Count(const std::string& promql) {
    auto data = Api("/api/v1/query?query=" + UrlEncode(promql));
    if (!data.ok()) return data.status();
    const auto* result = Field(data->struct_value(), "result");
    if (result == nullptr) return absl::InternalError("no result");
    return result->has_list_value() ? result->list_value().values_size() : 1;
  }

 private:
  int port_ = 0;
  demo::Child child_;
};

TEST(MonitoringArtifacts, DashboardAndRulesAreWellFormed) {
  auto text = ReadText(kDashboard);
  ASSERT_TRUE(text.ok()) << text.status();
  auto dash = ParseJsonObject(*text);
  ASSERT_TRUE(dash.ok()) << dash.status();
  EXPECT_FALSE(StringField(*dash, "uid").empty());
  const auto vars = DashboardVariables(*dash);
  EXPECT_NE(std::find(vars.begin(), vars.end(),
                      std::make_pair(std::string("datasource"), std::string("datasource"))),
            vars.end());
  std::set<double> ids;
  for (const auto& p : Field(*dash, "panels")->list_value().values()) {
    const auto& panel = p.struct_value();
    EXPECT_TRUE(ids.insert(Field(panel, "id")->number_value()).second) << "duplicate panel id";
    if (StringField(panel, "type") == "row") continue;
    const auto* ds = Field(panel, "datasource");
    ASSERT_NE(ds, nullptr) << StringField(panel, "title");
    EXPECT_EQ(StringField(ds->struct_value(), "uid"), "${datasource}")
        << StringField(panel, "title");
  }
  const auto queries = DashboardPanelQueries(*dash);
  EXPECT_GE(queries.size(), 20u);
  for (const NamedQuery& q : queries) EXPECT_FALSE(q.expr.empty()) << q.name;
  auto rules_text = ReadText(kRules);
  ASSERT_TRUE(rules_text.ok()) << rules_text.status();
  auto alerts = RuleAlertExprs(*rules_text);
  ASSERT_TRUE(alerts.ok()) << alerts.status();
  std::set<std::string> names;
  for (const NamedQuery& a : *alerts) names.insert(a.name);
  for (const char* required :
       {"WsyncSyncFailing", "WsyncSyncStuckPastDeadline", "WsyncWeightsStale",
        "WsyncWorkerLeaseChurn", "WsyncReplicasOnDifferentVersions", "WsyncThroughputLow"}) {
    EXPECT_EQ(names.count(required), 1u) << required;
  }
}

TEST(PrometheusIntegration, EveryPanelAndAlertQueryReturnsData) {
  const std::string bin = FindPrometheus();
  if (bin.empty()) {
    GTEST_SKIP() << "prometheus not found on $PATH (Debian package 'prometheus', "
                    "scripts/install_deps.sh; or set WSYNC_PROMETHEUS_BIN)";
  }
  const absl::Time t0 = absl::Now();
  auto dash = ParseJsonObject(*ReadText(kDashboard));
  ASSERT_TRUE(dash.ok()) << dash.status();
  auto alerts = RuleAlertExprs(*ReadText(kRules));
  ASSERT_TRUE(alerts.ok()) << alerts.status();

  // A controller and two host workers (one trainer rank, one inference rank).
  demo::ClusterOptions options = DefaultClusterOptions();
  const std::string dir = options.work_dir;
  auto run_or = CaseRun::Start(Case("fsdp:1", "vllm-tp:1"), options);
  ASSERT_TRUE(run_or.ok()) << run_or.status();
  CaseRun& run = **run_or;
  ASSERT_EQ(run.cluster->num_workers(), 2);
  PrometheusServer prom;
  std::vector<std::string> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(absl::StrCat("127.0.0.1:", run.cluster->worker(w).metrics_port));
  }
  ASSERT_TRUE(prom.Start(bin, dir,
                         {{"wsync-controller",
                           {absl::StrCat("127.0.0.1:", run.cluster->controller_metrics_port())}},
                          {"wsync-worker", workers}},
                         kRules)
                  .ok());
  // Every target scraped before the syncs: rates see them start from zero.
  auto up = [&] { return prom.Count("up == 1"); };
  for (int i = 0; i < 100 && up().value_or(0) < 3; ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_EQ(up().value_or(0), 3) << "targets not up; see " << dir << "/prometheus.log";

  ASSERT_TRUE(run.Define("t").ok());
  for (int v = 1; v <= 4; ++v) {
    run.Fill(v);
    v1::SyncStatus st;
    ASSERT_TRUE(run.SyncAndWait("t", v, &st).ok());
    ASSERT_EQ(st.phase(), v1::SYNC_SUCCEEDED) << st.error();
    absl::SleepFor(absl::Milliseconds(700));  // a scrape between syncs
  }
  v1::SetServingRequest req;
  req.set_group("inference");
  req.set_version(4);
  req.set_state(v1::SERVING_STATE_SERVING);
  req.set_replica("r0");
  req.set_replica_ranks(1);
  grpc::ClientContext ctx;
  v1::SetServingResponse resp;
  const grpc::Status s =
      demo::LocalStub(run.cluster->worker(run.dst_worker[0]).socket)->SetServing(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();

  // Every query, retried until it has data (the serving report reaches the
  // controller with a heartbeat, then a scrape), within one bound.
  // Panel queries must return series. An alert's expression must evaluate
  // (whether it returns series is whether it fires); each series it reads
  // must exist.
  struct Check {
    std::string name;
    std::string promql;
    bool needs_data;
  };
  std::vector<Check> checks;
  for (const NamedQuery& q : DashboardPanelQueries(*dash)) {
    checks.push_back({q.name, SubstituteVariables(q.expr, kRateWindow), true});
  }
  for (const NamedQuery& a : *alerts) {
    checks.push_back({a.name, a.expr, false});
    for (const std::string& m : MetricNames(a.expr))
      checks.push_back({a.name + " reads " + m, m, true});
  }
  std::vector<std::string> missing;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  for (const Check& c : checks) {
    absl::StatusOr<int> n = prom.Count(c.promql);
    while (n.ok() && *n == 0 && c.needs_data && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(250));
      n = prom.Count(c.promql);
    }
    if (!n.ok()) {
      missing.push_back(absl::StrCat(c.name, ": ", n.status().ToString()));
    } else if (*n == 0 && c.needs_data) {
      missing.push_back(absl::StrCat(c.name, ": no data for ", c.promql));
    }
  }
  EXPECT_TRUE(missing.empty()) << absl::StrJoin(missing, "\n");
  // The dashboard's transfer variable (label_values(wsync_syncs_total,
  // transfer)) lists the transfer.
  auto values = prom.Api("/api/v1/label/transfer/values?match[]=wsync_syncs_total");
  ASSERT_TRUE(values.ok()) << values.status();
  std::vector<std::string> transfers;
  for (const auto& v : values->list_value().values()) transfers.push_back(v.string_value());
  EXPECT_EQ(transfers, std::vector<std::string>{"t"});
  // The server loaded every rule and evaluated each without error.
  auto rules = prom.Api("/api/v1/rules");
  ASSERT_TRUE(rules.ok()) << rules.status();
  int loaded = 0;
  for (const auto& g : Field(rules->struct_value(), "groups")->list_value().values()) {
    for (const auto& r : Field(g.struct_value(), "rules")->list_value().values()) {
      ++loaded;
      const std::string health = StringField(r.struct_value(), "health");
      EXPECT_EQ(health, "ok") << StringField(r.struct_value(), "name") << ": "
                              << StringField(r.struct_value(), "lastError");
    }
  }
  EXPECT_EQ(loaded, static_cast<int>(alerts->size()));
  std::printf("%zu dashboard/alert queries checked against prometheus in %.1f s\n", checks.size(),
              absl::ToDoubleSeconds(absl::Now() - t0));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(90));
}

}  // namespace
}  // namespace wsync::integration
