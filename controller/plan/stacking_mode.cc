// Stacking modes (stacking_mode.h).
#include "controller/plan/stacking_mode.h"

#include "absl/strings/str_cat.h"

namespace wsync::plan {

absl::StatusOr<StackingMode> ParseStackingMode(absl::string_view text, absl::string_view flag) {
  if (text == "off") return StackingMode::kOff;
  if (text == "on") return StackingMode::kOn;
  if (text == "auto") return StackingMode::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be off, on or auto, not '", text, "'"));
}

}  // namespace wsync::plan
