// DataOps on plain host memory: synchronous strided copies with conversions
// from common/cast.h, with fast paths for contiguous rows. Not thread-safe:
// one instance per executor (it keeps scratch buffers between calls).
#ifndef WSYNC_WORKER_BACKENDS_HOST_HOST_DATA_OPS_H_
#define WSYNC_WORKER_BACKENDS_HOST_HOST_DATA_OPS_H_

#include <cstdint>
#include <vector>

#include "worker/plane/data_ops.h"

namespace wsync::exec {

class HostDataOps : public DataOps {
 public:
  std::string Name() const override { return "host"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }

  absl::StatusOr<StagingBuffer> AllocateStaging(int64_t bytes) override;
  absl::Status Pack(absl::Span<const PackItem> items, void* staging_base) override;
  absl::Status Unpack(const void* staging_base, absl::Span<const UnpackItem> items) override;
  absl::Status Copy(absl::Span<const CopyItem> items, ItemsHandle handle = {}) override;
  absl::Status Reduce(absl::Span<const ReduceInput> inputs, absl::Span<const ReduceItem> items,
                      const void* staging_base) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status Quantize(absl::Span<const QuantizeInput> inputs,
                        absl::Span<const QuantizeItem> items, const void* staging_base) override;

  // What Copy checks of one item before moving its bytes: both views, equal
  // element counts, a conversion common/cast.h has.
  static absl::Status CheckCopyItem(const CopyItem& item);

 private:
  // src -> dst element-wise in row-major order, converting dtypes.
  absl::Status Transfer(const StridedView& src, const StridedView& dst);

  std::vector<uint8_t> scratch_src_;
  std::vector<uint8_t> scratch_dst_;
  std::vector<uint8_t> scratch_out_;
  std::vector<std::vector<uint8_t>> scratch_inputs_;
  // Block fp8: the assembled region in fp32, its fp8 bytes and its scales.
  absl::Status PackQuantized(const PackItem& it, void* staging_base);
  std::vector<float> quant_in_;
  std::vector<uint8_t> quant_out_;
  std::vector<float> quant_scales_;
};

}  // namespace wsync::exec

#endif  // WSYNC_WORKER_BACKENDS_HOST_HOST_DATA_OPS_H_
