#include "worker/backends/cuda/cuda_peer_writer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace wsync::cuda {

std::string CudaPeerWriter::Name() const { return absl::StrCat("cuda-ipc:", ops_->device()); }

absl::Status CudaPeerWriter::Put(absl::Span<const exec::CopyItem> items, exec::ItemsHandle handle,
                                 bool alone) {
  return ops_->Put(items, handle, alone);
}

absl::Status CudaPeerWriter::Fence() { return ops_->FinishPuts(); }

absl::StatusOr<uint8_t*> CudaPeerWriter::TokenSlots(size_t count) {
  const int64_t need = static_cast<int64_t>(count * kTokenBytes);
  if (tokens_.bytes() < need) {
    tokens_.Reset();
    ASSIGN_OR_RETURN(tokens_, ops_->AllocateStaging(need));
  }
  return static_cast<uint8_t*>(tokens_.data());
}

absl::Status CudaPeerWriter::WriteToken(uint8_t* slot, uint64_t value) {
  return ops_->WriteStaging(slot, &value, kTokenBytes);
}

absl::StatusOr<uint64_t> CudaPeerWriter::ReadToken(const uint8_t* slot) {
  uint64_t value = 0;
  RETURN_IF_ERROR(ops_->ReadStaging(&value, slot, kTokenBytes));
  return value;
}

}  // namespace wsync::cuda
