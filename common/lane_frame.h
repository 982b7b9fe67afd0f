// Frames of the control fast lane (proto/wsync/v1/lane.proto): a 4-byte
// little-endian payload length, then the payload (a serialized LaneRequest or
// LaneResponse). Bounded: a frame whose length is over the reader's limit is
// an error before any of its payload is buffered.
#ifndef WSYNC_COMMON_LANE_FRAME_H_
#define WSYNC_COMMON_LANE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"

namespace wsync {

inline constexpr size_t kLaneHeaderBytes = 4;
// The default largest request payload (a report names its dropped parts and
// verify results: far below this).
inline constexpr uint32_t kLaneMaxFrameBytes = 16u << 20;
// The largest answer: an assignment carries a worker's op list, as large as
// gRPC lets the controller send one (its 256 MiB message limit).
inline constexpr uint32_t kLaneMaxResponseBytes = 256u << 20;

// Appends `message` as one frame to *out. INVALID_ARGUMENT (nothing
// appended) when it serializes to more than `max_frame` bytes.
absl::Status AppendLaneFrame(const google::protobuf::MessageLite& message, uint32_t max_frame,
                             std::string* out);

// The next complete frame at the start of `buffer`.
struct LaneFrame {
  size_t consumed = 0;        // header + payload; 0: incomplete, read more
  absl::string_view payload;  // into `buffer`
};
// INVALID_ARGUMENT when the header announces more than `max_frame` bytes
// (naming both): the stream cannot be resynchronized, close it.
absl::StatusOr<LaneFrame> NextLaneFrame(absl::string_view buffer, uint32_t max_frame);

// Parses `payload` into *message; INVALID_ARGUMENT naming `what` when it is
// not one.
absl::Status ParseLanePayload(absl::string_view payload, absl::string_view what,
                              google::protobuf::MessageLite* message);

}  // namespace wsync

#endif  // WSYNC_COMMON_LANE_FRAME_H_
