// An owner of one rank's tensors (what a trainer rank or an inference engine
// does): one POSIX shared-memory object holding all its buffers, registered
// with its worker over the worker's local Unix-socket API.
#ifndef WSYNC_TOOLS_DEMO_OWNER_H_
#define WSYNC_TOOLS_DEMO_OWNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/demo/layout_data.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::demo {

class OwnerRank {
 public:
  // Creates (exclusively) shm object `shm_name` sized for `buffers`.
  static absl::StatusOr<std::unique_ptr<OwnerRank>> Create(std::string socket, std::string group,
                                                           std::vector<BufferSpec> buffers,
                                                           std::string shm_name);
  ~OwnerRank();

  // RegisterTensors on the worker (replace: drop the group's earlier ones).
  absl::Status Register();
  // The request Register() sends.
  v1::RegisterTensorsRequest Request() const;
  const BufferMap& memory() const { return memory_; }
  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  int64_t bytes() const { return size_; }
  v1::WorkerLocal::Stub& stub() { return *stub_; }

 private:
  OwnerRank() = default;
  std::string socket_;
  std::string group_;
  std::vector<BufferSpec> buffers_;
  std::vector<int64_t> offsets_;
  std::string shm_name_;
  uint8_t* base_ = nullptr;
  int64_t size_ = 0;
  BufferMap memory_;
  std::unique_ptr<v1::WorkerLocal::Stub> stub_;
};

}  // namespace wsync::demo

#endif  // WSYNC_TOOLS_DEMO_OWNER_H_
