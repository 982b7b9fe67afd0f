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
// Save writes "<path>.tmp" and renames it over <path>: a crash at any moment
// leaves either the old or the new state, never a mix. When the bytes reach
// the disk depends on the flush mode:
//  - kEverySave: Save fsyncs the file before the rename and the directory
//    after it; a saved state survives a power cut once Save returns.
//  - kBackground: Save returns once the new file is in place (it survives
//    the controller's own crash at once); a flusher thread fsyncs the file
//    and its directory right after, coalescing saves that arrive meanwhile.
//    A power cut can lose the saves of the last flush (about one fsync, a
//    millisecond or so); Flush() waits for them.
// Save and Load are not thread-safe: the owner (SyncCoordinator) serializes
// them; Flush may be called from any thread.
#ifndef WSYNC_CONTROLLER_SERVER_STATE_STORE_H_
#define WSYNC_CONTROLLER_SERVER_STATE_STORE_H_

#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
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

enum class StateFlush { kEverySave, kBackground };

// Parses --state_fsync ("always" = kEverySave, "background").
absl::StatusOr<StateFlush> ParseStateFlush(absl::string_view mode);

class StateStore {
 public:
  explicit StateStore(std::string path, StateFlush flush = StateFlush::kEverySave);
  // Flushes what is pending (kBackground) and stops the flusher.
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  const std::string& path() const { return path_; }
  // The saved state; an empty one when the file does not exist. Errors name
  // the file (unreadable, corrupt).
  absl::StatusOr<v1::ControllerState> Load() const;
  // Replaces the file atomically; durably as the flush mode says (above).
  absl::Status Save(const v1::ControllerState& state);
  // Returns once every earlier Save is on the disk, with the first flush
  // error since the last Flush (kEverySave: at once, OK).
  absl::Status Flush();
  // Moves a damaged file aside to "<path>.corrupt-<unix seconds>" (for
  // --state_start_empty); returns the new name.
  absl::StatusOr<std::string> MoveAside() const;
  int64_t saves() const { return saves_; }
  StateFlush flush_mode() const { return flush_; }

 private:
  // Writes <path>.tmp (fsynced when `sync`) and renames it over <path>.
  absl::Status Replace(const std::string& bytes, bool sync);
  // fsyncs <path> and its directory.
  absl::Status SyncToDisk() const;
  void FlushLoop();

  const std::string path_;
  const StateFlush flush_;
  int64_t saves_ = 0;

  absl::Mutex mu_;
  absl::CondVar cv_;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // saves renamed into place
  int64_t flushed_ ABSL_GUARDED_BY(mu_) = 0;  // saves known to be on the disk
  absl::Status flush_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread flusher_;  // kBackground only
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_STATE_STORE_H_
