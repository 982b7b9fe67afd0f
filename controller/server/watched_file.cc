#include "controller/server/watched_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace wsync::controller {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path, "'"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<bool> WatchedFile::Changed() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < interval_) return false;
  checked_ = now;
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot stat ", flag_, " '", path_, "'"));
  }
  if (st.st_size == size_ && st.st_mtim.tv_sec == mtime_.tv_sec &&
      st.st_mtim.tv_nsec == mtime_.tv_nsec) {
    return false;
  }
  mtime_ = st.st_mtim;
  size_ = st.st_size;
  return true;
}

void WatchedFile::Forget() {
  absl::MutexLock lock(&mu_);
  size_ = -1;
  mtime_ = {};
}

}  // namespace wsync::controller
