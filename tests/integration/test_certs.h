// Test certificates made with Debian's openssl: a CA, the controller's
// certificate (SAN IP 127.0.0.1 / DNS localhost) and client certificates with
// the URI SANs of docs/security.md. Short-lived, EC P-256 (fast to make).
#ifndef WSYNC_TESTS_INTEGRATION_TEST_CERTS_H_
#define WSYNC_TESTS_INTEGRATION_TEST_CERTS_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace wsync::integration {

// In `dir`: ca.pem / ca.key, then <name>.pem / <name>.key per Issue call.
class TestCerts {
 public:
  // Makes the CA.
  static absl::StatusOr<TestCerts> Create(const std::string& dir) {
    TestCerts c(dir);
    absl::Status st = c.Run(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout ca.key -out ca.pem -days 2 -subj /CN=wsync-test-ca");
    if (!st.ok()) return st;
    return c;
  }

  // A certificate for `name` signed by the CA, with subjectAltName `san`
  // (e.g. "URI:wsync://group/trainer,URI:wsync://group/inference").
  absl::Status Issue(const std::string& name, const std::string& san) {
    return Run(absl::StrCat(
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
        ".key -out ", name, ".csr -subj /CN=", name, " && printf 'subjectAltName=%s\\n' '", san,
        "' > ", name, ".ext && openssl x509 -req -in ", name,
        ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out ", name, ".pem -extfile ", name,
        ".ext"));
  }

  std::string Path(const std::string& file) const { return absl::StrCat(dir_, "/", file); }
  std::string Read(const std::string& file) const {
    std::ifstream in(Path(file));
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Runs `command` in the directory (output to openssl.log).
  absl::Status Run(const std::string& command) const {
    const std::string line = absl::StrCat("cd '", dir_, "' && (", command, ") >> openssl.log 2>&1");
    if (std::system(line.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("failed: ", command, " (see ", dir_, "/openssl.log)"));
    }
    return absl::OkStatus();
  }

 private:
  explicit TestCerts(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace wsync::integration

#endif  // WSYNC_TESTS_INTEGRATION_TEST_CERTS_H_
