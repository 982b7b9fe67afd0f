// When the planner stacks alike tensors (plan_stacking.h): the mode of
// BuildOptions::stacking, wsyncctl plan --stacking and wsync-controller
// --plan_stacking. A header of its own so that settings need not include
// the planner.
#ifndef WSYNC_CONTROLLER_PLAN_STACKING_MODE_H_
#define WSYNC_CONTROLLER_PLAN_STACKING_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wsync::plan {

// kAuto: only a spec the piece limit refuses unstacked; kOn: every spec;
// kOff: never (planner.h BuildOptions::stacking).
enum class StackingMode { kOff, kAuto, kOn };

// "off", "on" or "auto"; INVALID_ARGUMENT naming `flag` and the value
// otherwise.
absl::StatusOr<StackingMode> ParseStackingMode(absl::string_view text, absl::string_view flag);

}  // namespace wsync::plan

#endif  // WSYNC_CONTROLLER_PLAN_STACKING_MODE_H_
