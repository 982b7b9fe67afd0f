// One mmap of a whole POSIX shared-memory object (host buffers registered by
// owner processes, and peers' buffers written directly).
#ifndef WSYNC_WORKER_BACKENDS_HOST_SHM_MAPPING_H_
#define WSYNC_WORKER_BACKENDS_HOST_SHM_MAPPING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace wsync::host {

// Unmapped on destruction.
class ShmMapping {
 public:
  // Maps `name` read-write. Errors name the object.
  static absl::StatusOr<std::shared_ptr<ShmMapping>> Open(const std::string& name);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // "<st_dev>:<st_ino>" of the object mapped: a name unlinked and created
  // again names another object.
  const std::string& identity() const { return identity_; }

 private:
  ShmMapping(std::string name, std::string identity, uint8_t* data, int64_t size)
      : name_(std::move(name)), identity_(std::move(identity)), data_(data), size_(size) {}
  std::string name_;
  std::string identity_;
  uint8_t* data_;
  int64_t size_;
};

}  // namespace wsync::host

#endif  // WSYNC_WORKER_BACKENDS_HOST_SHM_MAPPING_H_
