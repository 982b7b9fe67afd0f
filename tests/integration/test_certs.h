// Test certificates made with Debian's openssl: a CA, the controller's
// certificate (SAN IP 127.0.0.1 / DNS localhost) and client certificates with
// the URI SANs of docs/security.md, revocation lists and expired
// certificates. Short-lived, EC P-256 (fast to make).
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

  // Writes crl.pem: the CA's revocation list of every certificate revoked so
  // far (none at first), replaced atomically (openssl ca's database in the
  // directory).
  absl::Status WriteCrl() {
    if (absl::Status st = EnsureCaDatabase(); !st.ok()) return st;
    return Run("openssl ca -config ca.cnf -gencrl -out crl.pem.new && mv crl.pem.new crl.pem");
  }
  // Revokes <name>.pem and writes crl.pem again.
  absl::Status Revoke(const std::string& name) {
    if (absl::Status st = EnsureCaDatabase(); !st.ok()) return st;
    if (absl::Status st = Run(absl::StrCat("openssl ca -config ca.cnf -revoke ", name, ".pem"));
        !st.ok()) {
      return st;
    }
    return WriteCrl();
  }
  // A certificate like Issue's that expired in 2020.
  absl::Status IssueExpired(const std::string& name, const std::string& san) {
    if (absl::Status st = EnsureCaDatabase(); !st.ok()) return st;
    return Run(absl::StrCat(
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
        ".key -out ", name, ".csr -subj /CN=", name, " && printf 'subjectAltName=%s\\n' '", san,
        "' > ", name, ".ext && openssl ca -config ca.cnf -batch -notext -in ", name,
        ".csr -startdate 20200101000000Z -enddate 20200102000000Z -out ", name, ".pem -extfile ",
        name, ".ext"));
  }

  // The serial of <name>.pem in upper-case hex ("" if unreadable).
  std::string Serial(const std::string& name) const {
    if (!Run(absl::StrCat("openssl x509 -noout -serial -in ", name, ".pem > ", name, ".serial"))
             .ok()) {
      return "";
    }
    std::string line = Read(name + ".serial");
    const size_t eq = line.find('=');
    if (eq == std::string::npos) return "";
    line = line.substr(eq + 1);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return line;
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
  // The files `openssl ca` needs (its own serial file: Issue's ca.srl would
  // hand out a serial already used).
  absl::Status EnsureCaDatabase() const {
    return Run(
        "test -f ca.cnf || { touch index.txt && echo 01 > crlnumber && openssl rand -hex 16 > "
        "ca-db.srl && printf '[ca]\\ndefault_ca = test_ca\\n[test_ca]\\ndatabase = "
        "index.txt\\ncrlnumber = crlnumber\\ndefault_md = sha256\\ndefault_crl_days = "
        "2\\ncertificate = ca.pem\\nprivate_key = ca.key\\nnew_certs_dir = .\\nserial = "
        "ca-db.srl\\npolicy = any\\nunique_subject = no\\n[any]\\ncommonName = "
        "supplied\\n' > ca.cnf; }");
  }
  std::string dir_;
};

}  // namespace wsync::integration

#endif  // WSYNC_TESTS_INTEGRATION_TEST_CERTS_H_
