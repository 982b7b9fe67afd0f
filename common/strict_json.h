// Strict checks on a proto3 JSON document before protobuf parses it.
// google::protobuf::util::JsonStringToMessage keeps the last of duplicate
// keys and flattens a nested array in a repeated scalar field
// ("shape": [[64, 32]] reads as [64, 32]); a layout spec with either is
// almost certainly wrong, so CheckStrictJson refuses both, naming where:
// the field's path from the root and the nearest enclosing object with a
// "name" (e.g. "tensor 'layers.0.w'"). It also refuses a scalar field given
// an array or object, nesting deeper than kMaxJsonDepth, and text that is not
// JSON. Unknown fields are left to the protobuf parser.
#ifndef WSYNC_COMMON_STRICT_JSON_H_
#define WSYNC_COMMON_STRICT_JSON_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace wsync {

inline constexpr int kMaxJsonDepth = 64;

// INVALID_ARGUMENT starting with `source` (e.g. "spec 'a.json'") on the first
// violation; OK otherwise. `root`: the message type the document encodes.
absl::Status CheckStrictJson(absl::string_view json, const google::protobuf::Descriptor& root,
                             absl::string_view source);

}  // namespace wsync

#endif  // WSYNC_COMMON_STRICT_JSON_H_
