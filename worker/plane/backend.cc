#include "worker/plane/backend.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace wsync::plane {

std::string TransportKindName(TransportKind kind) {
  return absl::AsciiStrToLower(absl::StripPrefix(v1::TransportKind_Name(kind), "TRANSPORT_"));
}

bool Backend::CanWrite(const std::string& domain, const std::string& device_uuid) const {
  const std::string mine = MemoryDomain();
  if (mine.empty() || domain != mine) return false;
  const std::vector<std::string> devices = WritableDevices();
  if (devices.empty()) return device_uuid.empty();
  return std::find(devices.begin(), devices.end(), device_uuid) != devices.end();
}

absl::StatusOr<std::unique_ptr<SwapArena>> Backend::NewSwapArena(int64_t bytes,
                                                                 const std::string& name) {
  return absl::UnimplementedError(absl::StrCat("backend ", Name(), " has no remappable arenas (",
                                               "arena '", name, "', ", bytes, " bytes)"));
}

}  // namespace wsync::plane
