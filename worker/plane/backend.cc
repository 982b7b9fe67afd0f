#include "worker/plane/backend.h"

#include <algorithm>

namespace wsync::plane {

const char* TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kGloo:
      return "gloo";
    case TransportKind::kNccl:
      return "nccl";
  }
  return "unknown";
}

bool Backend::CanWrite(const std::string& domain, const std::string& device_uuid) const {
  const std::string mine = MemoryDomain();
  if (mine.empty() || domain != mine) return false;
  const std::vector<std::string> devices = WritableDevices();
  if (devices.empty()) return device_uuid.empty();
  return std::find(devices.begin(), devices.end(), device_uuid) != devices.end();
}

}  // namespace wsync::plane
