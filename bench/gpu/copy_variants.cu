#include "bench/gpu/copy_variants.h"
#include "worker/backends/cuda/piece_kernel_impl.cuh"

namespace wsync::bench {
namespace {

using cuda::PieceDesc;
using cuda::TaskDesc;
using cuda::piece_impl::kThreads;
using cuda::piece_impl::PieceKernel;

template <int kMinBlocks, int kPerLane, int kParts>
cudaError_t Run(const void* table, const cuda::TableLayout& l, int blocks_per_sm, int sms,
                cudaStream_t stream) {
  auto kernel = PieceKernel<true, kMinBlocks, kPerLane, kParts>;
  int fit = 0;
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, 0);
  if (e != cudaSuccess) return e;
  const int per_sm = blocks_per_sm < fit ? blocks_per_sm : fit;
  const char* d = static_cast<const char*>(table);
  e = cudaMemsetAsync(const_cast<char*>(d) + l.counter_offset, 0, 8, stream);
  if (e != cudaSuccess) return e;
  kernel<<<sms * per_sm, kThreads, 0, stream>>>(
      reinterpret_cast<const PieceDesc*>(d + l.pieces_offset),
      reinterpret_cast<const TaskDesc*>(d + l.tasks_offset), l.num_tasks,
      reinterpret_cast<const uint64_t*>(d + l.inputs_offset),
      reinterpret_cast<unsigned long long*>(const_cast<char*>(d) + l.counter_offset), 0u);
  return cudaGetLastError();
}

}  // namespace

const std::vector<CopyVariant>& CopyVariants() {
  static const std::vector<CopyVariant> v = {
      {"v_l8p8b3", &Run<3, 8, 8>},  // production
      {"v_l4p8b3", &Run<3, 4, 8>},   {"v_l4p16b3", &Run<3, 4, 16>}, {"v_l8p4b3", &Run<3, 8, 4>},
      {"v_l8p16b3", &Run<3, 8, 16>}, {"v_l8p8b2", &Run<2, 8, 8>},   {"v_l4p8b4", &Run<4, 4, 8>},
      {"v_l4p32b4", &Run<4, 4, 32>}, {"v_l2p32b4", &Run<4, 2, 32>}, {"v_l16p4b2", &Run<2, 16, 4>},
  };
  return v;
}

}  // namespace wsync::bench
