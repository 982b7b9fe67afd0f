#include "common/tls_file_stage.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/openssl_ptr.h"

namespace wsync {
namespace {

constexpr char kPrefix[] = "wsync-tls-";
constexpr char kLock[] = "lock";
// Larger than any key, certificate chain or CA bundle (a full public bundle
// is ~200 KiB).
constexpr size_t kMaxFileBytes = size_t{4} << 20;

std::string Named(const TlsFileStage::File& f) { return absl::StrCat(f.flag, " '", f.path, "'"); }

absl::StatusOr<std::string> ReadFile(const TlsFileStage::File& f) {
  const int fd = open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", Named(f), ": ", std::strerror(errno)));
  }
  std::string text;
  char buf[16384];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", Named(f), ": ", std::strerror(err)));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxFileBytes) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(Named(f), " is over ", kMaxFileBytes >> 20,
                                                     " MiB: not a PEM key, chain or CA bundle"));
    }
  }
  close(fd);
  return text;
}

X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  if (bio == nullptr) return nullptr;
  X509Ptr x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return x;
}

// OK when the named files of a set can be used together.
absl::Status CheckSet(const TlsFileStage::Options& o, const std::string& key,
                      const std::string& cert, const std::string& ca) {
  if (!o.ca.path.empty() && FirstCertificate(ca) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Named(o.ca), " holds no PEM certificate"));
  }
  if (o.key.path.empty()) return absl::OkStatus();
  X509Ptr leaf = FirstCertificate(cert);
  if (leaf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Named(o.cert), " holds no PEM certificate"));
  }
  BioPtr bio = MemBio(key);
  PkeyPtr pkey(bio == nullptr ? nullptr
                              : PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(o.key), " holds no PEM private key (an encrypted key is not read)"));
  }
  const int match = X509_check_private_key(leaf.get(), pkey.get());
  ERR_clear_error();
  if (match != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the key in ", Named(o.key), " does not match the first certificate in ",
                     Named(o.cert), " (replaced one of them but not yet the other?)"));
  }
  return absl::OkStatus();
}

bool WritableDirectory(const std::string& path) {
  struct stat st {};
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         access(path.c_str(), W_OK | X_OK) == 0;
}

std::string ParentDirectory(const std::string& asked) {
  if (!asked.empty()) return asked;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("WSYNC_TLS_STAGE_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  candidates.push_back("/dev/shm");
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr) candidates.push_back(tmp);
  candidates.push_back("/tmp");
  for (const std::string& c : candidates) {
    if (WritableDirectory(c)) return c;
  }
  return "/tmp";
}

// Removes wsync-tls-* directories of this user whose `lock` nobody holds.
// One without a lock file (being made, or not ours) is left alone.
void RemoveStale(const std::string& parent) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, kPrefix)) continue;
    struct stat st {};
    if (lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) {
      continue;
    }
    const std::string lock = entry.path().string() + "/" + kLock;
    const int fd = open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) std::filesystem::remove_all(entry.path(), ec);
    close(fd);
  }
}

absl::Status WriteStamped(const std::string& path, const std::string& text, int64_t stamp) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "nothing written";
      close(fd);
      return absl::InternalError(absl::StrCat("cannot write '", path, "': ", why));
    }
    done += static_cast<size_t>(n);
  }
  const struct timespec times[2] = {{stamp, 0}, {stamp, 0}};
  const int rc = futimens(fd, times);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot stamp '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

std::string Generation(int64_t n) { return absl::StrCat("set-", n); }

}  // namespace

absl::StatusOr<std::unique_ptr<TlsFileStage>> TlsFileStage::Start(Options options) {
  if (options.key.path.empty() != options.cert.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.key.flag, " and ", options.cert.flag, " go together"));
  }
  const std::string parent = ParentDirectory(options.parent_dir);
  RemoveStale(parent);
  std::string dir = absl::StrCat(parent, "/", kPrefix, getpid(), "-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make the private TLS directory under '", parent, "' (",
                     std::strerror(errno), "): set WSYNC_TLS_STAGE_DIR to a writable directory"));
  }
  // Locked before it has its name: another stage's RemoveStale never finds
  // it unlocked.
  const std::string lock = dir + "/" + kLock;
  const std::string unnamed = lock + ".new";
  const int lock_fd = open(unnamed.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0 ||
      rename(unnamed.c_str(), lock.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    if (lock_fd >= 0) close(lock_fd);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return absl::FailedPreconditionError(absl::StrCat("cannot lock '", lock, "' (", why,
                                                      "): set WSYNC_TLS_STAGE_DIR to a local "
                                                      "writable directory"));
  }
  std::unique_ptr<TlsFileStage> stage(
      new TlsFileStage(std::move(options), std::move(dir), lock_fd));
  if (absl::Status st = stage->Refresh(); !st.ok()) return st;
  if (stage->options_.interval > absl::ZeroDuration()) {
    stage->thread_ = std::thread([s = stage.get()] { s->Loop(); });
  }
  return stage;
}

