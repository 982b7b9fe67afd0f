// Host-only build: no GPU data plane.
#include "absl/strings/str_cat.h"
#include "worker/agent/gpu_plane.h"

namespace wsync::agent {

absl::StatusOr<std::unique_ptr<GpuPlane>> CreateGpuPlane(int device) {
  return absl::UnimplementedError(
      absl::StrCat("--device ", device,
                   ": this wsync-worker was built without the GPU data plane (configure with "
                   "-DWSYNC_WITH_CUDA=ON)"));
}

}  // namespace wsync::agent
