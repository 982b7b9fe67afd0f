// The CUDA backend's direct writer: puts from this GPU into peers' memory
// mapped by CUDA IPC with peer access (CudaBackend::OpenBuffer, peer =
// true). The put path itself (cuda_data_ops_put.cc) runs beside its
// CudaDataOps' stream on a put stream and the copy engines, keeps each
// prepared put list's copy list and kernel table resident (ItemsHandle), and
// shares the ops' retired memory, freed by their Synchronize(); the tokens
// move on a stream of their own. Not thread-safe; use it and its ops from one
// thread.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_CUDA_PEER_WRITER_H_
#define WSYNC_WORKER_BACKENDS_CUDA_CUDA_PEER_WRITER_H_

#include <memory>
#include <string>

#include "worker/backends/cuda/cuda_data_ops.h"
#include "worker/backends/cuda/cuda_handles.h"
#include "worker/plane/peer_writer.h"

namespace wsync::cuda {

class CudaPeerWriter : public exec::PeerWriter {
 public:
  // `ops` (not owned) outlives the writer.
  explicit CudaPeerWriter(CudaDataOps* ops) : ops_(ops) {}

  std::string Name() const override;
  exec::MemorySpace memory_space() const override { return exec::MemorySpace::kCuda; }

  absl::Status Put(absl::Span<const exec::CopyItem> items, exec::ItemsHandle handle,
                   bool alone) override;
  absl::Status Fence() override;
  absl::StatusOr<uint8_t*> TokenSlots(size_t count) override;
  absl::Status WriteToken(uint8_t* slot, uint64_t value) override;
  absl::StatusOr<uint64_t> ReadToken(const uint8_t* slot) override;

  CudaDataOps& ops() const { return *ops_; }

 private:
  CudaDataOps* const ops_;
  exec::StagingBuffer tokens_;  // device memory from the ops' staging pool
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_CUDA_PEER_WRITER_H_
