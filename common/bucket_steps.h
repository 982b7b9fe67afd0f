// Steps inside a round (v1::Bucket.step): the bound every reader checks.
#ifndef WSYNC_COMMON_BUCKET_STEPS_H_
#define WSYNC_COMMON_BUCKET_STEPS_H_

#include <cstdint>

#include "wsync/v1/plan.pb.h"

namespace wsync {

// A bucket's step lies in [0, kMaxBucketSteps); a local bucket's is 0.
inline constexpr int32_t kMaxBucketSteps = 64;

// Workers that run a round's steps in order register this capability. An
// older worker would move every step of a round at once, so a zero-copy
// relay could send bytes before they arrived: the controller refuses to
// hand it a part with steps (controller/server/worker_checks.h).
inline constexpr char kBucketStepsCapability[] = "bucket_steps";

// Does any bucket of `plan` move in a step other than 0?
inline bool HasBucketSteps(const v1::Plan& plan) {
  for (const v1::Bucket& b : plan.buckets()) {
    if (b.step() != 0) return true;
  }
  return false;
}

}  // namespace wsync

#endif  // WSYNC_COMMON_BUCKET_STEPS_H_
