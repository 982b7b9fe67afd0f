// Owning pointers for OpenSSL objects (freed with their own *_free), and a
// read-only memory BIO over bytes the caller keeps alive.
#ifndef WSYNC_COMMON_OPENSSL_PTR_H_
#define WSYNC_COMMON_OPENSSL_PTR_H_

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/string_view.h"

namespace wsync {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// Null when OpenSSL cannot make it.
inline BioPtr MemBio(absl::string_view bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

}  // namespace wsync

#endif  // WSYNC_COMMON_OPENSSL_PTR_H_
