// Leveled, timestamped logging for every wsync process and tool: spdlog
// (Debian's libspdlog) writing to stderr. Use the spdlog calls directly with
// fmt-style arguments, e.g. `spdlog::info("worker {} registered", id)`;
// InitLogging sets the format and the level once at start.
//
// Level: WSYNC_LOG_LEVEL (trace, debug, info, warn, error, critical, off),
// default info. Lines look like
//   2026-11-26T22:41:07.123Z I wsync-worker[4711] registered as worker 3
#ifndef WSYNC_COMMON_LOGGING_H_
#define WSYNC_COMMON_LOGGING_H_

#include <string_view>

#include "spdlog/spdlog.h"  // IWYU pragma: export

namespace wsync {

// Makes stderr the default sink with the format above and the level from
// WSYNC_LOG_LEVEL, naming the process `program`. Safe to call more than once
// (the last call wins); an unknown level is reported and info is used.
void InitLogging(std::string_view program);

}  // namespace wsync

#endif  // WSYNC_COMMON_LOGGING_H_
