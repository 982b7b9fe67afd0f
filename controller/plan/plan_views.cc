#include "controller/plan/plan_views.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/types/span.h"

namespace wsync::plan::planner_detail {
ViewFields FieldsOf(const v1::TensorView& v) {
  ViewFields f;
  f.buffer_name = v.buffer_name();
  f.byte_offset = v.byte_offset();
  f.rank = v.shape_size();
  f.shape = v.shape().data();
  f.strides = v.strides().data();
  f.dtype = v.dtype();
  f.side = v.side();
  return f;
}

namespace {

bool Equal(const ViewFields& a, const ViewFields& b) {
  return a.buffer_name == b.buffer_name && a.byte_offset == b.byte_offset && a.rank == b.rank &&
         a.dtype == b.dtype && a.side == b.side && std::equal(a.shape, a.shape + a.rank, b.shape) &&
         std::equal(a.strides, a.strides + a.rank, b.strides);
}

}  // namespace

void FillView(const ViewFields& f, v1::TensorView* v) {
  v->set_buffer_name(f.buffer_name);
  v->set_byte_offset(f.byte_offset);
  v->mutable_shape()->Reserve(f.rank);
  v->mutable_strides()->Reserve(f.rank);
  for (int d = 0; d < f.rank; ++d) v->add_shape(f.shape[d]);
  for (int d = 0; d < f.rank; ++d) v->add_strides(f.strides[d]);
  v->set_dtype(f.dtype);
  v->set_side(f.side);
}

size_t ViewTable::Hash::operator()(const ViewFields& f) const {
  return absl::HashOf(f.buffer_name, f.byte_offset, static_cast<int>(f.dtype),
                      static_cast<int>(f.side), absl::MakeConstSpan(f.shape, f.rank),
                      absl::MakeConstSpan(f.strides, f.rank));
}

size_t ViewTable::Hash::operator()(const v1::TensorView* v) const { return (*this)(FieldsOf(*v)); }

bool ViewTable::Eq::operator()(const v1::TensorView* a, const v1::TensorView* b) const {
  return a == b || Equal(FieldsOf(*a), FieldsOf(*b));
}

bool ViewTable::Eq::operator()(const v1::TensorView* a, const ViewFields& b) const {
  return Equal(FieldsOf(*a), b);
}

v1::TensorView* ViewTable::Get(const ViewFields& f) {
  auto it = views_.find(f);
  if (it != views_.end()) return *it;
  v1::TensorView* v = google::protobuf::Arena::CreateMessage<v1::TensorView>(arena_);
  FillView(f, v);
  views_.insert(v);
  return v;
}

}  // namespace wsync::plan::planner_detail
