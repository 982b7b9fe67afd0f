// The declared range of a buffer location (an owner's registration or a
// peer's buffer list), checked before anything is opened: offset and size
// non-negative, offset + size representable (no int64 wrap) and at least
// `bytes` (what the tensor's dtype and shape need) long. The backend then
// checks the range against the object it maps (the host backend with
// common/checked_math.h's RangeWithin; the CUDA one against the allocation).
#ifndef WSYNC_WORKER_AGENT_LOCATION_BOUNDS_H_
#define WSYNC_WORKER_AGENT_LOCATION_BOUNDS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "worker/plane/backend.h"

namespace wsync::agent {

// INVALID_ARGUMENT / OUT_OF_RANGE naming `what` and the location's fields.
absl::Status CheckLocationRange(const plane::BufferLocation& where, int64_t bytes,
                                const std::string& what);

}  // namespace wsync::agent

#endif  // WSYNC_WORKER_AGENT_LOCATION_BOUNDS_H_
