// libFuzzer target: the control fast lane's frame parser
// (common/lane_frame.h) as the controller's lane thread runs it
// (controller/server/lane_server.cc RunFrames): bytes arrive in chunks of
// arbitrary sizes (the first input byte picks them), each complete frame is
// parsed as a LaneRequest, an error ends the connection. Checks: a frame
// never claims more than the buffer holds or than the limit; what parses
// re-encodes to a frame that parses to the same request; the buffer a
// connection holds never grows past one frame and one chunk.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/lane_frame.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "wsync/v1/lane.pb.h"

namespace {

constexpr uint32_t kMaxFrame = 1024;  // small: the limit is reached often

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string in;
  for (size_t at = 0; at < input.size(); at += chunk) {
    in.append(input, at, chunk);
    Check(in.size() <= wsync::kLaneHeaderBytes + kMaxFrame + chunk);
    size_t used = 0;
    while (true) {
      const absl::string_view rest = absl::string_view(in).substr(used);
      absl::StatusOr<wsync::LaneFrame> frame = wsync::NextLaneFrame(rest, kMaxFrame);
      if (!frame.ok()) return 0;  // the connection is closed
      if (frame->consumed == 0) break;
      Check(frame->consumed <= rest.size());
      Check(frame->payload.size() <= kMaxFrame);
      Check(frame->consumed == wsync::kLaneHeaderBytes + frame->payload.size());
      used += frame->consumed;
      wsync::v1::LaneRequest req;
      if (!wsync::ParseLanePayload(frame->payload, "LaneRequest", &req).ok()) return 0;
      std::string again;
      if (!wsync::AppendLaneFrame(req, wsync::kLaneMaxFrameBytes, &again).ok()) continue;
      absl::StatusOr<wsync::LaneFrame> back =
          wsync::NextLaneFrame(again, wsync::kLaneMaxFrameBytes);
      Check(back.ok() && back->consumed == again.size());
      wsync::v1::LaneRequest reparsed;
      Check(wsync::ParseLanePayload(back->payload, "LaneRequest", &reparsed).ok());
      Check(reparsed.SerializeAsString() == req.SerializeAsString());
    }
    in.erase(0, used);
  }
  return 0;
}
