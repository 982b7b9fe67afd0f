// Known values for end-to-end checks: every element of every source tensor
// gets a value that depends on (tensor, element, version); destinations are
// checked byte for byte against the value their mapping says they receive.
// Works on any TransferSpec (mesh or fragment layouts, mappings); not for
// Partial placements. Values are small integers, exact in every float dtype.
#ifndef WSYNC_TOOLS_DEMO_LAYOUT_DATA_H_
#define WSYNC_TOOLS_DEMO_LAYOUT_DATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/plan/compiled_layout.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::demo {

struct BufferSpec {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  int64_t bytes = 0;
};

// The value element `linear` (row-major) of source tensor `tensor` has at `version`.
double SourceValue(const std::string& tensor, int64_t linear, int64_t version);

// Buffers of each rank of a compiled side: rank -> buffers (sorted by name).
std::vector<std::vector<BufferSpec>> BuffersPerRank(const plan::CompiledSide& side);

// Where the buffers of one rank live in this process.
using BufferMap = std::map<std::string, uint8_t*>;

// Writes version `version`'s values into every source fragment of `rank`.
absl::Status FillSource(const plan::CompiledSide& side, int32_t rank, int64_t version,
                        const BufferMap& buffers);

struct VerifyResult {
  int64_t elements = 0;
  int64_t bytes = 0;
  int64_t wrong_elements = 0;
  std::string first_error;  // names tensor, global index, expected, found
};

// Checks every destination element of `rank` against the source value its
// mapping assigns (cast into the destination dtype; block-fp8 tensors and
// their scales against the reference quantization of those values).
absl::StatusOr<VerifyResult> VerifyDestination(const v1::TransferSpec& spec,
                                               const plan::CompiledSide& destination,
                                               const plan::CompiledSide& source, int32_t rank,
                                               int64_t version, const BufferMap& buffers);

// Overwrites every destination byte of `rank` with a poison pattern, so a
// sync that skips an element cannot pass verification by leftovers.
void Poison(const std::vector<BufferSpec>& buffers, const BufferMap& memory);

}  // namespace wsync::demo

#endif  // WSYNC_TOOLS_DEMO_LAYOUT_DATA_H_
