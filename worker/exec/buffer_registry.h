// A worker's registered tensors: (side, buffer name) -> memory. The plan
// names buffers, never addresses; binding (bound_plan.h) resolves names here.
// A colocated worker holds both a source and a destination buffer set, which
// may reuse names, hence the side in the key.
//
// Not thread-safe: the worker agent owns it and binds plans on one thread.
// Every change moves generation() to a value unique in the process (never
// reused, also across registry instances); plans bound earlier must be
// rebound.
#ifndef WSYNC_WORKER_EXEC_BUFFER_REGISTRY_H_
#define WSYNC_WORKER_EXEC_BUFFER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "worker/plane/transport.h"

namespace wsync::exec {

enum class BufferSide { kSource, kDestination };
const char* BufferSideName(BufferSide side);

struct RegisteredBuffer {
  void* data = nullptr;
  int64_t bytes = 0;
  DType dtype = v1::DTYPE_UNSPECIFIED;
  transport::MemorySpace space = transport::MemorySpace::kHost;
};

class BufferRegistry {
 public:
  // ALREADY_EXISTS for a name registered on that side; INVALID_ARGUMENT for a
  // null pointer with bytes > 0, negative size or no dtype.
  absl::Status Register(BufferSide side, const std::string& name, const RegisteredBuffer& buffer);
  absl::Status Unregister(BufferSide side, const std::string& name);
  // Null if absent.
  const RegisteredBuffer* Find(BufferSide side, const std::string& name) const;
  bool Has(BufferSide side, const std::string& name) const { return Find(side, name) != nullptr; }
  uint64_t generation() const { return generation_; }
  size_t size() const { return buffers_.size(); }

 private:
  std::map<std::pair<BufferSide, std::string>, RegisteredBuffer> buffers_;
  uint64_t generation_ = NextGeneration();
  static uint64_t NextGeneration();
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_EXEC_BUFFER_REGISTRY_H_
