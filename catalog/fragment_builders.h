// Small builders for explicit-fragment layouts, shared by the vLLM layout
// builders (dense and expert tensors).
#ifndef WSYNC_CATALOG_FRAGMENT_BUILDERS_H_
#define WSYNC_CATALOG_FRAGMENT_BUILDERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "wsync/v1/layout.pb.h"

namespace wsync::catalog {

// A tensor in explicit-fragment form with no fragments yet.
inline v1::TensorLayout NewTensor(const std::string& name, v1::DType dtype,
                                  const std::vector<int64_t>& shape) {
  v1::TensorLayout t;
  t.set_name(name);
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_fragments();
  return t;
}

// Rank `rank` holds box (offset, length) contiguously in `buffer` at byte_offset.
inline void AddFragment(v1::TensorLayout* t, int64_t rank, const std::vector<int64_t>& offset,
                        const std::vector<int64_t>& length, const std::string& buffer,
                        int64_t byte_offset) {
  v1::Fragment* f = t->mutable_fragments()->add_fragments();
  f->set_rank(static_cast<int32_t>(rank));
  for (int64_t o : offset) f->mutable_box()->add_offset(o);
  for (int64_t l : length) f->mutable_box()->add_length(l);
  f->set_buffer(buffer);
  f->set_byte_offset(byte_offset);
}

}  // namespace wsync::catalog

#endif  // WSYNC_CATALOG_FRAGMENT_BUILDERS_H_
