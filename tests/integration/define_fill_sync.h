// The integration tests' common step on a started case (harness.h CaseRun):
// define the transfer, fill the sources with a version and sync it.
#ifndef WSYNC_TESTS_INTEGRATION_DEFINE_FILL_SYNC_H_
#define WSYNC_TESTS_INTEGRATION_DEFINE_FILL_SYNC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace wsync::integration {

// Defines `transfer` (the case's spec; again after a controller restart),
// fills version `version` and syncs it, waiting for its end: OK only when
// the sync succeeded, otherwise what failed (the call, or the sync's phase
// and error).
inline absl::Status DefineFillSync(CaseRun& run, const std::string& transfer, int64_t version) {
  if (grpc::Status s = run.Define(transfer); !s.ok()) {
    return absl::InternalError(absl::StrCat("DefineTransfer '", transfer, "': ", s.error_message()));
  }
  run.Fill(version);
  v1::SyncStatus st;
  if (grpc::Status s = run.SyncAndWait(transfer, version, &st); !s.ok()) {
    return absl::InternalError(absl::StrCat("Sync ", version, ": ", s.error_message()));
  }
  if (st.phase() != v1::SYNC_SUCCEEDED) {
    return absl::InternalError(absl::StrCat("sync ", version, " ended ",
                                            v1::SyncPhase_Name(st.phase()), ": ", st.error()));
  }
  return absl::OkStatus();
}

}  // namespace wsync::integration

#endif  // WSYNC_TESTS_INTEGRATION_DEFINE_FILL_SYNC_H_
