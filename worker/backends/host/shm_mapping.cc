#include "worker/backends/host/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wsync::host {

absl::StatusOr<std::shared_ptr<ShmMapping>> ShmMapping::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("shm_open('", name, "'): ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat of shm '", name, "': ", std::strerror(err)));
  }
  if (st.st_size <= 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shm '", name, "' is empty"));
  }
  // Populated now (registration, a warm-up's peer mapping): the first sync
  // then takes no page fault on it (docs/warm-up.md).
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  close(fd);  // the mapping stays valid without the descriptor
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of shm '", name, "': ", std::strerror(err)));
  }
  return std::shared_ptr<ShmMapping>(new ShmMapping(name, absl::StrCat(st.st_dev, ":", st.st_ino),
                                                    static_cast<uint8_t*>(p),
                                                    static_cast<int64_t>(st.st_size)));
}

ShmMapping::~ShmMapping() { munmap(data_, static_cast<size_t>(size_)); }

}  // namespace wsync::host