TlsFileStage::TlsFileStage(Options options, std::string dir, int lock_fd)
    : options_(std::move(options)), dir_(std::move(dir)), lock_fd_(lock_fd) {
  const std::string current = dir_ + "/current/";
  if (!options_.key.path.empty()) key_path_ = current + "key.pem";
  if (!options_.cert.path.empty()) cert_path_ = current + "cert.pem";
  if (!options_.ca.path.empty()) ca_path_ = current + "ca.pem";
}

TlsFileStage::~TlsFileStage() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
  close(lock_fd_);  // after: a stage starting meanwhile must not take it for stale
}

int64_t TlsFileStage::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

absl::Status TlsFileStage::Refresh() {
  absl::MutexLock serial(&refresh_mu_);
  std::string text[3];
  const File* files[3] = {&options_.key, &options_.cert, &options_.ca};
  for (int i = 0; i < 3; ++i) {
    if (files[i]->path.empty()) continue;
    absl::StatusOr<std::string> read = ReadFile(*files[i]);
    if (!read.ok()) return read.status();
    text[i] = *std::move(read);
  }
  absl::MutexLock lock(&mu_);
  if (generation_ > 0 && text[0] == key_ && text[1] == cert_ && text[2] == ca_) {
    return absl::OkStatus();
  }
  if (absl::Status st = CheckSet(options_, text[0], text[1], text[2]); !st.ok()) return st;
  return Publish(text[0], text[1], text[2]);
}

absl::Status TlsFileStage::Publish(const std::string& key, const std::string& cert,
                                   const std::string& ca) {
  const int64_t next = generation_ + 1;
  const std::string set = Generation(next);
  const std::string path = absl::StrCat(dir_, "/", set);
  std::error_code ec;
  std::filesystem::remove_all(path, ec);  // a half-made one of a failed attempt
  if (mkdir(path.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("cannot make '", path, "': ", std::strerror(errno)));
  }
  // Later than every earlier set in whole seconds: the provider compares
  // second-granular mtimes around its read.
  const int64_t stamp = std::max(absl::ToUnixSeconds(absl::Now()), stamp_ + 1);
  const std::pair<const std::string*, const char*> files[] = {
      {&key_path_, "key.pem"}, {&cert_path_, "cert.pem"}, {&ca_path_, "ca.pem"}};
  const std::string* texts[] = {&key, &cert, &ca};
  for (int i = 0; i < 3; ++i) {
    if (files[i].first->empty()) continue;
    absl::Status st = WriteStamped(absl::StrCat(path, "/", files[i].second), *texts[i], stamp);
    if (!st.ok()) return st;
  }
  const std::string link = dir_ + "/current.new";
  unlink(link.c_str());
  if (symlink(set.c_str(), link.c_str()) != 0 ||
      rename(link.c_str(), (dir_ + "/current").c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot point '", dir_, "/current' at ", set, ": ", std::strerror(errno)));
  }
  // The set before stays (a read under way may still open it by path).
  if (next > 2) std::filesystem::remove_all(absl::StrCat(dir_, "/", Generation(next - 2)), ec);
  generation_ = next;
  stamp_ = stamp;
  key_ = key;
  cert_ = cert;
  ca_ = ca;
  return absl::OkStatus();
}

void TlsFileStage::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.interval)) return;
    }
    const int64_t before = generation();
    absl::Status st = Refresh();
    absl::MutexLock lock(&mu_);
    if (!st.ok()) {
      if (st.message() != logged_) {
        spdlog::warn("TLS files: {}; the files read before stay in use until this is fixed",
                     std::string(st.message()));
        logged_ = std::string(st.message());
      }
    } else {
      if (!logged_.empty()) spdlog::info("TLS files: usable again");
      logged_.clear();
      if (generation_ != before) {
        spdlog::info("TLS files: new files in use ({})",
                     Named(options_.cert.path.empty() ? options_.ca : options_.cert));
      }
    }
  }
}

}  // namespace wsync
