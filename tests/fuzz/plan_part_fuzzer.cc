// libFuzzer target: a worker's plan part as it arrives from the controller
// (binary v1::Plan), bound to a worker's registered host buffers
// (worker/exec BindPlan) and, when it binds, executed round by round on the
// host data ops against a staging area of the size the binding computed:
// anything BindPlan accepts must stay inside the buffers it was checked
// against (AddressSanitizer reports any byte outside). Piece runs: a part
// whose runs stand for more than kMaxRunMembers pieces must be refused (a
// trap otherwise); one that stands for more than kMaxFuzzMembers is skipped
// (binding it is legitimate but costly).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/plan_names.h"
#include "common/plan_pieces.h"
#include "google/protobuf/message.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "worker/backends/host/host_data_ops.h"
#include "worker/exec/bound_plan.h"
#include "worker/exec/buffer_registry.h"
#include "wsync/v1/plan.pb.h"

namespace {

using wsync::exec::BufferSide;

// Work above this is skipped (a stride-0 view may count many elements).
constexpr int64_t kMaxElements = int64_t{1} << 18;
constexpr int64_t kMaxStaging = int64_t{4} << 20;
constexpr int64_t kMaxBufferBytes = int64_t{1} << 20;
constexpr int64_t kMaxFuzzMembers = int64_t{1} << 14;

// The members of all of the plan's runs (counts below 0 count 0).
int64_t RunMembers(const wsync::v1::Plan& plan) {
  int64_t n = 0;
  for (const wsync::v1::Bucket& b : plan.buckets()) {
    for (const wsync::v1::PieceRun& r : b.runs()) n += std::max(r.count(), 0);
  }
  return n;
}

int64_t Elements(const wsync::exec::StridedView& v) {
  int64_t n = 1;
  for (int d = 0; d < v.ndim; ++d) {
    if (v.shape[d] > kMaxElements) return kMaxElements + 1;
    n *= v.shape[d];
    if (n > kMaxElements) return kMaxElements + 1;
  }
  return n;
}

bool Affordable(const wsync::exec::BoundRound& r) {
  int64_t n = 0;
  auto add = [&n](const wsync::exec::StridedView& v) { n += Elements(v); };
  for (const auto& p : r.pack) add(p.src);
  for (const auto& u : r.unpack) add(u.dst);
  for (const auto& c : r.copies) add(c.src);
  for (const auto& i : r.reduce_inputs) add(i.view);
  for (const auto& q : r.quantize_inputs) add(q.view);
  return n <= kMaxElements && r.staging_bytes <= kMaxStaging;
}

// Every TensorView anywhere in the plan (reflection: buckets, reduces,
// quantizes alike).
void CollectViews(const google::protobuf::Message& m,
                  std::vector<const wsync::v1::TensorView*>* out) {
  if (const auto* v = dynamic_cast<const wsync::v1::TensorView*>(&m)) {
    out->push_back(v);
    return;
  }
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const auto* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i)
        CollectViews(r->GetRepeatedMessage(m, f, i), out);
    } else {
      CollectViews(r->GetMessage(m, f), out);
    }
  }
}

// The worker's registered buffers: one per (side, name) the plan's views
// name, with the dtype and the extent (capped) of the first view naming it,
// so later views may lie inside or outside. Separate heap blocks: a byte
// past one is an ASan report.
struct Buffers {
  std::vector<std::unique_ptr<std::vector<uint8_t>>> memory;
  wsync::exec::BufferRegistry registry;

  explicit Buffers(const wsync::v1::Plan& plan) {
    std::vector<const wsync::v1::TensorView*> views;
    CollectViews(plan, &views);
    for (const wsync::v1::TensorView* v : views) {
      auto name = wsync::PlanName(plan, v->buffer_name(), "fuzz");
      if (!name.ok()) continue;
      const BufferSide side = v->side() == wsync::v1::DESTINATION_BUFFER ? BufferSide::kDestination
                                                                         : BufferSide::kSource;
      if (registry.Has(side, **name)) continue;
      const int64_t es = std::max<int64_t>(wsync::DTypeSize(v->dtype()), 1);
      auto extent = wsync::StridedExtent(v->shape(), v->strides(), es, "fuzz");
      auto end = extent.ok() ? wsync::CheckedAdd(v->byte_offset(), *extent, "fuzz") : extent;
      const int64_t bytes = end.ok() ? std::min(*end, kMaxBufferBytes) : 64;
      memory.push_back(
          std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(std::max<int64_t>(bytes, 1))));
      wsync::exec::RegisteredBuffer r{memory.back()->data(), bytes, v->dtype()};
      (void)registry.Register(side, **name, r);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wsync::v1::Plan plan;
  if (!plan.ParseFromArray(data, static_cast<int>(size))) return 0;
  const int64_t members = RunMembers(plan);
  if (members > wsync::kMaxRunMembers) {
    wsync::exec::BufferRegistry none;
    if (wsync::exec::BindPlan(plan, 0, none, wsync::exec::MemorySpace::kHost).ok()) {
      __builtin_trap();  // runs over the budget were bound
    }
    return 0;
  }
  if (members > kMaxFuzzMembers) return 0;
  Buffers buffers(plan);
  std::vector<int32_t> workers = {0};
  for (int i = 0; i < plan.ranks_size() && i < 4; ++i) workers.push_back(plan.ranks(i).worker());
  for (int32_t worker : workers) {
    auto bound =
        wsync::exec::BindPlan(plan, worker, buffers.registry, wsync::exec::MemorySpace::kHost);
    if (!bound.ok()) continue;
    wsync::exec::HostDataOps ops;
    for (const wsync::exec::BoundRound& r : (*bound)->rounds) {
      if (!Affordable(r)) continue;
      std::vector<uint8_t> staging(static_cast<size_t>(std::max<int64_t>(r.staging_bytes, 1)));
      (void)ops.Pack(r.pack, staging.data());
      (void)ops.Unpack(staging.data(), r.unpack);
      (void)ops.Copy(r.copies);
      (void)ops.Reduce(r.reduce_inputs, r.reduces, staging.data());
      (void)ops.Quantize(r.quantize_inputs, r.quantizes, staging.data());
    }
  }
  return 0;
}
