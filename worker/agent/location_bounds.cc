#include "worker/agent/location_bounds.h"

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace wsync::agent {
namespace {

// [offset, +size) representable and at least `bytes` long.
absl::Status CheckRange(int64_t offset, int64_t size, int64_t bytes, const std::string& what) {
  RETURN_IF_ERROR(CheckedAdd(offset, size, what).status());
  if (bytes < 0 || bytes > size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": range [", offset, ", +", size, ") cannot hold ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLocationRange(const plane::BufferLocation& where, int64_t bytes,
                                const std::string& what) {
  if (where.shm != nullptr) {
    RETURN_IF_ERROR(CheckRange(where.shm->offset(), where.shm->size(), bytes,
                               absl::StrCat(what, " (shm '", where.shm->name(), "')")));
  }
  if (where.cuda_ipc != nullptr) {
    // (The CUDA backend checks the range against base_size, the allocation.)
    RETURN_IF_ERROR(CheckRange(where.cuda_ipc->offset(), where.cuda_ipc->size(), bytes,
                               absl::StrCat(what, " (CUDA IPC)")));
  }
  if (where.cuda_vmm != nullptr) {
    RETURN_IF_ERROR(CheckRange(where.cuda_vmm->offset(), where.cuda_vmm->size(), bytes,
                               absl::StrCat(what, " (CUDA virtual memory)")));
  }
  return absl::OkStatus();
}

}  // namespace wsync::agent
