#include "controller/plan/simulator.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bucket_steps.h"

namespace wsync::plan {
namespace {

absl::Status AddSide(const v1::Side& side, WorkerNodes* nodes) {
  for (const v1::RankInfo& r : side.ranks()) {
    auto [it, inserted] = nodes->emplace(r.worker(), r.node());
    if (!inserted && it->second != r.node()) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", r.worker(), " is on node '",
                                                     it->second, "' and on node '", r.node(),
                                                     "' (side '", side.name(), "')"));
    }
  }
  return absl::OkStatus();
}

// Dense worker index: per-round accumulators are vectors, not maps, so that
// a 100k-bucket plan simulates in milliseconds. Each worker's node is looked
// up once, when it gets its index.
struct WorkerIndex {
  explicit WorkerIndex(const WorkerNodes& n) : nodes(n) {}
  int32_t Of(int32_t w) {
    auto [it, inserted] = index.emplace(w, static_cast<int32_t>(ids.size()));
    if (inserted) {
      ids.push_back(w);
      auto node = nodes.find(w);
      node_of.push_back(node == nodes.end() ? nullptr : &node->second);
    }
    return it->second;
  }
  const WorkerNodes& nodes;
  absl::flat_hash_map<int32_t, int32_t> index;
  std::vector<int32_t> ids;                 // worker id by index
  std::vector<const std::string*> node_of;  // node by index; nullptr: not in `nodes`
};

// Bytes one worker (by index) moves on each link in one step of a round.
struct Event {
  int32_t round, step, worker;
  LinkBytes bytes;
};

void Add(LinkBytes* to, const LinkBytes& b) {
  to->nvlink_out += b.nvlink_out;
  to->nvlink_in += b.nvlink_in;
  to->nic_out += b.nic_out;
  to->nic_in += b.nic_in;
  to->local += b.local;
}

// Bucket b's events: one local copy, or the sender's egress and the
// receiver's ingress (NVLink within a named node, else the NIC). Fails on a
// round outside the plan, negative bytes, a transport contradicting the
// ends, or a worker of unknown node.
absl::Status AppendBucketEvents(const v1::Bucket& b, int32_t num_rounds,
                                const SimulateOptions& options, WorkerIndex* index,
                                std::vector<Event>* events) {
  // Formatted only for an error: plans have hundreds of thousands of buckets.
  auto where = [&b] {
    return absl::StrCat("bucket ", b.id(), " (", b.sender(), " -> ", b.receiver(), ", round ",
                        b.round(), ")");
  };
  if (b.round() < 0 || b.round() >= num_rounds) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": round outside [0, ", num_rounds, ")"));
  }
  if (b.bytes() < 0) return absl::InvalidArgumentError(absl::StrCat(where(), ": negative bytes"));
  const bool same = b.sender() == b.receiver();
  const int32_t max_step = same ? 0 : kMaxBucketSteps - 1;
  if (b.step() < 0 || b.step() > max_step) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": step ", b.step(), " outside [0, ", max_step, "]"));
  }
  if (same != (b.transport() == v1::TRANSPORT_LOCAL)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": transport ", v1::BucketTransport_Name(b.transport()),
                     same ? " for a copy within one worker" : " between two workers"));
  }
  if (same) {
    Event e{b.round(), 0, index->Of(b.sender()), {}};
    e.bytes.local = b.bytes();
    events->push_back(e);
    return absl::OkStatus();
  }
  Event out{b.round(), b.step(), index->Of(b.sender()), {}};
  Event in{b.round(), b.step(), index->Of(b.receiver()), {}};
  const std::string* s = index->node_of[out.worker];
  const std::string* r = index->node_of[in.worker];
  if (s == nullptr || r == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where(), ": no node known for worker ",
                                                   s == nullptr ? b.sender() : b.receiver()));
  }
  // An unnamed node is an unknown placement: assume the slower NIC.
  bool nvlink = !s->empty() && *s == *r;
  if (nvlink && options.nvlink_pairs != nullptr) {
    nvlink = std::binary_search(options.nvlink_pairs->begin(), options.nvlink_pairs->end(),
                                std::make_pair(b.sender(), b.receiver()));
  }
  (nvlink ? out.bytes.nvlink_out : out.bytes.nic_out) = b.bytes();
  (nvlink ? in.bytes.nvlink_in : in.bytes.nic_in) = b.bytes();
  events->push_back(out);
  events->push_back(in);
  return absl::OkStatus();
}

