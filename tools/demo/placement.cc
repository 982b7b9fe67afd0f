#include "tools/demo/placement.h"

#include <fstream>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "controller/plan/link_rate_flags.h"
#include "google/protobuf/util/json_util.h"

namespace wsync::demo {

absl::StatusOr<Placement> ParsePlacement(const std::string& placement, int slots_per_node,
                                         int num_workers, int gpus) {
  if (slots_per_node < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slots_per_node must be >= 0, got ", slots_per_node));
  }
  Placement out;
  if (placement.empty()) {
    for (int i = 0; i < num_workers; ++i) out.slots.push_back(i);
  } else {
    for (absl::string_view part : absl::StrSplit(placement, ',')) {
      int slot = -1;
      if (!absl::SimpleAtoi(part, &slot) || slot < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--placement '", placement, "': '", part, "' is not a slot >= 0"));
      }
      out.slots.push_back(slot);
    }
  }
  if (static_cast<int>(out.slots.size()) != num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("--placement '", placement, "' names ",
                                                   out.slots.size(), " slots for ", num_workers,
                                                   " workers (one per worker, in worker order)"));
  }
  absl::flat_hash_set<int> seen;
  for (int slot : out.slots) {
    if (!seen.insert(slot).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--placement: slot ", slot, " given twice (one worker per slot)"));
    }
    if (gpus > 0 && slot >= gpus) {
      return absl::InvalidArgumentError(absl::StrCat("--placement: slot ", slot,
                                                     " is not a GPU of --gpus ", gpus,
                                                     " (NCCL needs one GPU "
                                                     "per worker)"));
    }
  }
  out.nodes.assign(num_workers, "");
  if (slots_per_node > 0) {
    for (int i = 0; i < num_workers; ++i) {
      out.nodes[i] = absl::StrCat("n", out.slots[i] / slots_per_node);
    }
  }
  return out;
}

absl::Status ApplyNodes(const Placement& placement, v1::TransferSpec* spec) {
  if (placement.nodes.empty() || placement.nodes[0].empty()) return absl::OkStatus();
  for (v1::Side* side : {spec->mutable_source(), spec->mutable_destination()}) {
    for (v1::RankInfo& r : *side->mutable_ranks()) {
      if (r.worker() < 0 || r.worker() >= static_cast<int>(placement.nodes.size())) {
        return absl::InvalidArgumentError(absl::StrCat("side '", side->name(), "': worker ",
                                                       r.worker(), " has no place (",
                                                       placement.nodes.size(), " workers)"));
      }
      r.set_node(placement.nodes[r.worker()]);
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyLinkRates(double nvlink_gbps, double nic_gbps, double copy_gbps,
                            v1::TransferSpec* spec) {
  std::vector<plan::LinkRateFlag> flags;
  const plan::LinkRateFlag given[] = {{plan::LinkField::kNvlink, "--nvlink_gbps", nvlink_gbps},
                                      {plan::LinkField::kNic, "--nic_gbps", nic_gbps},
                                      {plan::LinkField::kCopy, "--copy_gbps", copy_gbps}};
  for (const plan::LinkRateFlag& f : given) {
    if (f.value != 0) flags.push_back(f);  // 0: the field as it is
  }
  return plan::ApplyLinkRateFlags(flags, spec);
}

absl::Status WriteSpecJson(const v1::TransferSpec& spec, const std::string& path) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  auto st = google::protobuf::util::MessageToJsonString(spec, &json, options);
  if (!st.ok()) {
    return absl::InternalError(absl::StrCat("--spec_out: spec to JSON: ", st.ToString()));
  }
  std::ofstream out(path);
  out << json << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("--spec_out: cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace wsync::demo
