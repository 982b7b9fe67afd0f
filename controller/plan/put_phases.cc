#include "controller/plan/put_phases.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace wsync::plan {
namespace {

using Matrix = std::vector<std::vector<int64_t>>;

// Byte sums saturate: a hostile plan's sizes near INT64_MAX give poor
// phases, never overflow.
int64_t AddBytes(int64_t a, int64_t b) {
  const int64_t add = std::max<int64_t>(b, 0);
  return a > INT64_MAX - add ? INT64_MAX : a + add;
}

// One pair's buckets in the writer's (round, seq) order, and the byte
// intervals of the pair's stream that each phase carries.
struct PairStream {
  std::vector<const v1::Bucket*> buckets;
  std::vector<std::pair<int64_t, int32_t>> phase_ends;  // (end byte, phase), ascending
  int64_t bytes = 0;
};

// Kuhn's augmenting paths on the bipartite graph of entries >= `at_least`.
class Matcher {
 public:
  Matcher(const Matrix& m, int64_t at_least) : m_(m), at_least_(at_least) {}

  // Row i -> column; empty when no perfect matching exists.
  std::vector<int> Perfect() {
    const int n = static_cast<int>(m_.size());
    col_owner_.assign(n, -1);
    for (int i = 0; i < n; ++i) {
      seen_.assign(n, false);
      if (!Augment(i)) return {};
    }
    std::vector<int> row_to(n, -1);
    for (int j = 0; j < n; ++j) row_to[col_owner_[j]] = j;
    return row_to;
  }

 private:
  bool Augment(int i) {
    for (int j = 0; j < static_cast<int>(m_.size()); ++j) {
      if (m_[i][j] < at_least_ || m_[i][j] <= 0 || seen_[j]) continue;
      seen_[j] = true;
      if (col_owner_[j] < 0 || Augment(col_owner_[j])) {
        col_owner_[j] = i;
        return true;
      }
    }
    return false;
  }

  const Matrix& m_;
  const int64_t at_least_;
  std::vector<int> col_owner_;
  std::vector<bool> seen_;
};

// The perfect matching of `pad`'s positive entries whose smallest entry is
// largest (fewer, longer phases). `pad` has equal positive row and column
// sums, so one exists (Birkhoff).
std::vector<int> BottleneckMatching(const Matrix& pad) {
  std::vector<int64_t> values;
  for (const auto& row : pad) {
    for (int64_t v : row) {
      if (v > 0) values.push_back(v);
    }
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::vector<int> best;
  size_t lo = 0, hi = values.size();  // the answer's threshold index is in [lo, hi)
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    std::vector<int> m = Matcher(pad, values[mid]).Perfect();
    if (m.empty()) {
      hi = mid;
    } else {
      best = std::move(m);
      lo = mid + 1;
    }
  }
  return best;
}

// Adds dummy bytes (the diagonal included: an idle slot) until every row
// and column sums to the largest row or column sum. The deficits of rows
// and columns add up to the same total, so the greedy pass closes all.
Matrix Pad(const Matrix& real) {
  const size_t n = real.size();
  std::vector<int64_t> row(n, 0), col(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      row[i] = AddBytes(row[i], real[i][j]);
      col[j] = AddBytes(col[j], real[i][j]);
    }
  }
  const int64_t busiest = std::max(*std::max_element(row.begin(), row.end()),
                                   *std::max_element(col.begin(), col.end()));
  Matrix pad = real;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const int64_t add = std::min(busiest - row[i], busiest - col[j]);
      if (add <= 0) continue;
      pad[i][j] += add;
      row[i] += add;
      col[j] += add;
    }
  }
  return pad;
}

// Decomposes one group's matrix into phases and records, per pair, which
// byte intervals of its stream each phase carries. Returns the phase count.
int32_t DecomposeGroup(const std::vector<int32_t>& workers,
                       std::map<WorkerPair, PairStream>& streams) {
  const size_t n = workers.size();
  Matrix real(n, std::vector<int64_t>(n, 0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      auto it = streams.find({workers[i], workers[j]});
      if (it != streams.end()) real[i][j] = it->second.bytes;
    }
  }
  Matrix pad = Pad(real);
  Matrix sent(n, std::vector<int64_t>(n, 0));
  int32_t phase = 0;
  // Each phase empties at least one padded entry.
  for (size_t guard = 0; guard <= n * n; ++guard) {
    const std::vector<int> match = BottleneckMatching(pad);
    if (match.empty()) break;  // everything placed
    int64_t take = pad[0][match[0]];
    for (size_t i = 0; i < n; ++i) take = std::min(take, pad[i][match[i]]);
    bool carried = false;
    for (size_t i = 0; i < n; ++i) {
      const size_t j = static_cast<size_t>(match[i]);
      pad[i][j] -= take;
      const int64_t r = std::min(take, real[i][j]);  // real bytes first, dummy after
      if (r <= 0 || i == j) continue;
      real[i][j] -= r;
      sent[i][j] += r;
      streams[{workers[i], workers[j]}].phase_ends.emplace_back(sent[i][j], phase);
      carried = true;
    }
    if (carried) ++phase;
  }
  return phase;
}

