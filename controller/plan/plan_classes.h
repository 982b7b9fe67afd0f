// Tensor classes: destination tensors whose cells (plan_mapping.cc, block
// fp8 in plan_quant.cc) are the same up to which tensor they are. Kimi-K2
// has 60 MoE layers whose w13 / w2 tensors differ only in their names (and
// so in their sources' names), all dense layers alike; with separate HF
// expert tensors on the source, the 384 experts of a layer are alike too.
//
// A class is decided from everything the cell stage reads, and nothing
// else, so that the cells of one member, with its ids translated, are the
// cells of any other:
//  * a source tensor's class: its dtype, shape and holder groups in order
//    (each group's box, how many full holders, and the size and reduce op of
//    each partial group). Which fragments and ranks hold it is not part of it
//    (cells do not name ranks; source choice, later, does).
//  * a destination tensor's class: its dtype, shape, block quantization,
//    its DstGroups in order (box and member count), and its mapping entries
//    in order (the source tensor's class and every offset and length).
// Tensors of a class may sit on different ranks and buffers: only the
// geometry the cell stage works on must match.
#ifndef WSYNC_CONTROLLER_PLAN_PLAN_CLASSES_H_
#define WSYNC_CONTROLLER_PLAN_PLAN_CLASSES_H_

#include <cstdint>
#include <vector>

#include "controller/plan/planner_internal.h"

namespace wsync::plan::planner_detail {

struct TensorClasses {
  // Per source tensor: its class (dense, from 0) and its holder groups,
  // [hg_begin, hg_begin + hg_count) of Work::holder_groups.
  std::vector<int32_t> src_class;
  std::vector<int32_t> hg_begin;
  std::vector<int32_t> hg_count;
  // Per destination tensor: its class (dense, from 0; -1 for scale tensors
  // and tensors without DstGroups) and its DstGroups [group_begin,
  // group_begin + group_count) of Work::dst_groups.
  std::vector<int32_t> dst_class;
  std::vector<int32_t> group_begin;
  std::vector<int32_t> group_count;
  int32_t num_src_classes = 0;
  int32_t num_dst_classes = 0;
};

// The classes of w's tensors; needs holder groups, source index, DstGroups
// and maps (after ValidateAndMap and BuildHolderGroups / BuildDstGroups).
TensorClasses FindTensorClasses(const Work& w);

}  // namespace wsync::plan::planner_detail

#endif  // WSYNC_CONTROLLER_PLAN_PLAN_CLASSES_H_
