#include "common/lane_frame.h"

#include "absl/strings/str_cat.h"

namespace wsync {

absl::Status AppendLaneFrame(const google::protobuf::MessageLite& message, uint32_t max_frame,
                             std::string* out) {
  const size_t size = message.ByteSizeLong();
  if (size > max_frame) {
    return absl::InvalidArgumentError(absl::StrCat("lane frame: a ", message.GetTypeName(), " of ",
                                                   size, " bytes is over the limit of ", max_frame,
                                                   " bytes"));
  }
  const size_t at = out->size();
  out->resize(at + kLaneHeaderBytes + size);
  char* p = out->data() + at;
  for (size_t i = 0; i < kLaneHeaderBytes; ++i) p[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  if (!message.SerializeToArray(p + kLaneHeaderBytes, static_cast<int>(size))) {
    out->resize(at);
    return absl::InternalError(
        absl::StrCat("lane frame: cannot serialize a ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

absl::StatusOr<LaneFrame> NextLaneFrame(absl::string_view buffer, uint32_t max_frame) {
  LaneFrame frame;
  if (buffer.size() < kLaneHeaderBytes) return frame;
  uint32_t size = 0;
  for (size_t i = 0; i < kLaneHeaderBytes; ++i) {
    size |= static_cast<uint32_t>(static_cast<unsigned char>(buffer[i])) << (8 * i);
  }
  if (size > max_frame) {
    return absl::InvalidArgumentError(absl::StrCat("lane frame: the header announces ", size,
                                                   " bytes, over the limit of ", max_frame,
                                                   " bytes (not a wsync lane peer?)"));
  }
  // size <= max_frame < 2^32: no overflow in size_t.
  if (buffer.size() - kLaneHeaderBytes < size) return frame;
  frame.consumed = kLaneHeaderBytes + size;
  frame.payload = buffer.substr(kLaneHeaderBytes, size);
  return frame;
}

absl::Status ParseLanePayload(absl::string_view payload, absl::string_view what,
                              google::protobuf::MessageLite* message) {
  if (payload.size() > static_cast<size_t>(INT32_MAX) ||
      !message->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("lane frame: ", payload.size(), " bytes that are not a ", what));
  }
  return absl::OkStatus();
}

}  // namespace wsync
