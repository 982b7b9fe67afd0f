// The backends this build has, by name: one registration line each in
// backend_registry.cc.
#ifndef WSYNC_WORKER_NODE_BACKEND_REGISTRY_H_
#define WSYNC_WORKER_NODE_BACKEND_REGISTRY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/plane/backend.h"

namespace wsync::node {

using BackendFactory =
    absl::StatusOr<std::unique_ptr<plane::Backend>> (*)(const plane::BackendConfig&);

// The names registered in this build ("host", and "cuda" with WSYNC_WITH_CUDA).
std::vector<std::string> BackendNames();
// Backend `name` made from `config`. NOT_FOUND for a name this build does
// not have, naming the ones it has (and, for "cuda", the build option).
absl::StatusOr<std::unique_ptr<plane::Backend>> CreateBackend(const std::string& name,
                                                              const plane::BackendConfig& config);
// What wsync-worker's flags pick: "cuda" with a device, else "host".
std::string BackendNameFor(const plane::BackendConfig& config);

}  // namespace wsync::node

#endif  // WSYNC_WORKER_NODE_BACKEND_REGISTRY_H_
