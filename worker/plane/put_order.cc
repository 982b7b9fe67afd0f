#include "worker/plane/put_order.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace wsync::plane {

std::vector<size_t> InterleaveByPeer(absl::Span<const PutShare> shares, int first_peer) {
  std::vector<size_t> order(shares.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::map<int, int64_t> total;  // by peer
  for (const PutShare& s : shares) total[s.peer] += std::max<int64_t>(s.bytes, 0);
  if (total.size() < 2) return order;
  // Rank of each peer in the cyclic order starting at first_peer.
  std::map<int, size_t> rank;
  auto start = total.lower_bound(first_peer);
  size_t r = 0;
  for (auto it = start; it != total.end(); ++it) rank[it->first] = r++;
  for (auto it = total.begin(); it != start; ++it) rank[it->first] = r++;
  // Each entry's key is the midpoint of its byte range over its peer's
  // total, (2c + b) / 2T, compared as (2c + b) * T' against (2c' + b') * T
  // (exact: 2c + b <= 2^64 and T < 2^63). A peer of total 0 keys 0.
  using u128 = unsigned __int128;
  std::vector<u128> mid(shares.size());
  std::vector<int64_t> tot(shares.size());
  std::vector<size_t> rk(shares.size());
  std::map<int, int64_t> done;
  for (size_t i = 0; i < shares.size(); ++i) {
    const int64_t b = std::max<int64_t>(shares[i].bytes, 0);
    int64_t& c = done[shares[i].peer];
    tot[i] = std::max<int64_t>(total[shares[i].peer], 1);
    rk[i] = rank[shares[i].peer];
    mid[i] = static_cast<u128>(c) * 2 + static_cast<u128>(b);
    c += b;
  }
  auto before = [&](size_t a, size_t b) {
    const u128 lhs = mid[a] * static_cast<u128>(tot[b]);
    const u128 rhs = mid[b] * static_cast<u128>(tot[a]);
    if (lhs != rhs) return lhs < rhs;
    if (rk[a] != rk[b]) return rk[a] < rk[b];
    return a < b;
  };
  std::sort(order.begin(), order.end(), before);
  return order;
}

PartCut CutIntoParts(int64_t units, int64_t unit_bytes, int64_t max_part_bytes) {
  PartCut cut;
  cut.units_per_part = std::max<int64_t>(units, 0);
  if (units <= 1 || unit_bytes <= 0 || max_part_bytes <= 0) return cut;
  const int64_t per = std::max<int64_t>(max_part_bytes / unit_bytes, 1);
  if (per >= units) return cut;
  cut.units_per_part = per;
  cut.parts = (units + per - 1) / per;
  return cut;
}

}  // namespace wsync::plane