// The phase of each of the pair's buckets: the one its middle byte is in.
void AssignBuckets(const PairStream& s, std::vector<int32_t>& phase_of_bucket) {
  int64_t start = 0;
  size_t k = 0;
  for (const v1::Bucket* b : s.buckets) {
    const int64_t middle = AddBytes(start, b->bytes() / 2);
    while (k + 1 < s.phase_ends.size() && s.phase_ends[k].first <= middle) ++k;
    const int32_t phase = s.phase_ends.empty() ? 0 : s.phase_ends[k].second;
    if (b->id() >= 0 && static_cast<size_t>(b->id()) < phase_of_bucket.size()) {
      phase_of_bucket[static_cast<size_t>(b->id())] = phase;
    }
    start = AddBytes(start, b->bytes());
  }
}

// The connected groups of workers joined by pairs, each sorted.
std::vector<std::vector<int32_t>> Groups(const std::vector<WorkerPair>& pairs) {
  std::map<int32_t, int32_t> parent;
  auto find = [&parent](int32_t w) {
    while (parent[w] != w) w = parent[w] = parent[parent[w]];
    return w;
  };
  for (const WorkerPair& p : pairs) {
    parent.try_emplace(p.first, p.first);
    parent.try_emplace(p.second, p.second);
    parent[find(p.first)] = find(p.second);
  }
  std::map<int32_t, std::vector<int32_t>> by_root;
  for (const auto& [w, unused] : parent) by_root[find(w)].push_back(w);
  std::vector<std::vector<int32_t>> groups;
  for (auto& [root, members] : by_root) groups.push_back(std::move(members));
  return groups;
}

}  // namespace

PutPhases PlanPutPhases(const v1::Plan& plan, const std::vector<WorkerPair>& pairs) {
  PutPhases out;
  if (pairs.empty()) return out;
  out.phase_of_bucket.assign(static_cast<size_t>(plan.buckets_size()), 0);
  std::map<WorkerPair, PairStream> streams;
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.transport() != v1::TRANSPORT_NETWORK) continue;
    const WorkerPair pair(b.sender(), b.receiver());
    if (!std::binary_search(pairs.begin(), pairs.end(), pair)) continue;
    PairStream& s = streams[pair];
    s.buckets.push_back(&b);
    s.bytes = AddBytes(s.bytes, b.bytes());
  }
  for (auto& [pair, s] : streams) {
    std::stable_sort(
        s.buckets.begin(), s.buckets.end(), [](const v1::Bucket* x, const v1::Bucket* y) {
          return std::make_pair(x->round(), x->seq()) < std::make_pair(y->round(), y->seq());
        });
  }
  for (const std::vector<int32_t>& group : Groups(pairs)) {
    if (static_cast<int32_t>(group.size()) > kMaxPutPhaseWorkers) continue;
    out.num_phases += DecomposeGroup(group, streams);
  }
  for (const auto& [pair, s] : streams) AssignBuckets(s, out.phase_of_bucket);
  return out;
}

std::string PutPhasesKey(const v1::Plan& part, const std::vector<int32_t>& phase_of_bucket) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  auto mix = [&h](uint64_t v) {
    for (int k = 0; k < 8; ++k) {
      h ^= static_cast<uint8_t>(v >> (8 * k));
      h *= 1099511628211ull;
    }
  };
  bool any = false;
  for (const v1::Bucket& b : part.buckets()) {
    if (b.id() < 0 || static_cast<size_t>(b.id()) >= phase_of_bucket.size()) continue;
    const int32_t phase = phase_of_bucket[static_cast<size_t>(b.id())];
    if (phase == 0) continue;
    any = true;
    mix(static_cast<uint64_t>(b.id()));
    mix(static_cast<uint64_t>(static_cast<uint32_t>(phase)));
  }
  return any ? absl::StrCat("/ph", absl::Hex(h, absl::kZeroPad16)) : "";
}

}  // namespace wsync::plan
