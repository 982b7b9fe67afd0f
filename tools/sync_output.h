// What wsyncctl prints about syncs and controller state: phase names, the
// live progress line of `watch` / `sync --watch`, the outcome line and its
// exit code, protobuf messages as JSON (proto field names), and durations
// given on the command line.
#ifndef WSYNC_TOOLS_SYNC_OUTPUT_H_
#define WSYNC_TOOLS_SYNC_OUTPUT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "tools/controller_channel.h"
#include "wsync/v1/controller.pb.h"

namespace wsync::tools {

// "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED" ("UNSPECIFIED" otherwise).
const char* PhaseName(v1::SyncPhase phase);

// One line of progress: bar, percentage, bytes done / total (B, KB, MB or
// GB), rate (bytes_done / elapsed, GB/s), workers done / total and the ETA at
// that rate.
std::string ProgressLine(const v1::SyncStatus& status, int bar_width = 24);

// The outcome: "... SUCCEEDED after 0.120 s: 1.234 GB (10.3 GB/s), 2/2 workers", or
// "... FAILED: group G rank R (worker W, round N, op K): error (code C)".
std::string OutcomeLine(const v1::SyncStatus& status);

// kExitOk for SUCCEEDED, kExitFailed for every other phase.
int OutcomeExitCode(const v1::SyncStatus& status);

// Follows WatchSync(sync_id) to its end: on a terminal (`live`) one progress
// line rewritten in place, else a plain line per update; then the outcome
// line. Returns OutcomeExitCode, or kExitFailed (logged with the gRPC code)
// when the stream fails or ends while the sync still runs.
int FollowSync(const Controller& controller, const std::string& sync_id, int64_t timeout_ms,
               bool live);

// `message` as indented JSON with the proto field names.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);
// Prints ToJson(message) and a newline to stdout: kExitOk, or kExitFailed
// after logging "<command>: <why>".
int PrintJson(const google::protobuf::Message& message, const std::string& command);

// A duration flag's value in milliseconds: "250ms", "30s", "2m", "1h" or a
// bare number of milliseconds. INVALID_ARGUMENT naming `flag` otherwise, or
// when negative.
absl::StatusOr<int64_t> ParseMillis(const std::string& text, const std::string& flag);

}  // namespace wsync::tools

#endif  // WSYNC_TOOLS_SYNC_OUTPUT_H_
