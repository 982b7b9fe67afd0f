// Helpers of ShadowSet (shadow_set.cc, shadow_set_swap.cc): byte views and
// the shape of a plan's tensor views.
#ifndef WSYNC_WORKER_AGENT_SHADOW_VIEWS_H_
#define WSYNC_WORKER_AGENT_SHADOW_VIEWS_H_

#include <cstdint>

#include "worker/plane/data_ops.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::agent::shadow_views {

inline exec::StridedView Bytes(void* data, int64_t bytes) {
  exec::StridedView v;
  v.data = data;
  v.dtype = v1::UINT8;
  v.ndim = 1;
  v.shape[0] = bytes;
  v.strides[0] = 1;
  return v;
}

inline const char* ModeName(v1::StagingMode mode) {
  return mode == v1::STAGING_HOST_SHADOW ? "host_shadow" : "device_shadow";
}

// Whether `v` covers one contiguous byte range (row-major and dense, size-1
// dims ignored).
inline bool Dense(const v1::TensorView& v) {
  int64_t expected = 1;
  for (int d = v.shape_size() - 1; d >= 0; --d) {
    if (v.shape(d) == 1) continue;
    if (d >= v.strides_size() || v.strides(d) != expected) return false;
    expected *= v.shape(d);
  }
  return true;
}

inline int64_t NumElements(const v1::TensorView& v) {
  int64_t n = 1;
  for (int64_t s : v.shape()) n *= s;
  return n;
}

}  // namespace wsync::agent::shadow_views

#endif  // WSYNC_WORKER_AGENT_SHADOW_VIEWS_H_
