// Helpers shared by the executor's source files (executor.cc,
// executor_tokens.cc); not part of its interface.
#ifndef WSYNC_WORKER_EXEC_EXECUTOR_INTERNAL_H_
#define WSYNC_WORKER_EXEC_EXECUTOR_INTERNAL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wsync::exec::internal {

// `s` with `where` in front of its message (OK stays OK).
inline absl::Status Wrap(const absl::Status& s, const std::string& where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

}  // namespace wsync::exec::internal

#endif  // WSYNC_WORKER_EXEC_EXECUTOR_INTERNAL_H_
