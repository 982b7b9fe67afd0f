#include "worker/node/backend_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/backends/host/host_backend.h"
#ifdef WSYNC_WITH_CUDA
#include "worker/backends/cuda/cuda_backend.h"
#endif

namespace wsync::node {
namespace {

struct Registration {
  const char* name;
  BackendFactory factory;
};

// One line per backend.
const Registration kBackends[] = {
    {"host", &host::CreateHostBackend},
#ifdef WSYNC_WITH_CUDA
    {"cuda", &cuda::CreateCudaBackend},
#endif
};

}  // namespace

std::vector<std::string> BackendNames() {
  std::vector<std::string> names;
  for (const Registration& r : kBackends) names.push_back(r.name);
  return names;
}

absl::StatusOr<std::unique_ptr<plane::Backend>> CreateBackend(const std::string& name,
                                                              const plane::BackendConfig& config) {
  for (const Registration& r : kBackends) {
    if (name == r.name) return r.factory(config);
  }
  std::string hint;
  if (name == "cuda") {
    hint = absl::StrCat("--device ", config.device,
                        ": this wsync-worker was built without the GPU data plane (configure "
                        "with -DWSYNC_WITH_CUDA=ON); ");
  }
  return absl::UnimplementedError(
      absl::StrCat(hint, "no data-plane backend '", name,
                   "' in this build (it has: ", absl::StrJoin(BackendNames(), ", "), ")"));
}

std::string BackendNameFor(const plane::BackendConfig& config) {
  return config.device >= 0 ? "cuda" : "host";
}

}  // namespace wsync::node
