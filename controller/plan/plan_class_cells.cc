// Stage 2's driver: the cells of one tensor per class (plan_classes.h) are
// computed (plan_mapping.cc, plan_quant.cc); every other member of the class
// gets a copy of the cells, cell holders, QuantGroups and their record slots
// that computation appended to Work, its ids translated. Members are copied
// at their own place in tensor order, so the arrays, and the plan, are
// exactly what computing each tensor would give, with one difference: the
// boxes (source or destination coordinates, the same for every member of a
// class) are not copied; a copied cell or QuantGroup names its template's
// box. Nothing reads a box id but to look its contents up, so the plan is
// the same, and the box arena holds one class member's boxes, not all of
// them (Kimi-K2 from FSDP over 256 ranks: 17.7 M cells, 0.7 GB of boxes).
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "controller/plan/plan_classes.h"
#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {
namespace {

// What computing the cells of a class's first tensor appended to Work.
struct Template {
  int32_t tensor = -1;  // the destination tensor computed
  int32_t cell_begin = 0, cell_end = 0;
  int32_t holder_begin = 0, holder_end = 0;
  int32_t qgroup_begin = 0, qgroup_end = 0;
  int32_t rec_begin = 0, rec_end = 0;
  // The template's map entry ids -> their position in maps_of_dst[tensor].
  absl::flat_hash_map<int32_t, int32_t> map_pos;
};

class ClassCells {
 public:
  ClassCells(Work* w, const TensorClasses& k) : w_(w), k_(k), templates_(k.num_dst_classes) {}

  absl::Status Run(int32_t* copied) {
    for (size_t t = 0; t < k_.dst_class.size(); ++t) {
      const int32_t begin = k_.group_begin[t], end = begin + k_.group_count[t];
      const int32_t cls = k_.dst_class[t];
      if (cls >= 0 && templates_[cls].tensor >= 0) {
        Copy(templates_[cls], static_cast<int32_t>(t));
        if (copied != nullptr) ++*copied;
        continue;
      }
      Template rec;
      Mark(&rec.cell_begin, &rec.holder_begin, &rec.qgroup_begin, &rec.rec_begin);
      if (absl::Status s = BuildGroupCells(w_, begin, end); !s.ok()) return s;
      if (cls < 0) continue;
      Mark(&rec.cell_end, &rec.holder_end, &rec.qgroup_end, &rec.rec_end);
      rec.tensor = static_cast<int32_t>(t);
      const std::vector<int32_t>& maps = w_->maps_of_dst[t];
      for (size_t i = 0; i < maps.size(); ++i) rec.map_pos[maps[i]] = static_cast<int32_t>(i);
      templates_[cls] = std::move(rec);
    }
    return absl::OkStatus();
  }

 private:
  void Mark(int32_t* cell, int32_t* holder, int32_t* qgroup, int32_t* rec) const {
    *cell = static_cast<int32_t>(w_->cells.size());
    *holder = static_cast<int32_t>(w_->cell_holders.size());
    *qgroup = static_cast<int32_t>(w_->qgroups.size());
    *rec = static_cast<int32_t>(w_->qgroup_recs.size());
  }

  // Tensor `t`'s cells as a copy of template `r`'s (boxes shared).
  void Copy(const Template& r, int32_t t) {
    const int32_t holder_delta = static_cast<int32_t>(w_->cell_holders.size()) - r.holder_begin;
    const int32_t qgroup_delta = static_cast<int32_t>(w_->qgroups.size()) - r.qgroup_begin;
    const int32_t rec_delta = static_cast<int32_t>(w_->qgroup_recs.size()) - r.rec_begin;
    const int32_t group_delta = k_.group_begin[t] - k_.group_begin[r.tensor];
    // Holder group ids are rewritten below, per cell (its map's source).
    // (No reserve: exact reserves would regrow the arrays on every copy;
    // push_back of an element of the vector itself is well defined.)
    for (int32_t h = r.holder_begin; h < r.holder_end; ++h) {
      w_->cell_holders.push_back(w_->cell_holders[h]);
    }
    w_->qgroup_recs.resize(w_->qgroup_recs.size() + (r.rec_end - r.rec_begin), 0);
    for (int32_t q = r.qgroup_begin; q < r.qgroup_end; ++q) {
      QuantGroup g = w_->qgroups[q];
      g.dst_group += group_delta;
      g.rec_begin += rec_delta;
      w_->qgroups.push_back(g);
    }
    const std::vector<int32_t>& maps = w_->maps_of_dst[t];
    for (int32_t i = r.cell_begin; i < r.cell_end; ++i) {
      Cell c = w_->cells[i];
      const int32_t from_map = c.map;
      c.map = maps[r.map_pos.at(from_map)];
      c.dst_group += group_delta;
      if (c.qgroup >= 0) c.qgroup += qgroup_delta;
      if (c.quant != kQuantGroup) {
        // Holders are groups of the map's source tensor, at the same place
        // in its (identically laid out) groups.
        const int32_t hg_delta =
            k_.hg_begin[w_->maps[c.map].src_tensor] - k_.hg_begin[w_->maps[from_map].src_tensor];
        const int32_t from = c.hg_begin;
        c.hg_begin += holder_delta;
        for (int32_t h = 0; h < c.hg_count; ++h) {
          w_->cell_holders[c.hg_begin + h] = w_->cell_holders[from + h] + hg_delta;
        }
      }
      w_->cells.push_back(c);
    }
  }

  Work* w_;
  const TensorClasses& k_;
  std::vector<Template> templates_;
};

}  // namespace

absl::Status BuildCells(Work* w, bool classes, int32_t* copied) {
  if (copied != nullptr) *copied = 0;
  if (absl::Status s = BuildHolderGroups(w); !s.ok()) return s;
  BuildDstGroups(w);
  if (!classes) return BuildGroupCells(w, 0, static_cast<int32_t>(w->dst_groups.size()));
  return ClassCells(w, FindTensorClasses(*w)).Run(copied);
}

}  // namespace wsync::plan::planner_detail
