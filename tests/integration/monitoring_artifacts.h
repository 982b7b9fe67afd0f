// The PromQL inside deploy/grafana/wsync-dashboard.json (every panel target,
// every query variable) and deploy/prometheus/wsync-rules.yaml (every alert
// expression), for tests that evaluate them against a real Prometheus.
#ifndef WSYNC_TESTS_INTEGRATION_MONITORING_ARTIFACTS_H_
#define WSYNC_TESTS_INTEGRATION_MONITORING_ARTIFACTS_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace wsync::integration {

struct NamedQuery {
  std::string name;  // panel title + refId, variable or alert name
  std::string expr;
};

inline absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline absl::StatusOr<google::protobuf::Struct> ParseJsonObject(const std::string& json) {
  google::protobuf::Struct s;
  const auto st = google::protobuf::util::JsonStringToMessage(json, &s);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("bad JSON: ", st.ToString()));
  return s;
}

inline const google::protobuf::Value* Field(const google::protobuf::Struct& s,
                                            const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? nullptr : &it->second;
}

inline std::string StringField(const google::protobuf::Struct& s, const std::string& key) {
  const google::protobuf::Value* v = Field(s, key);
  return v != nullptr && v->has_string_value() ? v->string_value() : "";
}

// Every target of every panel (rows' nested panels too): "title/refId".
inline void CollectPanelQueries(const google::protobuf::Value& panels,
                                std::vector<NamedQuery>* out) {
  for (const google::protobuf::Value& p : panels.list_value().values()) {
    const google::protobuf::Struct& panel = p.struct_value();
    if (const auto* nested = Field(panel, "panels")) CollectPanelQueries(*nested, out);
    const auto* targets = Field(panel, "targets");
    if (targets == nullptr) continue;
    for (const google::protobuf::Value& t : targets->list_value().values()) {
      out->push_back(
          {absl::StrCat(StringField(panel, "title"), "/", StringField(t.struct_value(), "refId")),
           StringField(t.struct_value(), "expr")});
    }
  }
}

inline std::vector<NamedQuery> DashboardPanelQueries(const google::protobuf::Struct& dash) {
  std::vector<NamedQuery> out;
  if (const auto* panels = Field(dash, "panels")) CollectPanelQueries(*panels, &out);
  return out;
}

// The dashboard's template variables as (name, type).
inline std::vector<std::pair<std::string, std::string>> DashboardVariables(
    const google::protobuf::Struct& dash) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto* templating = Field(dash, "templating");
  if (templating == nullptr) return out;
  const auto* list = Field(templating->struct_value(), "list");
  if (list == nullptr) return out;
  for (const google::protobuf::Value& v : list->list_value().values()) {
    out.emplace_back(StringField(v.struct_value(), "name"), StringField(v.struct_value(), "type"));
  }
  return out;
}

// Grafana's variables replaced as Grafana would for "All" over a range of
// `rate_window`: $transfer (All: ".*"), $__rate_interval, $__interval.
inline std::string SubstituteVariables(const std::string& expr, const std::string& rate_window) {
  return absl::StrReplaceAll(
      expr, {{"$__rate_interval", rate_window}, {"$__interval", rate_window}, {"$transfer", ".*"}});
}

// The alerts of a Prometheus rule file: `- alert: NAME` and its `expr:`,
// given on one line or as a block scalar (`expr: >-` / `|`) whose more
// indented lines follow. Enough YAML for deploy/prometheus/wsync-rules.yaml;
// an expr in any other form is an error, not skipped.
inline absl::StatusOr<std::vector<NamedQuery>> RuleAlertExprs(const std::string& yaml) {
  std::vector<NamedQuery> out;
  std::vector<std::string> lines;
  std::stringstream in(yaml);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  auto indent = [](const std::string& l) { return l.find_first_not_of(' '); };
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view l = lines[i];
    l = absl::StripLeadingAsciiWhitespace(l);
    if (absl::ConsumePrefix(&l, "- alert:")) {
      out.push_back({std::string(absl::StripAsciiWhitespace(l)), ""});
      continue;
    }
    if (!absl::ConsumePrefix(&l, "expr:") || out.empty()) continue;
    if (!out.back().expr.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("alert ", out.back().name, ": two exprs"));
    }
    const std::string head(absl::StripAsciiWhitespace(l));
    if (head == ">-" || head == ">" || head == "|" || head == "|-") {
      const size_t key_indent = indent(lines[i]);
      std::string expr;
      while (i + 1 < lines.size() && (lines[i + 1].find_first_not_of(' ') == std::string::npos ||
                                      indent(lines[i + 1]) > key_indent)) {
        absl::StrAppend(&expr, expr.empty() ? "" : " ", absl::StripAsciiWhitespace(lines[++i]));
      }
      out.back().expr = std::string(absl::StripAsciiWhitespace(expr));
    } else if (!head.empty() && head[0] != '\'' && head[0] != '"') {
      out.back().expr = head;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("alert ", out.back().name, ": expr form not understood: ", head));
    }
  }
  for (const NamedQuery& q : out) {
    if (q.expr.empty())
      return absl::InvalidArgumentError(absl::StrCat("alert ", q.name, ": no expr"));
  }
  return out;
}

}  // namespace wsync::integration

#endif  // WSYNC_TESTS_INTEGRATION_MONITORING_ARTIFACTS_H_
