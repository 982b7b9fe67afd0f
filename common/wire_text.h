#ifndef WSYNC_COMMON_WIRE_TEXT_H_
#define WSYNC_COMMON_WIRE_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace wsync {

// The longest error message (bytes) a status carries to a client. gRPC sends
// a status message in the trailers (percent-encoded, so up to 3 x on the
// wire), and clients refuse metadata over 8 KiB by default: a longer message
// (one that echoes a huge request field, say) would reach the client as
// "received metadata size exceeds limit", or stall the call.
inline constexpr size_t kMaxWireMessageBytes = 2048;

// `text` if it is at most `max` bytes; else its first bytes (cut on a UTF-8
// character boundary) and " [... N bytes cut]", at most `max` bytes in all
// for any max >= 64.
std::string ClipForWire(absl::string_view text, size_t max = kMaxWireMessageBytes);

}  // namespace wsync

#endif  // WSYNC_COMMON_WIRE_TEXT_H_
