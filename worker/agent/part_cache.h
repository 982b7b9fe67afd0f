// The op lists ("parts", SyncAssignment.part_key) a worker keeps between
// syncs. The controller sends each part once per lease and later assignments
// only name it, so the cache is bounded by bytes (--parts_cache_bytes, the
// parts' serialized size), evicting the least recently used; the keys it
// evicted ride on the worker's next ReportResult (dropped_part_keys) and the
// controller sends those parts again. The newest part always stays, even
// alone above the budget (the running assignment needs it).
#ifndef WSYNC_WORKER_AGENT_PART_CACHE_H_
#define WSYNC_WORKER_AGENT_PART_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::agent {

class PartCache {
 public:
  explicit PartCache(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // Stores `plan` under `key` (replacing it) as the most recently used, then
  // evicts the least recently used others until the cache fits the budget.
  // Returns the evicted keys (also kept for TakeEvicted).
  std::vector<std::string> Put(const std::string& key, std::shared_ptr<const v1::Plan> plan);
  // The part, now the most recently used; null when absent.
  std::shared_ptr<const v1::Plan> Get(const std::string& key);
  // The keys evicted since the last call, for the next report.
  std::vector<std::string> TakeEvicted();

  int64_t bytes() const { return bytes_; }
  size_t size() const { return by_key_.size(); }
  int64_t budget_bytes() const { return budget_bytes_; }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const v1::Plan> plan;
    int64_t bytes = 0;
  };
  void Erase(std::list<Entry>::iterator it);

  const int64_t budget_bytes_;
  int64_t bytes_ = 0;
  std::list<Entry> lru_;  // front: most recently used
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> by_key_;
  std::vector<std::string> evicted_;
};

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_PART_CACHE_H_
