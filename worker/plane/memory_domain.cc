#include "worker/plane/memory_domain.h"

#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace wsync::plane {
namespace {

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

// "<st_dev>:<st_ino>" of `path`, or empty.
std::string FileIdentity(const char* path) {
  struct stat st;
  if (stat(path, &st) != 0) return "";
  return absl::StrCat(st.st_dev, ":", st.st_ino);
}

}  // namespace

std::string HostMemoryDomain() {
  const std::string boot = BootId(), shm = FileIdentity("/dev/shm");
  if (boot.empty() || shm.empty()) return "";
  return absl::StrCat("shm:", boot, ":", shm);
}

std::string GpuMemoryDomain() {
  const std::string boot = BootId(), pid_ns = FileIdentity("/proc/self/ns/pid");
  if (boot.empty() || pid_ns.empty()) return "";
  return absl::StrCat("cuda:", boot, ":", pid_ns);
}

}  // namespace wsync::plane
