// Fuzzing: the size limits under which a fuzzed TransferSpec is planned (the
// planner's own limits are the controller's flags; these keep one input
// within milliseconds and megabytes so the fuzzer explores structure, not
// scale). Inputs over them are skipped, not reported.
#ifndef WSYNC_TESTS_FUZZ_SPEC_LIMITS_H_
#define WSYNC_TESTS_FUZZ_SPEC_LIMITS_H_

#include <cstdint>

#include "wsync/v1/layout.pb.h"

namespace wsync::fuzz {

inline constexpr int kMaxRanks = 16;
inline constexpr int kMaxTensors = 128;
inline constexpr int kMaxDims = 4;
inline constexpr int64_t kMaxTensorElements = 1 << 16;
inline constexpr int64_t kMaxSideElements = 1 << 18;
inline constexpr int64_t kMaxMeshRanks = 16;
inline constexpr int kMaxFragments = 32;
inline constexpr int64_t kMinBucketBytes = 64;

inline bool SideWithinLimits(const v1::Side& side) {
  if (side.ranks_size() > kMaxRanks || side.tensors_size() > kMaxTensors) return false;
  int64_t side_elements = 0;
  for (const v1::TensorLayout& t : side.tensors()) {
    if (t.shape_size() > kMaxDims) return false;
    int64_t n = 1;
    for (int64_t d : t.shape()) {
      if (d < 0 || d > kMaxTensorElements) return false;
      n *= d;
      if (n > kMaxTensorElements) return false;
    }
    side_elements += n;
    if (side_elements > kMaxSideElements) return false;
    if (t.has_mesh()) {
      int64_t ranks = 1;
      if (t.mesh().mesh_shape_size() > kMaxDims || t.mesh().placements_size() > kMaxDims)
        return false;
      for (int64_t d : t.mesh().mesh_shape()) {
        if (d < 0 || d > kMaxMeshRanks) return false;
        ranks *= d;
        if (ranks > kMaxMeshRanks) return false;
      }
    }
    if (t.has_fragments() && t.fragments().fragments_size() > kMaxFragments) return false;
    for (int64_t b : t.block_quantization().block()) {
      if (b > kMaxTensorElements) return false;
    }
  }
  return true;
}

inline bool SpecWithinLimits(const v1::TransferSpec& spec) {
  const int64_t bucket = spec.options().bucket_bytes();
  if (bucket != 0 && bucket < kMinBucketBytes) return false;
  if (spec.options().staging_cap_bytes() < 0 || spec.mappings_size() > kMaxTensors) return false;
  return SideWithinLimits(spec.source()) && SideWithinLimits(spec.destination());
}

}  // namespace wsync::fuzz

#endif  // WSYNC_TESTS_FUZZ_SPEC_LIMITS_H_
