#include "common/plan_names.h"

#include "absl/strings/str_cat.h"

namespace wsync {

absl::StatusOr<const std::string*> PlanName(const v1::Plan& plan, int32_t index,
                                            absl::string_view what) {
  if (index < 0 || index >= plan.names_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": name index ", index, " outside the plan's ", plan.names_size(), " names"));
  }
  return &plan.names(index);
}

std::string PlanNameOrIndex(const v1::Plan& plan, int32_t index) {
  if (index >= 0 && index < plan.names_size()) return plan.names(index);
  return absl::StrCat("#", index);
}

}  // namespace wsync