// Per (round, step, worker) group of `events` (sorted so): the worker's
// busiest link time adds to its load; a step lasts as long as its slowest
// worker, a round as its steps one after the other plus a step latency for
// each but the first (its seconds start at the round latency).
void TimeRounds(const std::vector<Event>& events, const LinkRates& rates,
                std::vector<WorkerLoad>* loads, SimulationResult* result) {
  std::vector<double> longest_step(result->rounds.size(), 0.0);
  for (size_t i = 0; i < events.size();) {
    const int32_t round_index = events[i].round, step = events[i].step;
    double step_seconds = 0;
    int32_t step_critical = -1;
    size_t j = i;
    while (j < events.size() && events[j].round == round_index && events[j].step == step) {
      LinkBytes sum;
      size_t k = j;
      for (; k < events.size() && events[k].round == round_index && events[k].step == step &&
             events[k].worker == events[j].worker;
           ++k) {
        Add(&sum, events[k].bytes);
      }
      WorkerLoad& load = (*loads)[events[j].worker];
      Add(&load.bytes, sum);
      const double t = BusiestLinkSeconds(sum, rates);
      load.busy_seconds += t;
      if (step_critical < 0 || t > step_seconds) {
        step_seconds = t;
        step_critical = load.worker;
      }
      j = k;
    }
    RoundTiming& round = result->rounds[round_index];
    if (round.steps > 0) round.seconds += rates.step_latency;
    round.seconds += step_seconds;
    if (round.critical_worker < 0 || step_seconds > longest_step[round_index]) {
      longest_step[round_index] = step_seconds;
      round.critical_worker = step_critical;
    }
    ++round.steps;
    i = j;
  }
}

}  // namespace

LinkRates EffectiveRates(const v1::LinkModel& model) {
  LinkRates r;
  r.nvlink = model.nvlink_bytes_per_second() > 0 ? model.nvlink_bytes_per_second() : 370e9;
  r.nic = model.nic_bytes_per_second() > 0 ? model.nic_bytes_per_second() : 50e9;
  r.local = model.local_copy_bytes_per_second() > 0 ? model.local_copy_bytes_per_second() : 2e12;
  r.round_latency = std::max(0.0, model.round_latency_seconds());
  r.step_latency = std::max(0.0, model.step_latency_seconds());
  return r;
}

double BusiestLinkSeconds(const LinkBytes& b, const LinkRates& r, std::string* busiest) {
  const std::pair<double, const char*> links[] = {{b.nvlink_out / r.nvlink, "nvlink_out"},
                                                  {b.nvlink_in / r.nvlink, "nvlink_in"},
                                                  {b.nic_out / r.nic, "nic_out"},
                                                  {b.nic_in / r.nic, "nic_in"},
                                                  {b.local / r.local, "local"}};
  double best = 0;
  const char* name = "none";
  for (const auto& [seconds, link] : links) {
    if (seconds > best) {
      best = seconds;
      name = link;
    }
  }
  if (busiest != nullptr) *busiest = name;
  return best;
}

absl::StatusOr<SimulationResult> SimulatePlan(const v1::Plan& plan, const WorkerNodes& nodes,
                                              const v1::LinkModel& model,
                                              const SimulateOptions& options) {
  const LinkRates rates = EffectiveRates(model);
  const int32_t num_rounds = plan.num_rounds();
  // Every round of a real plan moves at least one bucket; the cap keeps a
  // corrupt round count from allocating gigabytes of round timings.
  if (num_rounds < 0 || num_rounds > std::max<int64_t>(plan.buckets_size(), 1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", num_rounds, " rounds for ", plan.buckets_size(), " buckets"));
  }
  WorkerIndex index(nodes);
  std::vector<Event> events;
  events.reserve(plan.buckets_size() * 2);
  for (const v1::Bucket& b : plan.buckets()) {
    if (absl::Status s = AppendBucketEvents(b, num_rounds, options, &index, &events); !s.ok()) {
      return s;
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.round, a.step, a.worker) < std::tie(b.round, b.step, b.worker);
  });
  SimulationResult result;
  std::vector<WorkerLoad> loads(index.ids.size());
  for (size_t i = 0; i < index.ids.size(); ++i) loads[i].worker = index.ids[i];
  result.rounds.resize(num_rounds);
  for (int32_t r = 0; r < num_rounds; ++r) {
    result.rounds[r].round = r;
    result.rounds[r].seconds = rates.round_latency;
  }
  TimeRounds(events, rates, &loads, &result);
  for (const RoundTiming& r : result.rounds) result.makespan_seconds += r.seconds;
  for (WorkerLoad& load : loads) {
    std::string link;
    load.bound_seconds = BusiestLinkSeconds(load.bytes, rates, &link);
    if (load.bound_seconds > result.lower_bound_seconds) {
      result.lower_bound_seconds = load.bound_seconds;
      result.bound_worker = load.worker;
      result.bound_link = link;
    }
  }
  std::sort(loads.begin(), loads.end(),
            [](const WorkerLoad& a, const WorkerLoad& b) { return a.worker < b.worker; });
  result.workers = std::move(loads);
  return result;
}

absl::StatusOr<WorkerNodes> WorkerNodesFromSpec(const v1::TransferSpec& spec) {
  WorkerNodes nodes;
  if (absl::Status s = AddSide(spec.source(), &nodes); !s.ok()) return s;
  if (absl::Status s = AddSide(spec.destination(), &nodes); !s.ok()) return s;
  return nodes;
}

absl::StatusOr<WorkerNodes> WorkerNodesFromPlan(const v1::Plan& plan) {
  WorkerNodes nodes;
  for (const v1::WorkerInfo& w : plan.workers()) {
    if (!nodes.emplace(w.worker(), w.node()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan lists worker ", w.worker(), " twice in workers"));
    }
  }
  return nodes;
}

}  // namespace wsync::plan
