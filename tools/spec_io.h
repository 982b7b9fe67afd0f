// Reading TransferSpecs (proto3 JSON files or "-" for stdin) and writing
// protos as JSON for wsyncctl.
#ifndef WSYNC_TOOLS_SPEC_IO_H_
#define WSYNC_TOOLS_SPEC_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::tools {

absl::StatusOr<v1::TransferSpec> ReadSpecFile(const std::string& path);
// proto3 JSON mapping: lowerCamelCase field names, enums by name, int64 as
// strings; every field printed, defaults included (docs/plan-format.md).
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_SPEC_IO_H_
