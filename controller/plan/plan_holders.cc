// Stage 2's first part: every source tensor's holder groups (the fragments
// holding each distinct box, full or as partial sums), and on first use the
// index that finds the groups meeting a box by binary search along the dim
// with the most distinct offsets (SourceIndexOf).
#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

// The holder groups of one source tensor while they are built: appended to
// w->holder_groups contiguously from `base`, with their full holders and
// partial groups collected here until Flush. `shared_boxes`: the box ids of
// the groups of an earlier tensor with the same fragment list (compiled
// fragments shared by mesh signature), by group index; a group whose box
// equals the one at its index there names that box instead of adding a
// copy, and a tensor that is first with its list fills it.
class TensorHolders {
 public:
  TensorHolders(Work* w, const CompiledTensor& ct, std::vector<int32_t>* shared_boxes)
      : w_(w),
        ct_(ct),
        rank_(static_cast<int>(ct.shape.size())),
        base_(static_cast<int32_t>(w->holder_groups.size())),
        shared_boxes_(shared_boxes) {}

  // Full replicas: fragments come sorted by box, so those of one box are
  // adjacent. Partial fragments are collected by partial_group.
  void AddFullHolders(std::map<int32_t, std::vector<int32_t>>* partial) {
    int32_t last = -1;
    for (size_t f = 0; f < ct_.num_fragments(); ++f) {
      const CompiledFragment& fr = ct_.fragment(f);
      if (fr.box.Empty() && rank_ > 0) continue;
      if (fr.partial_group != 0) {
        (*partial)[fr.partial_group].push_back(static_cast<int32_t>(f));
        continue;
      }
      if (last < 0 || !SameBox(last, fr.box)) last = NewGroup(fr.box);
      full_of_[last].push_back(static_cast<int32_t>(f));
    }
  }

  // Partial group pg (its fragments): one box and one op; joins the holder
  // group of that box.
  absl::Status AddPartialGroup(int32_t pg, const std::vector<int32_t>& frags) {
    const CompiledFragment& first = ct_.fragment(frags[0]);
    for (int32_t f : frags) {
      const CompiledFragment& fr = ct_.fragment(f);
      if (fr.box != first.box || fr.partial_op != first.partial_op) {
        return absl::InvalidArgumentError(
            absl::StrCat("source tensor '", ct_.name, "': partial_group ", pg,
                         " mixes boxes or ops (rank ", first.rank, " holds ", first.box.ToString(),
                         ", rank ", fr.rank, " holds ", fr.box.ToString(), ")"));
      }
    }
    int32_t local = -1;
    for (size_t i = 0; i < groups_.size() && local < 0; ++i) {
      if (SameBox(static_cast<int32_t>(i), first.box)) local = static_cast<int32_t>(i);
    }
    if (local < 0) local = NewGroup(first.box);
    PartialGroup p;
    p.frag_begin = static_cast<int32_t>(w_->holder_frags.size());
    p.frag_count = static_cast<int32_t>(frags.size());
    p.op = first.partial_op;
    w_->holder_frags.insert(w_->holder_frags.end(), frags.begin(), frags.end());
    parts_of_[local].push_back(static_cast<int32_t>(w_->partial_groups.size()));
    w_->partial_groups.push_back(p);
    return absl::OkStatus();
  }

  // The tensor's HolderGroup ids: [base(), base() + size()).
  int32_t base() const { return base_; }
  int32_t size() const { return static_cast<int32_t>(groups_.size()); }

  // Writes every group's full holders and partial groups into w.
  void Flush() {
    for (size_t i = 0; i < groups_.size(); ++i) {
      HolderGroup& hg = w_->holder_groups[groups_[i]];
      hg.full_begin = static_cast<int32_t>(w_->holder_frags.size());
      hg.full_count = static_cast<int32_t>(full_of_[i].size());
      w_->holder_frags.insert(w_->holder_frags.end(), full_of_[i].begin(), full_of_[i].end());
      hg.part_begin = static_cast<int32_t>(w_->holder_parts.size());
      hg.part_count = static_cast<int32_t>(parts_of_[i].size());
      w_->holder_parts.insert(w_->holder_parts.end(), parts_of_[i].begin(), parts_of_[i].end());
    }
  }

