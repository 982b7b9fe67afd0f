// Status propagation helpers (this Abseil release ships none publicly).
#ifndef WSYNC_COMMON_STATUS_MACROS_H_
#define WSYNC_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define WSYNC_CONCAT_INNER_(a, b) a##b
#define WSYNC_CONCAT_(a, b) WSYNC_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status wsync_status_ = (expr);     \
    if (!wsync_status_.ok()) return wsync_status_; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(WSYNC_CONCAT_(wsync_statusor_, __LINE__), lhs, expr)

#endif  // WSYNC_COMMON_STATUS_MACROS_H_
