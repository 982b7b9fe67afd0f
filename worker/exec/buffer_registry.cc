#include "worker/exec/buffer_registry.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace wsync::exec {

uint64_t BufferRegistry::NextGeneration() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

const char* BufferSideName(BufferSide side) {
  return side == BufferSide::kSource ? "source" : "destination";
}

absl::Status BufferRegistry::Register(BufferSide side, const std::string& name,
                                      const RegisteredBuffer& buffer) {
  if (buffer.bytes < 0 || (buffer.data == nullptr && buffer.bytes > 0) ||
      DTypeSize(buffer.dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(BufferSideName(side), " buffer '", name, "': invalid registration (",
                     buffer.bytes, " bytes at ", buffer.data == nullptr ? "null" : "non-null",
                     ", dtype ", DTypeName(buffer.dtype), ")"));
  }
  if (!buffers_.emplace(std::make_pair(side, name), buffer).second) {
    return absl::AlreadyExistsError(
        absl::StrCat(BufferSideName(side), " buffer '", name, "' is already registered"));
  }
  generation_ = NextGeneration();
  return absl::OkStatus();
}

absl::Status BufferRegistry::Unregister(BufferSide side, const std::string& name) {
  if (buffers_.erase(std::make_pair(side, name)) == 0) {
    return absl::NotFoundError(
        absl::StrCat(BufferSideName(side), " buffer '", name, "' is not registered"));
  }
  generation_ = NextGeneration();
  return absl::OkStatus();
}

const RegisteredBuffer* BufferRegistry::Find(BufferSide side, const std::string& name) const {
  auto it = buffers_.find(std::make_pair(side, name));
  return it == buffers_.end() ? nullptr : &it->second;
}

}  // namespace wsync::exec
