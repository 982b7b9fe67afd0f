#include "controller/plan/rank_parts.h"

#include "absl/container/flat_hash_map.h"
#include "controller/plan/plan_arena.h"
#include "google/protobuf/arena.h"

namespace wsync::plan {

std::vector<RankPart> SplitRankPlans(const v1::Plan& plan) {
  std::vector<RankPart> parts;
  std::vector<v1::Plan*> out;
  absl::flat_hash_map<int32_t, size_t> index;  // worker -> parts[i]
  for (const v1::RankPlan& rp : plan.ranks()) {
    auto [it, added] = index.try_emplace(rp.worker(), parts.size());
    if (added) {
      std::shared_ptr<google::protobuf::Arena> arena = NewPlanArena();
      v1::Plan* p = google::protobuf::Arena::CreateMessage<v1::Plan>(arena.get());
      p->set_key(plan.key());
      p->set_num_rounds(plan.num_rounds());
      parts.push_back({rp.worker(), std::shared_ptr<const v1::Plan>(arena, p)});
      out.push_back(p);
    }
    *out[it->second]->add_ranks() = rp;
  }
  auto part_of = [&](int32_t worker) -> v1::Plan* {
    auto it = index.find(worker);
    return it == index.end() ? nullptr : out[it->second];
  };
  for (const v1::Bucket& b : plan.buckets()) {
    v1::Plan* s = part_of(b.sender());
    if (s != nullptr) *s->add_buckets() = b;
    v1::Plan* r = b.receiver() == b.sender() ? nullptr : part_of(b.receiver());
    if (r != nullptr) *r->add_buckets() = b;
  }
  for (const v1::Reduce& red : plan.reduces()) {
    if (v1::Plan* p = part_of(red.worker())) *p->add_reduces() = red;
  }
  for (const v1::Quantize& q : plan.quantizes()) {
    if (v1::Plan* p = part_of(q.worker())) *p->add_quantizes() = q;
  }
  for (const v1::RankSummary& rs : plan.summary().ranks()) {
    if (v1::Plan* p = part_of(rs.worker())) *p->mutable_summary()->add_ranks() = rs;
  }
  for (v1::Plan* p : out) {
    *p->mutable_workers() = plan.workers();
    *p->mutable_names() = plan.names();
  }
  return parts;
}

}  // namespace wsync::plan
