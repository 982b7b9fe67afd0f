// TlsFileStage: TLS files an operator rotates in place, handed to gRPC's
// FileWatcherCertificateProvider only as whole, usable sets.
//
// The provider re-reads the key file and the certificate file one after the
// other and uses whatever pair it read; its only guard is that neither
// file's mtime, in whole seconds, changed while it read. An operator who
// replaces the key and then the certificate (each with an atomic `mv`)
// therefore hands it, if a reload falls between the two, a key that does not
// match its certificate, and every handshake fails until the next reload
// (a worker lost its reports and its lease that way, docs/security.md).
//
// The stage sits between the operator's files and the provider. It re-reads
// the operator's files every `interval` and publishes a set only when it is
// usable: each named file readable PEM, the key matching the first
// certificate of the chain, the CA bundle holding at least one certificate.
// A set that is not (a rotation half done, a truncated file) keeps the one
// published before, and is logged once per distinct problem. A set is
// published into a new directory of its own, its files stamped with an
// mtime (in seconds) no earlier set had, and made current by renaming one
// symlink; the provider reads through that symlink, so a read that spans a
// switch sees the mtimes change and reads again. Every set the provider
// keeps is one published set.
//
// The private directory (mode 0700) is made under, in order: $WSYNC_TLS_STAGE_DIR,
// /dev/shm, $TMPDIR, /tmp (the first writable one), named
// wsync-tls-<pid>-XXXXXX, and holds a file `lock` the stage keeps locked
// (flock) for its life; it is removed when the stage is destroyed, and a
// directory of this user and name whose lock nobody holds (its process was
// killed; in whatever PID namespace) is removed when a stage starts. It
// holds a copy of the private key, readable by this user only.
//
// Thread-safe.
#ifndef WSYNC_COMMON_TLS_FILE_STAGE_H_
#define WSYNC_COMMON_TLS_FILE_STAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace wsync {

class TlsFileStage {
 public:
  // One file of a set: its path and the name it goes by in messages (the
  // flag, e.g. "--key"). An empty path: the set has no such file.
  struct File {
    std::string path;
    std::string flag;
  };
  struct Options {
    File key;   // private key (PEM); named together with `cert`
    File cert;  // certificate chain (PEM), the leaf first
    File ca;    // CA bundle (PEM)
    // How often the operator's files are re-read; 0: only by Refresh().
    absl::Duration interval = absl::Seconds(10);
    // Where the private directory goes; empty: the order above.
    std::string parent_dir;
  };

  // Reads, checks and publishes the operator's files. INVALID_ARGUMENT naming
  // the flag and the path when a file cannot be read or the set is not
  // usable (e.g. the key does not match the certificate); FAILED_PRECONDITION
  // when no private directory can be made.
  static absl::StatusOr<std::unique_ptr<TlsFileStage>> Start(Options options);
  ~TlsFileStage();  // stops re-reading; removes the private directory
  TlsFileStage(const TlsFileStage&) = delete;
  TlsFileStage& operator=(const TlsFileStage&) = delete;

  // The paths to give the provider (through the `current` symlink): empty
  // where the operator named no file. Fixed for the stage's life.
  const std::string& key_path() const { return key_path_; }
  const std::string& cert_path() const { return cert_path_; }
  const std::string& ca_path() const { return ca_path_; }
  const std::string& directory() const { return dir_; }

  // Re-reads the operator's files once: OK when they are unchanged or the new
  // set was published; the problem (and the previous set kept) when not.
  absl::Status Refresh() ABSL_LOCKS_EXCLUDED(refresh_mu_, mu_);
  // Sets published so far (1 after Start).
  int64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  TlsFileStage(Options options, std::string dir, int lock_fd);
  absl::Status Publish(const std::string& key, const std::string& cert, const std::string& ca)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  const Options options_;
  const std::string dir_;
  const int lock_fd_;  // `lock`, held (flock) until the directory is gone
  std::string key_path_, cert_path_, ca_path_;
  absl::Mutex refresh_mu_;  // one Refresh at a time: reads publish in order
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(refresh_mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stamp_ ABSL_GUARDED_BY(mu_) = 0;            // the last set's mtime, seconds
  std::string key_, cert_, ca_ ABSL_GUARDED_BY(mu_);  // the published set
  std::string logged_ ABSL_GUARDED_BY(mu_);           // the last problem logged
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace wsync

#endif  // WSYNC_COMMON_TLS_FILE_STAGE_H_
