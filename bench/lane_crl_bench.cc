// The control fast lane's revocation check per worker call, against the
// CRL's size (controller/server/revocation.h): CheckIdentity (what the lane
// runs now: hash look-ups of the (issuer, serial) pairs its lease registered
// with) next to Check (what it ran before session 20, and what gRPC runs on
// the certificate a call presents: the PEM parsed, names printed), and the
// load of the list itself, which a lane call that came right after the file
// changed used to pay on the lane's one thread (now the list's reloader
// thread pays it).
//
//   build/bench/lane_crl_bench [--entries=10,10000]
//
// Certificates and CRLs made with Debian's openssl (tests/integration's
// TestCerts); the extra entries are written into the CA's database and
// `openssl ca -gencrl` signs them.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "controller/server/revocation.h"
#include "tests/integration/test_certs.h"

ABSL_FLAG(std::string, entries, "10,10000", "CRL sizes to measure (revoked serials)");

namespace {

using wsync::controller::CertificateIdentity;
using wsync::controller::IdentifyCertificate;
using wsync::controller::ParseRevocations;
using wsync::controller::RevocationList;
using wsync::integration::TestCerts;

// Seconds per call of `fn`, over about 0.3 s (at least `min_calls` calls).
template <typename Fn>
double PerCall(Fn fn, int min_calls) {
  int64_t calls = 0;
  const absl::Time start = absl::Now();
  absl::Duration spent;
  do {
    for (int i = 0; i < min_calls; ++i) fn();
    calls += min_calls;
    spent = absl::Now() - start;
  } while (spent < absl::Milliseconds(300));
  return absl::ToDoubleSeconds(spent) / static_cast<double>(calls);
}

int Measure(int entries) {
  char dir[] = "/tmp/wsync-crl-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  absl::StatusOr<TestCerts> ca = TestCerts::Create(dir);
  if (!ca.ok() || !ca->Issue("bob", "URI:wsync://group/src").ok() || !ca->WriteCrl().ok()) {
    std::fprintf(stderr, "openssl failed (see %s/openssl.log)\n", dir);
    return 1;
  }
  {  // revoked entries of made-up serials, then the CRL signed again
    std::ofstream index(ca->Path("index.txt"), std::ios::app);
    for (int i = 0; i < entries; ++i) {
      index << absl::StrFormat("R\t301231000000Z\t240101000000Z\t%08X\tunknown\t/CN=gone-%d\n",
                               0x10000000 + i, i);
    }
  }
  if (!ca->WriteCrl().ok()) return 1;
  const std::string crl = ca->Read("crl.pem"), ca_pem = ca->Read("ca.pem");
  const std::string bob = ca->Read("bob.pem");
  auto list = RevocationList::Create(ca->Path("crl.pem"), ca->Path("ca.pem"), absl::Seconds(60));
  if (!list.ok()) {
    std::fprintf(stderr, "%s\n", list.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<const CertificateIdentity> id = IdentifyCertificate(bob, "");
  if (!(*list)->CheckIdentity(*id, "bench").ok() || !(*list)->Check(bob, "", "bench").ok()) {
    std::fprintf(stderr, "bob should not be revoked\n");
    return 1;
  }
  const double identity_s = PerCall([&] { (void)(*list)->CheckIdentity(*id, "bench"); }, 10000);
  const double pem_s = PerCall([&] { (void)(*list)->Check(bob, "", "bench"); }, 200);
  const double load_s = PerCall([&] { (void)ParseRevocations(crl, ca_pem, "crl.pem"); }, 1);
  std::printf("%8d | %12.0f ns | %12.1f us | %10.2f ms | %7zu KiB\n", entries, identity_s * 1e9,
              pem_s * 1e6, load_s * 1e3, crl.size() / 1024);
  std::string rm = absl::StrCat("rm -rf '", dir, "'");
  return std::system(rm.c_str()) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::printf("%8s | %15s | %15s | %13s | %s\n", "entries", "CheckIdentity", "Check (PEM)",
              "load the CRL", "CRL file");
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_entries), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 0) {
      std::fprintf(stderr, "--entries: '%s' is not a count\n", std::string(s).c_str());
      return 2;
    }
    if (int rc = Measure(n); rc != 0) return rc;
  }
  return 0;
}
