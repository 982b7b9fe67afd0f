// The catalog-case flags shared by `wsyncctl plan` and `wsyncctl catalog`:
//   --model NAME --source fsdp:N|hsdp:RxN|megatron:tpA,ppB,dpC[,epD]
//   --destination vllm-tp:T[xR][,ep] [--gpus-per-node G] [--colocated]
//   [--trainer-dtype fp32|bf16] [--inference-dtype bf16] [--experts separate|stacked]
#ifndef WSYNC_TOOLS_CASE_FLAGS_H_
#define WSYNC_TOOLS_CASE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/args.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::tools {

// Adds the case flags to `spec`.
void AddCaseFlags(FlagSpec* spec);
// True when any case flag was given.
bool HasCaseFlags(const Args& args);
// Builds the spec; errors name the flag.
absl::StatusOr<v1::TransferSpec> SpecFromCaseFlags(const Args& args);
std::string CaseFlagsUsage();

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_CASE_FLAGS_H_
