#include "worker/plane/kv_store.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace wsync::transport {

absl::Status InMemoryKvStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryKvStore::Get(const std::string& key, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&present), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("store key '", key, "' not set by deadline"));
  }
  return values_[key];
}

std::string FileKvStore::PathFor(const std::string& key) const {
  // Hex keeps any key a single safe file name.
  return absl::StrCat(dir_, "/", absl::BytesToHexString(key));
}

absl::Status FileKvStore::Set(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathFor(key);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      return absl::UnavailableError(absl::StrCat("store key '", key, "': cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("store key '", key, "': rename to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKvStore::Get(const std::string& key, absl::Time deadline) {
  const std::string path = PathFor(key);
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' not set by deadline (file ", path, ")"));
    }
    absl::SleepFor(std::min(poll_interval_, deadline - now));
  }
}

}  // namespace wsync::transport
