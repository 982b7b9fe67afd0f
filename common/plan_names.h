// Plans refer to tensor and buffer names by index into Plan.names (one string
// per name instead of one per piece and view); these resolve an index with an
// error that says which reference was bad.
#ifndef WSYNC_COMMON_PLAN_NAMES_H_
#define WSYNC_COMMON_PLAN_NAMES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "wsync/v1/plan.pb.h"

namespace wsync {

absl::StatusOr<const std::string*> PlanName(const v1::Plan& plan, int32_t index,
                                            absl::string_view what);

// The name, or "#<index>" when the index is out of range (for messages only).
std::string PlanNameOrIndex(const v1::Plan& plan, int32_t index);

}  // namespace wsync

#endif  // WSYNC_COMMON_PLAN_NAMES_H_
