// StateStore: the controller's durable state (transfers, last delivered
// versions, the latest sync outcomes; proto wsync.v1.ControllerState) in one
// small file, so that a restarted controller serves the same transfers and
// never lets a version go backwards.
//
// File format (version 1): one text header line
//   "wsync-controller-state format=1 bytes=<N> crc32=<8 hex digits>\n"
// followed by exactly N bytes of the serialized ControllerState; crc32 is the
// IEEE CRC-32 of those bytes. Anything else (truncated, bad checksum, other
// format, trailing bytes) is a corrupt file: Load fails naming the file and
// what is wrong.
//
// Save writes "<path>.tmp", fsyncs it, renames it over <path> and fsyncs the
// directory: a crash at any moment leaves either the old or the new state,
// never a mix. Not thread-safe: its owner (SyncCoordinator) serializes calls.
#ifndef WSYNC_CONTROLLER_SERVER_STATE_STORE_H_
#define WSYNC_CONTROLLER_SERVER_STATE_STORE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "wsync/v1/controller_state.pb.h"

namespace wsync::controller {

inline constexpr int kStateFormat = 1;

// The file's bytes for `state` (header + payload).
std::string EncodeState(const v1::ControllerState& state);
// Parses EncodeState's output; `what` (the file name) prefixes every error
// (DATA_LOSS for a damaged file, FAILED_PRECONDITION for another format).
absl::StatusOr<v1::ControllerState> DecodeState(absl::string_view bytes, const std::string& what);
// IEEE 802.3 CRC-32 (as zlib's crc32).
uint32_t Crc32(absl::string_view bytes);

class StateStore {
 public:
  explicit StateStore(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  // The saved state; an empty one when the file does not exist. Errors name
  // the file (unreadable, corrupt).
  absl::StatusOr<v1::ControllerState> Load() const;
  // Replaces the file atomically and durably (see above).
  absl::Status Save(const v1::ControllerState& state);
  // Moves a damaged file aside to "<path>.corrupt-<unix seconds>" (for
  // --state_start_empty); returns the new name.
  absl::StatusOr<std::string> MoveAside() const;
  int64_t saves() const { return saves_; }

 private:
  const std::string path_;
  int64_t saves_ = 0;
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_STATE_STORE_H_
