// Host-only build: no GPU owners.
#include "absl/strings/str_cat.h"
#include "tools/demo/gpu_owner.h"

namespace wsync::demo {

absl::StatusOr<std::unique_ptr<Owner>> CreateGpuOwner(std::string, std::string group,
                                                      std::vector<BufferSpec>, int device) {
  return absl::UnimplementedError(
      absl::StrCat("GPU owner for group '", group, "' on device ", device,
                   ": this build has no CUDA (configure with -DWSYNC_WITH_CUDA=ON)"));
}

int VisibleGpus() { return 0; }

}  // namespace wsync::demo
