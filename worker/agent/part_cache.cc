#include "worker/agent/part_cache.h"

#include <utility>

namespace wsync::agent {

void PartCache::Erase(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  by_key_.erase(it->key);
  lru_.erase(it);
}

std::vector<std::string> PartCache::Put(const std::string& key,
                                        std::shared_ptr<const v1::Plan> plan) {
  if (auto it = by_key_.find(key); it != by_key_.end()) Erase(it->second);
  const int64_t bytes = static_cast<int64_t>(plan->ByteSizeLong());
  lru_.push_front(Entry{key, std::move(plan), bytes});
  by_key_[key] = lru_.begin();
  bytes_ += bytes;
  std::vector<std::string> out;
  while (bytes_ > budget_bytes_ && lru_.size() > 1) {
    auto last = std::prev(lru_.end());
    out.push_back(last->key);
    Erase(last);
  }
  evicted_.insert(evicted_.end(), out.begin(), out.end());
  return out;
}

std::shared_ptr<const v1::Plan> PartCache::Get(const std::string& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->plan;
}

std::vector<std::string> PartCache::TakeEvicted() { return std::exchange(evicted_, {}); }

}  // namespace wsync::agent