 private:
  int32_t NewGroup(const BoxNd& b) {
    HolderGroup hg;
    const size_t local = groups_.size();
    if (local < shared_boxes_->size() && BoxIs((*shared_boxes_)[local], b)) {
      hg.box = (*shared_boxes_)[local];
    } else {
      hg.box = w_->boxes.Add(rank_, b.offset.data(), b.length.data());
      if (local == shared_boxes_->size()) shared_boxes_->push_back(hg.box);
    }
    w_->holder_groups.push_back(hg);
    groups_.push_back(static_cast<int32_t>(w_->holder_groups.size()) - 1);
    full_of_.emplace_back();
    parts_of_.emplace_back();
    return static_cast<int32_t>(groups_.size()) - 1;
  }

  bool SameBox(int32_t local, const BoxNd& b) const {
    return BoxIs(w_->holder_groups[base_ + local].box, b);
  }

  // Whether arena box `id` is b.
  bool BoxIs(int32_t id, const BoxNd& b) const {
    return w_->boxes.rank(id) == rank_ &&
           std::equal(b.offset.begin(), b.offset.end(), w_->boxes.offset(id)) &&
           std::equal(b.length.begin(), b.length.end(), w_->boxes.length(id));
  }

  Work* w_;
  const CompiledTensor& ct_;
  const int rank_;
  const int32_t base_;
  std::vector<int32_t>* shared_boxes_;
  std::vector<int32_t> groups_;  // HolderGroup ids, by local index
  std::vector<std::vector<int32_t>> full_of_, parts_of_;
};

// Index of a tensor's holder groups `groups` (rank `rank`) along the dim
// with the most distinct offsets: groups by begin, with the prefix max of
// their ends.
void IndexHolderGroups(const Work& w, int rank, std::vector<int32_t> groups, SourceIndex* si) {
  si->key_dim = 0;
  if (rank > 0) {
    size_t best = 0;
    for (int d = 0; d < rank; ++d) {
      std::vector<int64_t> offs;
      for (int32_t g : groups) offs.push_back(w.boxes.offset(w.holder_groups[g].box)[d]);
      std::sort(offs.begin(), offs.end());
      const size_t distinct = std::unique(offs.begin(), offs.end()) - offs.begin();
      if (distinct > best) {
        best = distinct;
        si->key_dim = d;
      }
    }
  }
  const int k = si->key_dim;
  auto begin_of = [&](int32_t g) {
    return rank == 0 ? 0 : w.boxes.offset(w.holder_groups[g].box)[k];
  };
  std::sort(groups.begin(), groups.end(), [&](int32_t a, int32_t b) {
    return begin_of(a) != begin_of(b) ? begin_of(a) < begin_of(b) : a < b;
  });
  si->groups = groups;
  int64_t running = INT64_MIN;
  for (int32_t g : groups) {
    si->begin.push_back(begin_of(g));
    const int64_t end = rank == 0 ? 1 : begin_of(g) + w.boxes.length(w.holder_groups[g].box)[k];
    running = std::max(running, end);
    si->max_end.push_back(running);
  }
}

}  // namespace

absl::Status BuildHolderGroups(Work* w) {
  const size_t n = w->src->tensors.size();
  w->source_index.assign(n, SourceIndex());
  w->src_hg_begin.assign(n, 0);
  w->src_hg_count.assign(n, 0);
  // Per fragment list: its holder groups' boxes (TensorHolders).
  absl::flat_hash_map<const std::vector<CompiledFragment>*, std::vector<int32_t>> boxes_of;
  for (size_t t = 0; t < w->src->tensors.size(); ++t) {
    const CompiledTensor& ct = w->src->tensors[t];
    TensorHolders holders(w, ct, &boxes_of[&ct.fragments()]);
    std::map<int32_t, std::vector<int32_t>> partial;  // partial_group -> fragments
    holders.AddFullHolders(&partial);
    for (auto& [pg, frags] : partial) {
      if (absl::Status s = holders.AddPartialGroup(pg, frags); !s.ok()) return s;
    }
    holders.Flush();
    w->src_hg_begin[t] = holders.base();
    w->src_hg_count[t] = holders.size();
  }
  return absl::OkStatus();
}

const SourceIndex& SourceIndexOf(Work* w, int32_t t) {
  SourceIndex& si = w->source_index[t];
  if (!si.built) {
    std::vector<int32_t> groups(w->src_hg_count[t]);
    for (size_t i = 0; i < groups.size(); ++i) {
      groups[i] = w->src_hg_begin[t] + static_cast<int32_t>(i);
    }
    IndexHolderGroups(*w, static_cast<int>(w->src->tensors[t].shape.size()), std::move(groups),
                      &si);
    si.built = true;
  }
  return si;
}

}  // namespace wsync::plan::planner_detail
