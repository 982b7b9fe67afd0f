// File descriptors an owner process handed to its worker in one batch
// (SCM_RIGHTS over the worker's descriptor socket, worker/agent/fd_inbox.h):
// e.g. the POSIX handles of CUDA virtual-memory allocations. The batch owns
// the descriptors and closes them when the last holder lets go; a backend
// that opens memory from them duplicates or imports what it keeps.
#ifndef WSYNC_WORKER_PLANE_FD_BATCH_H_
#define WSYNC_WORKER_PLANE_FD_BATCH_H_

#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wsync::plane {

class FdBatch {
 public:
  FdBatch(std::string token, std::vector<int> fds)
      : token_(std::move(token)), fds_(std::move(fds)) {}
  ~FdBatch() {
    for (int fd : fds_) ::close(fd);
  }
  FdBatch(const FdBatch&) = delete;
  FdBatch& operator=(const FdBatch&) = delete;

  const std::string& token() const { return token_; }
  int32_t size() const { return static_cast<int32_t>(fds_.size()); }
  // The descriptor at `index`, or -1 outside [0, size()).
  int fd(int32_t index) const {
    return index >= 0 && index < size() ? fds_[static_cast<size_t>(index)] : -1;
  }

 private:
  const std::string token_;
  const std::vector<int> fds_;
};

}  // namespace wsync::plane

#endif  // WSYNC_WORKER_PLANE_FD_BATCH_H_
