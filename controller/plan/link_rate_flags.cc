#include "controller/plan/link_rate_flags.h"

#include "absl/strings/str_cat.h"

namespace wsync::plan {

absl::Status ApplyLinkRateFlags(absl::Span<const LinkRateFlag> flags, v1::TransferSpec* spec) {
  return ApplyLinkRateFlags(flags, spec->mutable_options());
}

absl::Status ApplyLinkRateFlags(absl::Span<const LinkRateFlag> flags, v1::PlanOptions* options) {
  for (const LinkRateFlag& f : flags) {
    const bool latency = f.field == LinkField::kRoundLatency || f.field == LinkField::kStepLatency;
    if (!(latency ? f.value >= 0 : f.value > 0) || !(f.value <= kMaxLinkFlagValue)) {
      return absl::InvalidArgumentError(absl::StrCat(f.flag, " ", f.value, ": want a number ",
                                                     latency ? ">= 0" : "> 0", " up to 1e12"));
    }
  }
  v1::LinkModel* lm = options->mutable_link_model();
  for (const LinkRateFlag& f : flags) {
    switch (f.field) {
      case LinkField::kNvlink:
        lm->set_nvlink_bytes_per_second(f.value * 1e9);
        break;
      case LinkField::kNic:
        lm->set_nic_bytes_per_second(f.value * 1e9);
        break;
      case LinkField::kCopy:
        lm->set_local_copy_bytes_per_second(f.value * 1e9);
        break;
      case LinkField::kRoundLatency:
        lm->set_round_latency_seconds(f.value * 1e-6);
        break;
      case LinkField::kStepLatency:
        lm->set_step_latency_seconds(f.value * 1e-6);
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync::plan
