// The puts of one Put call before they are issued: copy-engine copies and
// piece-kernel requests, each with the peer device it writes to. Emit cuts
// and interleaves them by peer (worker/plane/put_order.h) when they go to
// several peers, so that the copy streams and the kernel's blocks, which
// work front to back, keep every peer's link busy. Host only, no CUDA calls.
#ifndef WSYNC_WORKER_BACKENDS_CUDA_PUT_LIST_H_
#define WSYNC_WORKER_BACKENDS_CUDA_PUT_LIST_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "worker/backends/cuda/piece_table.h"

namespace wsync::cuda {

// One put on the copy engines: a cudaMemcpy2DAsync of `height` rows of
// `width` bytes (height 1: a cudaMemcpyAsync). `item` names it in errors.
struct PutCopy {
  void* dst = nullptr;
  size_t dst_pitch = 0;
  const void* src = nullptr;
  size_t src_pitch = 0;
  size_t width = 0;
  size_t height = 0;
  size_t item = 0;
};

// One put of the piece kernel: shape[0..n) elements, strides in elements of
// each side's dtype (a common refinement of the item's two views).
struct PutRequest {
  const void* src = nullptr;
  DType src_dtype = v1::DTYPE_UNSPECIFIED;
  const void* dst = nullptr;
  DType dst_dtype = v1::DTYPE_UNSPECIFIED;
  int n = 0;
  int64_t shape[kMaxRequestDims] = {};
  int64_t src_strides[kMaxRequestDims] = {};
  int64_t dst_strides[kMaxRequestDims] = {};
  size_t item = 0;
};

class PutList {
 public:
  void Clear() { entries_.clear(); }
  void AddCopy(const PutCopy& copy, int peer);
  void AddRequest(const PutRequest& request, int peer);

  // Appends every put to `copies` (adding their bytes to `*copy_bytes`) or
  // to `table`. With more than one peer and `max_part_bytes` > 0, each put
  // is first cut into parts of at most `max_part_bytes` along its outermost
  // dim (rows; bytes of a 1-D copy), and the parts are ordered by
  // plane::InterleaveByPeer, first peer the (self mod n)-th of the n peers in
  // ascending order (writers of distinct `self` to one set of peers start on
  // distinct peers). Otherwise in the order added. The parts together write
  // exactly what the puts did.
  absl::Status Emit(int self, int64_t max_part_bytes, PieceTable* table,
                    std::vector<PutCopy>* copies, int64_t* copy_bytes) const;

  // Distinct peers of the puts added since Clear, ascending.
  std::vector<int> peers() const;

 private:
  struct Entry {
    bool is_copy = false;
    PutCopy copy;
    PutRequest request;
    int peer = 0;
    int64_t bytes = 0;  // written to the peer
  };
  static void Cut(const Entry& e, int64_t max_part_bytes, std::vector<Entry>* out);
  static absl::Status EmitOne(const Entry& e, PieceTable* table, std::vector<PutCopy>* copies,
                              int64_t* copy_bytes);

  std::vector<Entry> entries_;
};

}  // namespace wsync::cuda

#endif  // WSYNC_WORKER_BACKENDS_CUDA_PUT_LIST_H_
