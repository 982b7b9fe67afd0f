// An owner rank whose tensors live in one CUDA allocation on one GPU, as a
// trainer's or vLLM's parameters do, registered with its worker (started
// with --device) by CUDA IPC handle. The demo fills and checks a host mirror
// and copies it to and from the device around each sync (Publish / Fetch).
// Only WSYNC_WITH_CUDA builds have one (gpu_owner.cc); elsewhere
// CreateGpuOwner says what to rebuild (gpu_owner_none.cc).
#ifndef WSYNC_TOOLS_DEMO_GPU_OWNER_H_
#define WSYNC_TOOLS_DEMO_GPU_OWNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/demo/owner.h"

namespace wsync::demo {

absl::StatusOr<std::unique_ptr<Owner>> CreateGpuOwner(std::string socket, std::string group,
                                                      std::vector<BufferSpec> buffers, int device);

// GPUs this process sees (0 without CUDA or without a driver).
int VisibleGpus();

}  // namespace wsync::demo

#endif  // WSYNC_TOOLS_DEMO_GPU_OWNER_H_
