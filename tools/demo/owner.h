// An owner of one rank's tensors (what a trainer rank or an inference engine
// does), registered with its worker over the worker's local Unix-socket API:
// OwnerRank keeps them in one POSIX shared-memory object (host workers);
// gpu_owner.h keeps them in one CUDA allocation (workers with --device).
#ifndef WSYNC_TOOLS_DEMO_OWNER_H_
#define WSYNC_TOOLS_DEMO_OWNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/demo/layout_data.h"
#include "wsync/v1/worker_local.grpc.pb.h"

namespace wsync::demo {

// What the demo needs from an owner rank, wherever its memory lives. The
// demo fills and checks values through memory(), a host view.
class Owner {
 public:
  virtual ~Owner() = default;
  // RegisterTensors on the worker (replace: drop the group's earlier ones).
  virtual absl::Status Register() = 0;
  virtual const BufferMap& memory() const = 0;
  virtual int64_t bytes() const = 0;
  virtual v1::WorkerLocal::Stub& stub() = 0;
  // Makes the host view's contents what the worker reads (before a sync).
  virtual absl::Status Publish() { return absl::OkStatus(); }
  // Makes the host view show what the worker wrote (after a sync).
  virtual absl::Status Fetch() { return absl::OkStatus(); }
};

// Creates a v1::WorkerLocal stub for the worker's socket.
std::unique_ptr<v1::WorkerLocal::Stub> LocalStub(const std::string& socket);
// Sends `req` to the worker; errors name the group and the socket.
absl::Status SendRegistration(v1::WorkerLocal::Stub& stub, const v1::RegisterTensorsRequest& req,
                              const std::string& socket);

class OwnerRank : public Owner {
 public:
  // Creates (exclusively) shm object `shm_name` sized for `buffers`.
  static absl::StatusOr<std::unique_ptr<OwnerRank>> Create(std::string socket, std::string group,
                                                           std::vector<BufferSpec> buffers,
                                                           std::string shm_name);
  ~OwnerRank() override;

  absl::Status Register() override;
  // The request Register() sends.
  v1::RegisterTensorsRequest Request() const;
  const BufferMap& memory() const override { return memory_; }
  const std::vector<BufferSpec>& buffers() const { return buffers_; }
  int64_t bytes() const override { return size_; }
  v1::WorkerLocal::Stub& stub() override { return *stub_; }

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
