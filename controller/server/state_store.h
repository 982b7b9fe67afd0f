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
// Save alternates between two files, <path> and <path>.alt, overwriting the
// older one in place (no rename, no new file after the first two saves: a
// save touches no directory and allocates nothing, which is what made
// tmp+rename cost 0.2-0.7 ms on ext4). Each write carries a save_sequence;
// Load takes the valid file with the higher one. A crash mid-write leaves
// that file corrupt and the other one holding the previous state: the old
// or the new state, never a mix. A corrupt file beside a valid one is
// logged and skipped; with no valid file at all Load fails.
// When the bytes reach the disk depends on the flush mode:
//  - kEverySave: Save fdatasyncs the file (and, when it created it, the
//    directory) before it returns; a saved state survives a power cut.
//  - kBackground: Save returns once the bytes are written (they survive the
//    controller's own crash at once); a flusher thread fdatasyncs them right
//    after, coalescing saves that arrive meanwhile. A save waits for the
//    flush of the file it keeps, so at most one file is unflushed: a power
//    cut can lose the last save (about a millisecond), never both files.
//    Flush() waits for every earlier save. A failed flush is logged once
//    per streak of failures (and once when flushing works again) and
//    reported to the flush-failure listener every time.
// Save and Load are not thread-safe: the owner (SyncCoordinator) serializes
// them; Flush may be called from any thread.
#ifndef WSYNC_CONTROLLER_SERVER_STATE_STORE_H_
#define WSYNC_CONTROLLER_SERVER_STATE_STORE_H_

#include <unistd.h>

#include <cstdint>
#include <functional>
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
// The file's bytes for a serialized ControllerState.
std::string FrameState(absl::string_view payload);
// Appends to `out` a ControllerState `transfers` entry made of two encoded
// TransferState parts (protobuf merges concatenated encodings: `cached`
// may hold fields encoded once, e.g. the spec, `fresh` the rest).
void AppendTransferState(absl::string_view cached, absl::string_view fresh, std::string* out);
// Parses EncodeState's output; `what` (the file name) prefixes every error
// (DATA_LOSS for a damaged file, FAILED_PRECONDITION for another format).
absl::StatusOr<v1::ControllerState> DecodeState(absl::string_view bytes, const std::string& what);
// IEEE 802.3 CRC-32 (zlib's crc32).
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
  // The current saved state (see above); an empty one when neither file
  // exists. Errors name the file (unreadable, corrupt). Later saves go on
  // from the loaded state's save_sequence.
  absl::StatusOr<v1::ControllerState> Load();
  // Writes `state` (its save_sequence set here) over the older file.
  absl::Status Save(const v1::ControllerState& state);
  // The same for a serialized ControllerState (its save_sequence is
  // appended here, which overrides any in `payload`).
  absl::Status SaveSerialized(std::string payload);
  // Returns once every earlier Save is on the disk, with the first flush
  // error since the last Flush (kEverySave: at once, OK).
  absl::Status Flush();
  // Moves damaged files aside to "<file>.corrupt-<unix seconds>" (for
  // --state_start_empty); returns the new name of <path> (or of <path>.alt
  // when only it existed).
  absl::StatusOr<std::string> MoveAside();
  int64_t saves() const { return saves_; }
  // Called by the flusher (kBackground) on every failed flush, with the
  // error and the failures in a row so far (1 for the first of a streak).
  // Set before the first save; it must not call back into the store.
  void SetFlushFailureListener(std::function<void(const absl::Status&, int64_t streak)> listener) {
    flush_failed_ = std::move(listener);
  }
  // Tests only: the call that syncs a file's data (default ::fdatasync),
  // to inject the failures a real disk gives rarely (EIO, ENOSPC).
  void SetDataSyncForTesting(int (*data_sync)(int fd)) { data_sync_ = data_sync; }
  StateFlush flush_mode() const { return flush_; }

 private:
  // One of the two files, opened on first use and kept open.
  struct Slot {
    std::string path;
    int fd = -1;
    bool created = false;  // by this store: its directory entry needs a sync
  };
  absl::Status Write(Slot& slot, const std::string& bytes);
  absl::Status SyncSlot(int index);
  void CloseSlots();
  void FlushLoop();

  const std::string path_;
  const StateFlush flush_;
  int64_t saves_ = 0;
  int64_t sequence_ = 0;  // of the last state loaded or saved
  Slot slots_[2];
  int current_ = 1;  // the slot holding that state (a fresh store saves to 0 first)

  absl::Mutex mu_;
  absl::CondVar cv_;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // saves written in place
  int64_t flushed_ ABSL_GUARDED_BY(mu_) = 0;  // saves known to be on the disk
  // The written_ count of each file's last write: synced once flushed_
  // reaches it.
  int64_t written_at_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  absl::Status flush_error_ ABSL_GUARDED_BY(mu_);
  int64_t failed_flushes_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const absl::Status&, int64_t)> flush_failed_;
  int (*data_sync_)(int fd) = ::fdatasync;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread flusher_;  // kBackground only
};

}  // namespace wsync::controller

#endif  // WSYNC_CONTROLLER_SERVER_STATE_STORE_H_
